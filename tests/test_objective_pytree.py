"""The objective as a pytree: its data are leaves, so a user's own jitted step takes them
as arguments, and the estimators compute with the objective handed to ``update``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad


def _objective(seed, n=200, d=4):
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(seed), n, d)
  model = dsgrad.models.logistic_regression(x, y)
  return dsgrad.meanfield_gaussian(model), model, (x, y)


def _batch(objective, seed=1, b=16):
  indices = jax.random.choice(jax.random.key(seed), objective.num_data, (b,), replace=False)
  return indices, objective.sample_noise(jax.random.key(seed + 1), b)


def test_leaves_are_the_data_and_with_data_keeps_the_structure():
  objective, model, (x, y) = _objective(0)
  leaves = jax.tree.leaves(objective)
  assert sorted(leaf.shape for leaf in leaves) == [(200,), (200, 4)]
  other = objective.with_data({"x": -x, "signs": objective.data_tree()["signs"]})
  assert jax.tree.structure(other) == jax.tree.structure(objective)
  # Another model (other functions) is another structure, whatever its data.
  second, _, _ = _objective(0)
  assert jax.tree.structure(second) != jax.tree.structure(objective)
  # Round trip: the rebuilt objective computes with the leaves it was given.
  params = dsgrad.meanfield_init(model, 0.0, -1.0)
  indices, noise = _batch(objective)
  rebuilt = jax.tree.map(lambda v: -v if v.ndim == 2 else v, objective)
  np.testing.assert_allclose(rebuilt.value(params, indices, noise),
                             other.value(params, indices, noise), rtol=1e-6)


def test_jit_over_the_objective_traces_once_for_two_data_sets(counting_jit):
  objective, model, _ = _objective(0)
  other_x, other_y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(5), 200, 4)
  other = objective.with_data({"x": other_x, "signs": 2.0 * other_y - 1.0})
  direct = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(other_x, other_y))
  params = dsgrad.meanfield_init(model, 0.3, -1.0)
  indices, noise = _batch(objective)
  grad, traces = counting_jit(lambda o, p, i, e: o.grad(p, i, e, validate=False))
  first = grad(objective, params, indices, noise)
  second = grad(other, params, indices, noise)
  assert len(traces) == 1
  close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
  jax.tree.map(close, first, objective.grad(params, indices, noise))
  jax.tree.map(close, second, direct.grad(params, indices, noise))
  assert not np.allclose(first["loc"], second["loc"])


# cv keeps no state that follows the data (its control is computed afresh each step), and
# its update is joint SVRG's without the snapshot: -m slow.
@pytest.mark.parametrize("make", [
    pytest.param(lambda o, m: dsgrad.cv(o, control_weight=1.0), marks=pytest.mark.slow),
    lambda o, m: dsgrad.joint_saga(o, dsgrad.approx.glm_mean_taylor(m), control_weight=1.0),
    lambda o, m: dsgrad.joint_svrg(o, every=5),
], ids=["cv", "joint_saga", "joint_svrg"])
def test_estimators_compute_with_the_objective_handed_to_update(make):
  """``update(..., objective=other)`` inside the user's jit equals the estimator built for
  ``other`` directly, after several steps (the state follows the handed data)."""
  objective, model, _ = _objective(0)
  other_x, other_y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(5), 200, 4)
  other = objective.with_data({"x": other_x, "signs": 2.0 * other_y - 1.0})
  other_model = dsgrad.models.logistic_regression(other_x, other_y)
  direct = dsgrad.meanfield_gaussian(other_model)
  params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  mine = optax.chain(make(objective, model), optax.sgd(1e-3))
  reference = optax.chain(make(direct, other_model), optax.sgd(1e-3))

  @jax.jit
  def step(objective, params, state, indices, key):
    return dsgrad.train_step(objective, mine, params, state, indices, key)

  state = mine.init(params0)  # init reads no data: the first update's full passes do
  ref_state = reference.init(params0)
  params, ref_params = params0, params0
  for t in range(8):
    indices, _ = _batch(objective, seed=10 + t)
    key = jax.random.key(100 + t)
    params, state = step(other, params, state, indices, key)
    ref_params, ref_state = jax.jit(functools.partial(dsgrad.train_step, direct, reference))(
        ref_params, ref_state, indices, key)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=1e-6),
               params, ref_params)


def test_update_refuses_an_objective_of_another_model():
  objective, model, _ = _objective(0)
  stranger, _, _ = _objective(1)
  opt = dsgrad.checked(dsgrad.cv(objective), objective)
  params = dsgrad.meanfield_init(model, 0.0, -1.0)
  state = opt.init(params)
  indices, noise = _batch(objective)
  grads = objective.grad(params, indices, noise)
  with pytest.raises(ValueError, match="is not the estimator's .* on other data"):
    opt.update(grads, state, params, indices=indices, noise=noise, objective=stranger)
  with pytest.raises(TypeError, match="objective= must be a dsgrad.Objective"):
    opt.update(grads, state, params, indices=indices, noise=noise, objective={"x": 1})


def test_another_family_or_setting_of_one_model_is_another_objective():
  """An objective's structure holds its functions: another family or noise setting of the
  same model is refused as the estimator's objective on other data."""
  _, model, _ = _objective(0)
  first = dsgrad.meanfield_gaussian(model)
  opt = dsgrad.cv(first)
  params = dsgrad.meanfield_init(model, 0.0, -1.0)
  state = opt.init(params)
  indices, noise = _batch(first)
  grads = first.grad(params, indices, noise)
  for other in (dsgrad.meanfield_gaussian(model, path_derivative=True),
                dsgrad.meanfield_gaussian(model, shared_noise=False)):
    assert jax.tree.structure(other) != jax.tree.structure(first)
    with pytest.raises(ValueError, match="is not the estimator's .* on other data"):
      dsgrad.checked(opt, first).update(grads, state, params, indices=indices, noise=noise,
                                        objective=other)


@pytest.mark.parametrize("wrap", ["jit", "lru_cache"])
def test_a_likelihood_behind_a_wrapper_computes_with_the_data_it_is_handed(wrap):
  """The likelihood receives the batch's rows as an argument, so a jax.jit or lru_cache
  wrapper around it holds no data: with_data computes with the new arrays."""
  import functools
  _, model, (x, y) = _objective(0)
  if wrap == "jit":
    lik = jax.jit(model.log_likelihood)
  else:
    cached = functools.lru_cache(None)(lambda: model.log_likelihood)
    lik = lambda z, rows: cached()(z, rows)  # noqa: E731
  objective = dsgrad.meanfield_gaussian(model._replace(log_likelihood=lik))
  other_x, other_y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(7), 200, 4)
  moved = objective.with_data({"x": other_x, "signs": 2.0 * other_y - 1.0})
  direct = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(other_x, other_y))
  params = dsgrad.meanfield_init(model, 0.2, -1.0)
  indices, noise = _batch(objective)
  np.testing.assert_allclose(moved.value(params, indices, noise),
                             direct.value(params, indices, noise), rtol=1e-6)
  assert not np.allclose(objective.value(params, indices, noise),
                         moved.value(params, indices, noise))


def test_the_objectives_functions_and_the_noise_shape_are_refused_where_they_enter():
  def loss(params, rows, noise):
    return rows["y"] * jnp.sum(params["m"] + noise, -1)
  data = {"y": jnp.ones(8)}
  # A string or None in place of a function was kept and failed at the first step.
  with pytest.raises(TypeError, match="noise_fn must be a function, got str 'gauss'"):
    dsgrad.Objective(loss, "gauss", 8, data=data)
  with pytest.raises(TypeError, match="loss_fn must be a function, got NoneType"):
    dsgrad.Objective(None, dsgrad.gaussian_noise((3,)), 8, data=data)
  # A negative size was accepted (and failed at the first draw); a number is a vector's
  # size, as in NumPy (it failed with "'int' object is not iterable").
  with pytest.raises(ValueError, match=r"gaussian_noise: shape\[0\] must be an integer >= 1"):
    dsgrad.gaussian_noise((-3,))
  assert dsgrad.gaussian_noise(3)(jax.random.key(0), 2).shape == (2, 3)
