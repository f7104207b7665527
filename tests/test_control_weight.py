"""Adaptive control-variate weights: computed from earlier steps only, switched off for
a useless control, kept near one for a good one, refused when malformed."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.training.batching import sample_batch
from conftest import BATCH, fill_by_training


def _useless_approximation():
  """A control term of pure noise, uncorrelated with the gradient: ``grad f~ = 30 eps``
  on ``loc`` and ``log_scale`` (zero expectation). With weight 1 it only adds variance."""
  def grad_and_expected(objective, params, indices, noise):
    eps = noise if objective.shared_noise else jnp.mean(noise, 0)
    drawn = {"loc": 30.0 * eps, "log_scale": -30.0 * eps}
    return drawn, jax.tree.map(jnp.zeros_like, drawn)

  def expected_grad(objective, params, indices):
    return jax.tree.map(jnp.zeros_like, params)

  return dsgrad.Approximation(grad_and_expected, expected_grad, "useless")


def _factories(objective, model, approx, weight):
  return {
      "cv": dsgrad.cv(objective, approx, control_weight=weight),
      "joint_saga": dsgrad.joint_saga(objective, approx, control_weight=weight),
      "joint_svrg": dsgrad.joint_svrg(objective, approx, every=20, control_weight=weight),
  }


@pytest.mark.parametrize("name", ["cv", "joint_saga", "joint_svrg"])
def test_weight_comes_from_earlier_steps_only(logreg_model, params0, name):
  """The adaptive output is ``g + c * control`` with ``c`` the weight stored in the state
  *before* the update, for every draw: the current draw never enters its own weight."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  approx = dsgrad.approx.linearize()  # imperfect for the scales: weights strictly below 1
  adaptive = _factories(objective, logreg_model, approx, "adaptive")[name]
  fixed = _factories(objective, logreg_model, approx, 1.0)[name]
  state, params = fill_by_training(adaptive, objective, params0, jax.random.key(1), steps=30)
  moments = state.control_weight if name != "cv" else state
  weights = moments.weight
  fixed_state = (state._replace(control_weight=()) if name != "cv"
                 else fixed.init(params))
  assert int(moments.count) == 30
  assert all(bool(jnp.all((0.0 <= w) & (w <= 1.0))) for w in jax.tree.leaves(weights))
  for k in jax.random.split(jax.random.key(2), 3):
    indices, noise = sample_batch(k, objective, BATCH)
    g = objective.grad(params, indices, noise)
    out, new_state = adaptive.update(g, state, params, indices=indices, noise=noise)
    plain, _ = fixed.update(g, fixed_state, params, indices=indices, noise=noise)
    expected = jax.tree.map(lambda gi, p, w: gi + w * (p - gi), g, plain, weights)
    for key in g:
      np.testing.assert_allclose(out[key], expected[key], rtol=1e-5, atol=1e-5)
    # The draw does enter the moments behind the *next* weight.
    new_moments = new_state.control_weight if name != "cv" else new_state
    assert np.any(np.asarray(new_moments.cross["loc"]) != np.asarray(moments.cross["loc"]))


# joint SVRG is slow (2 s): its weight is the same moving-average state as joint SAGA's.
@pytest.mark.parametrize("name", ["cv", "joint_saga",
                                  pytest.param("joint_svrg", marks=pytest.mark.slow)])
def test_useless_control_is_switched_off(logreg_model, params0, name):
  """With a control term of pure noise, weight 1 multiplies naive's variance, the
  adaptive weight falls near 0 and the variance stays within 10% of naive's."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  approx = _useless_approximation()
  adaptive = _factories(objective, logreg_model, approx, "adaptive")[name]
  fixed = _factories(objective, logreg_model, approx, 1.0)[name]
  state, params = fill_by_training(adaptive, objective, params0, jax.random.key(3),
                                   steps=300)
  weights = state.control_weight.weight if name != "cv" else state.weight
  assert all(float(jnp.mean(w)) < 0.15 for w in jax.tree.leaves(weights)), weights

  def variance(tx, st):
    samples = np.asarray(dsgrad.estimator_samples(tx, st, params, objective,
                                                  jax.random.key(4), 3000, BATCH))
    return samples.var(0).sum()

  naive = variance(dsgrad.naive(), optax.EmptyState())
  fixed_state = (state._replace(control_weight=()) if name != "cv" else fixed.init(params))
  assert variance(fixed, fixed_state) > 3.0 * naive
  assert variance(adaptive, state) < 1.1 * naive


def test_good_control_keeps_weight_near_one(logreg_model, params0):
  """After 200 steps the adaptive weight of a good control is near 1, and far from the
  useless control's (below 0.15, above). The weight after 200 steps varies from run to
  run (over 16 seeds: 0.75 to 1.0, spread about 0.07), so the test averages 6 runs."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  tx = dsgrad.cv(objective, dsgrad.approx.glm_taylor(logreg_model), control_weight="adaptive")
  weights = []
  for seed in range(6):
    state, _ = fill_by_training(tx, objective, params0, jax.random.key(seed), steps=200)
    weights.append([float(jnp.mean(w)) for w in jax.tree.leaves(state.weight)])
  weights = np.array(weights)
  assert np.all(weights.mean(0) > 0.85) and np.all(weights > 0.6), weights


@pytest.mark.parametrize("kwargs,match", [
    (dict(control_weight="adaptiv"), "control_weight"),
    (dict(control_weight=1.5), "control_weight"),
    (dict(control_weight=-0.1), "control_weight"),
    (dict(control_weight="adaptive", control_weight_horizon=0), "control_weight_horizon"),
])
def test_bad_weights_are_refused_by_name(logreg_model, kwargs, match):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  for make in (lambda: dsgrad.cv(objective, **kwargs),
               lambda: dsgrad.joint_saga(objective, **kwargs),
               lambda: dsgrad.joint_svrg(objective, every=5, **kwargs)):
    with pytest.raises(ValueError, match=match):
      make()


def test_fixed_weight_scales_the_control(logreg_model, params0):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  indices, noise = sample_batch(jax.random.key(6), objective, BATCH)
  g = objective.grad(params0, indices, noise)
  full, _ = dsgrad.cv(objective, control_weight=1.0).update(g, (), params0, indices=indices, noise=noise)
  half, _ = dsgrad.cv(objective, control_weight=0.5).update(g, (), params0, indices=indices,
                                                            noise=noise)
  for key in g:
    np.testing.assert_allclose(half[key], g[key] + 0.5 * (full[key] - g[key]), rtol=1e-5,
                               atol=1e-5)


def test_the_adaptive_weight_is_the_default(logreg_model, params0):
  """A control variate that adds variance must not cost the user: cv, joint SAGA and joint
  SVRG adapt their weight unless told otherwise (``control_weight=1.0``: the paper's)."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  for make in (lambda **kw: dsgrad.cv(objective, **kw),
               lambda **kw: dsgrad.joint_saga(objective, **kw),
               lambda **kw: dsgrad.joint_svrg(objective, every=10, **kw)):
    default = jax.tree.leaves(make().init(params0),
                              is_leaf=lambda s: isinstance(s, dsgrad.AdaptiveWeightState))
    paper = jax.tree.leaves(make(control_weight=1.0).init(params0),
                            is_leaf=lambda s: isinstance(s, dsgrad.AdaptiveWeightState))
    assert any(isinstance(s, dsgrad.AdaptiveWeightState) for s in default)
    assert not any(isinstance(s, dsgrad.AdaptiveWeightState) for s in paper)
