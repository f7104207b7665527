"""The fused step (:func:`dsgrad.fused_update`: the estimator computes the naive gradient
itself) gives the numbers of the two-call form, for every estimator and approximation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.estimators import chain as chain_lib
from dsgrad.models import logistic_regression, softmax_regression

N, B, STEPS = 120, 16, 3


def _model(num_classes):
  x = np.asarray(jax.random.normal(jax.random.key(0), (N, 5)))
  if num_classes == 1:
    return logistic_regression(x, (x[:, 0] + x[:, 1] > 0).astype(np.int32))
  y = np.asarray(jax.random.randint(jax.random.key(1), (N,), 0, num_classes))
  return softmax_regression(x, y, num_classes)


APPROXIMATIONS = {
    "linearize": lambda m: None,
    "glm_mean_taylor": dsgrad.approx.glm_mean_taylor,
    "glm_taylor": dsgrad.approx.glm_taylor,
    "logistic_probit": dsgrad.approx.logistic_probit,
}
ESTIMATORS = {
    "cv": lambda o, a: dsgrad.cv(o, a, control_weight=1.0),
    "cv_adaptive": lambda o, a: dsgrad.cv(o, a),
    "joint_svrg": lambda o, a: dsgrad.joint_svrg(o, a, every=2, control_weight=1.0),
    "joint_saga": lambda o, a: dsgrad.joint_saga(o, a, control_weight=1.0),
    "joint_saga_bfloat16_table": lambda o, a: dsgrad.joint_saga(
        o, a, table_dtype=jnp.bfloat16),
}
# Every approximation with a fused kernel under each estimator that uses it, the
# adaptive weight and a rounded table once each; linearize (no kernel) for the fallback.
# Of the grid of three estimators and three approximations, one of each pairs with one of
# each in the default run; the other six pairs are slow (5 s together).
_PAIRED = {("cv", "linearize"), ("joint_svrg", "glm_mean_taylor"), ("joint_saga", "glm_taylor")}
CASES = ([(3, e, a) if (e, a) in _PAIRED else pytest.param(3, e, a, marks=pytest.mark.slow)
          for a in ("linearize", "glm_mean_taylor", "glm_taylor")
          for e in ("cv", "joint_svrg", "joint_saga")]
         + [(1, e, "logistic_probit") for e in ("cv", "joint_svrg", "joint_saga",
                                                "joint_saga_bfloat16_table")]
         + [(1, "joint_saga_bfloat16_table", "glm_mean_taylor"), (3, "cv_adaptive", "glm_taylor")])


def _run_both(objective, transform, params):
  """Updates and states of ``STEPS`` steps in the two-call and the fused form, from the
  same params, batches and noise (the params follow the two-call updates)."""
  two, fused = transform.init(params), transform.init(params)

  @jax.jit
  def both(two, fused, params, idx, eps):
    grads = objective.grad(params, idx, eps, validate=False)
    return (transform.update(grads, two, params, indices=idx, noise=eps),
            dsgrad.fused_update(transform, fused, params, indices=idx, noise=eps,
                                objective=objective))

  out = []
  for t in range(STEPS):
    # Repeated indices included: the running mean's change counts each datum once.
    idx = jax.random.randint(jax.random.key(t), (B,), 0, N)
    eps = objective.sample_noise(jax.random.key(100 + t), B)
    (u_two, two), (u_fused, fused) = both(two, fused, params, idx, eps)
    out.append(((u_two, two), (u_fused, fused)))
    params = optax.apply_updates(params, jax.tree.map(lambda u: -0.05 * u, u_two))
  return out


@pytest.mark.parametrize("num_classes,estimator,approx_name", CASES)
def test_fused_equals_two_calls(num_classes, estimator, approx_name):
  model = _model(num_classes)
  objective = dsgrad.meanfield_gaussian(model)
  approx = APPROXIMATIONS[approx_name](model)
  transform = ESTIMATORS[estimator](objective, approx)
  params = dsgrad.meanfield_init(model, 0.1, -1.0)
  for two, fused in _run_both(objective, transform, params):
    for a, b in zip(jax.tree.leaves(two), jax.tree.leaves(fused)):
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      # float32 sums in another order (one stacked product instead of several)
      np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5 * (1 + np.abs(a).max()))


def test_glm_approximations_fuse_only_their_own_objective():
  model = _model(3)
  approx = dsgrad.approx.glm_taylor(model)
  assert approx.fused_for(dsgrad.meanfield_gaussian(model)) is not None
  assert approx.fused_for(dsgrad.families.MeanFieldGaussian(model.latent_dim).objective(
      model)) is not None
  # One noise draw per datum, another model, or a changed loss: the two-call form.
  assert approx.fused_for(dsgrad.meanfield_gaussian(model, shared_noise=False)) is None
  assert approx.fused_for(dsgrad.meanfield_gaussian(_model(3))) is None
  weighted = dsgrad.estimators._common.reweighted(dsgrad.meanfield_gaussian(model),
                                                  jnp.ones(B))
  assert approx.fused_for(weighted) is None


@pytest.mark.parametrize("name", ["inc", "smiso"])
def test_estimators_without_a_fused_kernel_compute_the_gradient_themselves(name):
  model = _model(1)
  objective = dsgrad.meanfield_gaussian(model)
  transform = {"inc": dsgrad.inc(objective), "smiso": dsgrad.smiso(objective, 0.05)}[name]
  params = dsgrad.meanfield_init(model, 0.1, -1.0)
  idx = jnp.arange(B)
  eps = objective.sample_noise(jax.random.key(3), B)
  state = transform.init(params)
  two = transform.update(objective.grad(params, idx, eps), state, params, indices=idx,
                         noise=eps, objective=objective)
  fused = dsgrad.fused_update(transform, state, params, indices=idx, noise=eps,
                              objective=objective)
  for a, b in zip(jax.tree.leaves(two), jax.tree.leaves(fused)):
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_the_fused_entry_needs_an_estimator_first_in_the_chain():
  model = _model(1)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model)
  for optimizer in (optax.chain(dsgrad.naive(), optax.adam(1e-2)), optax.adam(1e-2)):
    with pytest.raises(ValueError, match="first transformation is not a dsgrad estimator"):
      dsgrad.fused_update(optimizer, optimizer.init(params), params, indices=jnp.arange(B),
                          noise=objective.sample_noise(jax.random.key(0), B),
                          objective=objective)


def test_fit_uses_the_fused_step_only_when_an_estimator_leads_the_chain():
  model = _model(1)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model)
  leads = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  assert chain_lib.computes_own_gradient(jax.eval_shape(leads.init, params))
  wrapped = optax.inject_hyperparams(
      lambda learning_rate: optax.chain(dsgrad.cv(objective), optax.adam(learning_rate)))(
          learning_rate=1e-2)
  assert not chain_lib.computes_own_gradient(jax.eval_shape(wrapped.init, params))
  plain = optax.with_extra_args_support(optax.adam(1e-2))
  assert not chain_lib.computes_own_gradient(jax.eval_shape(plain.init, params))


def test_train_step_fused_and_two_call_agree():
  model = _model(3)
  objective = dsgrad.meanfield_gaussian(model)
  optimizer = optax.chain(dsgrad.joint_saga(objective, dsgrad.approx.glm_taylor(model)),
                          optax.adam(1e-2))
  params = dsgrad.meanfield_init(model, 0.0, -1.0)
  state = optimizer.init(params)
  idx = jax.random.randint(jax.random.key(5), (B,), 0, N)
  outs = [jax.jit(lambda o, p, s, fused=fused: dsgrad.train_step(
      o, optimizer, p, s, idx, jax.random.key(6), fused=fused))(objective, params, state)
          for fused in (False, True)]
  for a, b in zip(*map(jax.tree.leaves, outs)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shift", [-3, 2])
def test_train_step_refuses_indices_outside_the_data(shift):
  # JAX clamps an index past the end and wraps a negative one: the step trained on rows
  # the caller did not ask for, without an error.
  model = _model(3)
  objective = dsgrad.meanfield_gaussian(model)
  optimizer = optax.chain(dsgrad.cv(objective), optax.adam(1e-2))
  params = dsgrad.meanfield_init(model)
  state = optimizer.init(params)
  indices = jnp.arange(B) + (shift if shift < 0 else N - B + shift)
  step = jax.jit(lambda o, p, s, i: dsgrad.train_step(o, optimizer, p, s, i, jax.random.key(0)))
  with pytest.raises(Exception, match=f"indices out of range: every index must lie in \\[0, {N}\\)"):
    jax.block_until_ready(step(objective, params, state, indices))
  with pytest.raises(ValueError, match="1-D array of datum indices"):
    dsgrad.train_step(objective, optimizer, params, state, indices.reshape(1, -1),
                      jax.random.key(0))


def test_train_step_names_a_state_made_by_another_optimizer():
  model = _model(3)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model)
  # optax failed inside Adam's update: "'EmptyState' object has no attribute 'mu'".
  with pytest.raises(ValueError, match="train_step: the state passed to update is not one "
                                       "this optimizer's init makes .*EmptyState"):
    dsgrad.train_step(objective, optax.adam(1e-2), params, optax.sgd(1e-2).init(params),
                      jnp.arange(B), jax.random.key(0))
