"""Inputs that are finite and meaningful after they enter: each kind of input that used to
be accepted silently (or refused with an error that did not say why) is refused by name,
or gives the documented answer.

The generated tests that guard these kinds for entry points added later (every model
factory's floating arrays, every catalogue model's data with a meaning) are in
``tests/test_argument_kinds.py``.
"""

import inspect
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad import mcmc
from dsgrad.training import batching
from dsgrad.datasets import mnist, uci
from dsgrad.mcvae.networks import check_images

def test_standardize_gives_z_scores_for_values_beyond_float32():
  """Z-scores do not depend on a column's scale: 1e300 once overflowed into a zero column."""
  x = np.array([[1e300, 1.0], [1.0, 2.0], [3.0, 4.0]])
  expected = uci.standardize(np.array([[1.0, 1.0], [1e-300, 2.0], [3e-300, 4.0]]))
  np.testing.assert_allclose(uci.standardize(x), expected, rtol=1e-6)
  assert np.all(np.abs(uci.standardize(x)[:, 0]) > 0.5)
  with pytest.raises(ValueError, match="non-finite"):
    uci.standardize(np.array([[np.nan, 1.0], [1.0, 2.0]]))
  with pytest.raises(ValueError, match="float32"):
    uci.add_intercept(np.array([[1e39], [1.0]]))
  with pytest.raises(ValueError, match=r"shape \(N, D\), got \(3,\)"):  # was numpy's AxisError
    uci.add_intercept(np.arange(3.0))


def test_a_latent_given_as_a_python_float_is_refused():
  def log_lik(z, batch):
    return -0.5 * (batch["y"] - jnp.sum(z)) ** 2

  data = {"y": np.zeros(5, np.float32)}
  with pytest.raises(TypeError, match=r"latent=3\.0 is ambiguous.*latent=3\b"):
    dsgrad.model_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2), log_lik, data, 3.0)
  # The two unambiguous forms: a dimension, or an example value as an array.
  assert dsgrad.model_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2), log_lik, data,
                                      3).latent_dim == 3
  assert dsgrad.model_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2), log_lik, data,
                                      jnp.zeros(())).latent_dim == 1


def test_float_indices_into_host_data_are_refused_not_truncated(tmp_path):
  path = os.path.join(tmp_path, "x.npy")
  np.save(path, np.arange(20, dtype=np.float32).reshape(10, 2))
  host = dsgrad.data.open_memmap(path)
  np.testing.assert_array_equal(host.rows(np.array([1, 2])), [[2, 3], [4, 5]])
  with pytest.raises(TypeError, match="integers"):
    host.rows(np.array([1.7, 2.2]))


def test_object_arrays_on_disk_are_refused_by_name(tmp_path):
  path = os.path.join(tmp_path, "objects.npy")
  np.save(path, np.array([[1, "a"]], dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match="objects.npy.*object values.*numeric"):
    dsgrad.data.open_memmap(path)


def test_a_batch_without_replacement_larger_than_the_data_is_refused():
  assert batching.uniform_indices(jax.random.key(0), 10, 10, replace=False).shape == (10,)
  with pytest.raises(ValueError, match="20 distinct indices cannot be drawn from 10"):
    batching.uniform_indices(jax.random.key(0), 10, 20, replace=False)


def test_signs_of_a_signed_chain_must_be_plus_or_minus_one():
  values = np.ones((3, 2))
  np.testing.assert_allclose(mcmc.signed_mean(values * [[1], [2], [3]],
                                              np.array([1.0, -1.0, 1.0])), [2.0, 2.0])
  for bad in (np.array([1.0, np.nan, 1.0]), np.array([1, 0, 1])):
    with pytest.raises(ValueError, match=r"\+1 or -1"):
      mcmc.signed_mean(values, bad)
    with pytest.raises(ValueError, match=r"\+1 or -1"):
      mcmc.positive_fraction(bad)
  with pytest.raises(ValueError, match="sum to"):  # all negative: no estimate
    mcmc.signed_mean(values, -np.ones(3))


def test_a_mass_matrix_that_is_not_symmetric_is_refused_not_symmetrized():
  mcmc.hmc_parameters(0.1, 3, np.array([[2.0, 0.5], [0.5, 2.0]]))
  with pytest.raises(ValueError, match="not symmetric"):
    mcmc.hmc_parameters(0.1, 3, np.array([[2.0, 1.0], [0.0, 2.0]]))


@pytest.fixture(scope="module")
def logistic():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 60, 3)
  model = dsgrad.models.logistic_regression(x, y)
  return model, dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)


def test_a_users_loop_gets_fits_chain_rule_through_checked(logistic):
  model, objective, params = logistic
  wrong = optax.chain(optax.clip_by_global_norm(1e-3), dsgrad.cv(objective), optax.adam(1e-2))
  with pytest.raises(ValueError, match="must come first"):
    dsgrad.fit(objective, wrong, params, jax.random.key(0), num_steps=2, batch_size=10,
               elbo_samples=0, progress=False)
  with pytest.raises(ValueError, match="dsgrad.checked.*must come first"):
    dsgrad.checked(wrong).init(params)
  right = dsgrad.checked(optax.chain(dsgrad.cv(objective), optax.clip_by_global_norm(1e-3),
                                     optax.adam(1e-2)))
  state = right.init(params)
  indices = jnp.arange(10)
  noise = objective.sample_noise(jax.random.key(1), 10)
  updates, _ = right.update(objective.grad(params, indices, noise), state, params,
                            indices=indices, noise=noise)
  assert np.all(np.isfinite(updates["loc"]))
  with pytest.raises(ValueError, match="must come first"):  # a state of the wrong chain
    right.update(updates, wrong.init(params), params, indices=indices, noise=noise)


def test_an_approximation_that_is_not_finite_is_named(logistic):
  model, objective, params = logistic
  base = dsgrad.approx.linearize()

  def grad_and_expected(objective, params, indices, noise):
    g, e = base.grad_and_expected(objective, params, indices, noise)
    return g, jax.tree.map(lambda t: t * jnp.inf, e)

  def expected_grad(objective, params, indices):
    return jax.tree.map(lambda t: t * jnp.inf, base.expected_grad(objective, params, indices))

  infinite = base._replace(grad_and_expected=grad_and_expected, expected_grad=expected_grad,
                           name="diverging")
  indices = jnp.arange(10)
  noise = objective.sample_noise(jax.random.key(1), 10)
  grads = objective.grad(params, indices, noise)
  for estimator in (dsgrad.cv(objective, infinite), dsgrad.joint_svrg(objective, infinite, every=5)):
    estimator = dsgrad.checked(estimator, objective)
    with pytest.raises(ValueError, match="non-finite update from a finite gradient, params "
                                         "and noise: an estimator's approximation is not finite"):
      estimator.update(grads, estimator.init(params), params, indices=indices, noise=noise)


def test_a_shared_noise_function_in_a_per_datum_objective_is_refused(logistic):
  model, objective, params = logistic
  with pytest.raises(ValueError, match="shared_noise=False.*one draw per datum"):
    dsgrad.Objective(objective.loss_fn, dsgrad.gaussian_noise((3,), shared=True), 60,
                     shared_noise=False)
  dsgrad.Objective(objective.loss_fn, dsgrad.gaussian_noise((3,)), 60, shared_noise=False)


def test_complex_noise_is_refused_by_name(logistic):
  model, objective, params = logistic
  noise = objective.sample_noise(jax.random.key(0), 5)
  with pytest.raises(TypeError, match="noise passed to .* is complex"):
    objective.grad(params, jnp.arange(5), noise.astype(jnp.complex64))
  with pytest.raises(TypeError, match="complex noise"):
    dsgrad.Objective(objective.loss_fn,
                     lambda key, b: jax.random.normal(key, (3,), jnp.complex64), 60,
                     shared_noise=True)


def test_a_compact_saga_state_given_to_the_dense_estimator_is_named():
  model = dsgrad.models.bradley_terry(np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0]), 4)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model)
  compact = dsgrad.joint_saga(objective, dsgrad.approx.sparse_linearize(objective))
  dense = dsgrad.joint_saga(objective, dsgrad.approx.linearize())
  indices = jnp.arange(2)
  noise = objective.sample_noise(jax.random.key(0), 2)
  with pytest.raises(ValueError, match=r"not one this optimizer's init makes.*table\['loc'\]"
                                       r".*sparse_linearize"):
    dsgrad.checked(dense, objective).update(objective.grad(params, indices, noise), compact.init(params), params,
                 indices=indices, noise=noise)


def test_initial_values_of_the_wrong_length_are_named():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 20, 3)
  model = dsgrad.models.logistic_regression(x, y)
  with pytest.raises(ValueError, match=r"loc has shape \(5,\).*dimension is 3"):
    dsgrad.meanfield_init(model, jnp.zeros(5))
  with pytest.raises(ValueError, match=r"log_scale has shape \(2,\)"):
    dsgrad.meanfield_init(model, 0.0, jnp.zeros(2))


def test_images_that_are_empty_or_hold_nan_are_named():
  check_images(np.zeros((2, 4)))
  with pytest.raises(ValueError, match="empty"):
    check_images(np.zeros((0, 4)))
  pixels = np.zeros((2, 4))
  pixels[1, 2] = np.nan
  with pytest.raises(ValueError, match=r"1 non-finite pixels.*image 1, pixel 2"):
    check_images(pixels)


def test_a_device_list_with_repeats_is_refused():
  device = jax.devices()[0]
  assert dsgrad.training.parallel.data_mesh([device]).size == 1
  with pytest.raises(ValueError, match="devices repeat"):
    dsgrad.training.parallel.data_mesh([device, device])


def test_an_idx_header_whose_sizes_overflow_is_refused(tmp_path):
  """Sizes whose product wraps around in int64 once matched a small file."""
  header = np.array([2051, 2 ** 32 - 1, 2 ** 32 - 1, 2 ** 32 - 1], ">u4").tobytes()
  with pytest.raises(ValueError, match="header announces"):
    mnist._parse("bad-idx", header + bytes(16), 2051, 3)


def test_a_checkpoint_of_a_function_names_the_leaf(tmp_path):
  with pytest.raises(TypeError, match=r"leaf at \['f'\] is a function"):
    dsgrad.training.checkpoint.save(os.path.join(tmp_path, "c.ckpt"), {"w": np.zeros(2), "f": lambda x: x})


def test_the_kinds_of_every_entry_point_above_are_public():
  # The checks live where the inputs enter: the public functions named above.
  for function in (dsgrad.checked, mcmc.signed_mean, mcmc.hmc_parameters, uci.standardize,
                   dsgrad.training.parallel.data_mesh, dsgrad.training.checkpoint.save, dsgrad.data.open_memmap):
    assert inspect.getdoc(function)


def test_masked_arrays_are_refused_where_data_enter():
  """``np.asarray`` of a masked array keeps its masked entries' stored values: standardize
  returned z-scores with the fill -999 counted as data; a model's data failed inside JAX
  without naming the column."""
  x = np.ma.masked_array(np.array([[1.0, 2.0], [-999.0, 3.0], [2.0, 4.0]]),
                         mask=[[False, False], [True, False], [False, False]])
  with pytest.raises(ValueError, match=r"features is a NumPy masked array \(1 masked"):
    uci.standardize(x)
  with pytest.raises(ValueError, match=r"images is a NumPy masked array"):
    check_images(np.ma.masked_array(np.zeros((2, 4)), mask=np.zeros((2, 4), bool)))
  with pytest.raises(ValueError, match=r"data\['x'\] is a NumPy masked array"):
    dsgrad.model_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2),
                                 lambda z, b: -0.5 * (b["x"][:, 0] - z[0]) ** 2, {"x": x}, 1)


def test_a_float16_column_builds_a_model_without_a_warning():
  """The whole-number check of float columns compared a float16 column with 2**24, which
  overflows float16: a RuntimeWarning from dsgrad's own code on a user's data."""
  x = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float16)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    model = dsgrad.model_from_logdensity(
        lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: -0.5 * (b["x"] @ z) ** 2, {"x": x}, 2)
  assert model.num_data == 50
