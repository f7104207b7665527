"""The narrow-posterior benchmark's yardstick: its KL from q to the exact posterior of a
Bayesian linear regression, checked at the posterior itself and against a Monte Carlo
estimate, for both families' params as dsgrad lays them out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from benchmarks import narrow_posterior


@pytest.fixture(scope="module")
def data():
  return narrow_posterior.problem(500, 4)


def test_the_exact_posterior_solves_the_regression(data):
  x, y = data["x"].astype(np.float64), data["y"].astype(np.float64)
  # The gradient of the log posterior, on the data the objective reads, vanishes at its mean.
  np.testing.assert_allclose(x.T @ (y - x @ data["mean"]) - data["mean"], 0, atol=1e-9)
  # The two correlated columns make the posterior's covariance far from diagonal.
  cov = np.linalg.inv(data["precision"])
  assert abs(cov[0, 1]) / np.sqrt(cov[0, 0] * cov[1, 1]) > 0.8


def test_kl_is_zero_at_the_posterior_and_its_parts_say_what_misses(data):
  cov = np.linalg.inv(data["precision"])
  exact = dsgrad.families.FullRankGaussian.params_from_cholesky(
      jnp.asarray(data["mean"], jnp.float32), jnp.asarray(np.linalg.cholesky(cov), jnp.float32))
  mean_part, cov_part = narrow_posterior.kl_to_posterior(exact, data)
  assert abs(mean_part) < 1e-3 and abs(cov_part) < 1e-3
  shifted = dict(exact, loc=exact["loc"] + 0.05)  # about a posterior sd: sqrt(1 / 500)
  mean_part, cov_part = narrow_posterior.kl_to_posterior(shifted, data)
  assert mean_part > 1.0 and abs(cov_part) < 1e-3


@pytest.mark.parametrize("family", narrow_posterior.FAMILIES)
def test_kl_matches_monte_carlo_from_draws_of_q(data, family):
  """``E_q[log q(z) - log p(z | data)]`` from 20,000 draws made by dsgrad's own family
  (its transform of standard normal noise), within four standard errors of the closed
  form; their covariance is the one the KL is computed from."""
  dim = data["x"].shape[1]
  rng = np.random.default_rng(1)
  # Near the posterior (scales of about 0.05, as its own), none of its entries exact.
  params = {k: jnp.asarray(np.asarray(v) + 0.05 * rng.standard_normal(np.shape(v)), jnp.float32)
            for k, v in dsgrad.families.by_name(family, dim).params().items()}
  scale = "log_scale" if family == "meanfield" else "log_diag"
  params[scale] = params[scale] - 3.0
  params["loc"] = jnp.asarray(data["mean"] + 0.02 * rng.standard_normal(dim), jnp.float32)
  transform = dsgrad.families.by_name(family, dim).transform
  noise = jax.random.normal(jax.random.key(2), (20_000, dim))
  draws = np.asarray(jax.vmap(lambda eps: transform(params, eps))(noise), np.float64)
  cov = narrow_posterior.covariance(params)
  # The draws' covariance: within a few of its sampling errors of cov (about 1% here).
  np.testing.assert_allclose(np.cov(draws.T), cov, rtol=0.05, atol=0.05 * np.diag(cov).max())
  log_q = _gaussian_log_density(draws, np.asarray(params["loc"], np.float64), cov)
  log_p = _gaussian_log_density(draws, data["mean"], np.linalg.inv(data["precision"]))
  estimate = log_q - log_p
  closed = sum(narrow_posterior.kl_to_posterior(params, data))
  assert abs(estimate.mean() - closed) < 4 * estimate.std() / np.sqrt(len(estimate)) + 1e-6


def _gaussian_log_density(z, mean, cov):
  gap = z - mean
  solved = np.linalg.solve(cov, gap.T).T
  return -0.5 * (np.sum(gap * solved, 1) + np.linalg.slogdet(cov)[1]
                 + len(mean) * np.log(2 * np.pi))


def test_the_mean_field_floor_is_the_kl_of_the_best_mean_field_q(data):
  """The best mean-field q has the posterior's mean and the precision's diagonal as its
  precisions; any other scale is further away."""
  best = {"loc": jnp.asarray(data["mean"], jnp.float32),
          "log_scale": jnp.asarray(-0.5 * np.log(np.diag(data["precision"])), jnp.float32)}
  floor = narrow_posterior.family_floor(data, "meanfield")
  assert sum(narrow_posterior.kl_to_posterior(best, data)) == pytest.approx(floor, abs=1e-3)
  assert floor > 0.5  # the correlated pair: -log(1 - 0.9^2) / 2 = 0.83 at many rows
  for shift in (-0.1, 0.1):
    worse = dict(best, log_scale=best["log_scale"] + shift)
    assert sum(narrow_posterior.kl_to_posterior(worse, data)) > floor + 1e-3
  assert narrow_posterior.family_floor(data, "fullrank") == 0.0
