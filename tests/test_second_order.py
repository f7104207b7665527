"""The second-order Taylor approximations (paper App. F, Eq. 65-67) on every Gaussian
parameter: exact expectations, exactness on quadratic models, agreement between the
generic and the compact-table GLM versions, and a scale-gradient variance below the
first-order approximation's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad.families import FullRankGaussian
from dsgrad.models import Model
from conftest import assert_drawn_mean_is_expected

Z = 4.5  # standard errors; Bonferroni-safe for the ~20 coordinates compared at once


def _linear_regression(n=40, d=4, noise_sd=0.7):
  """``y ~ N(x . z, s^2)``, ``z ~ N(0, I)``: every ``k_n`` is exactly quadratic."""
  kx, kz, ky = jax.random.split(jax.random.key(11), 3)
  x = jax.random.normal(kx, (n, d))
  y = x @ jax.random.normal(kz, (d,)) + noise_sd * jax.random.normal(ky, (n,))

  def log_prior(z):
    return -0.5 * jnp.sum(z ** 2) - 0.5 * d * jnp.log(2 * jnp.pi)

  def log_likelihood(z, indices):
    r = y[indices] - x[indices] @ z
    return -0.5 * (r / noise_sd) ** 2 - jnp.log(noise_sd) - 0.5 * jnp.log(2 * jnp.pi)

  def negative_elbo(loc, cov, entropy):
    """Closed form: E_q of the quadratic log joint, independent of dsgrad."""
    expected_sq = (y - x @ loc) ** 2 + jnp.einsum("nd,de,ne->n", x, cov, x)
    exp_loglik = -0.5 * expected_sq / noise_sd ** 2 - jnp.log(noise_sd) - 0.5 * jnp.log(2 * jnp.pi)
    exp_logprior = -0.5 * (loc @ loc + jnp.trace(cov)) - 0.5 * d * jnp.log(2 * jnp.pi)
    return -jnp.sum(exp_loglik) - exp_logprior - entropy

  return Model(log_prior, log_likelihood, n, d, "linear_regression"), negative_elbo


def _perturbed(params, key, scale=0.3):
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(tree, [l + scale * jax.random.normal(k, l.shape)
                                   for l, k in zip(leaves, keys)])


def _families(d):
  return {"meanfield": (dsgrad.families.MeanFieldGaussian, dsgrad.families.MeanFieldGaussian(d)),
          "fullrank": (FullRankGaussian, FullRankGaussian(d))}


@pytest.mark.parametrize("family_name", ["meanfield", "fullrank"])
def test_expectation_is_the_closed_form_elbo_gradient_on_a_quadratic_model(family_name):
  model, negative_elbo = _linear_regression()
  cls, family = _families(model.latent_dim)[family_name]
  params = _perturbed(family.params(), jax.random.key(1))
  objective = family.objective(model)

  def exact(p):
    chol = (jnp.diag(jnp.exp(p["log_scale"])) if family_name == "meanfield"
            else cls.cholesky(p))
    return negative_elbo(p["loc"], chol @ chol.T, cls.entropy_at(p))

  approx = dsgrad.approx.gaussian_taylor(model)
  indices = jnp.array([0, 3, 3, 17, 39], jnp.int32)

  @jax.jit  # one program: run eagerly, every operation compiled one of its own
  def gradients(params):
    expected = approx.expected_grad(objective, params,
                                    jnp.arange(model.num_data, dtype=jnp.int32))
    drawn = {}  # on a quadratic model f~ = f: the drawn gradient is the objective's own
    for shared in (True, False):
      obj = family.objective(model, shared_noise=shared)
      noise = obj.sample_noise(jax.random.key(2), indices.shape[0])
      drawn[shared] = approx.grad_and_expected(obj, params, indices, noise)[0], obj.grad(
          params, indices, noise)
    return expected, jax.grad(exact)(params), drawn

  expected, reference, drawn = gradients(params)
  for key in reference:
    np.testing.assert_allclose(expected[key], reference[key], rtol=2e-4, atol=2e-4,
                               err_msg=f"{family_name} {key}")
  for shared, (estimate, true) in drawn.items():
    for key in true:
      np.testing.assert_allclose(estimate[key], true[key], rtol=2e-4, atol=2e-4,
                                 err_msg=f"{family_name} shared={shared} {key}")


@pytest.mark.parametrize("case", ["meanfield-shared", "meanfield-per-datum", "fullrank",
                                  "meanfield-glm-compact", "meanfield-no-prior-diag"])
def test_expectation_is_the_monte_carlo_mean_of_the_drawn_gradient(logreg_model, case):
  """On logistic regression (not quadratic) E grad f~ equals the mean of grad f~ over
  many noise draws, within Z standard errors, for every parameter including scales."""
  d = logreg_model.latent_dim
  model = logreg_model
  # A wide q (standard deviations near 0.6), where the second-order term is large.
  if case == "fullrank":
    family = FullRankGaussian(d, log_scale=0.0)
    objective = family.objective(model)
  else:
    family = dsgrad.families.MeanFieldGaussian(d, log_scale=0.0)
    objective = family.objective(model, shared_noise=case != "meanfield-per-datum")
  if case == "meanfield-no-prior-diag":  # the Hessian-vector-product fallback
    model = model._replace(log_prior_hessian_diag=None)
  approx = (dsgrad.approx.glm_taylor(model) if case == "meanfield-glm-compact"
            else dsgrad.approx.gaussian_taylor(model))
  params = _perturbed(family.params(), jax.random.key(3), 0.2)
  params = {**params, **({"log_scale": params["log_scale"] - 0.5} if "log_scale" in params else {})}
  indices = jnp.array([1, 4, 7, 7, 30], jnp.int32)

  @jax.jit
  def draw(key):
    return approx.grad_and_expected(objective, params, indices,
                                    objective.sample_noise(key, indices.shape[0]))

  expected = assert_drawn_mean_is_expected(draw, jax.random.key(4), case, z_max=Z)
  # The scale expectation is not the first-order one (the second-order term is there).
  scale_key = "log_scale" if "log_scale" in params else "log_diag"
  first = dsgrad.approx.linearize().expected_grad(objective, params, indices)
  assert np.max(np.abs(np.asarray(expected[scale_key]) - first[scale_key])) > 1.0


@pytest.mark.parametrize("shared", [True, False])
def test_glm_compact_version_equals_the_generic_one_at_the_current_params(logreg_model, shared):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared)
  params = _perturbed(dsgrad.meanfield_init(logreg_model, 0.0, -1.0), jax.random.key(5))
  indices = jnp.array([0, 2, 2, 9, 44], jnp.int32)
  noise = objective.sample_noise(jax.random.key(6), 5)
  generic = dsgrad.approx.gaussian_taylor(logreg_model)
  compact = dsgrad.approx.glm_taylor(logreg_model)
  for a, b in zip(generic.grad_and_expected(objective, params, indices, noise),
                  compact.grad_and_expected(objective, params, indices, noise)):
    for key in a:
      np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-4)
  # ... and equals gaussian_mean_taylor on loc (same quadratic model of k_n).
  app_f = dsgrad.approx.gaussian_mean_taylor(logreg_model)
  g2, e2 = generic.grad_and_expected(objective, params, indices, noise)
  g1, e1 = app_f.grad_and_expected(objective, params, indices, noise)
  np.testing.assert_allclose(g2["loc"], g1["loc"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(e2["loc"], e1["loc"], rtol=1e-5, atol=1e-5)


def test_scale_gradient_variance_falls_below_the_first_order_approximation(logreg_model):
  """cv's log_scale variance with the second-order term is far below linearize()'s,
  which lacks the eps^2 part of the scale gradient."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  params = _perturbed(dsgrad.meanfield_init(logreg_model, 0.0, -1.0), jax.random.key(7))
  variances = {}
  for name, approx in [("first", dsgrad.approx.linearize()),
                       ("second", dsgrad.approx.glm_taylor(logreg_model))]:
    tx = dsgrad.cv(objective, approx)
    samples = np.asarray(dsgrad.estimator_samples(tx, tx.init(params), params, objective,
                                                  jax.random.key(8), 4000, 5))
    variances[name] = samples[:, logreg_model.latent_dim:].var(0).sum()  # log_scale block
  assert variances["second"] < 0.5 * variances["first"], variances


def test_bad_input_is_refused_by_name(logreg_model):
  _, negative_elbo = _linear_regression()
  del negative_elbo
  with pytest.raises(ValueError, match="linear predictor"):
    dsgrad.approx.glm_taylor(dsgrad.models.ppca(np.zeros((10, 3), np.float32), 2))
  objective = dsgrad.meanfield_gaussian(logreg_model)
  idx = jnp.arange(5, dtype=jnp.int32)
  with pytest.raises(ValueError, match="Gaussian params"):
    dsgrad.approx.gaussian_taylor(logreg_model).expected_grad(
        objective, {"mean": jnp.zeros(5)}, idx)
  with pytest.raises(ValueError, match="params\\['loc'\\] has shape"):
    dsgrad.approx.glm_taylor(logreg_model).expected_grad(
        objective, {"loc": jnp.zeros(4), "log_scale": jnp.zeros(4)}, idx)
