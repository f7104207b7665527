"""Equivalences between approximations, and the closed forms against brute force."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad.approx import dropout_taylor_values
from dsgrad.models import dropout_glm

LOC_ONLY = {"loc": True, "log_scale": False}


@pytest.mark.parametrize("shared_noise", [True, False])
def test_app_f_formula_equals_masked_linearize(logreg_model, params0, shared_noise):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  idx = jnp.array([0, 3, 7, 7, 49], jnp.int32)
  noise = objective.sample_noise(jax.random.key(1), idx.shape[0])
  app_f = dsgrad.approx.gaussian_mean_taylor(logreg_model)
  masked = dsgrad.approx.linearize(LOC_ONLY)

  @jax.jit  # one program, not one per operation
  def both(params):
    return [(a.grad_and_expected(objective, params, idx, noise),
             a.expected_grad(objective, params, idx)) for a in (app_f, masked)]

  ((got_g, got_e), got_expected), ((want_g, want_e), want_expected) = both(params0)
  chex.assert_trees_all_close(got_g, want_g, rtol=1e-5, atol=1e-4)
  chex.assert_trees_all_close(got_e, want_e, rtol=1e-5, atol=1e-4)
  chex.assert_trees_all_close(got_expected, want_expected, rtol=1e-5, atol=1e-4)
  # The loc part is non-trivial and the log_scale part is switched off.
  assert float(jnp.abs(got_g["loc"] - got_e["loc"]).max()) > 1e-2
  assert float(jnp.abs(got_g["log_scale"]).max()) == 0.0


@pytest.mark.parametrize("mask", [{"mean": True}, {"loc": True}], ids=["misnamed", "partial"])
def test_a_mask_unlike_the_params_is_named_as_the_mask(logreg_model, params0, mask):
  # It was reported as "pytree structure error" and "Was it built from another model
  # than the objective?", pointing away from the mask.
  objective = dsgrad.meanfield_gaussian(logreg_model)
  estimator = dsgrad.cv(objective, dsgrad.approx.linearize(mask))
  with pytest.raises(ValueError, match=r"the mask must have the structure of the params, one "
                                       r"True or False for each of their leaves \(loc, "
                                       r"log_scale\); got leaves \((mean|loc)\)$"):
    estimator.init(params0)


def test_linearize_expectation_is_gradient_at_zero_noise_and_mean_of_tilde(
    logreg_model, params0):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)
  idx = jnp.arange(10, dtype=jnp.int32)
  lin = dsgrad.approx.linearize()
  expected = lin.expected_grad(objective, params0, idx)
  chex.assert_trees_all_close(expected, objective.grad(params0, idx, objective.zero_noise(10)))
  # grad f~ is linear in the noise, so its mean over +/- eps pairs is exactly E grad f~.
  noise = objective.sample_noise(jax.random.key(2), 10)
  g_plus, _ = lin.grad_and_expected(objective, params0, idx, noise)
  g_minus, _ = lin.grad_and_expected(objective, params0, idx, -noise)
  chex.assert_trees_all_close(jax.tree.map(lambda a, b: (a + b) / 2, g_plus, g_minus),
                              expected, rtol=1e-5, atol=1e-4)
  # And it agrees with the true gradient to first order for small noise.
  g_small, _ = lin.grad_and_expected(objective, params0, idx, 1e-3 * noise)
  chex.assert_trees_all_close(g_small, objective.grad(params0, idx, 1e-3 * noise),
                              rtol=1e-3, atol=1e-3)


def test_a_dropout_glm_of_one_class_under_the_softmax_loss_is_refused():
  x = np.random.default_rng(0).normal(size=(10, 2)).astype(np.float32)
  # A softmax over one class is 1 whatever the logits: it trained to nothing.
  with pytest.raises(ValueError, match="at least 2 classes"):
    dropout_glm(x, np.zeros(10, np.int32), num_outputs=1)
  squared = lambda logits, label: 0.5 * jnp.sum((logits - label) ** 2)  # noqa: E731
  assert dropout_glm(x, np.ones((10, 1), np.float32), num_outputs=1, loss=squared).num_data == 10


@pytest.fixture(scope="module")
def glm_setup():
  k1, k2, k3, k4 = jax.random.split(jax.random.key(3), 4)
  x = jax.random.normal(k1, (40, 6))
  y = jax.random.randint(k2, (40,), 0, 3)
  glm = dropout_glm(np.asarray(x), np.asarray(y), num_outputs=3, dropout_std=0.5)
  params = {"weight": 0.7 * jax.random.normal(k3, (3, 6)),
            "bias": 0.1 * jax.random.normal(k4, (3,))}
  return glm, params


def test_dropout_expectation_closed_form_equals_hessian_trace(glm_setup):
  """E f~ = f(w; n, 0) + s^2/2 tr Hess_delta f(w; n, 0) (Eq. 58), the trace taken from an
  explicit D x D Hessian of the true objective in the noise."""
  glm, params = glm_setup
  objective = glm.objective()
  zero = jnp.zeros(6)

  @jax.jit  # one program for the three data, not one per operation and datum
  def both(n):
    f = lambda d: objective.datum_loss(params, n, d)
    brute = f(zero) + 0.5 * glm.dropout_std ** 2 * jnp.trace(jax.hessian(f)(zero))
    return dropout_taylor_values(glm, params, n, zero)[1], brute

  for n in [0, 5, 17]:
    closed, brute = both(jnp.int32(n))
    np.testing.assert_allclose(closed, brute, rtol=1e-5)


def test_dropout_taylor_matches_second_order_expansion_of_the_loss(glm_setup):
  """f~(delta) equals the second-order Taylor polynomial of the true f in delta."""
  glm, params = glm_setup
  objective = glm.objective()
  f = lambda d: objective.datum_loss(params, jnp.int32(2), d)
  zero = jnp.zeros(6)

  @jax.jit  # one program, not one per operation
  def both(delta):
    taylor = f(zero) + jax.grad(f)(zero) @ delta + 0.5 * delta @ jax.hessian(f)(zero) @ delta
    return dropout_taylor_values(glm, params, 2, delta)[0], taylor

  tilde, taylor = both(0.5 * jax.random.normal(jax.random.key(4), (6,)))
  np.testing.assert_allclose(tilde, taylor, rtol=1e-5)


def test_dropout_expected_gradient_matches_monte_carlo(glm_setup):
  """The closed-form E grad f~ equals the Monte Carlo mean of grad f~ over delta."""
  glm, params = glm_setup
  objective = glm.objective()
  approx = dsgrad.approx.dropout_taylor(glm)
  idx = jnp.array([1, 4, 9], jnp.int32)
  expected = jax.flatten_util.ravel_pytree(
      jax.jit(approx.expected_grad)(objective, params, idx))[0]

  @jax.jit
  def draw(k):
    g, _ = approx.grad_and_expected(objective, params, idx, objective.sample_noise(k, 3))
    return jax.flatten_util.ravel_pytree(g)[0]

  samples = np.asarray(jax.lax.map(draw, jax.random.split(jax.random.key(5), 20_000)))
  se = samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
  z = np.abs(samples.mean(0) - np.asarray(expected)) / np.maximum(se, 1e-9)
  assert np.all(z < 4.5), z.max()
  # Both expansions are useful control variates: the residual variance of
  # grad f - grad f~ + E grad f~ is well below the variance of grad f. (Measured here,
  # s = 0.5: the first-order expansion leaves slightly less than the second-order one.)
  def resid_var(a):
    def one(k):
      e = objective.sample_noise(k, 3)
      g_true = objective.grad(params, idx, e)
      if a is None:
        return jax.flatten_util.ravel_pytree(g_true)[0]
      g_t, e_t = a.grad_and_expected(objective, params, idx, e)
      return jax.flatten_util.ravel_pytree(
          jax.tree.map(lambda t, gt, et: t - gt + et, g_true, g_t, e_t))[0]
    draws = jax.lax.map(jax.jit(one), jax.random.split(jax.random.key(6), 2000))
    return float(np.asarray(draws).var(0).sum())
  plain = resid_var(None)
  assert resid_var(approx) < 0.5 * plain
  assert resid_var(dsgrad.approx.linearize()) < 0.5 * plain


def test_custom_approximation_plugs_into_estimators(logreg_model, params0):
  """A user-supplied Approximation: the zero approximation turns cv into naive."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  zeros = lambda p: jax.tree.map(jnp.zeros_like, p)
  custom = dsgrad.Approximation(
      grad_and_expected=lambda obj, p, i, e: (zeros(p), zeros(p)),
      expected_grad=lambda obj, p, i: zeros(p), name="zero")
  idx = jnp.array([1, 2, 3], jnp.int32)
  noise = objective.sample_noise(jax.random.key(0), 3)
  g = objective.grad(params0, idx, noise)
  tx = dsgrad.cv(objective, custom)
  out, _ = tx.update(g, tx.init(params0), params0, indices=idx, noise=noise)
  chex.assert_trees_all_close(out, g)


def test_an_approximation_whose_expectation_is_not_exact_is_refused_at_init():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 400, 4)
  model = dsgrad.models.logistic_regression(x, y)
  # Standard deviation 1: wide enough for the noisy approximation's bias to show in 256 draws.
  objective, params = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model, 0.0, 0.0)

  def at_mean_noise(objective, params, indices):
    return objective.grad(params, indices, objective.zero_noise(indices.shape[0]),
                          validate=False)

  # The gradient at the drawn noise with, as its "expectation", the gradient at the mean
  # noise: wrong for a nonlinear model, so every control variate on it was biased.
  def noisy(objective, params, indices, noise):
    return objective.grad(params, indices, noise, validate=False), at_mean_noise(
        objective, params, indices)

  def exact(objective, params, indices, noise):  # the how-to's: no noise term at all
    g = at_mean_noise(objective, params, indices)
    return g, g

  def two_expectations(objective, params, indices, noise):
    g = at_mean_noise(objective, params, indices)
    return g, jax.tree.map(lambda v: 2.0 * v + 1.0, g)

  biased = dsgrad.Approximation(noisy, at_mean_noise, name="noisy")
  for make in (dsgrad.cv, dsgrad.joint_saga,
               lambda o, a: dsgrad.joint_svrg(o, a, every=40)):
    with pytest.raises(ValueError, match="approximation 'noisy' is not unbiased: over 256 "
                                         "noise draws"):
      make(objective, biased).init(params)
    make(objective, dsgrad.Approximation(exact, at_mean_noise, name="ok")).init(params)
  with pytest.raises(ValueError, match="grad_and_expected returns differs from expected_grad"):
    dsgrad.cv(objective, dsgrad.Approximation(two_expectations, at_mean_noise)).init(params)
