"""dsgrad.approx.logistic_probit: the sigmoid's normal scale mixture is accurate, its
Gaussian expectation is the closed form, the drawn term's noise mean equals the stated
expectation for *stale* table statistics (what makes joint SAGA unbiased), and with a
fresh table the loc control variate removes the loc gradient's noise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import dsgrad
from dsgrad.approx import sigmoid_probit_mixture, sigmoid_probit_mixture_gaussian_mean
from conftest import BATCH, assert_drawn_mean_is_expected

Z = 4.5  # standard errors; Bonferroni-safe for the ~10 coordinates compared at once


def test_mixture_is_the_sigmoid_to_within_its_stated_error():
  a = np.linspace(-40.0, 40.0, 160_001)
  mixture = np.asarray(sigmoid_probit_mixture(jnp.asarray(a, jnp.float32)), np.float64)
  # 6.83e-07 in float64 (docs/scripts/probit_mixture_fit.py); float32 adds rounding.
  assert np.max(np.abs(mixture - special.expit(a))) < 1e-6
  np.testing.assert_allclose(mixture + mixture[::-1], 1.0, atol=2e-7)  # symmetric


@pytest.mark.parametrize("mean,sd", [(0.0, 1.0), (2.5, 0.3), (-1.7, 4.0), (6.0, 10.0)])
def test_gaussian_mean_is_the_quadrature_of_the_mixture(mean, sd):
  """Closed form vs adaptive quadrature (scipy, float64) of the mixture itself."""
  from scipy import integrate, stats
  from dsgrad.approx.glm import PROBIT_SLOPES, PROBIT_WEIGHTS
  mixture = lambda a: float(np.sum(np.asarray(PROBIT_WEIGHTS)
                                   * stats.norm.cdf(a * np.asarray(PROBIT_SLOPES))))
  quadrature = integrate.quad(lambda xi: mixture(mean + sd * xi) * stats.norm.pdf(xi),
                              -12, 12, points=[-mean / sd], limit=200, epsabs=1e-10)[0]
  closed = float(sigmoid_probit_mixture_gaussian_mean(jnp.float32(mean), jnp.float32(sd)))
  assert abs(closed - quadrature) < 2e-6


@pytest.mark.parametrize("shared_noise", [True, False])
def test_drawn_term_has_the_stated_expectation_for_stale_statistics(logreg_model, params0,
                                                                   shared_noise):
  """The table holds (logit, sd) from *earlier* params; the drawn term uses the current
  noise and scale. Its Monte Carlo mean must equal ``datum_terms``' expectation, or joint
  SAGA would be biased."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  fns = dsgrad.approx.logistic_probit(logreg_model).statistics
  stale = {"loc": params0["loc"] + 0.4, "log_scale": params0["log_scale"] + 0.7}
  indices = jnp.array([1, 4, 7, 7, 30], jnp.int32)
  rows = objective.rows(indices)
  stats = fns.statistics(stale, rows)
  weights = jnp.full((5,), 0.2)

  @jax.jit
  def draw(key):
    noise = objective.sample_noise(key, 5)
    return fns.datum_terms(objective, params0, stats, rows, noise, weights)

  expected = assert_drawn_mean_is_expected(draw, jax.random.key(5), "logistic_probit",
                                           z_max=Z)
  # The expectation held in the running mean depends on the stored statistics only.
  held = fns.expectation(params0, fns.datum_expected(objective, params0, stats, rows,
                                                     weights))
  np.testing.assert_allclose(held["loc"], expected["loc"], rtol=1e-5, atol=1e-4)


def test_fresh_table_removes_the_loc_gradients_noise(logreg_model, params0):
  """With every row at the current params, the probit's loc control variate equals the
  true loc gradient up to the mixture's error, whatever the posterior's width; the
  second-order Taylor one (glm_taylor) leaves third and higher orders."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  wide = {**params0, "log_scale": params0["log_scale"] + 1.0}
  d = params0["loc"].shape[0]
  loc_variance = {}
  for name in ("glm_taylor", "logistic_probit"):
    tx = dsgrad.joint_saga(objective, getattr(dsgrad.approx, name)(logreg_model))
    samples = dsgrad.estimator_samples(tx, tx.init(wide), wide, objective,
                                       jax.random.key(6), 2000, BATCH)
    loc_variance[name] = float(np.sum(np.var(np.asarray(samples)[:, :d], 0)))
  assert loc_variance["logistic_probit"] < 1e-4 * loc_variance["glm_taylor"], loc_variance


def test_non_logistic_models_are_refused(logreg_data):
  x, y = logreg_data
  softmax = dsgrad.models.softmax_regression(x, np.asarray(y, np.int32), 2)
  with pytest.raises(ValueError, match="logistic_probit needs a binary logistic regression"):
    dsgrad.approx.logistic_probit(softmax)
