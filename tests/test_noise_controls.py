"""Sticking the landing (path_derivative) and randomized QMC noise (multi_sample):
unbiased against a closed-form ELBO gradient, composable with the estimators, and
lower-variance where theory says so.

The model is a Poisson regression, whose ELBO under a mean-field Gaussian is closed form
(E exp(x.z) = exp(x.mu + sum x^2 sigma^2 / 2)), so the exact gradient is known, and whose
likelihood is not quadratic, so the Monte Carlo noise and its reduction are real.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad.models.base import Model, model_data

N, D = 40, 3


def _poisson_model():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, D)).astype(np.float32) * 0.5
  counts = rng.poisson(np.exp(x @ np.array([0.5, -0.3, 0.2]))).astype(np.float32)
  data = model_data(x=x, y=counts)

  def log_likelihood(z, rows):
    eta = rows["x"] @ z
    return rows["y"] * eta - jnp.exp(eta)

  def log_prior(z):
    return -0.5 * jnp.sum(z ** 2)

  model = Model(log_prior, log_likelihood, N, D, name="poisson", data=data)

  def exact_negative_elbo(params):
    mu, var = params["loc"], jnp.exp(2 * params["log_scale"])
    expected_lik = counts @ (x @ mu) - jnp.sum(jnp.exp(x @ mu + 0.5 * (x ** 2) @ var))
    expected_prior = -0.5 * jnp.sum(mu ** 2 + var)
    return -(expected_lik + expected_prior + dsgrad.meanfield_entropy(params["log_scale"]))

  return model, exact_negative_elbo


PARAMS = {"loc": jnp.array([0.3, -0.1, 0.1]), "log_scale": jnp.array([-1.0, -0.7, -1.2])}


def _full_batch_grads(objective, key, replicates, estimator=None):
  """``replicates`` full-batch gradients (flattened), each with fresh noise; through
  ``estimator`` (fused step) when given."""
  indices = jnp.arange(N)

  def one(k):
    noise = objective.sample_noise(k, N)
    if estimator is None:
      g = objective.grad(PARAMS, indices, noise, validate=False)
    else:
      state = estimator.init(PARAMS)
      g, _ = estimator.update(None, state, PARAMS, indices=indices, noise=noise,
                              objective=objective)
    return jnp.concatenate([g["loc"], g["log_scale"]])

  return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(key, replicates)), np.float64)


def _assert_unbiased(draws, exact):
  mean = draws.mean(0)
  se = draws.std(0, ddof=1) / np.sqrt(len(draws)) + 1e-6 * (1 + np.abs(exact))
  z = np.abs(mean - exact) / se
  assert np.all(z < 4.5), (mean, exact, z)


@pytest.fixture(scope="module")
def poisson():
  model, exact = _poisson_model()
  grad = jax.grad(exact)(PARAMS)
  return model, np.concatenate([grad["loc"], grad["log_scale"]]).astype(np.float64)


@pytest.mark.parametrize("shared", [True, False])
def test_path_derivative_is_unbiased(poisson, shared):
  model, exact = poisson
  objective = dsgrad.meanfield_gaussian(model, shared_noise=shared, path_derivative=True)
  _assert_unbiased(_full_batch_grads(objective, jax.random.key(1), 4000), exact)


def test_path_derivative_vanishes_at_an_exact_posterior():
  """y_n ~ N(z, I), z ~ N(0, I): the posterior N(sum y / (N + 1), I / (N + 1)) is in both
  families. There the path-derivative gradient is zero for every draw, while the
  closed-form-entropy gradient is not (its log_scale part has the score term)."""
  rng = np.random.default_rng(3)
  y = rng.normal(size=(N, D)).astype(np.float32) + 1.0
  data = model_data(y=y)
  model = Model(lambda z: -0.5 * jnp.sum(z ** 2),
                lambda z, i: -0.5 * jnp.sum((i["y"] - z) ** 2, axis=-1), N, D,
                name="gaussian", data=data)
  loc = jnp.asarray(y.sum(0) / (N + 1))
  log_sd = jnp.full((D,), -0.5 * np.log(N + 1.0), jnp.float32)
  meanfield = {"loc": loc, "log_scale": log_sd}
  fullrank = {"loc": loc, "log_diag": log_sd, "unit_lower": jnp.zeros((D, D))}
  indices = jnp.arange(N)
  for family, params in ((dsgrad.families.MeanFieldGaussian(D), meanfield),
                         (dsgrad.families.FullRankGaussian(D), fullrank)):
    stl = family.objective(model, path_derivative=True)
    plain = family.objective(model)
    worst_stl = worst_plain = 0.0
    for seed in range(5):
      noise = stl.sample_noise(jax.random.key(seed), N)
      worst_stl = max(worst_stl, max(float(jnp.max(jnp.abs(g))) for g in
                                     jax.tree.leaves(stl.grad(params, indices, noise))))
      worst_plain = max(worst_plain, max(float(jnp.max(jnp.abs(g))) for g in
                                         jax.tree.leaves(plain.grad(params, indices, noise))))
    assert worst_stl < 1e-3 * N, (type(family).__name__, worst_stl)
    assert worst_plain > 0.1, (type(family).__name__, worst_plain)


def test_path_derivative_turns_off_the_fused_kernel_not_meanfield_init():
  """A fused kernel computes the closed-form-entropy gradient, so it must not claim the
  path-derivative objective; the objective is still mean-field, and meanfield_init makes
  its params (it refused it as "not a mean-field one", from a user's own model too)."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 30, 3)
  model = dsgrad.models.logistic_regression(x, y)
  approx = dsgrad.approx.glm_mean_taylor(model)
  assert approx.fused_for(dsgrad.meanfield_gaussian(model)) is not None
  stl = dsgrad.meanfield_gaussian(model, path_derivative=True)
  assert approx.fused_for(stl) is None
  own = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z["w"] ** 2),
      lambda z, rows: -jax.nn.softplus(-rows["s"] * (rows["x"] @ z["w"])),
      {"x": x, "s": 2.0 * y - 1.0}, {"w": jnp.zeros(3)}, path_derivative=True)
  for objective in (stl, own):
    params = dsgrad.meanfield_init(objective, 0.0, -1.0)
    assert params["loc"].shape == params["log_scale"].shape == (3,)
    assert np.isfinite(objective.loss(params, jnp.arange(4), objective.sample_noise(
        jax.random.key(1), 4))).all()


def test_sobol_normal_rows_are_standard_normal():
  """Each point of the randomized set is exactly N(0, I): over random shifts, every row's
  coordinates have mean 0 and variance 1, and P(z < 1) = Phi(1), within standard errors."""
  draws = np.asarray(jax.vmap(lambda k: dsgrad.noise.sobol_normal(k, 16, 4))(
      jax.random.split(jax.random.key(0), 6000)), np.float64)  # (R, 16, 4)
  r = draws.shape[0]
  assert np.all(np.abs(draws.mean(0)) < 4.5 / np.sqrt(r))
  assert np.all(np.abs(draws.var(0) - 1.0) < 4.5 * np.sqrt(2.0 / r))
  below = (draws < 1.0).mean(0)
  p = 0.8413447460685429
  assert np.all(np.abs(below - p) < 4.5 * np.sqrt(p * (1 - p) / r))


@pytest.mark.parametrize("shared", [True, False])
def test_rqmc_is_unbiased_and_beats_independent_draws(poisson, shared):
  model, exact = poisson
  base = dsgrad.meanfield_gaussian(model, shared_noise=shared)
  rqmc = _full_batch_grads(dsgrad.multi_sample(base, 16, sampler="rqmc"),
                           jax.random.key(2), 3000)
  mc = _full_batch_grads(dsgrad.multi_sample(base, 16), jax.random.key(3), 3000)
  _assert_unbiased(rqmc, exact)
  _assert_unbiased(mc, exact)
  # Sixteen Sobol points in three dimensions on a smooth integrand: well below MC's variance.
  assert rqmc.var(0).sum() < 0.5 * mc.var(0).sum(), (rqmc.var(0).sum(), mc.var(0).sum())


@pytest.mark.parametrize("estimator", ["cv", "joint_svrg", "joint_saga"])
def test_rqmc_and_path_derivative_compose_with_control_variates(poisson, estimator):
  """The joint control variates with RQMC noise and the path derivative together: still
  unbiased (the control's expectation is exact whatever the draws' joint law)."""
  model, exact = poisson
  objective = dsgrad.multi_sample(
      dsgrad.meanfield_gaussian(model, path_derivative=True), 8, sampler="rqmc")
  factory = getattr(dsgrad, estimator)
  extra = {"every": 5} if estimator == "joint_svrg" else {}
  est = factory(objective, **extra)
  _assert_unbiased(_full_batch_grads(objective, jax.random.key(4), 1000, est), exact)


def test_multi_sample_refuses_what_it_cannot_do(poisson):
  model, _ = poisson
  base = dsgrad.meanfield_gaussian(model)
  with pytest.raises(ValueError, match="unknown sampler"):
    dsgrad.multi_sample(base, 4, sampler="sobol")
  with pytest.raises(ValueError, match="num_samples"):
    dsgrad.multi_sample(base, 0)
  other = dsgrad.Objective(base.loss_fn, lambda key, b: jax.random.uniform(key, (D,)) - 0.5,
                           N, shared_noise=True, data=base.data)
  with pytest.raises(ValueError, match="not dsgrad.gaussian_noise"):
    dsgrad.multi_sample(other, 4, sampler="rqmc")


def test_randomized_qmc_beyond_sobols_dimensions_is_ruled_out_not_raised():
  """A latent larger than scipy's 21,201 Sobol dimensions: ``multi_sample`` refuses rqmc
  when it is built, and the advice rules the candidate out with that reason."""
  from dsgrad.advice import candidates
  rng = np.random.default_rng(0)
  data = {"u": rng.integers(0, 21_300, 50).astype(np.int32), "y": np.ones(50, np.float32)}
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, rows: rows["y"] * z[rows["u"]], data,
      latent=21_300)
  with pytest.raises(ValueError, match="Sobol dimensions"):
    dsgrad.multi_sample(objective, 2, sampler="rqmc")
  [ruled_out] = candidates.build(("rqmc",), objective, {"z": jnp.zeros(21_300)}, 10)
  assert ruled_out.name == "rqmc" and "Sobol dimensions" in ruled_out.why_not


def _gaussian_target(dtype, n=20, d=50):
  """y_n ~ N(z, I), z ~ N(0, I) in ``d`` dimensions, with its ELBO in closed form for any
  q = N(m, L L^T): E log p(y, z) - E log q = -1/2 sum_n (|y_n - m|^2 + tr S) - 1/2 (|m|^2
  + tr S) - (n + 1) d/2 log 2 pi + H(q)."""
  y = np.random.default_rng(5).normal(size=(n, d)).astype(dtype) + 1.0
  data = model_data(y=y)
  log_2pi = np.log(2 * np.pi)
  model = Model(lambda z: -0.5 * jnp.sum(z ** 2) - 0.5 * d * log_2pi,
                lambda z, i: -0.5 * jnp.sum((i["y"] - z) ** 2, axis=-1)
                - 0.5 * d * log_2pi, n, d, name="gaussian", data=data)

  def exact_elbo(m, cov, log_diag):
    m, cov = np.asarray(m, np.float64), np.asarray(cov, np.float64)
    trace = np.trace(cov)
    expected = (-0.5 * np.sum((y.astype(np.float64) - m) ** 2) - 0.5 * n * trace
                - 0.5 * (m @ m + trace) - 0.5 * (n + 1) * d * log_2pi)
    return expected + np.sum(log_diag) + 0.5 * d * (1 + log_2pi)

  return model, exact_elbo


@pytest.mark.parametrize("x64", [False, True])
def test_full_rank_path_derivative_elbo_with_an_ill_conditioned_scale(x64):
  """A random lower-triangular L of size 50 has a condition number near 1e17: recovering
  eps from z = m + L eps by a triangular solve then returns |eps|^2 of 1e16 in float32.
  The path-derivative draw must still equal log p(x, z) - log q(z) at the draw, so its
  mean agrees with the closed-form ELBO within Monte Carlo error, in float32 and float64,
  and with the closed-form-entropy objective's estimate."""
  with jax.enable_x64(x64):
    dtype = np.float64 if x64 else np.float32
    model, exact_elbo = _gaussian_target(dtype)
    d = model.latent_dim
    family = dsgrad.families.FullRankGaussian(d)
    params = {"loc": jnp.full((d,), 0.5, dtype), "log_diag": jnp.linspace(-3.0, 1.0, d, dtype=dtype),
              "unit_lower": 3.0 * jax.random.normal(jax.random.key(3), (d, d), dtype)}
    chol = np.asarray(family.cholesky(params), np.float64)
    assert np.linalg.cond(chol) > 1e12
    exact = exact_elbo(params["loc"], chol @ chol.T, params["log_diag"])
    for path_derivative in (True, False):
      objective = family.objective(model, path_derivative=path_derivative)
      mean, se = dsgrad.elbo(objective, params, jax.random.key(1), 2000)
      assert abs(mean - exact) < 4 * se + 1e-4 * abs(exact), (path_derivative, mean, se, exact)


def test_path_derivative_gradient_is_the_path_term_of_log_q():
  """In float64 at a well-conditioned L, the score that uses the draw's own eps equals
  differentiating log q_v(T_w(eps)) (v = w held fixed) through the family's log_prob, draw
  by draw, for both families."""
  with jax.enable_x64(True):
    model, _ = _gaussian_target(np.float64, n=6, d=4)
    rng = np.random.default_rng(2)
    families = {
        dsgrad.families.MeanFieldGaussian(4): {
            "loc": jnp.asarray(rng.normal(size=4)), "log_scale": jnp.asarray(rng.normal(size=4) * 0.3)},
        dsgrad.families.FullRankGaussian(4): {
            "loc": jnp.asarray(rng.normal(size=4)), "log_diag": jnp.asarray(rng.normal(size=4) * 0.3),
            "unit_lower": jnp.asarray(rng.normal(size=(4, 4)) * 0.5)}}
    indices = jnp.arange(6)
    for family, params in families.items():
      objective = family.objective(model, path_derivative=True)

      @jax.jit  # one program a family, not one per operation
      def both(params, eps):
        def reference(w):
          z = family.transform(w, eps)
          log_joint = 6 * model.log_likelihood_at(z, indices) + model.log_prior(z)
          return jnp.mean(-log_joint + family.log_prob_at(jax.lax.stop_gradient(w), z))

        return objective.grad(params, indices, eps, validate=False), jax.grad(reference)(params)

      for seed in range(3):
        got, want = both(params, objective.sample_noise(jax.random.key(seed), 6))
        for key in params:
          np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("shape, shared", [((7,), True), ((6,), True), ((5,), False),
                                           ((3, 3), False)])
def test_gaussian_noise_gives_jax_random_normals_numbers_at_any_count(shape, shared):
  """An odd count is drawn as the next even count and cut (two XLA threads draw an odd
  count several times slower in a loop): the numbers are still those of
  ``jax.random.normal`` at the same key and shape, so runs and checkpoints repeat."""
  noise = dsgrad.gaussian_noise(shape, scale=2.0, shared=shared)(jax.random.key(4), 3)
  full = shape if shared else (3,) + shape
  np.testing.assert_array_equal(noise, 2.0 * jax.random.normal(jax.random.key(4), full))
