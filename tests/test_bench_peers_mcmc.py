"""The MCMC peer benchmark treats the mass matrix the same for every sampler, its NumPyro
and BlackJAX samplers target dsgrad's posterior, and a smoke run of every sampler
completes with a table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsgrad import mcmc
from benchmarks import peers_mcmc


@pytest.fixture(scope="module")
def problem():
  return peers_mcmc.make_problem(2000, 3, 100, 10)


# Slow, as the benchmark's other fairness checks: they guard a published comparison and
# run with -m slow before the benchmark is rerun (the module's problem compiles once).
@pytest.mark.slow
def test_numpyro_model_is_the_dsgrad_model(problem):
  from numpyro.infer.util import log_density
  theta = problem.theta_star + 0.1
  model = peers_mcmc.numpyro_model(problem.model.num_data, None)
  theirs, _ = log_density(model, (problem.x, problem.y), {}, {"theta": theta})
  everyone = jnp.arange(problem.model.num_data)
  ours = problem.model.log_prior(theta) + jnp.sum(problem.model.log_likelihood_at(theta, everyone))
  np.testing.assert_allclose(theirs, ours, rtol=1e-5)


# Slow, as the benchmark's other fairness checks: they guard a published comparison and
# run with -m slow before the benchmark is rerun (the module's problem compiles once).
@pytest.mark.slow
def test_laplace_setting_hands_both_libraries_the_same_mass_matrix(problem):
  # (NumPyro's HMCECS chains under this setting run in the smoke run below.)
  kernel = peers_mcmc.numpyro_kernel(problem, "hmc", "laplace")
  from numpyro.infer import MCMC
  runner = MCMC(kernel, num_warmup=30, num_samples=1, progress_bar=False)
  runner.warmup(jax.random.key(1), problem.x, problem.y)
  numpyro_inverse = runner.post_warmup_state.adapt_state.inverse_mass_matrix[("theta",)]
  ours = mcmc.sample(jax.random.key(2), problem.model, num_samples=2, num_warmup=30,
                     subsample_size=100, num_blocks=10, reference_point=problem.theta_star,
                     reference_updates_every=0, mass_matrix=problem.precision, progress=False)
  want = np.linalg.inv(problem.precision)
  np.testing.assert_allclose(numpyro_inverse, want, rtol=2e-3, atol=1e-6)
  np.testing.assert_allclose(ours.parameters.inverse_mass_matrix, want, rtol=2e-3, atol=1e-6)


# Slow, as the benchmark's other fairness checks: they guard a published comparison and
# run with -m slow before the benchmark is rerun (the module's problem compiles once).
@pytest.mark.slow
@pytest.mark.parametrize("library", ["dsgrad", "blackjax"])
def test_sgld_steps_drift_by_the_same_amount(problem, library):
  """BlackJAX's SGLD step ``h`` is dsgrad's ``epsilon / 2``: from a point two posterior
  sd off the mode, one step of either moves, on average over keys, by ``(epsilon / 2)
  grad log p`` (a wrong conversion would be off by a factor of 2)."""
  s = peers_mcmc.sg_settings(problem)
  step, _ = peers_mcmc.sg_step(problem, s, library, "sgld")
  sd = np.sqrt(np.diag(np.linalg.inv(problem.precision)))
  theta = problem.theta_star + 2 * jnp.asarray(sd, jnp.float32)
  everyone = jnp.arange(problem.model.num_data)
  grad = jax.grad(lambda t: problem.model.log_prior(t)
                  + jnp.sum(problem.model.log_likelihood_at(t, everyone)))(theta)
  want = 0.5 * s["sgld_eps"] * np.asarray(grad, np.float64)
  moves = np.asarray(jax.jit(jax.vmap(lambda k: step(k, theta)))(
      jax.random.split(jax.random.key(3), 40_000)), np.float64) - np.asarray(theta)
  se = moves.std(0) / np.sqrt(moves.shape[0])
  assert np.all(np.abs(moves.mean(0) - want) < 4 * se), (moves.mean(0), want, se)
  assert np.all(np.abs(want) > 10 * se)  # the drift is resolved: the check has teeth


@pytest.mark.slow  # about two minutes: every sampler compiles for both settings
def test_smoke_run_writes_every_sampler(capsys):
  code = peers_mcmc.main(["--num-data", "2000", "--dim", "3", "--subsample-size", "100",
                          "--num-blocks", "10", "--chains", "2", "--seeds", "1",
                          "--num-warmup", "40", "--num-samples", "40",
                          "--reference-samples", "100", "--no-write"])
  assert code == 0
  out = capsys.readouterr().out
  for name in [*peers_mcmc.METHODS, *peers_mcmc.SG_METHODS]:
    assert out.count(f"| {name} |") == (2 if name in peers_mcmc.METHODS else 1), name
  assert "Setting `adapt`" in out and "Setting `laplace`" in out
  assert "dsgrad HMC-ECS perturbed / NumPyro HMCECS" in out
  assert "Reading (written by the benchmark" in out


def test_reported_ess_and_rhat_match_chains_of_known_autocorrelation():
  """Ground truth for the table's ESS and R-hat columns: four AR(1) chains with
  coefficient rho have ESS = n (1 - rho) / (1 + rho) and R-hat 1; shifting one chain's
  mean by one standard deviation makes R-hat clearly larger than 1."""
  rho, chains, draws = 0.5, 4, 5000
  rng = np.random.default_rng(0)
  x = np.zeros((chains, draws, 2))
  x[:, 0] = rng.normal(size=(chains, 2))
  for t in range(1, draws):  # stationary AR(1) with unit variance
    x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho ** 2) * rng.normal(size=(chains, 2))
  row = peers_mcmc.summarize(peers_mcmc.Chains(x, None, 1.0, 0.0, 1.0, ""), np.zeros(2),
                             np.ones(2))
  expected = chains * draws * (1 - rho) / (1 + rho)  # 6,667
  # The ESS estimate's relative spread at this length is a few percent; min over 2 dims.
  assert 0.85 * expected < row["ess"] < 1.1 * expected, (row["ess"], expected)
  assert row["rhat"] < 1.01, row["rhat"]
  assert row["mean_err"] < 0.1 and 0.9 < row["sd_lo"] <= row["sd_hi"] < 1.1, row
  shifted = x.copy()
  shifted[0] += 1.0
  row = peers_mcmc.summarize(peers_mcmc.Chains(shifted, None, 1.0, 0.0, 1.0, ""),
                             np.zeros(2), np.ones(2))
  assert row["rhat"] > 1.05, row["rhat"]
