"""The variance facts of the paper (Eq. 6, 10, 14), measured by Monte Carlo.

Variances are traces of covariance matrices (the paper's convention). Comparisons allow
4 standard errors of the estimated variances.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad.diagnostics import estimator_samples, total_variance
from dsgrad.models import Model
from conftest import BATCH, N_DATA, exact_negative_elbo, fill_by_training

NUM_DRAWS = 8000


def _variance(tx, state, params, objective, seed, num_draws=NUM_DRAWS):
  return total_variance(estimator_samples(tx, state, params, objective,
                                          jax.random.key(seed), num_draws, BATCH))


def _quadratic_objective(num_data=30, dim=4, seed=0):
  """f(w; n, eps) = (w - a_n)^T diag(h_n) (w - a_n) / 2 + eps^T C_n w: its gradient is
  linear in eps, so the first-order expansion in the noise is exact (f~ = f)."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  a = jax.random.normal(k1, (num_data, dim))
  h = jnp.exp(0.3 * jax.random.normal(k2, (num_data, dim)))
  c = jax.random.normal(k3, (num_data, dim, dim))

  def loss_fn(params, indices, noise):
    w = params["w"]
    quad = 0.5 * jnp.sum(h[indices] * (w - a[indices]) ** 2, axis=1)
    return quad + jnp.einsum("bi,bij,j->b", noise, c[indices], w)

  return dsgrad.Objective(loss_fn, dsgrad.gaussian_noise((dim,)), num_data, name="quadratic")


def test_joint_variance_zero_when_approximation_exact():
  """Eq. 6 with f~ = f and every table row equal to w: the variance is zero."""
  objective = _quadratic_objective()
  params = {"w": jnp.array([0.3, -0.2, 0.1, 0.5])}
  naive_var, _ = _variance(dsgrad.naive(), dsgrad.naive().init(params), params, objective, 1)
  for tx in [dsgrad.joint_saga(objective), dsgrad.joint_svrg(objective, every=100)]:
    var, _ = _variance(tx, tx.init(params), params, objective, 2)
    assert var < 1e-6 * naive_var, (var, naive_var)  # float32 rounding only
  # cv also removes MC noise exactly here but keeps the subsampling variance.
  cv_tx = dsgrad.cv(objective)
  cv_var, _ = _variance(cv_tx, cv_tx.init(params), params, objective, 3)
  assert cv_var > 1e-2 * naive_var


def test_meanfield_gaussian_joint_zero_variance_on_loc_for_gaussian_model():
  """Conjugate Gaussian model: k_n is quadratic, so App. F's Taylor expansion is exact on
  loc and joint's loc-gradient has zero variance at a fresh table."""
  k1, k2 = jax.random.split(jax.random.key(4))
  x = jax.random.normal(k1, (N_DATA, 3)) + 1.0

  model = Model(
      log_prior=lambda z: -0.5 * jnp.sum(z ** 2),
      log_likelihood=lambda z, idx: -0.5 * jnp.sum((x[idx] - z) ** 2, axis=-1),
      num_data=N_DATA, latent_dim=3, name="gaussian_mean")
  objective = dsgrad.meanfield_gaussian(model, shared_noise=False)
  params = {"loc": jax.random.normal(k2, (3,)), "log_scale": jnp.full((3,), -0.5)}
  tx = dsgrad.joint_saga(objective, dsgrad.approx.gaussian_mean_taylor(model))
  samples = np.asarray(estimator_samples(tx, tx.init(params), params, objective,
                                         jax.random.key(5), 4000, BATCH))
  naive = np.asarray(estimator_samples(dsgrad.naive(), (), params, objective,
                                       jax.random.key(5), 4000, BATCH))
  loc_var = samples[:, :3].var(0).sum()
  assert loc_var < 1e-6 * naive[:, :3].var(0).sum()
  assert samples[:, 3:].var(0).sum() > 0  # log_scale has no control variate


@pytest.fixture(scope="module")
def endpoint(logreg_model, params0):
  """Parameters after a short naive optimization, as in Table 1 / Fig. 2."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=True)
  _, params = fill_by_training(dsgrad.naive(), objective, params0, jax.random.key(11),
                               steps=300, lr=2e-3)
  return objective, params


def _per_datum_exact_grads(model_data, params):
  """grad_w E_eps f(w; n, eps) for every datum n, by quadrature (shape (N, P))."""
  x, y = model_data
  rows = []
  for n in range(N_DATA):
    def f_n(p, n=n):
      # Quadrature objective restricted to datum n: N * loss_n + prior + entropy terms
      # equals the full objective with the likelihood of datum n alone weighted by N.
      full = exact_negative_elbo((np.repeat(x[n:n + 1], N_DATA, 0),
                                  np.repeat(y[n:n + 1], N_DATA, 0)))
      return full(p)
    rows.append(jax.flatten_util.ravel_pytree(jax.grad(f_n)(params))[0])
  return np.asarray(jnp.stack(rows), np.float64)


def test_cv_and_inc_sit_on_their_lower_bounds_and_joint_goes_below(
    logreg_model, logreg_data, endpoint):
  objective, params = endpoint
  # V_n: subsampling variance of the noise-averaged gradient, batch of B i.i.d. data.
  per_datum = _per_datum_exact_grads(logreg_data, params)
  v_n = per_datum.var(0).sum() / BATCH
  # V_eps: Monte Carlo variance of the full-data gradient at one shared noise draw.
  all_idx = jnp.arange(N_DATA, dtype=jnp.int32)

  @jax.jit
  def full_grad(k):
    g = objective.grad(params, all_idx, objective.sample_noise(k, 1), validate=False)
    return jax.flatten_util.ravel_pytree(g)[0]

  v_eps, v_eps_se = total_variance(jax.lax.map(full_grad,
                                               jax.random.split(jax.random.key(12), NUM_DRAWS)))

  cv_tx, inc_tx = dsgrad.cv(objective), dsgrad.inc(objective)
  naive_var, naive_se = _variance(dsgrad.naive(), (), params, objective, 13)
  cv_var, cv_se = _variance(cv_tx, cv_tx.init(params), params, objective, 14)
  inc_var, inc_se = _variance(inc_tx, inc_tx.init(params), params, objective, 15)
  saga_tx = dsgrad.joint_saga(objective)
  joint_var, joint_se = _variance(saga_tx, saga_tx.init(params), params, objective, 16)

  # Eq. 10: V[cv] >= V_n (the bound is exact, computed by quadrature).
  assert cv_var >= v_n - 4 * cv_se, (cv_var, v_n)
  # Eq. 14: V[inc] >= V_eps; with every table row at w the first term vanishes and
  # V[inc] = V_eps exactly.
  assert inc_var >= v_eps - 4 * np.hypot(inc_se, v_eps_se), (inc_var, v_eps)
  assert abs(inc_var - v_eps) <= 4 * np.hypot(inc_se, v_eps_se) + 1e-3 * v_eps
  # Joint goes below both bounds and below naive and cv.
  assert joint_var + 4 * joint_se < min(v_n, v_eps), (joint_var, v_n, v_eps)
  assert joint_var + 4 * joint_se < cv_var - 4 * cv_se
  assert joint_var + 4 * joint_se < naive_var - 4 * naive_se
  # cv does not increase the variance of naive.
  assert cv_var <= naive_var + 4 * np.hypot(cv_se, naive_se)


def test_joint_variance_below_naive_and_cv_with_stale_table(logreg_model, params0):
  """Table filled along a trajectory (rows at different iterates), evaluated at the
  current parameters: joint's variance is still below naive's and cv's."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=True)
  saga_tx = dsgrad.joint_saga(objective, control_weight=1.0)  # the paper's estimators
  state, params = fill_by_training(saga_tx, objective, params0, jax.random.key(21),
                                   steps=2 * N_DATA // BATCH, lr=2e-3)
  joint_var, joint_se = _variance(saga_tx, state, params, objective, 22)
  naive_var, naive_se = _variance(dsgrad.naive(), (), params, objective, 23)
  cv_tx = dsgrad.cv(objective, control_weight=1.0)
  cv_var, cv_se = _variance(cv_tx, (), params, objective, 24)
  assert joint_var + 4 * joint_se < naive_var - 4 * naive_se
  assert joint_var + 4 * joint_se < cv_var - 4 * cv_se


def test_variance_decomposition_matches_exact_subsampling_variance(logreg_data, endpoint):
  """Table 1's V_n from Monte Carlo (bias-corrected) equals the quadrature value, and
  the law of total variance holds: V_n_eps = V_n + E_n V_eps[grad f(w; n, eps)] / B >= V_n."""
  objective, params = endpoint
  per_datum = _per_datum_exact_grads(logreg_data, params)
  v_n_exact = per_datum.var(0, ddof=1).sum() / BATCH
  d = dsgrad.variance_decomposition(objective, params, jax.random.key(31), BATCH,
                                    num_draws=6000, full_draws=2000,
                                    noise_draws_per_datum=64)
  # Over seeds 0-3 the ratio V_n / exact was 1.013, 1.023, 1.013, 0.976 (sd ~2%): the
  # 5% band is ~2.5 sd. (With K = 64 the noise-inflation correction is only ~1% here.)
  assert abs(d["V_n"] - v_n_exact) < 0.05 * v_n_exact, (d["V_n"], v_n_exact)
  assert d["V_n_eps"] > v_n_exact - 4 * d["V_n_eps_se"]
  assert d["V_eps"] > 0 and d["V_eps_se"] < 0.1 * d["V_eps"]


# At the start a wrong mean term shows most; the endpoint (near zero mean gradient) runs
# with -m slow.
@pytest.mark.parametrize("where", ["start", pytest.param("endpoint", marks=pytest.mark.slow)])
def test_variance_decomposition_on_a_sample_of_the_data_is_unbiased(logreg_data, logreg_model,
                                                                     params0, endpoint, where):
  """V_n from 20 of the 50 data (what dsgrad.recommend does on large data sets): over
  independent samples its mean is the quadrature value, within 4 standard errors. At the
  start the mean gradient is far from zero, so a wrong mean term would show."""
  objective, params = endpoint
  if where == "start":
    params = params0
  v_n_exact = _per_datum_exact_grads(logreg_data, params).var(0, ddof=1).sum() / BATCH
  estimates = np.array([
      dsgrad.variance_decomposition(objective, params, jax.random.key(100 + r), BATCH,
                                    num_draws=2, full_draws=2,
                                    num_data_sampled=20)["V_n"] for r in range(24)])
  se = estimates.std(ddof=1) / np.sqrt(len(estimates))
  assert abs(estimates.mean() - v_n_exact) < 4 * se, (estimates.mean(), v_n_exact, se)
  assert se < 0.2 * v_n_exact  # the band is narrow enough to catch a wrong divisor


def test_estimator_samples_take_the_data_as_an_argument(logreg_data, params0):
  """Two objectives of one kind (a ``with_data`` copy) share one compiled program, and
  each draw is the estimator's output on that objective's own rows: the data are an
  argument of the program, not constants folded into it (gigabytes at scale). Joint
  SVRG, built on the first, refreshes from the objective it is handed."""
  from dsgrad.training import compile_cache
  from dsgrad.training.batching import sample_batch
  x, y = logreg_data[:2]
  first = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
  second = first.with_data(jax.tree.map(lambda a: a[::-1], first.data))
  naive = dsgrad.naive()
  estimator_samples(naive, (), params0, first, jax.random.key(0), 3, BATCH)
  programs = compile_cache.size()
  draws = estimator_samples(naive, (), params0, second, jax.random.key(0), 3, BATCH)
  assert compile_cache.size() == programs
  for row, k in zip(draws, jax.random.split(jax.random.key(0), 3)):
    indices, noise = sample_batch(k, second, BATCH, True)
    by_hand = jax.flatten_util.ravel_pytree(second.grad(params0, indices, noise))[0]
    np.testing.assert_allclose(row, by_hand, rtol=1e-5, atol=1e-6)
  # Joint SVRG, built on the first, takes its snapshot and its per-batch terms from the
  # objective it is handed: at the snapshot's point the control variate cancels most of
  # the subsampling noise (with the first's rows it would cancel none of it).
  svrg = dsgrad.joint_svrg(first, every=10)
  indices, noise = sample_batch(jax.random.key(2), second, BATCH, True)
  state = svrg.update(second.grad(params0, indices, noise), svrg.init(params0), params0,
                      indices=indices, noise=noise, objective=second)[1]  # the snapshot
  reduced, se = _variance(svrg, state, params0, second, 1, 2000)
  plain, plain_se = _variance(naive, (), params0, second, 1, 2000)
  assert reduced + 4 * se < 0.5 * (plain - 4 * plain_se)
  # The variance decomposition's programs too: one set for both, on each one's rows.
  decompose = lambda objective: dsgrad.variance_decomposition(
      objective, params0, jax.random.key(3), BATCH, num_draws=50, full_draws=20)
  decompose(first)
  programs = compile_cache.size()
  on_second = decompose(second)
  assert compile_cache.size() == programs
  built = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x[::-1], y[::-1]))
  assert on_second == pytest.approx(decompose(built), rel=1e-5)


def test_total_variance_of_params_like_draws_is_that_of_their_flattened_rows():
  # Before, a dict of draws (params with a draw axis) ended in "float() argument must be
  # a string or a real number, not 'dict'".
  rng = np.random.default_rng(0)
  draws = {"loc": rng.normal(size=(4000, 3)), "scale": 2.0 * rng.normal(size=(4000, 2, 2))}
  rows = np.concatenate([draws["loc"], draws["scale"].reshape(4000, 4)], 1)
  assert total_variance(draws) == total_variance(rows)
  variance, se = total_variance(draws)
  assert abs(variance - (3 + 4 * 4.0)) < 4 * se  # the trace of the covariance
  assert total_variance(rows[:, 0]) == total_variance(rows[:, :1])  # (M,) scalar draws
  with pytest.raises(ValueError, match="one shared leading draw axis"):
    total_variance({"loc": draws["loc"], "scale": draws["scale"][:10]})


def test_total_variance_refuses_draws_that_are_not_finite():
  draws = np.random.default_rng(0).normal(size=(50, 3))
  variance, se = total_variance(draws)
  assert variance == pytest.approx(np.var(draws, axis=0, ddof=1).sum()) and se > 0
  draws[7, 1] = np.nan  # reported as a NaN variance before, as if it had been measured
  with pytest.raises(ValueError, match="1 of 50 draws hold NaN or inf .*row 7"):
    total_variance(draws)
