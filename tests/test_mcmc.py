"""Subsampling MCMC: the Taylor control variates, the difference and
block-Poisson estimators, HMC-ECS (perturbed and signed) against an exact Gaussian
posterior, the SG-MCMC baselines, diagnostics and bad input."""

import functools
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad import mcmc
from dsgrad.models import Model, logistic_regression, synthetic_logistic_data

Z = 4.0
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: _COMPILES.append(event))


def _linear_gaussian(n=2000, d=3, noise=1.0, prior_scale=2.0, seed=0):
  """Bayesian linear regression with known noise: the posterior is Gaussian, in closed form."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(k1, (n, d))
  theta = prior_scale * jax.random.normal(k2, (d,)) / 2
  y = x @ theta + noise * jax.random.normal(k3, (n,))

  def log_prior(z):
    return -0.5 * jnp.sum((z / prior_scale) ** 2) - d * jnp.log(prior_scale * jnp.sqrt(2 * jnp.pi))

  def log_likelihood(z, idx):
    r = y[idx] - x[idx] @ z
    return -0.5 * (r / noise) ** 2 - jnp.log(noise * jnp.sqrt(2 * jnp.pi))

  xn, yn = np.asarray(x, np.float64), np.asarray(y, np.float64)
  precision = np.eye(d) / prior_scale ** 2 + xn.T @ xn / noise ** 2
  cov = np.linalg.inv(precision)
  mean = cov @ xn.T @ yn / noise ** 2
  return Model(log_prior, log_likelihood, n, d, "linear_gaussian"), mean, cov


@pytest.fixture(scope="module")
def logreg():
  x, y, _ = synthetic_logistic_data(jax.random.key(1), 3000, 4)
  return logistic_regression(x, y)


def test_taylor_sums_match_direct_evaluation(logreg):
  theta_star = 0.3 * jax.random.normal(jax.random.key(2), (logreg.latent_dim,))
  proxy = mcmc.taylor_proxy(logreg, theta_star, chunk_size=700)  # a ragged last chunk
  everyone = jnp.arange(logreg.num_data, dtype=jnp.int32)
  per_datum = jax.jit(jax.vmap(lambda i: (  # one program, not one per operation
      logreg.log_likelihood_at(theta_star, i[None])[0],
      jax.grad(lambda t: logreg.log_likelihood_at(t, i[None])[0])(theta_star),
      jax.hessian(lambda t: logreg.log_likelihood_at(t, i[None])[0])(theta_star))))(everyone)
  np.testing.assert_allclose(proxy.sum_value, per_datum[0].sum(), rtol=1e-5)
  np.testing.assert_allclose(proxy.sum_grad, per_datum[1].sum(0), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(proxy.sum_hessian, per_datum[2].sum(0), rtol=1e-4, atol=1e-3)
  theta = theta_star + 0.2 * jax.random.normal(jax.random.key(3), theta_star.shape)
  delta = theta - theta_star
  direct = per_datum[0] + per_datum[1] @ delta + 0.5 * jnp.einsum("i,kij,j->k", delta,
                                                                     per_datum[2], delta)
  np.testing.assert_allclose(mcmc.proxy_values(logreg, proxy, theta, everyone), direct,
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(mcmc.proxy_sum(proxy, theta), direct.sum(), rtol=1e-5)
  # At theta* every control variate is exact.
  np.testing.assert_allclose(mcmc.differences(logreg, proxy, theta_star, everyone), 0.0,
                             atol=1e-5)


def test_taylor_sums_from_declared_coordinates_are_the_dense_ones():
  """A model whose rows declare the latent rows they read (a user's and an item's effects
  and a shared slope) gets its sums from each datum's k x k Hessian: they equal the dense
  sums of d Hessian-vector products, off-diagonal blocks between the effects included."""
  rng = np.random.default_rng(0)
  n, users, items = 500, 13, 7
  data = {"u": rng.integers(0, users, n).astype(np.int32),
          "i": rng.integers(0, items, n).astype(np.int32),
          "x": rng.normal(size=n).astype(np.float32), "y": rng.poisson(2.0, n).astype(np.float32)}

  def log_lik(z, rows):
    eta = z["a"][rows["u"]] * z["b"][rows["i"]] + z["w"] * rows["x"]
    return rows["y"] * eta - jnp.exp(eta)

  latent = {"a": jnp.zeros(users), "b": jnp.zeros(items), "w": jnp.zeros(())}
  prior = lambda z: -0.5 * sum(jnp.sum(leaf ** 2) for leaf in jax.tree.leaves(z))
  declared = dsgrad.model_from_logdensity(prior, log_lik, data, latent)
  dense = dsgrad.model_from_logdensity(prior, log_lik, data, latent, reads=None)
  assert declared.sparse is not None and dense.sparse is None
  theta = 0.3 * jax.random.normal(jax.random.key(2), (declared.latent_dim,))
  fast, slow = (mcmc.taylor_proxy(m, theta, chunk_size=120) for m in (declared, dense))
  everyone = jnp.arange(n)
  total = lambda t: jnp.sum(dense.log_likelihood_at(t, everyone))
  np.testing.assert_allclose(fast.sum_value, slow.sum_value, rtol=1e-5)
  np.testing.assert_allclose(fast.sum_grad, jax.grad(total)(theta), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(fast.sum_hessian, slow.sum_hessian, rtol=1e-4, atol=1e-3)
  # The product of the two effects couples them: the blocks between them are not zero.
  assert np.abs(np.asarray(fast.sum_hessian)[:users, users:users + items]).max() > 1.0


def test_a_sparse_curvature_is_kept_as_its_entries_and_moves_the_chain_as_the_dense_one():
  """Random intercepts of 400 groups and a slope: the proxy's curvature B has some 1,200 of
  its 160,801 entries nonzero (a group's own, and its slope's); the proxy keeps them, and
  its sum, its gradient (the potential's) and the chain's draws equal those of the dense
  product."""
  rng = np.random.default_rng(3)
  n, groups = 2000, 400
  data = {"g": rng.integers(0, groups, n).astype(np.int32),
          "x": rng.normal(size=n).astype(np.float32)}
  data["y"] = (rng.random(n) < 0.5).astype(np.float32)

  def log_lik(z, rows):
    eta = z["a"][rows["g"]] + z["w"] * rows["x"]
    return rows["y"] * eta - jax.nn.softplus(eta)

  latent = {"a": jnp.zeros(groups), "w": jnp.zeros(())}
  model = dsgrad.model_from_logdensity(
      lambda z: -0.5 * sum(jnp.sum(leaf ** 2) for leaf in jax.tree.leaves(z)), log_lik, data,
      latent)
  star = mcmc.find_reference_point(model, jax.random.key(0))
  sparse = mcmc.taylor_proxy(model, star)
  dense = sparse._replace(hessian_entries=None)
  rows, cols, values = sparse.hessian_entries
  nonzero = np.count_nonzero(np.asarray(sparse.sum_hessian))
  assert rows.shape == (nonzero,) and 1000 < nonzero < 0.01 * (groups + 1) ** 2
  theta = star + 0.1 * jax.random.normal(jax.random.key(1), star.shape)
  (value, grad), (want_value, want_grad) = (
      jax.value_and_grad(lambda t, p=proxy: mcmc.proxy_sum(p, t))(theta)
      for proxy in (sparse, dense))
  np.testing.assert_allclose(value, want_value, rtol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-4)
  scheme = mcmc.perturbed(model, 100, 10)
  draws = []
  for proxy in (sparse, dense):
    algorithm = mcmc.hmcecs(model, proxy, scheme, mcmc.hmc_parameters(0.05, 4, dim=groups + 1))
    draws.append(mcmc.run_chain(jax.random.key(2), algorithm.step,
                                algorithm.init(star, jax.random.key(3)), 30, progress=False)[0])
  np.testing.assert_allclose(draws[0], draws[1], rtol=1e-4, atol=1e-5)
  assert np.ptp(np.asarray(draws[0]), axis=0).min() > 0  # every coordinate moved


def test_the_laplace_precision_floor_is_kept_with_or_without_the_eigendecomposition():
  """The floor at 1e-6 of the largest eigenvalue: a matrix well inside it comes back as it
  is (one factorization shows it), one with an eigenvalue below it or a negative one is
  floored as by its eigendecomposition."""
  from dsgrad.mcmc.reference import floored_eigenvalues
  rng = np.random.default_rng(1)
  q, _ = np.linalg.qr(rng.normal(size=(40, 40)))
  for values in (np.linspace(1.0, 1e3, 40), np.r_[-2.0, 1e-9, np.linspace(1.0, 1e3, 38)]):
    matrix = (q * values) @ q.T
    matrix = 0.5 * (matrix + matrix.T)
    expected = (q * np.maximum(values, 1e-6 * values.max())) @ q.T
    np.testing.assert_allclose(floored_eigenvalues(matrix), expected, atol=1e-9 * 1e3)
  well = (q * np.linspace(1.0, 1e3, 40)) @ q.T
  assert floored_eigenvalues(well) is well


def test_the_newton_step_solves_with_the_floored_precision_from_one_factorization(
    monkeypatch):
  """floored_solve: the solve with the floored precision, from the factor that checks the
  floor where the floor changes nothing (refined to the exact solution), from the floored
  matrix where it does, and by a factorization of the matrix itself where the smallest
  eigenvalue lies just above the floor (the refinement stalls)."""
  from dsgrad.mcmc import reference
  rng = np.random.default_rng(2)
  q, _ = np.linalg.qr(rng.normal(size=(40, 40)))
  vector = rng.normal(size=40)
  factorizations = []
  real_factor = reference._shifted_factor
  monkeypatch.setattr(reference, "_shifted_factor",
                      lambda m: factorizations.append("shifted") or real_factor(m))
  linalg = reference._scipy_linalg()
  real_cho_factor = linalg.cho_factor
  monkeypatch.setattr(linalg, "cho_factor",
                      lambda m, **kw: factorizations.append("cho") or real_cho_factor(m, **kw))
  top = np.linspace(1.0, 1e3, 39)
  # The shift that checks the floor: a millionth of the matrix's smaller norm.
  shift = 1e-6 * min(np.linalg.norm((q[:, 1:] * top) @ q[:, 1:].T, ord)
                     for ord in (np.inf, "fro"))
  # Well inside the floor (the shifted factor solves); below it (a negative and a tiny
  # eigenvalue: solved by the eigendecomposition that floors it, no factor after the
  # failed one); 1.5 shifts above zero, so half a shift above the shifted matrix's: the
  # refinement diverges and the matrix is factored itself.
  for values, expected_factorizations in (
      (np.r_[1.0, top], ["shifted", "cho"]),
      (np.r_[-2.0, 1e-9, np.linspace(1.0, 1e3, 38)], ["shifted", "cho"]),
      (np.r_[1.5 * shift, top], ["shifted", "cho", "cho"])):
    matrix = (q * values) @ q.T
    matrix = 0.5 * (matrix + matrix.T)
    floored = (q * np.maximum(values, 1e-6 * values.max())) @ q.T
    factorizations.clear()
    got = reference.floored_solve(matrix, vector)
    np.testing.assert_allclose(floored @ got, vector, rtol=1e-6, atol=1e-8)
    assert factorizations == expected_factorizations, factorizations


def test_a_latent_whose_matrices_do_not_fit_is_refused_before_anything_runs(monkeypatch):
  """HMC-ECS holds d x d matrices: where they cannot fit in the free memory, sample says so
  at once, naming d and the sizes, instead of being killed minutes into its setup."""
  from dsgrad.training import host_data
  model, _, _ = _linear_gaussian(n=100)
  monkeypatch.setattr(host_data, "free_memory_bytes", lambda: 200)
  # The module, which the package's function of the same name hides.
  monkeypatch.setattr(sys.modules["dsgrad.mcmc.sample"], "find_reference_point",
                      lambda *args, **kwargs: pytest.fail("the setup began"))
  with pytest.raises(ValueError, match=r"has d = 3 latent coordinates.*more than the 0.0 GB "
                                       r"free.*dsgrad.joint_saga"):
    mcmc.sample(jax.random.key(0), model, num_samples=10, num_warmup=10, progress=False)


def test_large_factorizations_run_on_one_blas_thread():
  """OpenBLAS's threaded Cholesky crashed the process at 16,000 x 16,000 on 2 cores: from
  ONE_LAPACK_THREAD_FROM on, every BLAS library loaded runs one thread; below, as set."""
  import threadpoolctl
  from dsgrad.mcmc.hmcecs import ONE_LAPACK_THREAD_FROM, lapack_threads_for
  threads = lambda: [pool["num_threads"] for pool in threadpoolctl.threadpool_info()
                     if pool["user_api"] == "blas"]
  before = threads()
  with lapack_threads_for(ONE_LAPACK_THREAD_FROM - 1):
    assert threads() == before
  with lapack_threads_for(ONE_LAPACK_THREAD_FROM):
    assert threads() and set(threads()) == {1}
  assert threads() == before


@pytest.mark.parametrize("order", [1, 2])
def test_difference_estimator_is_unbiased(logreg, order):
  theta_star = jnp.zeros(logreg.latent_dim)
  proxy = mcmc.taylor_proxy(logreg, theta_star, order=order)
  theta = 0.4 * jax.random.normal(jax.random.key(4), theta_star.shape)

  @jax.jit  # one program, not one per operation
  def exact_and_estimates(theta, idx):
    total = lambda t: jnp.sum(logreg.log_likelihood_at(t, jnp.arange(logreg.num_data)))  # noqa: E731
    return (*jax.value_and_grad(total)(theta),
            jax.vmap(lambda i: mcmc.difference_estimator(logreg, proxy, theta, i))(idx),
            jax.vmap(lambda i: mcmc.gradient_estimate(logreg, proxy, theta, i))(idx))

  exact, exact_grad, (l_hat, sigma2), grads = exact_and_estimates(
      theta, jax.random.randint(jax.random.key(5), (4000, 50), 0, logreg.num_data))
  exact, exact_grad = float(exact), np.asarray(exact_grad)
  l_hat = np.asarray(l_hat, np.float64)
  se = l_hat.std() / np.sqrt(l_hat.size)
  assert abs(l_hat.mean() - exact) < Z * se, (l_hat.mean(), exact, se)
  assert se > 0  # the estimator is random here, so the check has teeth
  # sigma2_hat estimates the variance of l_hat.
  assert 0.8 < np.mean(sigma2) / l_hat.var() < 1.25
  g = np.asarray(grads, np.float64)
  g_se = g.std(0) / np.sqrt(g.shape[0])
  assert np.all(np.abs(g.mean(0) - exact_grad) < Z * g_se + 1e-3)


@pytest.mark.parametrize("order", [1, 2])
def test_gradient_estimate_is_the_gradient_of_the_difference_estimator(logreg, order):
  """Eq. 4.7 written out (one gradient, one Hessian-vector product) equals automatic
  differentiation of the difference estimator it comes from."""
  proxy = mcmc.taylor_proxy(logreg, 0.1 * jnp.ones(logreg.latent_dim), order=order)
  theta = proxy.theta_star + 0.2 * jax.random.normal(jax.random.key(7), (logreg.latent_dim,))
  idx = jax.random.randint(jax.random.key(8), (60,), 0, logreg.num_data)
  want, got = jax.jit(lambda theta: (  # one program, not one per operation
      jax.grad(lambda t: mcmc.difference_estimator(logreg, proxy, t, idx)[0])(theta),
      mcmc.gradient_estimate(logreg, proxy, theta, idx)))(theta)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.abs(want).max()))


def test_block_poisson_estimator_is_unbiased_for_the_likelihood(logreg):
  proxy = mcmc.taylor_proxy(logreg, jnp.zeros(logreg.latent_dim))
  theta = 0.05 * jax.random.normal(jax.random.key(6), (logreg.latent_dim,))
  # Work relative to sum_k l_k(theta*): float32 cannot resolve 1e-3 of a log likelihood
  # of -2,000, so both sides drop that constant (the proxy's sum_value) exactly.
  everyone = jnp.arange(logreg.num_data)
  exact = float(np.sum(np.asarray(logreg.log_likelihood_at(theta, everyone), np.float64)
                       - np.asarray(logreg.log_likelihood_at(proxy.theta_star, everyone),
                                    np.float64)))
  proxy = proxy._replace(sum_value=jnp.zeros(()))
  lam, a = mcmc.suggest_block_poisson(logreg, proxy, theta[None], jax.random.key(7), 30)
  scheme = mcmc.block_poisson(logreg, 30, lam, a)
  log_abs, sign, _ = jax.jit(lambda keys: jax.vmap(  # one program, not one per operation
      lambda u: scheme.log_likelihood(proxy, theta, u))(jax.vmap(scheme.init)(keys)))(
          jax.random.split(jax.random.key(8), 20000))
  ratio = np.asarray(sign, np.float64) * np.exp(np.asarray(log_abs, np.float64) - exact)
  se = ratio.std() / np.sqrt(ratio.size)
  assert ratio.std() > 1e-3
  assert abs(ratio.mean() - 1.0) < Z * se, (ratio.mean(), se)


def _check_gaussian(samples, mean, cov, label, weights=None):
  ess = mcmc.effective_sample_size(samples)
  assert np.all(ess > 100), (label, ess)
  sd = np.sqrt(np.diag(cov))
  got = samples.mean(0) if weights is None else mcmc.signed_mean(samples, weights)
  z = np.abs(got - mean) / (sd / np.sqrt(ess))
  assert np.all(z < Z), (label, got, mean, z)
  var = samples.var(0)
  rel = np.abs(var / np.diag(cov) - 1) / np.sqrt(2.0 / ess)
  assert np.all(rel < Z), (label, var, np.diag(cov), rel)


@pytest.mark.parametrize("estimator,order", [("perturbed", 1), ("full", 2)])
def test_perturbed_hmcecs_matches_the_exact_posterior(estimator, order):
  """Conjugate Gaussian: the posterior is known in closed form. A first-order proxy
  leaves the subsample estimator random (a second-order one would be exact for this
  model; the logistic test below uses second order); ``full`` is plain HMC with the
  same kernel and tuning."""
  model, mean, cov = _linear_gaussian()
  # Full-data HMC needs no subsample size.
  sizes = dict(subsample_size=100) if estimator == "perturbed" else {}
  result = mcmc.sample(jax.random.key(10), model, num_samples=3000, num_warmup=400,
                       num_blocks=10, proxy_order=order, estimator=estimator,
                       reference_updates_every=200, progress=False, **sizes)
  assert result.samples.shape == (3000, 3)
  accept = result.info.acceptance_rate.mean()
  assert 0.6 < accept <= 1.0, accept
  if estimator == "perturbed":
    assert 0 < result.info.subsample_accepted.mean() <= 1.0
  else:
    np.testing.assert_array_equal(result.info.num_evaluations,
                                  model.num_data * result.info.num_integration_steps)
  _check_gaussian(result.samples, mean, cov, f"{estimator} order {order}")


def test_adapted_and_given_mass_matrices():
  """``mass_matrix="adapt"`` (a diagonal M from the warm-up draws, as NumPyro and Stan
  adapt it) lands on the posterior and its ``M^{-1}`` approximates the posterior
  variances; a given ``M`` is used unchanged (the same matrix handed to another library
  gives the same kernel)."""
  model, mean, cov = _linear_gaussian(seed=3)
  result = mcmc.sample(jax.random.key(15), model, num_samples=2000, num_warmup=600,
                       subsample_size=100, num_blocks=10, mass_matrix="adapt",
                       mass_window=200, reference_updates_every=0, progress=False)
  _check_gaussian(result.samples, mean, cov, "adapted mass")
  adapted = np.asarray(result.parameters.inverse_mass_matrix)
  assert adapted.shape == (3,)  # kept as its diagonal: O(d) a leapfrog step
  # 200 autocorrelated draws per window: within a factor of two of the true variances,
  # far from the identity it started at (the variances are ~1e-3).
  np.testing.assert_array_less(np.abs(np.log(adapted / np.diag(cov))), np.log(2.0))
  given = np.linalg.inv(cov)  # the exact posterior precision
  fixed = mcmc.sample(jax.random.key(16), model, num_samples=10, num_warmup=400,
                      subsample_size=100, num_blocks=10, mass_matrix=given, progress=False)
  np.testing.assert_allclose(fixed.parameters.inverse_mass_matrix, cov, rtol=1e-3,
                             atol=1e-3 * np.abs(cov).max())
  # A diagonal M given as its diagonal runs the chain a dense diagonal matrix runs.
  diagonal, dense = (mcmc.sample(jax.random.key(16), model, num_samples=10, num_warmup=0,
                                 subsample_size=100, num_blocks=10, mass_matrix=mass,
                                 progress=False)
                     for mass in (np.diag(given), np.diag(np.diag(given))))
  np.testing.assert_allclose(diagonal.parameters.inverse_mass_matrix, 1 / np.diag(given),
                             rtol=1e-4)
  np.testing.assert_allclose(diagonal.samples, dense.samples, rtol=1e-4, atol=1e-6)
  assert np.ptp(np.asarray(dense.samples), axis=0).min() > 0  # the chain moved
  for bad, match in (("diagonal", "mass_matrix must be"), (np.eye(2), "shape"),
                     (np.full(3, np.nan), "finite"), (-np.eye(3), "positive definite"),
                     (-np.ones(3), "finite positive values")):
    with pytest.raises(ValueError, match=match):
      mcmc.sample(jax.random.key(0), model, num_samples=5, num_warmup=0,
                  subsample_size=100, num_blocks=10, mass_matrix=bad, progress=False)


@functools.lru_cache(maxsize=1)
def _logistic_2d(n=2000):
  """A 2-parameter logistic regression and its exact posterior moments by quadrature."""
  x, y, _ = synthetic_logistic_data(jax.random.key(20), n, 2)
  model = logistic_regression(x, y)
  mode = mcmc.find_reference_point(model, jax.random.key(21), subset_size=n)
  sd = np.sqrt(np.diag(np.linalg.inv(np.asarray(mcmc.laplace_precision(
      model, mcmc.taylor_proxy(model, mode))))))
  grid = [np.linspace(m - 7 * s, m + 7 * s, 161) for m, s in zip(np.asarray(mode), sd)]
  a, b = np.meshgrid(*grid, indexing="ij")
  points = jnp.asarray(np.stack([a.ravel(), b.ravel()], 1), jnp.float32)
  everyone = jnp.arange(n)
  logpost = jax.jit(jax.vmap(lambda t: jnp.sum(model.log_likelihood_at(t, everyone))
                             + model.log_prior(t)))(points)
  logpost = np.asarray(logpost, np.float64)
  w = np.exp(logpost - logpost.max())
  w /= w.sum()
  p = np.asarray(points, np.float64)
  mean = w @ p
  cov = (p - mean).T @ ((p - mean) * w[:, None])
  return model, mean, cov


# Both chains are slow; the block-Poisson estimator's unbiasedness and the kernel on an
# exact Gaussian posterior are tested quickly above.
@pytest.mark.parametrize("estimator", [pytest.param("perturbed", marks=pytest.mark.slow),
                                       pytest.param("signed", marks=pytest.mark.slow)])
def test_hmcecs_on_a_non_gaussian_posterior(estimator):
  """Logistic regression, exact moments by quadrature: the perturbed chain's means and
  variances, and the signed chain's sign-corrected ones, match within MCMC error."""
  model, mean, cov = _logistic_2d()
  result = mcmc.sample(jax.random.key(11), model, num_samples=2500, num_warmup=200,
                       subsample_size=50, num_blocks=10, estimator=estimator,
                       progress=False)
  if estimator == "signed":
    assert result.scheme.name.startswith("block_poisson")
    assert set(np.unique(result.signs)) <= {-1.0, 1.0}
    assert mcmc.positive_fraction(result.signs) > 0.9
    _check_gaussian(result.samples, mean, cov, "signed", weights=result.signs)
  else:
    assert np.all(result.signs == 1)
    _check_gaussian(result.samples, mean, cov, "perturbed")


def test_chains_are_reproducible_from_a_key(capsys):
  model, mean, _ = _linear_gaussian(n=500)
  result = lambda k, shown=False: mcmc.sample(  # noqa: E731
      k, model, num_samples=20, num_warmup=0, subsample_size=50, num_blocks=10,
      reference_updates_every=0, reference_point=jnp.asarray(mean, jnp.float32) + 0.1,
      progress=shown)
  run = lambda k: result(k).samples  # noqa: E731
  first = result(jax.random.key(12), shown=True)
  # With progress, the setup (minutes at many thousand latents) says what it does.
  printed = capsys.readouterr().out
  assert "control variates' sums over 500 data (d = 3)" in printed, printed
  assert re.search(r"set up in [\d.]+ s \(500 data evaluations\); warming up", printed), printed
  np.testing.assert_array_equal(first.samples, run(jax.random.key(12)))
  assert not np.array_equal(first.samples, run(jax.random.key(13)))
  # A legacy uint32 key draws the chain of the typed key holding its bits (key 12's).
  raw = jax.random.PRNGKey(12)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.key(12)), raw)
  np.testing.assert_array_equal(run(raw), first.samples)
  # Its repr is a summary, not the final state's thousands of subsample indices.
  summary = repr(first)
  assert summary.startswith("MCMCResult(samples=(20, 3), scheme=") and len(summary) < 300
  assert "accepted=" in summary and "warmup_seconds=" in summary


def test_a_first_chain_compiles_one_program_a_stage_and_a_second_none():
  """Each stage of sample (the mode, the passes over the data, the warm-up windows, the
  chain, the signed scheme's tuning, the diagnostics) runs as a compiled program; run op
  by op, key slicing, warm-up bookkeeping and the signed tuning compiled some 45 small
  programs on a first chain (seconds before the first draw). The same call on a model of
  the same shapes compiles nothing."""
  model, _, _ = _linear_gaussian(n=1357, d=5)  # shapes of this test alone: nothing cached
  run = functools.partial(mcmc.sample, model=model, num_samples=100, num_warmup=150,
                          subsample_size=60, num_blocks=10, reference_updates_every=100,
                          progress=False)
  counts = {}
  for estimator in ("perturbed", "signed"):
    start = len(_COMPILES)
    run(jax.random.key(5), estimator=estimator)
    counts[estimator] = _COMPILES[start:].count(_COMPILE_EVENT)
  # 24 and 5 with jax 0.10; 47 and 42 before each stage was one program.
  assert 0 < counts["perturbed"] <= 30 and 0 < counts["signed"] <= 10, counts
  start = len(_COMPILES)
  again = run(jax.random.key(6))
  assert _COMPILES[start:].count(_COMPILE_EVENT) == 0
  assert np.all(np.isfinite(again.samples))


def test_chain_seconds_exclude_compiling_the_chain(monkeypatch):
  """run_chain's seconds (sample's sampling_seconds, the benchmarks' ESS per second) count
  the iterations only: they counted the compile of the chain's program, seconds on a first
  chain. A stand-in compiler takes 100 s of a stand-in clock that runs no other time."""
  import types
  cache = sys.modules["dsgrad.training.compile_cache"]
  clock, compile_for_real = [0.0], cache.compiled_as_text

  def slow_compile(*args, **kwargs):
    clock[0] += 100.0
    return compile_for_real(*args, **kwargs)
  monkeypatch.setattr(cache, "compiled_as_text", slow_compile)
  monkeypatch.setattr(sys.modules["dsgrad.mcmc.chain"], "time",
                      types.SimpleNamespace(perf_counter=lambda: clock[0]))
  model, mean, _ = _linear_gaussian(n=500)
  algorithm = mcmc.sgld(model, None, step_size=1e-4, subsample_size=10,
                        control_variates=False)  # a new step: its chain compiles
  *_, seconds = mcmc.run_chain(jax.random.key(0), algorithm.step,
                               algorithm.init(jnp.asarray(mean, jnp.float32), None), 30,
                               progress=False)
  compiled = clock[0]
  assert compiled >= 100.0 and seconds == 0.0, (compiled, seconds)
  # The sampling chunk of a chain shorter than a warm-up window is compiled for it alone.
  result = mcmc.sample(jax.random.key(1), model, num_samples=30, num_warmup=60,
                       subsample_size=50, num_blocks=10, progress=False)
  assert clock[0] > compiled and result.sampling_seconds == 0.0


def test_an_interrupted_chain_keeps_its_draws(monkeypatch):
  """Ctrl-C while sampling used to lose every draw: the whole chunks drawn come back in
  the exception, the first draws of the uninterrupted chain."""
  import sys
  model, mean, _ = _linear_gaussian(n=500)
  run = functools.partial(mcmc.sample, jax.random.key(12), model, num_samples=500,
                          num_warmup=0, subsample_size=50, num_blocks=10,
                          reference_updates_every=0, progress=False,
                          reference_point=jnp.asarray(mean, jnp.float32) + 0.1)
  whole = run()
  module, chunks = sys.modules["dsgrad.mcmc.chain"], []

  def interrupted_bar(enabled, total):
    def update(n, close=False):  # the bar advances after each chunk of 200 draws
      chunks.append(n)
      if len(chunks) == 2:
        raise KeyboardInterrupt
    return update

  monkeypatch.setattr(module, "_bar", interrupted_bar)
  with pytest.raises(dsgrad.Interrupted, match="after 400 of 500 draws") as stop:
    run()
  assert isinstance(stop.value, KeyboardInterrupt)
  kept = stop.value.result
  assert isinstance(kept, mcmc.MCMCResult) and stop.value.step == 400
  np.testing.assert_array_equal(kept.samples, whole.samples[:400])
  assert kept.info.is_accepted.shape == (400,) and kept.proxy is not None
  np.testing.assert_array_equal(kept.state.position, kept.samples[-1])
  with pytest.raises(TypeError, match="run_chain from the kept result's state"):
    stop.value.resume()  # one interrupt type: a chain continues by run_chain, not resume


@pytest.mark.parametrize("which", ["sgld", "sghmc", "sgld without control variates"])
def test_sg_baselines_find_the_posterior(which):
  model, mean, cov = _linear_gaussian(seed=2)
  # A first-order proxy around a point off the mode: the gradient estimate is noisy.
  proxy = mcmc.taylor_proxy(model, jnp.asarray(mean, jnp.float32) + 0.05, order=1)
  precision = mcmc.laplace_precision(model, proxy)
  if which.startswith("sgld"):
    algo = mcmc.sgld(model, proxy, step_size=0.05 * float(np.min(np.diag(cov))),
                     subsample_size=50, control_variates="without" not in which)
  else:
    algo = mcmc.sghmc(model, proxy, mcmc.hmc_parameters(0.1, 5, precision), subsample_size=50)
  samples, _, _, _, _ = mcmc.run_chain(jax.random.key(14), algo.step,
                                       algo.init(jnp.zeros(3), None), 3000, progress=False)
  samples = samples[500:]
  sd = np.sqrt(np.diag(cov))
  # No Metropolis correction: a loose check that the chain sits on the posterior.
  assert np.all(np.abs(samples.mean(0) - mean) < 0.5 * sd), (samples.mean(0), mean)
  assert np.all(samples.std(0) < 3 * sd) and np.all(samples.std(0) > 0.3 * sd)


def test_sghmc_with_a_diagonal_mass_given_as_its_diagonal_moves_as_with_the_matrix():
  model, mean, cov = _linear_gaussian(seed=2)
  proxy = mcmc.taylor_proxy(model, jnp.asarray(mean, jnp.float32), order=1)
  diagonal = 1.0 / np.diag(cov)
  runs = []
  for mass in (diagonal, np.diag(diagonal)):
    algo = mcmc.sghmc(model, proxy, mcmc.hmc_parameters(0.1, 5, mass), subsample_size=50)
    runs.append(mcmc.run_chain(jax.random.key(14), algo.step, algo.init(jnp.zeros(3), None),
                               50, progress=False)[0])
  assert mcmc.hmc_parameters(0.1, 5, diagonal).inverse_mass_matrix.shape == (3,)
  np.testing.assert_allclose(runs[0], runs[1], rtol=1e-4, atol=1e-6)
  assert np.ptp(np.asarray(runs[0]), axis=0).min() > 0  # it moved


def test_effective_sample_size_of_an_ar1_process():
  rho, r = 0.8, 200_000
  rng = np.random.default_rng(0)
  x = np.zeros(r)
  noise = rng.normal(size=r)
  for t in range(1, r):
    x[t] = rho * x[t - 1] + noise[t]
  want = r * (1 - rho) / (1 + rho)
  got = mcmc.effective_sample_size(x[:, None])[0]
  assert abs(got / want - 1) < 0.1, (got, want)
  iid = mcmc.effective_sample_size(rng.normal(size=(5000, 1)))[0]
  assert 4000 < iid < 6500
  # A parameter the chain never moved taught nothing (arviz-stats alone would say R).
  stuck = np.column_stack([rng.normal(size=500), np.full(500, 2.0)])
  assert mcmc.effective_sample_size(stuck)[1] == 0.0


def test_a_chain_without_arviz_stats_keeps_its_draws_and_says_why_ess_is_missing(
    monkeypatch):
  monkeypatch.setitem(sys.modules, "arviz_stats", None)
  monkeypatch.setitem(sys.modules, "arviz_stats.base", None)
  with pytest.raises(ImportError, match=r"dsgrad\[diagnostics\]"):
    mcmc.effective_sample_size(np.zeros((10, 2)))
  model, _, _ = _linear_gaussian(seed=3)
  result = mcmc.sample(jax.random.key(16), model, num_samples=10, num_warmup=0,
                       subsample_size=100, num_blocks=10, progress=False)
  assert result.samples.shape == (10, 3) and np.all(np.isfinite(result.samples))
  assert np.all(np.isnan(result.ess))
  assert any("ess not computed" in w and "arviz-stats" in w for w in result.warnings)


def test_bad_input(logreg):
  with pytest.raises(ValueError, match="subsample_size"):
    mcmc.perturbed(logreg, logreg.num_data + 1, 1)
  with pytest.raises(ValueError, match="num_blocks"):
    mcmc.perturbed(logreg, 100, 0)
  with pytest.raises(ValueError, match="multiple"):
    mcmc.perturbed(logreg, 100, 7)
  with pytest.raises(ValueError, match="num_blocks"):
    mcmc.block_poisson(logreg, 10, 0, -1.0)
  with pytest.raises(ValueError, match="shape"):
    mcmc.taylor_proxy(logreg, jnp.zeros(logreg.latent_dim + 1))
  with pytest.raises(ValueError, match="reference_point"):
    mcmc.sample(jax.random.key(0), logreg, num_samples=5, subsample_size=10, num_blocks=1,
                reference_point=jnp.zeros(2), progress=False)
  with pytest.raises(ValueError, match="estimator"):
    mcmc.sample(jax.random.key(0), logreg, num_samples=5, subsample_size=10, num_blocks=1,
                estimator="exact", progress=False)
  for kwargs, match in ((dict(target_accept=1.0), "target_accept"),
                        (dict(target_accept=0.0), "target_accept"),
                        (dict(trajectory_length=0.0), "trajectory_length"),
                        (dict(position=jnp.full(logreg.latent_dim, jnp.nan)), "position must be finite"),
                        (dict(reference_point=jnp.full(logreg.latent_dim, jnp.inf)),
                         "reference_point must be finite")):
    with pytest.raises(ValueError, match=match):  # never a frozen or NaN chain
      mcmc.sample(jax.random.key(0), logreg, num_samples=5, subsample_size=10, num_blocks=1,
                  progress=False, **kwargs)
  with pytest.raises(ValueError, match="signs sum"):
    mcmc.signed_mean(np.ones((4, 2)), np.array([1.0, -1.0, -1.0, 1.0]))


def test_block_counts_no_subsample_can_meet_are_refused_before_the_setup(monkeypatch):
  """With more blocks than data, subsample_size="auto" chose all n data and the perturbed
  scheme then refused that size, which the user never gave, after the reference point's
  seconds; an explicit size out of range was refused only after them as well."""
  x, y, _ = synthetic_logistic_data(jax.random.key(0), 7, 2)
  model = logistic_regression(x, y)

  def no_setup(*args, **kwargs):
    raise AssertionError("the setup ran before the settings were checked")
  monkeypatch.setattr(sys.modules["dsgrad.mcmc.sample"], "find_reference_point", no_setup)
  run = functools.partial(mcmc.sample, jax.random.key(0), model, num_samples=5, progress=False)
  with pytest.raises(ValueError, match="num_blocks=10 is more than the n=7 data.*at most 7"):
    run(subsample_size="auto", num_blocks=10)
  with pytest.raises(ValueError, match=r"subsample_size must lie in \[1, n=7\], got 8"):
    run(subsample_size=8, num_blocks=1)
  with pytest.raises(ValueError, match="subsample_size=6 must be a multiple of num_blocks=4"):
    run(subsample_size=6, num_blocks=4, estimator="signed")
  with pytest.raises(ValueError, match="num_blocks=8 is more than the n=7 data"):
    mcmc.estimator_noise.choose_subsample_size(
        model, mcmc.taylor_proxy(model, jnp.zeros(2)), np.zeros((3, 2), np.float32),
        jax.random.key(1), num_blocks=8)


@pytest.mark.parametrize("thetas, match", [
    (np.zeros(4), r"\(K, 4\) array .* got shape \(4,\)"),  # one theta, not a batch of them
    (np.zeros((5, 3)), r"got shape \(5, 3\)"),
    (np.zeros((0, 4)), r"K >= 1"),
    (np.zeros((5, 4), int), "floating"),
    (np.array([[0.0] * 4, [np.nan] * 4]), r"NaN or inf values, in 1 of its 2 rows")])
def test_parameters_to_tune_at_are_refused_by_kind_where_they_enter(logreg, thetas, match):
  """The tuning helpers read the estimator at given latents: a single latent, another
  model's, none, integers or NaN gave bare matmul or shape errors, or NaN variances."""
  proxy = mcmc.taylor_proxy(logreg, jnp.zeros(logreg.latent_dim))
  for tune in (lambda t: mcmc.estimator_noise.choose_subsample_size(logreg, proxy, t,
                                                                    jax.random.key(0)),
               lambda t: mcmc.suggest_block_poisson(logreg, proxy, t, jax.random.key(0), 50),
               lambda t: mcmc.estimator_noise.variance_at_draws(logreg, proxy, t,
                                                                jax.random.key(0), 50)):
    with pytest.raises(ValueError, match="thetas .*" + match):
      tune(thetas)


def test_a_position_laid_out_like_the_latent_is_flattened_as_the_model_does():
  """A model written with a pytree latent takes its MCMC positions in that layout (and
  ``model.unravel`` lays the flat samples out again); a flat model refuses one by name."""
  x = jax.random.normal(jax.random.key(3), (200, 3))
  data = {"x": x, "y": (x[:, 0] > 0).astype(jnp.float32)}

  def log_lik(z, batch):
    logits = batch["x"] @ z["w"] + z["b"]
    return batch["y"] * logits - jnp.logaddexp(0.0, logits)

  latent = {"b": jnp.zeros(()), "w": jnp.zeros(3)}
  model = dsgrad.model_from_logdensity(
      lambda z: -0.5 * (z["b"] ** 2 + jnp.sum(z["w"] ** 2)), log_lik, data, latent)
  position = {"b": jnp.asarray(0.5), "w": jnp.array([1.0, -2.0, 3.0])}
  scheme = mcmc.perturbed(model, 20, 1)
  proxy = mcmc.taylor_proxy(model, jnp.zeros(4))
  state = mcmc.init(model, scheme, proxy, position, jax.random.key(0))
  assert model.unravel(state.position)["w"].tolist() == [1.0, -2.0, 3.0]
  assert float(model.unravel(state.position)["b"]) == 0.5
  sg = mcmc.sgld(model, proxy, step_size=1e-3, subsample_size=20)
  assert jnp.array_equal(sg.init(position, jax.random.key(0)).position, state.position)
  with pytest.raises(ValueError, match=r"laid out like the model's latent"):
    mcmc.init(model, scheme, proxy, {"w": jnp.zeros(3)}, jax.random.key(0))
  with pytest.raises(ValueError, match=r"laid out like the model's latent"):
    mcmc.taylor_proxy(model, {"b": jnp.zeros(()), "w": jnp.zeros(2)})
  with pytest.raises(ValueError, match=r"position must be finite"):
    sg.init({"b": jnp.asarray(jnp.nan), "w": jnp.zeros(3)}, jax.random.key(0))
  flat = Model(model.log_prior, model.log_likelihood, 200, 4, "flat")
  with pytest.raises(ValueError, match=r"must be a flat array of shape \(4,\).*its latent is flat"):
    mcmc.taylor_proxy(flat, position)


def test_a_proxy_or_mass_matrix_of_another_model_is_refused_where_it_enters():
  """A proxy built for a latent of another size broadcast into a bare "incompatible
  shapes" error inside the first step (or, for the mass matrix, inside the kernel)."""
  model, _, _ = _linear_gaussian(n=200, d=3)
  other, _, _ = _linear_gaussian(n=200, d=4)
  theirs = mcmc.taylor_proxy(other, jnp.zeros(4))
  ours = mcmc.taylor_proxy(model, jnp.zeros(3))
  wrong_size = r"proxy was built for a latent of another size: theta_star \(4,\)"
  for call in (lambda: mcmc.sgld(model, theirs, step_size=1e-3, subsample_size=20),
               lambda: mcmc.laplace_precision(model, theirs),
               lambda: mcmc.hmcecs(model, theirs, mcmc.perturbed(model, 20, 1),
                                   mcmc.hmc_parameters(0.1, 3, dim=3)),
               lambda: mcmc.choose_subsample_size(model, theirs, jnp.zeros((2, 3)),
                                                  jax.random.key(0))):
    with pytest.raises(ValueError, match=wrong_size):
      call()
  with pytest.raises(TypeError, match=r"proxy must be a dsgrad.mcmc.TaylorProxy"):
    mcmc.sgld(model, jnp.zeros(3), step_size=1e-3, subsample_size=20)
  with pytest.raises(ValueError, match=r"mass matrix of shape \(4,\), where model "
                                       r"'linear_gaussian' has d = 3"):
    mcmc.sghmc(model, ours, mcmc.hmc_parameters(0.1, 3, dim=4), subsample_size=20)
  # A subsample larger than the data: the message names the function, as its other
  # settings' do.
  with pytest.raises(ValueError, match=r"dsgrad.mcmc.sgld: subsample_size must be an "
                                       r"integer >= 1 and <= 200, got 201"):
    mcmc.sgld(model, ours, step_size=1e-3, subsample_size=201)
  with pytest.raises(ValueError, match=r"dsgrad.mcmc.sghmc: subsample_size"):
    mcmc.sghmc(model, ours, mcmc.hmc_parameters(0.1, 3, dim=3), subsample_size=201)


def test_a_precision_or_chain_state_that_is_not_one_is_refused_by_name():
  """laplace_draws with a precision that is not positive definite drew NaN without an
  error; run_chain given the position where the algorithm's state belongs failed inside
  the trace with "DynamicJaxprTracer has no attribute position"."""
  model, mean, _ = _linear_gaussian(n=200, d=3)
  proxy = mcmc.taylor_proxy(model, jnp.asarray(mean, jnp.float32))
  key = jax.random.key(0)
  for precision, why in ((-np.eye(3), "is not positive definite"),
                         (np.eye(2), r"must be of shape \(3, 3\), got shape \(2, 2\)"),
                         (np.full((3, 3), np.nan), "holds NaN or inf"),
                         (np.triu(np.ones((3, 3))), "is not symmetric")):
    with pytest.raises(ValueError, match="precision " + why):
      mcmc.laplace_draws(proxy, precision, key, 5)
  draws = mcmc.laplace_draws(proxy, 4 * np.eye(3), key, 4000)
  np.testing.assert_allclose(np.std(np.asarray(draws), 0), 0.5, rtol=0.05)  # se 1.1%
  algorithm = mcmc.sgld(model, proxy, step_size=1e-4, subsample_size=20)
  with pytest.raises(TypeError, match=r"state is a ArrayImpl, not a chain state.*"
                                      r"algorithm.init\(position, key\)"):
    mcmc.run_chain(key, algorithm.step, jnp.asarray(mean), 10, progress=False)
  draws, *_ = mcmc.run_chain(key, algorithm.step, algorithm.init(mean, None), 10,
                             progress=False)
  assert draws.shape == (10, 3)


def test_a_chain_that_diverges_is_refused_naming_the_iteration():
  """SGLD has no Metropolis correction: at too large a step its position overflows, and
  every later draw was NaN without an error."""
  model, mean, _ = _linear_gaussian(n=500, d=3)
  proxy = mcmc.taylor_proxy(model, jnp.asarray(mean, jnp.float32))
  algorithm = mcmc.sgld(model, proxy, step_size=10.0, subsample_size=20)
  with pytest.raises(mcmc.Diverged, match=r"the chain's position is not finite from "
                                          r"iteration \d+: it diverged.*smaller one") as info:
    mcmc.run_chain(jax.random.key(0), algorithm.step, algorithm.init(mean, None), 200,
                   chunk_size=50, progress=False)
  # The draws before the divergence are kept, every one finite, and no more.
  positions, signs, _, state, _ = info.value.result
  assert positions.shape == (info.value.iteration, 3) and signs.shape == (positions.shape[0],)
  assert np.all(np.isfinite(positions)) and np.all(np.isfinite(state.position))
  assert isinstance(info.value, ValueError)


def test_effective_sample_size_refuses_a_diverged_chain():
  samples = np.random.default_rng(0).normal(size=(100, 3))
  samples[40, 1] = np.nan
  with pytest.raises(ValueError, match=r"NaN or inf in parameter\(s\) \[1\]"):
    mcmc.effective_sample_size(samples)


def _heterogeneous_linear_gaussian(n=2000, d=3, seed=0):
  """Linear regression whose rows' scales vary (log-normal): with a first-order proxy the
  control variates' error ``-(x_k . delta)^2 / 2`` varies across data, so a small
  subsample gives a noisy estimator; the posterior is Gaussian in closed form."""
  rng = np.random.default_rng(seed)
  x = (rng.normal(size=(n, d)) * np.exp(0.5 * rng.normal(size=(n, 1)))).astype(np.float32)
  y = (x @ (0.5 * rng.normal(size=d)) + rng.normal(size=n)).astype(np.float32)
  data = dsgrad.models.base.model_data(x=x, y=y)
  log_2pi = np.log(2 * np.pi)
  model = Model(lambda z: -0.5 * jnp.sum(z ** 2) - 0.5 * d * log_2pi,
                lambda z, i: -0.5 * (i["y"] - i["x"] @ z) ** 2 - 0.5 * log_2pi,
                n, d, "heterogeneous regression", data=data)
  x64 = x.astype(np.float64)
  cov = np.linalg.inv(np.eye(d) + x64.T @ x64)
  return model, cov @ x64.T @ y.astype(np.float64), np.sqrt(np.diag(cov))


def test_a_noisy_estimator_warns_and_auto_subsample_size_lands_on_the_posterior():
  """m = 10 makes the estimator's variance at the draws far above 1 (read afresh there:
  the chain's own estimate is not): the chain ends many Monte Carlo standard errors from
  the closed-form posterior mean, and the result says so. subsample_size="auto" (the
  default) picks an m whose variance is about 1 where the chain goes: no warning, and
  every coordinate's mean within 3 standard errors (from the ESS)."""
  model, mean, sd = _heterogeneous_linear_gaussian()
  run = functools.partial(mcmc.sample, jax.random.key(1), model, num_samples=1000,
                          num_warmup=400, num_blocks=10, proxy_order=1, progress=False)
  results = {10: run(subsample_size=10), "auto": run()}
  errors = {m: (r.samples.mean(0) - mean) / (sd / np.sqrt(r.ess)) for m, r in results.items()}
  small, auto = results[10], results["auto"]
  assert np.max(np.abs(errors[10])) > 3, errors
  assert len(small.warnings) == 1 and "raise subsample_size from 10" in small.warnings[0]
  assert "theta*" not in small.warnings[0]  # found as the full-data mode, not suspected
  assert np.mean(small.estimator_variance) > 3
  # The chain's own estimate is conditioned on the subsamples it kept: far lower.
  assert np.mean(small.info.variance.with_control_variate) < np.mean(small.estimator_variance)
  assert auto.subsample_size > 10 and auto.warnings == ()
  assert np.median(auto.estimator_variance) < 1
  assert np.all(np.abs(errors["auto"]) < 3), (auto.subsample_size, errors)
  # The control variates are what keep the variance down: without them it is far larger.
  assert np.median(auto.info.variance.without_control_variate) > 100 * np.median(
      auto.info.variance.with_control_variate)
  assert auto.setup_evaluations > small.setup_evaluations  # choosing m is counted


def test_a_given_reference_point_far_from_the_posterior_is_named_and_no_m_past_n():
  """A given theta* three posterior standard deviations away with a first-order proxy,
  and a warm-up too short to move it: the control variates fit poorly where the chain
  samples, the variance is far above 1 and the draws are off. The warning names the
  reference point, and no subsample size larger than the data (it named m = 35,072 for
  500 data)."""
  model, mean, sd = _heterogeneous_linear_gaussian(n=500)
  result = mcmc.sample(jax.random.key(2), model, num_samples=100, num_warmup=50,
                       subsample_size=50, num_blocks=10, reference_point=mean + 3 * sd,
                       proxy_order=1, progress=False)
  assert np.mean(result.estimator_variance) > 500 / 50 * 3
  [message] = result.warnings
  assert "reference point theta*, and the one given may be far" in message, message
  assert "to about" not in message and "subsample_size='auto'" in message
  noise = mcmc.estimator_noise
  # Where some m below n would do, the sentence names it; a found theta* is not suspected.
  [fixable] = noise.variance_warnings(np.full(4, 8.0), 50, num_data=500)
  assert "raise subsample_size from 50 to about 400" in fixable and "theta*" not in fixable


def test_estimator_variance_is_the_subsample_estimators_spread():
  """EstimatorVariance.with_control_variate estimates the variance of the difference
  estimator over subsamples, and without_control_variate that of the plain n/m sum."""
  model, mean, sd = _heterogeneous_linear_gaussian(n=500)
  proxy = mcmc.taylor_proxy(model, jnp.asarray(mean, jnp.float32), order=1)
  theta = jnp.asarray(mean + 2 * sd, jnp.float32)
  idx = jax.random.randint(jax.random.key(0), (4000, 25), 0, model.num_data)
  estimate, variance = jax.vmap(
      lambda i: mcmc.proxy.estimate_with_variance(model, proxy, theta, i))(idx)
  l_hat = estimate + 0.5 * variance.with_control_variate
  plain = jax.vmap(lambda i: 500 * jnp.mean(model.log_likelihood_at(theta, i)))(idx)
  for draws, reported in ((l_hat, variance.with_control_variate),
                          (plain, variance.without_control_variate)):
    spread = np.var(np.asarray(draws, np.float64), ddof=1)
    # The reported variance is unbiased up to (m - 1) / m; its mean over 4,000 subsamples
    # is within 10% of the spread of the estimates themselves.
    np.testing.assert_allclose(np.mean(np.asarray(reported, np.float64)) * 25 / 24, spread,
                               rtol=0.1)


def test_a_second_order_proxy_of_a_gaussian_likelihood_is_exact_and_a_first_order_one_linear():
  """The proxy's full-data sum and its gradient (the potential's): at second order, for a
  Gaussian likelihood, the log likelihood itself (closed form: the sum of squares); at
  first order, the tangent ``S0 + A . delta``, its curvature left out (not computed)."""
  model, mean, sd = _heterogeneous_linear_gaussian(n=500)
  x, y = (np.asarray(model.data[k], np.float64) for k in ("x", "y"))
  theta = (mean + 2 * sd).astype(np.float32)
  log_lik = lambda t: np.sum(-0.5 * (y - x @ t) ** 2 - 0.5 * np.log(2 * np.pi))  # noqa: E731
  gradient = lambda t: x.T @ (y - x @ t)  # noqa: E731
  star = mean.astype(np.float32)
  for order in (1, 2):
    proxy = mcmc.taylor_proxy(model, star, order=order)
    value, grad = jax.value_and_grad(lambda t: mcmc.proxy_sum(proxy, t))(jnp.asarray(theta))
    delta = theta.astype(np.float64) - star
    want = (log_lik(theta), gradient(theta)) if order == 2 else (
        log_lik(star) + gradient(star) @ delta, gradient(star))
    np.testing.assert_allclose(float(value), want[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), want[1], rtol=1e-4, atol=1e-2)


def test_the_reference_point_is_refined_to_the_full_data_mode():
  """An item-response model (4,000 answers, 121 latents): the mode of a data subset leaves
  students with few answers in the subset far from their full-data mode. Damped Newton
  steps on the proxy's sums reach the mode: the Newton decrement there is below 0.01 (a
  step under a tenth of a posterior standard deviation), far below the subset mode's."""
  rng = np.random.default_rng(3)
  students, questions, n = 100, 20, 4000
  who, which = rng.integers(0, students, n), rng.integers(0, questions, n)
  truth = rng.normal(size=students)[who] - rng.normal(size=questions)[which]
  answers = (rng.uniform(size=n) < 1 / (1 + np.exp(-truth))).astype(np.float32)

  def log_lik(z, batch):
    logit = z["a"][batch["s"]] - z["b"][batch["q"]]
    return jnp.where(batch["y"] > 0, jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit))

  model = dsgrad.model_from_logdensity(
      lambda z: -0.5 * (jnp.sum(z["a"] ** 2) + jnp.sum(z["b"] ** 2)), log_lik,
      {"s": who.astype(np.int32), "q": which.astype(np.int32), "y": answers},
      {"a": jnp.zeros(students), "b": jnp.zeros(questions)})

  def decrement(proxy):
    grad = np.asarray(proxy.sum_grad + jax.grad(model.log_prior)(proxy.theta_star), np.float64)
    precision = np.asarray(mcmc.laplace_precision(model, proxy), np.float64)
    return float(grad @ np.linalg.solve(precision, grad))

  start = mcmc.taylor_proxy(model, mcmc.find_reference_point(model, jax.random.key(0)))
  refined, passes = mcmc.refine_reference_point(model, start)
  assert decrement(start) > 1.0, decrement(start)
  assert decrement(refined) < 0.01 and passes >= 2, (decrement(refined), passes)
  assert float(refined.sum_value) + float(model.log_prior(refined.theta_star)) > float(
      start.sum_value) + float(model.log_prior(start.theta_star))


def test_a_reference_point_that_drifted_from_the_mode_is_reported():
  """The warm-up moves theta* to the mean of recent draws; one coordinate 4 standard
  deviations from the mode is named, 2 are not."""
  precision = np.diag([4.0, 100.0])  # standard deviations 0.5 and 0.1
  mode = np.zeros(2)
  assert mcmc.estimator_noise.reference_drift_warnings(mode, [1.0, 0.2], precision) == ()
  (message,) = mcmc.estimator_noise.reference_drift_warnings(mode, [0.1, -0.4], precision)
  assert "4.0 posterior standard deviations" in message and "coordinate 1" in message


def test_sg_kernels_take_the_minibatch_as_an_argument():
  """SGLD's and SG-HMC's kernels step on the indices handed in (BlackJAX's idiom): with
  every datum, the estimated gradient is the posterior's exact gradient (closed form for
  a Gaussian posterior: -P (theta - mean)), so the SGLD step is that drift plus its own
  noise; SG-HMC's L steps each read their own row of indices."""
  model, mean, cov = _linear_gaussian(n=200, seed=4)
  precision = np.linalg.inv(cov)
  theta = jnp.asarray(mean, jnp.float32) + 0.3
  grad = mcmc.log_posterior_gradient(model, None, control_variates=False)
  everything = jnp.arange(model.num_data)
  exact = -precision @ (np.asarray(theta, np.float64) - mean)
  np.testing.assert_allclose(grad(theta, everything), exact, rtol=1e-3, atol=1e-2)
  eps, key = 1e-4, jax.random.key(0)
  moved, info = mcmc.sgld_kernel(grad)(key, mcmc.SGState(theta), everything, eps)
  noise = np.sqrt(eps) * np.asarray(jax.random.normal(key, theta.shape))
  np.testing.assert_allclose(np.asarray(moved.position) - noise,
                             np.asarray(theta) + 0.5 * eps * exact, rtol=0, atol=1e-5)
  assert int(info.num_evaluations) == model.num_data
  half = mcmc.sgld_kernel(grad)(key, mcmc.SGState(theta), everything[:100], eps)[0]
  assert not np.allclose(half.position, moved.position)  # the indices are what it reads
  hmc = mcmc.hmc_parameters(1e-3, 3, precision)
  kernel = mcmc.sghmc_kernel(grad, hmc, 1.0)
  rows = jnp.tile(everything[None, :50], (3, 1))
  state, info = kernel(key, mcmc.SGState(theta), rows)
  assert int(info.num_evaluations) == 150 and np.all(np.isfinite(state.position))
