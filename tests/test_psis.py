"""PSIS k-hat: arviz-stats' smoothing behind dsgrad's sign convention and checks,
cross-tested against BlackJAX's implementation on the same draws, and its verdict on
an exact and on a too-light-tailed approximation."""

import sys

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.training import compile_cache


@pytest.mark.parametrize("tail", ["normal", "student-t 1.5", "lognormal"])
def test_matches_blackjax_psis_weights(tail):
  key = jax.random.key(3)
  draws = {"normal": jax.random.normal(key, (2000,)),
           "student-t 1.5": jax.random.t(key, 1.5, (2000,)),
           "lognormal": jnp.exp(jax.random.normal(key, (2000,)))}[tail]
  log_weights, k = dsgrad.psis_log_weights(draws)
  reference_weights, reference_k = blackjax.diagnostics.psis_weights(draws)
  # BlackJAX fits the tail in float32, arviz-stats in float64: they agree to float32's
  # few digits (on the Student-t tail the largest weight, 0.99, differs by 1.3e-6).
  assert float(k) == pytest.approx(float(reference_k), abs=1e-4)
  np.testing.assert_allclose(np.exp(log_weights), np.exp(reference_weights), rtol=1e-3,
                             atol=1e-6)
  assert float(jnp.sum(jnp.exp(log_weights))) == pytest.approx(1.0, abs=1e-5)
  assert float(jax.jit(dsgrad.pareto_k)(draws)) == pytest.approx(float(k), rel=1e-4)
  batched = jax.vmap(dsgrad.pareto_k)(jnp.stack([draws, -draws]))  # a host callback
  assert float(batched[0]) == pytest.approx(float(k), rel=1e-4)


def test_log_ratio_sign_convention():
  # Ratios log p - log q with a heavy right tail (q misses mass) give a large k-hat;
  # their negation (ArviZ's argument) has a light right tail.
  cauchy = jax.random.cauchy(jax.random.key(0), (2000,))
  right_heavy = jnp.log(jnp.abs(cauchy))  # ratios with a Cauchy tail: k = 1
  assert float(dsgrad.pareto_k(right_heavy)) > 0.7
  # The same draws as ArviZ's argument (the negative log ratio) have an exponential
  # right tail at most: |cauchy| is bounded below by 0, its log's negation above by ...
  light = -jnp.log1p(jnp.abs(cauchy))
  assert float(dsgrad.pareto_k(light)) < 0.5


@pytest.mark.parametrize("num_draws", [100, 1000])
@pytest.mark.parametrize("shape", [0.0, 0.3])
def test_k_hat_scatters_as_its_stated_scatter_says(num_draws, shape):
  """k-hat from 300 independent sets of draws, of a normal tail (k = 0) or a generalized
  Pareto one: their spread is the scatter diagnose states, within 15% (three standard
  errors of a spread of 300 values, 12%, and the formula's asymptotics)."""
  rng = np.random.default_rng(int(10 * shape) + num_draws)

  def draws():
    if shape == 0.0:
      return 0.2 * rng.normal(size=num_draws)
    return np.log1p(((1 - rng.random(num_draws)) ** -shape - 1))

  k_hats = np.array([float(dsgrad.pareto_k(draws())) for _ in range(300)])
  stated = dsgrad.psis.k_hat_scatter(k_hats.mean(), num_draws)
  assert k_hats.std(ddof=1) == pytest.approx(stated, rel=0.15)


def test_a_k_hat_within_its_scatter_of_the_good_range_is_called_uncertain():
  # From 100 draws a fit with log ratios spread by 0.15 nats gave k-hat 0.78 ("do not
  # trust"), where 20 other sets of draws gave -0.11 to 0.65.
  few = dsgrad.psis.diagnose(0.78, 100)
  assert "too few draws to tell" in few and "+- 0.2" in few and "(100 draws)" in few
  assert "do not trust" in dsgrad.psis.diagnose(0.78, 10_000)
  assert "do not trust" in dsgrad.psis.diagnose(1.3, 100)  # beyond two scatters
  assert "do not trust" in dsgrad.psis.diagnose(0.78)  # draws unknown: as before
  assert "close to the posterior" in dsgrad.psis.diagnose(0.3, 100)


def test_ratios_spanning_thousands_of_nats_give_infinite_k_not_nan():
  # arviz-stats fits the tail in float64: at 300 nats k-hat is large and finite; at
  # 1,900 nats its threshold underflows exp and it returned NaN weights and k = 0.05.
  wide = jnp.concatenate([jnp.zeros(900), jnp.linspace(100.0, 400.0, 100)])
  assert 10 < float(dsgrad.pareto_k(wide)) < float("inf")
  ratios = jnp.concatenate([jnp.zeros(900), jnp.linspace(100.0, 2000.0, 100)])
  log_weights, k = dsgrad.psis_log_weights(ratios)
  assert float(k) == float("inf")
  assert float(jnp.sum(jnp.exp(log_weights))) == pytest.approx(1.0, abs=1e-5)
  assert "do not trust" in dsgrad.psis.diagnose(float(k))


def test_equal_ratios_have_no_tail_and_uniform_weights():
  log_weights, k = dsgrad.psis_log_weights(jnp.full(100, 3.0))
  assert float(k) == 0.0
  np.testing.assert_allclose(np.exp(log_weights), 0.01, rtol=1e-6)


def test_without_arviz_stats_psis_names_the_extra_and_fit_says_why(monkeypatch):
  monkeypatch.setitem(sys.modules, "arviz_stats", None)
  monkeypatch.setitem(sys.modules, "arviz_stats.base", None)
  with pytest.raises(ImportError, match=r"dsgrad\[diagnostics\]"):
    dsgrad.pareto_k(jnp.zeros(100))
  model, posterior, _, _ = _conjugate_gaussian()
  result = dsgrad.fit(dsgrad.meanfield_gaussian(model), optax.adam(1e-3), posterior,
                      jax.random.key(0), num_steps=2, batch_size=40, elbo_samples=30,
                      progress=False)
  assert result.pareto_k is None and "arviz-stats" in result.diagnosis
  assert np.isfinite(result.history.elbo[-1])


def test_too_few_draws_is_refused():
  with pytest.raises(ValueError, match="at least 25 draws"):
    dsgrad.pareto_k(jnp.zeros(10))


def test_nan_or_infinite_ratios_are_refused_and_minus_infinity_weighs_zero():
  # Before, NaN and +inf ratios gave k-hat NaN and weights of NaN, silently.
  ratios = jax.random.normal(jax.random.key(0), (400,))
  for bad in (jnp.nan, jnp.inf):
    with pytest.raises(ValueError, match="log_ratios must be finite or -inf"):
      dsgrad.psis_log_weights(ratios.at[7].set(bad))
  with pytest.raises(ValueError, match="with one finite"):
    dsgrad.pareto_k(jnp.full(100, -jnp.inf))
  # A draw of weight zero leaves the others' normalised weights as without it.
  weights, k = dsgrad.psis_log_weights(ratios.at[7].set(-jnp.inf))
  assert float(jnp.exp(weights[7])) == 0.0 and np.isfinite(float(k))
  np.testing.assert_allclose(float(jax.nn.logsumexp(weights)), 0.0, atol=1e-5)


def _conjugate_gaussian():
  """z ~ N(0, I_2), x_n ~ N(z, 0.5^2 I): the posterior is Gaussian with diagonal
  covariance, so a mean-field Gaussian can equal it exactly."""
  x = np.asarray(jax.random.normal(jax.random.key(1), (40, 2)) + 1.0, np.float32)
  sigma = 0.5

  def log_prior(z):
    return -0.5 * jnp.sum(z ** 2) - jnp.log(2 * jnp.pi)

  def log_lik(z, batch):
    return (-0.5 * jnp.sum((batch - z) ** 2, -1) / sigma ** 2
            - 2 * jnp.log(sigma) - jnp.log(2 * jnp.pi))

  model = dsgrad.model_from_logdensity(log_prior, log_lik, x, 2)
  precision = 1.0 + x.shape[0] / sigma ** 2
  posterior = {"loc": jnp.asarray(x.sum(0) / sigma ** 2 / precision),
               "log_scale": jnp.full(2, -0.5 * np.log(precision), jnp.float32)}
  return model, posterior, x, sigma


def test_exact_posterior_gives_constant_ratios_and_a_small_k_hat():
  model, posterior, x, sigma = _conjugate_gaussian()
  objective = dsgrad.meanfield_gaussian(model)
  ratios, draws = dsgrad.importance_log_ratios(objective, posterior, jax.random.key(2), 1000)
  # At the exact posterior every ratio is log p(x): the evidence in closed form
  # (x_n = z + noise, jointly Gaussian: per coordinate a covariance I s^2 + 11^T).
  n = x.shape[0]
  cov = sigma ** 2 * np.eye(n) + np.ones((n, n))
  sign, logdet = np.linalg.slogdet(cov)
  evidence = sum(-0.5 * x[:, j] @ np.linalg.solve(cov, x[:, j]) - 0.5 * logdet
                 - 0.5 * n * np.log(2 * np.pi) for j in range(2))
  np.testing.assert_allclose(ratios, evidence, rtol=1e-4)
  assert float(dsgrad.pareto_k(ratios)) < 0.5
  # There the ELBO is the evidence, and dsgrad.elbo, with log q as its control variate,
  # reports it with no Monte Carlo error left (float32 rounding only), where the draws
  # alone (their mean within four of their standard errors of it) spread.
  value, se = dsgrad.elbo(objective, posterior, jax.random.key(2), 1000)
  plain_se = draws.std(ddof=1) / np.sqrt(draws.size)
  assert value == pytest.approx(evidence, rel=1e-5)
  assert se < 1e-2 * plain_se, (se, plain_se)
  assert abs(draws.mean() - value) < 4 * plain_se


def test_a_last_evaluation_of_fewer_draws_runs_on_the_runs_program():
  """fit's last evaluation, cut to fewer draws by a time limit, takes its ratios from the
  first draws of the program the run's evaluations share: the same values, no compile."""
  model, _, _, _ = _conjugate_gaussian()
  objective = dsgrad.meanfield_gaussian(model)
  params, key = dsgrad.meanfield_init(model, 0.5, -1.0), jax.random.key(3)
  ratios, draws = dsgrad.psis.log_ratios_unchecked(objective, params, key, 100)
  programs = compile_cache.size()
  fewer = dsgrad.psis.log_ratios_unchecked(objective, params, key, 37, program_samples=100)
  assert compile_cache.size() == programs, "the cut evaluation compiled a program"
  np.testing.assert_allclose(fewer[0], ratios[:37], rtol=1e-6)
  np.testing.assert_allclose(fewer[1], draws[:37], rtol=1e-6)
  assert len(np.unique(np.round(fewer[0], 6))) == 37  # draws, not a constant


def _cauchy_target(dim=50):
  """One datum with a Cauchy likelihood in each of ``dim`` coordinates and a wide prior:
  a posterior with tails no Gaussian covers. (k-hat grows with the dimension; at 50,
  2000 draws put it above 0.88 on each of three seeds tried, 1.13 on the one used.)"""
  def log_prior(z):
    return jnp.sum(-0.5 * (z / 100.0) ** 2)

  def log_lik(z, batch):
    return -jnp.sum(jnp.log1p((z - batch) ** 2), -1)

  return dsgrad.model_from_logdensity(log_prior, log_lik, np.zeros((1, dim), np.float32), dim)


def test_fit_reports_k_hat_and_warns_on_a_light_tailed_approximation(capsys):
  objective = dsgrad.meanfield_gaussian(_cauchy_target())
  params = dsgrad.meanfield_init(_cauchy_target())
  result = dsgrad.fit(objective, optax.adam(1e-2), params, jax.random.key(0),
                      num_steps=600, batch_size=1, eval_every=300, elbo_samples=2000,
                      progress=True)
  assert result.pareto_k is not None and result.pareto_k > 0.7
  assert "do not trust" in result.diagnosis and "full-rank" in result.diagnosis
  assert "warning: k-hat" in capsys.readouterr().out


def test_a_full_rank_fit_with_a_poor_k_hat_is_not_sent_to_the_full_rank_family():
  family = dsgrad.families.by_name("fullrank", 50)
  objective = family.objective(_cauchy_target())
  result = dsgrad.fit(objective, optax.adam(1e-2), family.params(), jax.random.key(0),
                      num_steps=600, batch_size=1, eval_every=300, elbo_samples=2000,
                      progress=False)
  assert result.pareto_k > 0.7 and "do not trust" in result.diagnosis
  assert "full-rank" not in result.diagnosis and "annealed" in result.diagnosis


def test_fit_reports_a_small_k_hat_near_the_exact_posterior():
  model, posterior, _, _ = _conjugate_gaussian()
  objective = dsgrad.meanfield_gaussian(model)
  result = dsgrad.fit(objective, optax.adam(1e-3), posterior, jax.random.key(0),
                      num_steps=20, batch_size=40, elbo_samples=200, progress=False)
  assert result.pareto_k < 0.5 and "(200 draws)" in result.diagnosis, result.diagnosis


def test_fit_says_why_k_hat_is_missing():
  model, posterior, _, _ = _conjugate_gaussian()
  objective = dsgrad.meanfield_gaussian(model, shared_noise=False)
  result = dsgrad.fit(objective, optax.adam(1e-3), posterior, jax.random.key(0),
                      num_steps=2, batch_size=40, elbo_samples=30, progress=False)
  assert result.pareto_k is None and "one noise per datum" in result.diagnosis
  with pytest.raises(ValueError, match="one noise per datum"):
    dsgrad.importance_log_ratios(objective, posterior, jax.random.key(0), 100)
