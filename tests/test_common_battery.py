"""A battery every estimator must pass (after optax's contrib/_common_test.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization

import dsgrad
from dsgrad.training.batching import sample_batch
from conftest import BATCH, N_DATA, exact_negative_elbo
from estimator_cases import CASES, parametrized

NAMES = list(CASES)


def _make(name, objective, lr=1e-2, **kw):
  factory, is_optimizer = CASES[name]
  est = factory(objective, **kw)
  return est if is_optimizer else optax.chain(est, optax.adam(lr))


def _step_fn(opt, objective):
  def step(params, state, key):
    indices, noise = sample_batch(key, objective, BATCH, replace=False)
    grads = objective.grad(params, indices, noise)
    updates, state = opt.update(grads, state, params, indices=indices, noise=noise,
                                unexpected_extra_arg=1)
    return optax.apply_updates(params, updates), state
  return step


@pytest.fixture(scope="module")
def objective(logreg_model):
  return dsgrad.meanfield_gaussian(logreg_model, shared_noise=True)


@pytest.mark.parametrize("name", parametrized(NAMES))
def test_extra_args_no_recompile_scan_dtype(name, objective, params0):
  opt = _make(name, objective)
  step = jax.jit(_step_fn(opt, objective))
  state = opt.init(params0)
  keys = jax.random.split(jax.random.key(0), 6)
  params, state = step(params0, state, keys[0])
  compiled = step._cache_size()
  for k in keys[1:]:
    params, state = step(params, state, k)
  assert step._cache_size() == compiled, "estimator recompiles on later steps"
  # Same trajectory under lax.scan.
  def body(carry, k):
    return _step_fn(opt, objective)(*carry, k), None
  (params_scan, _), _ = jax.lax.scan(body, (params0, opt.init(params0)), keys)
  chex.assert_trees_all_close(params_scan, params, rtol=1e-5, atol=1e-5)
  # Dtypes and shapes kept.
  chex.assert_trees_all_equal_dtypes(params, params0)
  chex.assert_trees_all_equal_shapes(params, params0)


@pytest.mark.parametrize("name", parametrized(NAMES))
def test_map_params_leaves_tables_alone(name, objective, params0):
  opt = _make(name, objective)
  state = opt.init(params0)
  mapped = optax.tree.map_params(opt, lambda v: jnp.full_like(v, 7.0), state)
  assert dsgrad.table_bytes(mapped) == dsgrad.table_bytes(state)
  for path, leaf in jax.tree_util.tree_flatten_with_path(mapped)[0]:
    if any(getattr(k, "name", None) == "table" for k in path):
      assert leaf.shape[0] == N_DATA and not np.all(np.asarray(leaf) == 7.0)
  # Params-shaped fields (adam's moments, running means, snapshots) are mapped.
  assert any(np.all(np.asarray(l) == 7.0) for l in jax.tree.leaves(mapped))


@pytest.mark.parametrize("name", parametrized(n for n in NAMES if n != "smiso"))
def test_inject_hyperparams_matches_plain(name, objective, params0):
  factory, _ = CASES[name]
  plain = optax.chain(factory(objective), optax.adam(1e-2))
  injected = optax.chain(factory(objective),
                         optax.inject_hyperparams(optax.adam)(learning_rate=1e-2))
  results = []
  for opt in (plain, injected):
    step = jax.jit(_step_fn(opt, objective))
    params, state = params0, opt.init(params0)
    for k in jax.random.split(jax.random.key(1), 5):
      params, state = step(params, state, k)
    results.append(params)
  chex.assert_trees_all_close(results[0], results[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", parametrized(n for n in NAMES if n != "smiso"))
def test_apply_if_finite_skips_nan_steps_without_corrupting_state(name, objective, params0):
  factory, _ = CASES[name]
  opt = optax.apply_if_finite(optax.chain(factory(objective),
                                          optax.sgd(1e-3)), max_consecutive_errors=3)
  state = opt.init(params0)
  idx = jnp.arange(BATCH, dtype=jnp.int32)
  noise = objective.sample_noise(jax.random.key(2), BATCH)
  nan_grads = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), params0)
  update = jax.jit(lambda g, s, p: opt.update(g, s, p, indices=idx, noise=noise))
  updates, new_state = update(nan_grads, state, params0)
  assert int(new_state.notfinite_count) == 1
  chex.assert_trees_all_equal(optax.apply_updates(params0, updates), params0)
  chex.assert_trees_all_equal(new_state.inner_state, state.inner_state)
  grads = objective.grad(params0, idx, noise)
  updates, newer = update(grads, new_state, params0)
  assert int(newer.notfinite_count) == 0
  assert all(np.all(np.isfinite(l)) for l in jax.tree.leaves((updates, newer)))


@pytest.mark.parametrize("name", parametrized(NAMES))
def test_optimization_improves_elbo_and_state_serializes(name, objective, logreg_data, params0):
  opt = _make(name, objective, lr=2e-2)
  step = jax.jit(_step_fn(opt, objective))
  params, state = params0, opt.init(params0)
  for k in jax.random.split(jax.random.key(3), 150):
    params, state = step(params, state, k)
  exact = exact_negative_elbo(logreg_data)
  assert float(exact(params)) < float(exact(params0)) - 5.0
  restored = serialization.from_bytes(opt.init(params0), serialization.to_bytes(state))
  chex.assert_trees_all_equal(restored, state)


def test_chain_with_sgd_and_nnx_optimizer(objective, params0):
  """cv chained with optax.sgd, and joint_saga driven through flax.nnx.Optimizer."""
  from flax import nnx
  idx = jnp.arange(BATCH, dtype=jnp.int32)
  noise = objective.sample_noise(jax.random.key(4), BATCH)
  grads = objective.grad(params0, idx, noise)
  opt = optax.chain(dsgrad.cv(objective, control_weight=1.0), optax.sgd(0.1))
  updates, _ = opt.update(grads, opt.init(params0), params0, indices=idx, noise=noise)
  cv_out, _ = dsgrad.cv(objective, control_weight=1.0).update(grads, (), params0, indices=idx,
                                                              noise=noise)
  chex.assert_trees_all_close(updates, jax.tree.map(lambda g: -0.1 * g, cv_out))

  class Variational(nnx.Module):
    def __init__(self, p):
      self.loc = nnx.Param(p["loc"])
      self.log_scale = nnx.Param(p["log_scale"])

  model = Variational(params0)
  tx = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  as_dict = lambda m: {"loc": m.loc[...], "log_scale": m.log_scale[...]}
  nnx_grads = nnx.grad(lambda m: objective.value(as_dict(m), idx, noise))(model)
  optimizer.update(model, nnx_grads, indices=idx, noise=noise)
  g = objective.grad(params0, idx, noise)
  ref = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  ref_updates, _ = ref.update(g, ref.init(params0), params0, indices=idx, noise=noise)
  chex.assert_trees_all_close(as_dict(model), optax.apply_updates(params0, ref_updates),
                              rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", parametrized(NAMES))
def test_params_and_state_can_both_be_donated(name, objective, params0):
  """No state field aliases the params buffers (donating both would fail)."""
  opt = _make(name, objective)
  step = jax.jit(_step_fn(opt, objective), donate_argnums=(0, 1))
  params = jax.tree.map(jnp.copy, params0)
  state = opt.init(params)
  for k in jax.random.split(jax.random.key(5), 3):
    params, state = step(params, state, k)
  assert all(np.all(np.isfinite(l)) for l in jax.tree.leaves(params))
