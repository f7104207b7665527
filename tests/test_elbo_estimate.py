"""Ground truth for the ELBO dsgrad reports (`dsgrad.elbo`, the ELBO column of `fit`):
the estimate agrees with Gauss-Hermite quadrature of the exact ELBO, and its standard
error is the spread that repeated estimates really have."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from conftest import exact_negative_elbo



@pytest.mark.parametrize("num_draws", [10, 20])
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_the_control_variate_standard_error_is_the_spread_of_repeated_estimates(num_draws,
                                                                                shift):
  """A mean-field Gaussian's ELBO draws on a Bayesian linear regression, at its optimum's
  scales and its mean (or half a standard deviation off it), with log q + H beside them:
  over 4,000 repetitions the root mean square of the reported standard errors is the
  estimates' spread within 6% (each has an error of about 1.2%; the sandwich estimator
  comes out a few percent low at 10 draws): 0.955-0.973 of it at 10 draws, 0.991-0.995 at
  20. The residuals' plain spread (ddof=2) gave 0.885 at 10 draws and 0.940-0.944 at 20."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(300, 4))
  y = x @ rng.normal(size=4) + 0.7 * rng.normal(size=300)
  precision = x.T @ x / 0.49 + np.eye(4) / 4
  mean, sd = np.linalg.solve(precision, x.T @ y / 0.49), 1 / np.sqrt(np.diag(precision))
  eps = rng.normal(size=(4000, num_draws, 4))
  z = mean + shift * sd + sd * eps
  draws = (-0.5 * np.sum((y - z @ x.T) ** 2, -1) / 0.49 - 0.5 * np.sum(z ** 2, -1) / 4
           + np.sum(np.log(sd)))  # up to a constant
  offsets = -0.5 * np.sum(eps ** 2 - 1, -1)
  results = np.array([dsgrad.diagnostics.control_variate_mean(d, o)
                      for d, o in zip(draws, offsets)])
  ratio = np.sqrt(np.mean(results[:, 1] ** 2)) / results[:, 0].std(ddof=1)
  assert 0.94 < ratio < 1.06, ratio

@pytest.mark.parametrize("shared_noise", [True, False])
def test_elbo_and_its_standard_error_match_quadrature(logreg_model, logreg_data, params0,
                                                       shared_noise):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  exact = -float(exact_negative_elbo(logreg_data)(params0))
  # chunk_size below N: one Monte Carlo sample spans several chunks.
  estimates = [dsgrad.elbo(objective, params0, key, 400, chunk_size=16)
               for key in jax.random.split(jax.random.key(11), 30)]
  means = np.array([m for m, _ in estimates])
  ses = np.array([s for _, s in estimates])
  # Each estimate is within 4.5 of its own standard errors of the truth ...
  assert np.all(np.abs(means - exact) < 4.5 * ses), (means - exact, ses)
  # ... their average within 4 standard errors of the average ...
  assert abs(means.mean() - exact) < 4 * ses.mean() / np.sqrt(len(means))
  # ... and the reported standard error is the spread of repeated estimates: the ratio of
  # their sample SD (29 degrees of freedom) to the mean reported SE lies in the chi-square
  # interval [0.6, 1.4] (probability outside it below 1e-3).
  ratio = means.std(ddof=1) / ses.mean()
  assert 0.6 < ratio < 1.4, ratio


def test_log_q_as_control_variate_shrinks_the_error_near_the_optimum_and_stays_calibrated(
    logreg_model, logreg_data):
  """At the mean-field optimum (found on the quadrature ELBO itself), estimates with log q
  as control variate agree with quadrature, their standard error is the spread repeated
  estimates have, and it is well below that of the draws' plain mean."""
  exact_loss = jax.jit(jax.value_and_grad(exact_negative_elbo(logreg_data)))
  params = {"loc": jnp.zeros(logreg_data[0].shape[1]),
            "log_scale": jnp.full(logreg_data[0].shape[1], -1.0)}
  optimizer = optax.adam(3e-2)
  state = optimizer.init(params)
  for _ in range(600):
    _, grad = exact_loss(params)
    updates, state = optimizer.update(grad, state)
    params = optax.apply_updates(params, updates)
  exact = -float(exact_loss(params)[0])
  objective = dsgrad.meanfield_gaussian(logreg_model)
  keys = jax.random.split(jax.random.key(13), 30)
  estimates = np.array([dsgrad.elbo(objective, params, key, 200) for key in keys])
  means, ses = estimates[:, 0], estimates[:, 1]
  assert abs(means.mean() - exact) < 4 * ses.mean() / np.sqrt(len(means))
  ratio = means.std(ddof=1) / ses.mean()
  assert 0.6 < ratio < 1.4, ratio
  plain = [dsgrad.diagnostics.mean_and_standard_error(
      dsgrad.diagnostics.elbo_draws(objective, 200)(params, key))[1] for key in keys[:5]]
  assert ses.mean() < 0.7 * np.mean(plain), (ses.mean(), np.mean(plain))


def test_the_control_variate_estimate_is_the_regression_estimator():
  """Against the regression fitted by NumPy: the corrected mean is the intercept, and its
  standard error the intercept's by the HC2 sandwich (leverage-weighted squared
  residuals); too few draws, or offsets without spread, give the plain mean."""
  rng = np.random.default_rng(0)
  offsets = rng.normal(size=50)
  draws = 3.0 + 2.0 * offsets + 0.1 * rng.normal(size=50)
  value, se = dsgrad.diagnostics.control_variate_mean(draws, offsets)
  design = np.stack([np.ones(50), offsets], 1)
  inverse = np.linalg.inv(design.T @ design)
  residual = draws - design @ (inverse @ design.T @ draws)
  leverage = np.einsum("ij,jk,ik->i", design, inverse, design)
  sandwich = inverse @ (design.T * residual ** 2 / (1 - leverage)) @ design @ inverse
  assert value == pytest.approx(np.polyfit(offsets, draws, 1)[1], rel=1e-12)
  assert se == pytest.approx(np.sqrt(sandwich[0, 0]), rel=1e-10)
  plain = dsgrad.diagnostics.mean_and_standard_error
  assert dsgrad.diagnostics.control_variate_mean(draws[:9], offsets[:9]) == plain(draws[:9])
  assert dsgrad.diagnostics.control_variate_mean(draws, 0 * offsets) == plain(draws)


@pytest.mark.parametrize("shared_noise", [True, False])
def test_elbo_on_sampled_data_is_unbiased_with_the_subsampling_in_its_standard_error(
    logreg_model, logreg_data, params0, shared_noise):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  exact = -float(exact_negative_elbo(logreg_data)(params0))
  rows = objective.num_data // 4  # each draw reads a quarter of the data, two chunks
  estimates = [dsgrad.elbo(objective, params0, key, 200, chunk_size=rows // 2,
                           num_data_sampled=rows)
               for key in jax.random.split(jax.random.key(12), 30)]
  means = np.array([m for m, _ in estimates])
  ses = np.array([s for _, s in estimates])
  assert abs(means.mean() - exact) < 4 * ses.mean() / np.sqrt(len(means))
  # The reported standard error holds the subsampling: it is the spread of repeated
  # estimates (chi-square interval as above) and larger than a full pass's.
  ratio = means.std(ddof=1) / ses.mean()
  assert 0.6 < ratio < 1.4, ratio
  _, full_se = dsgrad.elbo(objective, params0, jax.random.key(12), 200)
  assert ses.mean() > 1.2 * full_se, (ses.mean(), full_se)


def test_sampled_elbo_program_reads_the_whole_data_in_a_full_pass(logreg_model, logreg_data,
                                                                   params0):
  # rows >= N: a full pass, the last chunk padded and masked (N is not a multiple of 7).
  objective = dsgrad.meanfield_gaussian(logreg_model)
  assert objective.num_data % 7
  draws = dsgrad.diagnostics.sampled_elbo_draws(objective, 400, 7)(
      params0, jax.random.key(3), objective.num_data)
  mean, se = dsgrad.diagnostics.mean_and_standard_error(draws)
  exact = -float(exact_negative_elbo(logreg_data)(params0))
  assert abs(mean - exact) < 4 * se, (mean, exact, se)
  # The same key draws the same rows and noise: the same parameters give the same draws.
  again = dsgrad.diagnostics.sampled_elbo_draws(objective, 400, 7)(
      params0, jax.random.key(3), objective.num_data + 5)
  np.testing.assert_allclose(draws, again, rtol=1e-6)
  # They are elbo_draws' draws for the key: each chunk read once for a group of draws.
  np.testing.assert_allclose(draws, dsgrad.diagnostics.elbo_draws(objective, 400, 7)(
      params0, jax.random.key(3)), rtol=1e-6)


def test_an_elbo_that_is_not_finite_is_refused_wherever_it_is_estimated():
  """A datum the likelihood deems impossible (log 0) makes the ELBO -inf whatever q is,
  while its gradient stays finite: the estimate, fit's evaluation and recommend's race
  each refuse it, instead of reporting -inf +- nan."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 60, 3)

  def log_lik(z, batch):
    ll = -jnp.logaddexp(0.0, -(2 * batch["y"] - 1) * (batch["x"] @ z["w"]))
    return jnp.where(batch["impossible"] > 0, -jnp.inf, ll)

  data = {"x": x, "y": y, "impossible": (jnp.arange(60) == 7).astype(jnp.float32)}
  latent = {"w": jnp.zeros(3)}
  objective = dsgrad.families.structured(dsgrad.objective_from_logdensity(
      lambda z: jnp.sum(jax.scipy.stats.norm.logpdf(z["w"])), log_lik, data, latent), latent)
  params = dsgrad.families.structured_init(latent)
  # Each names the datum (recommend's race too): the estimate's chunks (of 16 here: the last
  # padded) are searched.
  found = r"At one draw of q, 1 of the 60 data have a term that is not finite; the first is row 7"
  with pytest.raises(dsgrad.diagnostics.NonFiniteELBO, match=r"20 -inf of 20 Monte Carlo.*"
                                                             + found):
    dsgrad.elbo(objective, params, jax.random.key(1), 20, chunk_size=16)
  optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-2))
  with pytest.raises(ValueError, match=r"dsgrad.fit, evaluating after step 12: the ELBO is "
                                       r"not finite.*" + found):
    dsgrad.fit(objective, optimizer, params, jax.random.key(1), num_steps=24, batch_size=6,
               eval_every=12, elbo_samples=8, progress=False)
  with pytest.raises(ValueError, match=r"dsgrad.recommend: the ELBO is not finite.*" + found):
    dsgrad.recommend(objective, optax.adam(1e-2), params, jax.random.key(1), batch_size=6,
                     budget=20.0, share=0.5, race_at=0.05, candidates=("naive", "cv"),
                     progress=False)
  # A log prior outside its support reaches every datum's term (its share of the prior):
  # the message points at the prior, not at row 0.
  outside = dsgrad.families.structured(dsgrad.objective_from_logdensity(
      lambda z: jnp.sum(jnp.log(z["w"])), lambda z, batch: batch["x"] @ z["w"], data, latent),
      latent)
  with pytest.raises(ValueError, match=r"every datum's term is not finite: the log prior"):
    dsgrad.elbo(outside, dsgrad.families.structured_init(latent, {"w": -jnp.ones(3)}),
                jax.random.key(1), 20)
  # A finite ELBO passes the same check.
  draws = dsgrad.diagnostics.finite_elbo_draws(np.array([-1.0, -2.0]), "f")
  assert draws.dtype == np.float64


@pytest.mark.parametrize("at_once", [2 ** 20, 2 ** 10])
def test_draws_in_groups_and_chunks_are_each_draw_on_all_the_data(monkeypatch, at_once):
  """Data on the host are read a chunk at a time for a group of draws at once; with a
  small bound (``2 ** 10``: groups of 3 draws, the last padded, chunks of 3 rows) each
  draw is still minus the mean loss over all data at its own noise, as the same data in
  memory give, one draw's pass at a time."""
  from dsgrad import elbo_estimates
  monkeypatch.setattr(elbo_estimates, "ELBO_DRAWS_AT_ONCE", at_once)
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 50, 5)
  data = {"x": np.asarray(x), "y": np.asarray(y, np.float32)}
  build = lambda d: dsgrad.objective_from_logdensity(  # noqa: E731
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: -jax.nn.softplus(-(2 * b["y"] - 1) * (b["x"] @ z)), d, 5)
  on_host = build({k: dsgrad.data.HostArray(v) for k, v in data.items()})
  params = dsgrad.families.by_name("meanfield", 5).params()
  chunk = 3 if at_once < 2 ** 20 else 4096
  assert elbo_estimates._draws_at_once(on_host, params, 7, chunk) == (
      (3, 3) if at_once < 2 ** 20 else (7, 50))
  key = jax.random.key(4)
  np.testing.assert_allclose(elbo_estimates.elbo_draws(on_host, 7, chunk)(params, key),
                             elbo_estimates.elbo_draws(build(data), 7, chunk)(params, key),
                             rtol=1e-5)


def test_wide_rows_shrink_the_draws_and_rows_evaluated_at_once():
  """100 draws of 3,072-feature rows (CIFAR's width) at once would hold 3,072 numbers per
  row-draw: the group and its chunks shrink to keep within the bound."""
  from dsgrad import elbo_estimates
  x = np.zeros((500, 3072), np.float32)
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: -0.5 * (b["x"] @ z) ** 2, {"x": x}, 3072)
  params = dsgrad.families.by_name("meanfield", 3072).params()
  draws, rows = elbo_estimates._draws_at_once(objective, params, 100, 4096)
  assert 1 <= draws < 100 and rows >= 16
  assert draws * rows * 3073 <= 4 * elbo_estimates.ELBO_DRAWS_AT_ONCE


def test_an_elbo_pass_reads_its_chunks_as_slices_with_the_gathered_rows_numbers(tmp_path):
  """A full pass's chunks are ranges of rows: the ELBO program reads them as slices of the
  data (gathered row by row, a pass over 2,000,000 rows took twice as long on two CPU
  cores), with the draws the rows gathered by index give; host (memory-mapped) leaves are
  still gathered."""
  n = 300
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), n, 3)
  objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
  params, key = dsgrad.meanfield_init(objective, 0.1, -1.0), jax.random.key(1)
  draws = dsgrad.diagnostics.elbo_draws(objective, 4, 64)  # 4 chunks and a remainder
  text = jax.jit(draws).lower(params, key).as_text()
  assert "stablehlo.dynamic_slice" in text and "stablehlo.gather" not in text
  noises = [objective.sample_noise(k, 1) for k in jax.random.split(key, 4)]
  gathered = [-jnp.mean(objective.loss_fn(params, objective.rows(jnp.arange(n)), noise))
              for noise in noises]
  np.testing.assert_allclose(draws(params, key), gathered, rtol=1e-5)

  path = tmp_path / "x.npy"
  np.save(path, np.asarray(x))
  data = {"x": dsgrad.data.open_memmap(path, dtype=np.float32, shape=(None, 3)), "y": y}
  indices = 100 + jnp.arange(64)
  sliced = jax.jit(lambda d: dsgrad.data.rows_of(d, indices, contiguous=True))(data)
  np.testing.assert_array_equal(sliced["x"], np.asarray(x)[100:164])
  np.testing.assert_array_equal(sliced["y"], np.asarray(y)[100:164])


def test_the_log_q_offsets_come_from_each_pass_s_own_noise(logreg_model, params0):
  """The evaluation that also gives PSIS's offsets takes each offset from the noise its
  pass drew: its program samples normals as often as the plain evaluation's (drawing them
  again compiled the sampler twice), and each offset is ``d/2 - |eps|^2 / 2`` of the
  noise ``elbo_draws`` used for the same draw."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  key = jax.random.key(4)

  def normals_sampled(estimate):
    return jax.jit(estimate).lower(params0, key).as_text().count("erf_inv")

  plain = dsgrad.elbo_estimates.elbo_draws(objective, 20)
  with_offsets = dsgrad.elbo_estimates.elbo_draws_and_log_q(objective, 20)
  assert normals_sampled(with_offsets) == normals_sampled(plain) > 0
  draws, offsets = with_offsets(params0, key)
  np.testing.assert_array_equal(draws, plain(params0, key))
  # A draw's shared noise is sample_noise(k_s, 1) for the s-th of key's split keys.
  noise = jax.vmap(lambda k: objective.sample_noise(k, 1))(jax.random.split(key, 20))
  eps = np.asarray(noise, np.float64).reshape(20, -1)
  np.testing.assert_allclose(offsets, 0.5 * eps.shape[1] - 0.5 * np.sum(eps ** 2, 1),
                             rtol=1e-5)
