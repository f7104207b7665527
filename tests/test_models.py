"""Each model's per-datum log likelihood, summed over the data, equals a direct
full-data implementation written independently (numpy/scipy); gradients are finite and
bad inputs are refused with a message naming the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

import dsgrad
from dsgrad import models


def _all(model):
  return jnp.arange(model.num_data, dtype=jnp.int32)


def _check_sum_and_gradients(model, z, direct_log_lik, direct_log_prior):
  # One program each, not one per operation.
  log_lik, log_prior = jax.jit(lambda z: (jnp.sum(model.log_likelihood_at(z, _all(model))),
                                          model.log_prior(z)))(z)
  np.testing.assert_allclose(float(log_lik), direct_log_lik, rtol=2e-5)
  np.testing.assert_allclose(float(log_prior), direct_log_prior, rtol=2e-5)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model, 0.0, -1.0)
  params = dict(params, loc=jnp.asarray(z))
  idx = jnp.arange(min(7, model.num_data), dtype=jnp.int32)
  grads = objective.grad(params, idx, objective.sample_noise(jax.random.key(0), 7))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  assert grads["loc"].shape == (model.latent_dim,)


def test_ppca_matches_scipy_multivariate_normal():
  x, _ = models.synthetic_ppca_data(jax.random.key(0), 60, 7, 3, noise_std=0.7)
  model = models.ppca(x, latent_dim=3, noise_std=0.7)
  assert model.latent_dim == 21
  z = 0.8 * jax.random.normal(jax.random.key(1), (21,))
  w = np.asarray(z, np.float64).reshape(7, 3)
  cov = w @ w.T + 0.49 * np.eye(7)
  direct = stats.multivariate_normal(np.zeros(7), cov).logpdf(np.asarray(x, np.float64)).sum()
  prior = stats.norm.logpdf(np.asarray(z, np.float64)).sum()
  _check_sum_and_gradients(model, z, direct, prior)


@pytest.mark.slow
def test_ppca_derivatives_match_dense_covariance():
  # PPCA's Woodbury algebra uses a hand-written Cholesky (see dsgrad.models.ppca); its
  # gradient and the Hessian-vector product that cv/joint differentiate must equal those
  # of the dense D x D Gaussian log density.
  x, _ = models.synthetic_ppca_data(jax.random.key(3), 40, 6, 4, noise_std=0.8)
  model = models.ppca(x, latent_dim=4, noise_std=0.8)
  idx = jnp.arange(40, dtype=jnp.int32)

  def dense(z):
    w = z.reshape(6, 4)
    cov = w @ w.T + 0.64 * jnp.eye(6)
    _, log_det = jnp.linalg.slogdet(cov)
    quad = jnp.sum(x * jnp.linalg.solve(cov, x.T).T)
    return -0.5 * (40 * (6 * np.log(2 * np.pi) + log_det) + quad)

  woodbury = lambda z: jnp.sum(model.log_likelihood_at(z, idx))
  z = 0.7 * jax.random.normal(jax.random.key(4), (24,))
  tangent = jax.random.normal(jax.random.key(5), (24,))
  scale = float(jnp.max(jnp.abs(jax.grad(dense)(z))))
  np.testing.assert_allclose(jax.grad(woodbury)(z), jax.grad(dense)(z), atol=1e-4 * scale)
  hvp = lambda f: jax.jvp(jax.grad(f), (z,), (tangent,))[1]
  scale = float(jnp.max(jnp.abs(hvp(dense))))
  np.testing.assert_allclose(hvp(woodbury), hvp(dense), atol=1e-4 * scale)


def test_bradley_terry_matches_direct_formula():
  winners, losers, _ = models.synthetic_bradley_terry_data(jax.random.key(0), 12, 80)
  outcomes = np.asarray(jax.random.bernoulli(jax.random.key(2), 0.5, (80,)), np.int32)
  # Swapping the players of a datum and flipping its outcome is the same comparison.
  a = np.where(outcomes == 1, winners, losers)
  b = np.where(outcomes == 1, losers, winners)
  model = models.bradley_terry(a, b, 12, outcomes=outcomes)
  model_wl = models.bradley_terry(winners, losers, 12)
  theta = np.asarray(jax.random.normal(jax.random.key(1), (12,)), np.float64)
  direct = np.sum(np.log(special.expit(theta[winners] - theta[losers])))
  prior = stats.norm.logpdf(theta).sum()
  _check_sum_and_gradients(model, jnp.asarray(theta, jnp.float32), direct, prior)
  _check_sum_and_gradients(model_wl, jnp.asarray(theta, jnp.float32), direct, prior)


def test_movielens_matches_direct_loop():
  users, genres, ratings = models.synthetic_movielens_data(jax.random.key(0), num_users=6,
                                                          num_movies=15, num_ratings=40,
                                                          num_genres=4, num_classes=5)
  model = models.movielens(users, genres, ratings, num_users=6)
  assert model.latent_dim == (6 + 2) * 4 * 5
  z = 0.5 * jax.random.normal(jax.random.key(1), (model.latent_dim,))
  zz = np.asarray(z, np.float64)
  mu, sigma = zz[:20].reshape(4, 5), zz[20:40].reshape(4, 5)
  weights = zz[40:].reshape(6, 4, 5)
  direct = 0.0
  for m, x, y in zip(users, genres, ratings):
    logits = x @ weights[m]
    direct += logits[y] - special.logsumexp(logits)
  prior = (stats.norm.logpdf(mu).sum() + stats.norm.logpdf(sigma).sum()
           + stats.norm.logpdf(weights, mu[None], np.exp(sigma)[None]).sum())
  _check_sum_and_gradients(model, z, direct, prior)
  parts = models.movielens_latent(z, 6, 4, 5)
  np.testing.assert_allclose(parts.user_weights, weights, rtol=1e-6)


def test_softmax_and_binary_logistic_match_direct_formulas(logreg_data):
  x, y = logreg_data
  model = models.logistic_regression(x, y)
  z = np.asarray(jax.random.normal(jax.random.key(0), (x.shape[1],)), np.float64)
  direct = np.sum(np.log(special.expit((2 * y - 1) * (x @ z))))
  _check_sum_and_gradients(model, jnp.asarray(z, jnp.float32), direct,
                           stats.norm.logpdf(z).sum())
  labels = np.arange(x.shape[0]) % 3
  soft = models.softmax_regression(x, labels, 3)
  zs = np.asarray(jax.random.normal(jax.random.key(1), (x.shape[1] * 3,)), np.float64)
  logits = x @ zs.reshape(-1, 3)
  direct = np.sum(logits[np.arange(len(labels)), labels] - special.logsumexp(logits, axis=1))
  _check_sum_and_gradients(soft, jnp.asarray(zs, jnp.float32), direct,
                           stats.norm.logpdf(zs).sum())


def test_bad_model_inputs():
  with pytest.raises(ValueError, match="latent_dim"):
    models.ppca(np.zeros((5, 3)), latent_dim=4)
  with pytest.raises(ValueError, match="non-finite"):
    models.ppca(np.full((5, 3), np.nan), latent_dim=2)
  with pytest.raises(ValueError, match="player_b must lie in"):
    models.bradley_terry([0, 1], [1, 5], num_players=3)
  with pytest.raises(ValueError, match="itself"):
    models.bradley_terry([0, 1], [1, 1], num_players=3)
  with pytest.raises(ValueError, match="integer"):
    models.bradley_terry(np.array([0.0, 1.0]), [1, 2], num_players=3)
  users, genres, ratings = np.array([0, 1]), np.eye(2, dtype=int), np.array([0, 4])
  with pytest.raises(ValueError, match="users must lie in"):
    models.movielens(users, genres, ratings, num_users=1)
  with pytest.raises(ValueError, match="ratings must lie in"):
    models.movielens(users, genres, np.array([0, 5]), num_users=2)
  with pytest.raises(ValueError, match="genres must have shape"):
    models.movielens(users, genres[:1], ratings, num_users=2)
  with pytest.raises(ValueError, match="0/1"):
    models.movielens(users, 2 * genres, ratings, num_users=2)


def test_synthetic_logistic_data_correlated_features():
  """AR(1) features: unit variance and correlation rho^|i-j| (within 4 se of the sample
  correlation, se ~ (1 - r^2) / sqrt(N)); the intercept's weight can be fixed."""
  n, rho = 20_000, 0.9
  x, y, w = models.synthetic_logistic_data(jax.random.key(2), n, 6, feature_correlation=rho,
                                           intercept_value=-2.0)
  free = x[:, :5].astype(np.float64)
  np.testing.assert_allclose(free.std(0), 1.0, atol=4 * np.sqrt(0.5 / n))
  corr = np.corrcoef(free.T)
  for lag in (1, 2, 4):
    expected = rho**lag
    np.testing.assert_allclose(np.diag(corr, lag), expected,
                               atol=4 * (1 - expected**2) / np.sqrt(n))
  assert np.all(x[:, 5] == 1.0) and w[-1] == -2.0
  # labels follow the generating weight: the positive rate matches the mean probability
  p = special.expit(x @ w)
  assert abs(y.mean() - p.mean()) < 4 * np.sqrt(p.mean() * (1 - p.mean()) / n)
  with pytest.raises(ValueError, match="feature_correlation"):
    models.synthetic_logistic_data(jax.random.key(0), 10, 3, feature_correlation=1.0)
  with pytest.raises(ValueError, match="intercept_value"):
    models.synthetic_logistic_data(jax.random.key(0), 10, 3, intercept=False,
                                   intercept_value=1.0)


def test_a_hand_written_models_half_precision_terms_are_summed_in_float32():
  """A Model whose likelihood returns bfloat16 or float16 terms: its ELBO over 100,000 data
  was summed in their dtype, 166 nats off in bfloat16 and -inf in float16 (past 65,504),
  reported as a datum the likelihood deems impossible. Its copies on other data keep the
  same functions (their compiled programs serve them), and a sparse model's local terms
  reach dsgrad in float32 too."""
  n = 100_000
  rng = np.random.default_rng(0)
  data = {"x": rng.normal(size=(n, 3)).astype(np.float32),
          "y": (rng.random(n) < 0.5).astype(np.float32)}
  params = dsgrad.families.by_name("meanfield", 3).params()

  def model(dtype):
    def log_likelihood(z, rows):
      return -jnp.logaddexp(0.0, -(2 * rows["y"] - 1) * (rows["x"] @ z)).astype(dtype)
    return models.Model(lambda z: (-0.5 * jnp.sum(z ** 2)).astype(dtype), log_likelihood,
                        n, 3, data=data)

  elbos = {dtype: dsgrad.elbo(dsgrad.meanfield_gaussian(model(dtype)), params,
                              jax.random.key(0), num_samples=4)[0]
           for dtype in (jnp.float32, jnp.bfloat16, jnp.float16)}
  # Same draws: only the terms' rounding differs (0.01 nats here).
  assert abs(elbos[jnp.bfloat16] - elbos[jnp.float32]) < 3.0, elbos
  assert abs(elbos[jnp.float16] - elbos[jnp.float32]) < 3.0, elbos
  half = model(jnp.bfloat16)
  copy = half.with_data(data)
  assert copy.log_likelihood is half.log_likelihood and copy.log_prior is half.log_prior
  every = lambda rows: jnp.tile(jnp.arange(3), (len(rows["y"]), 1))  # noqa: E731
  sparse = models.with_coordinates(half, 3, every)
  terms = sparse.sparse.log_likelihood_local(jnp.zeros((2, 3)), half.rows(jnp.arange(2)))
  assert terms.dtype == jnp.float32
