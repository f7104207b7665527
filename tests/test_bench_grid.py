"""The benchmark's run grid: every execution path trains the same runs."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from benchmarks import _grid
from dsgrad.training.batching import batch_indices


def _naive_sgd_trainer(num_steps, num_evals):
  """``(model, objective, params0, estimator, train)`` for naive + SGD on a small GLM."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 60, 3)
  model = dsgrad.models.logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  est = dsgrad.naive()
  train = _grid.trainer(lambda lr: optax.chain(est, optax.sgd(lr)), objective, params0,
                        batch_size=5, num_steps=num_steps, num_evals=num_evals)
  return model, objective, params0, est, train


# Slow (7 s): the grid benchmark's paths; run with -m slow before the benchmark is rerun.
@pytest.mark.slow
def test_grid_paths_agree():
  model, objective, params0, est, train = _naive_sgd_trainer(24, 3)
  lrs = (1e-3, 1e-2)
  keys = jax.random.split(jax.random.key(1), 2)
  vmapped, _ = _grid.run_grid(train, lrs, keys)
  looped, _ = _grid.run_grid(train, lrs, keys, vmap_step_sizes=False)
  for a, b in zip(jax.tree.leaves(vmapped), jax.tree.leaves(looped)):
    assert a.shape == (2, 2, 3, model.latent_dim)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Step sizes and seeds really differ (the grid is not one run repeated).
  loc = vmapped["loc"]
  assert not np.allclose(loc[0, 0], loc[1, 0]) and not np.allclose(loc[0, 0], loc[0, 1])
  # Each run matches a plain Python-loop training run with the same batches and noise.
  lr, key = lrs[1], keys[0]
  batch_key, noise_key = jax.random.split(key)
  params, opt = params0, optax.chain(est, optax.sgd(lr))
  state = opt.init(params)
  for t in range(24):
    idx = batch_indices(batch_key, t, 1, objective.num_data, 5)[0]
    noise = objective.sample_noise(jax.random.fold_in(noise_key, t), 5)
    grads = objective.grad(params, idx, noise)
    updates, state = opt.update(grads, state, params, indices=idx, noise=noise)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(vmapped["loc"][1, 0, -1], params["loc"], rtol=1e-4, atol=1e-5)


def test_dropped_state_and_elbo_many():
  _, objective, _, _, train = _naive_sgd_trainer(6, 2)
  traces, states = _grid.run_grid(train, (1e-3,), jax.random.split(jax.random.key(2), 2),
                                  keep_state=False)
  assert states is None
  flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[3:]), traces)
  values = np.asarray(_grid.elbo_many(objective, 50)(flat, jax.random.key(3)))
  draws = dsgrad.diagnostics.elbo_draws(objective, 50)(jax.tree.map(lambda a: a[1], flat),
                                                       jax.random.key(3))
  np.testing.assert_allclose(values[1], np.mean(draws), rtol=1e-5)


def test_diverged_mask_is_sticky():
  ok = jnp.zeros((1, 1, 4, 2))
  bad = ok.at[0, 0, 1, 0].set(jnp.nan).at[0, 0, 3, 1].set(2e3)
  mask = _grid.diverged_mask({"a": bad})
  np.testing.assert_array_equal(mask[0, 0], [True, False, False, False])
  assert _grid.diverged_mask({"a": ok}).all()
  v = np.array([[[1.0], [np.nan]], [[0.5], [0.7]]])   # (L=2, S=2, 1)
  np.testing.assert_allclose(_grid.mean_over_seeds(v)[:, 0], [-np.inf, 0.6])


# Slow (6 s, a fresh interpreter): run with -m slow before the benchmark is rerun.
@pytest.mark.slow
def test_import_does_not_start_the_backend():
  # XLA_FLAGS set after `import dsgrad` must still take effect (the benchmarks rely on it).
  code = ("import dsgrad, benchmarks.paper, benchmarks.paper_large\n"
          "from jax._src import xla_bridge\n"
          "assert not xla_bridge.backends_are_initialized()\n")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
