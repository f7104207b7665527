"""Log-evidence estimators of the MCVAE paper on a linear Gaussian model whose evidence
is known in closed form: the IWAE and Langevin SIS estimates are lower bounds in
expectation whose gap shrinks with K, the SIS weight terms equal a direct evaluation of
the ULA kernel densities, and AIS with HMC recovers log p(x) with enough steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dsgrad import mcvae

D, P, NOISE = 2, 3, 0.7
Z = 4.0


def _problem(seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  theta0 = jax.random.normal(k1, (P,))
  theta1 = jax.random.normal(k2, (P, D))
  x = theta0 + theta1 @ jax.random.normal(k3, (D,)) + 0.3

  def log_joint(z):
    r = x - theta0 - theta1 @ z
    return (-0.5 * jnp.sum(z ** 2) - 0.5 * D * jnp.log(2 * jnp.pi)
            - 0.5 * jnp.sum(r ** 2) / NOISE ** 2 - P * jnp.log(NOISE)
            - 0.5 * P * jnp.log(2 * jnp.pi))

  cov = np.asarray(theta1 @ theta1.T, np.float64) + NOISE ** 2 * np.eye(P)
  exact = stats.multivariate_normal(np.asarray(theta0, np.float64), cov).logpdf(
      np.asarray(x, np.float64))
  # A deliberately poor proposal: the right scale's order, a shifted mean.
  post_cov = np.linalg.inv(np.eye(D) + np.asarray(theta1.T @ theta1) / NOISE ** 2)
  post_mean = post_cov @ np.asarray(theta1.T @ (x - theta0)) / NOISE ** 2
  mean = jnp.asarray(post_mean + 0.5, jnp.float32)
  log_scale = jnp.asarray(0.5 * np.log(np.diag(post_cov)) + 0.3, jnp.float32)
  return log_joint, float(exact), mean, log_scale


def _mean_and_se(values):
  v = np.asarray(values, np.float64)
  return v.mean(), v.std(ddof=1) / np.sqrt(v.size)


def _assert_lower_bounds_that_tighten(exact, estimate, ks):
  """``estimate(k)`` returns draws of a log-evidence estimator with ``k`` steps or samples:
  each mean lies below ``exact`` (within Z se) and rises with ``k`` by more than Z se.
  Returns the ``(mean, se)`` pairs."""
  means = []
  for k in ks:
    m, se = _mean_and_se(estimate(k))
    assert m < exact + Z * se, (k, m, exact)
    means.append((m, se))
  for (m_small, se_small), (m_big, se_big) in zip(means, means[1:]):
    assert m_big - Z * np.hypot(se_small, se_big) > m_small, means
  return means


def test_iwae_is_a_lower_bound_that_tightens_with_k():
  log_joint, exact, mean, log_scale = _problem()

  def estimate(k):
    eps = jax.random.normal(jax.random.key(k), (4000, k, D))
    return jax.jit(jax.vmap(lambda e: mcvae.iwae_bound(log_joint, mean, log_scale, e)))(eps)

  means = _assert_lower_bounds_that_tighten(exact, estimate, (1, 10, 100))
  assert exact - means[0][0] > 0.05  # the proposal is poor: the K = 1 gap is visible
  # K = 1 is the VAE bound.
  eps = jax.random.normal(jax.random.key(0), (5, D))
  np.testing.assert_allclose(*jax.jit(lambda eps: (  # one program, not one per operation
      jax.vmap(lambda e: mcvae.iwae_bound(log_joint, mean, log_scale, e[None]))(eps),
      jax.vmap(lambda e: mcvae.vae_bound(log_joint, mean, log_scale, e))(eps)))(eps),
      rtol=1e-6)


def test_langevin_sis_weight_terms_match_the_kernel_densities():
  log_joint, _, mean, log_scale = _problem()
  k, eta = 4, 0.05
  eps0 = jax.random.normal(jax.random.key(1), (D,))
  noise = jax.random.normal(jax.random.key(2), (k, D))
  w, path = mcvae.langevin_sis_bound(log_joint, mean, log_scale, eps0, noise, eta,
                                     return_path=True)
  betas = np.asarray(mcvae.linear_schedule(k))
  z = np.asarray(path.z, np.float64)
  log_q = lambda v: mcvae.gaussian_log_prob(v, mean, log_scale)  # noqa: E731
  direct = []
  for i in range(1, k + 1):
    grad = jax.grad(lambda v, b=betas[i]: b * log_joint(v) + (1 - b) * log_q(v))
    m = lambda a, b_: stats.multivariate_normal(  # noqa: E731
        a + eta * np.asarray(grad(jnp.asarray(a, jnp.float32)), np.float64),
        2 * eta * np.eye(D)).logpdf(b_)
    direct.append(m(z[i], z[i - 1]) - m(z[i - 1], z[i]))
    # The chain follows Eq. 11.
    np.testing.assert_allclose(
        z[i], z[i - 1] + eta * np.asarray(grad(jnp.asarray(z[i - 1], jnp.float32)))
        + np.sqrt(2 * eta) * np.asarray(noise[i - 1]), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(path.log_ratios, direct, rtol=1e-4, atol=1e-4)
  want = (float(log_joint(path.z[-1])) - float(log_q(path.z[0])) + sum(direct))
  np.testing.assert_allclose(float(w), want, rtol=1e-5, atol=1e-4)
  # K = 0 is the VAE bound.
  np.testing.assert_allclose(
      mcvae.langevin_sis_bound(log_joint, mean, log_scale, eps0, jnp.zeros((0, D)), eta),
      mcvae.vae_bound(log_joint, mean, log_scale, eps0), rtol=1e-6)


def test_langevin_sis_is_a_lower_bound_that_tightens_with_k():
  log_joint, exact, mean, log_scale = _problem()

  def estimate(k):
    def one(key):
      k0, k1 = jax.random.split(key)
      return mcvae.langevin_sis_bound(log_joint, mean, log_scale,
                                      jax.random.normal(k0, (D,)),
                                      jax.random.normal(k1, (k, D)), 0.02)
    return jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(10 + k), 6000))

  _assert_lower_bounds_that_tighten(exact, estimate, (0, 5, 20))


def test_mala_ais_is_a_lower_bound_that_tightens_with_k():
  log_joint, exact, mean, log_scale = _problem()

  def estimate(k):
    def one(key):
      k0, k1, k2 = jax.random.split(key, 3)
      w, _ = mcvae.mala_ais_bound(log_joint, mean, log_scale, jax.random.normal(k0, (D,)),
                                  jax.random.normal(k1, (k, D)),
                                  jax.random.uniform(k2, (k,)) - 0.5, 0.05)
      return w
    return jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(20 + k), 3000))

  _assert_lower_bounds_that_tighten(exact, estimate, (1, 5, 15))
  # The path: a state either moves to the MALA proposal or stays.
  w, log_a, path = mcvae.mala_ais_bound(
      log_joint, mean, log_scale, jnp.zeros(D), jax.random.normal(jax.random.key(1), (6, D)),
      jnp.linspace(-0.5, 0.49, 6), 0.5, return_path=True)
  stayed = np.all(np.asarray(path.z[1:] == path.z[:-1]), axis=1)
  np.testing.assert_array_equal(stayed, ~np.asarray(path.accepted))
  assert 0 < int(np.sum(path.accepted)) < 6  # this draw both accepts and rejects
  probs = np.exp(np.asarray(path.log_accept_prob, np.float64))
  acc = np.asarray(path.accepted)
  np.testing.assert_allclose(float(log_a), np.sum(np.log(np.where(acc, probs, 1 - probs))),
                             rtol=1e-4)


def test_mala_ais_refuses_uncentred_accept_noise():
  # U(0, 1) draws passed as they are would reject every proposal whose draw exceeds 1/2:
  # a biased bound, not an error, unless the range is checked.
  log_joint, _, mean, log_scale = _problem()
  args = (log_joint, mean, log_scale, jnp.zeros(D), jnp.zeros((3, D)))
  uniforms = jnp.array([0.2, 0.7, 0.9])
  with pytest.raises(ValueError, match=r"centred uniforms v - 1/2"):
    mcvae.mala_ais_bound(*args, uniforms, 0.05)
  traced = jax.jit(lambda v: mcvae.mala_ais_bound(*args, v, 0.05))
  assert np.all(np.isnan(np.asarray(traced(uniforms))))
  assert np.all(np.isfinite(np.asarray(traced(uniforms - 0.5))))


# A 1-D model for the A-MCVAE gradient: p(z) = N(0, 1), p(x | z) = N(theta z, SIG^2),
# q(z | x) = N(mu, s^2); K = 2 MALA steps with a fixed step size.
_X1, _SIG1, _ETA1 = 1.5, 0.5, 0.4


def _expected_w_by_quadrature(mu, log_s, theta, n=1601, lim=8.0):
  """E[W] for K = 2 written independently in numpy (float64): W = r(z0)/2 + r(z1)/2,
  r = log p - log q, z1 the MALA move from z0; the sum over the accept decision is
  exact, (u0, u1) are integrated by the trapezoidal rule."""
  u = np.linspace(-lim, lim, n)
  w_trap = np.full(n, u[1] - u[0])
  w_trap[[0, -1]] /= 2
  dens = w_trap * np.exp(-u ** 2 / 2) / np.sqrt(2 * np.pi)
  s = np.exp(log_s)
  logp = lambda z: (-z ** 2 / 2 - (_X1 - theta * z) ** 2 / (2 * _SIG1 ** 2)  # noqa: E731
                    - np.log(2 * np.pi) - np.log(_SIG1))
  dlogp = lambda z: -z + theta * (_X1 - theta * z) / _SIG1 ** 2  # noqa: E731
  logq = lambda z: -(z - mu) ** 2 / (2 * s ** 2) - log_s - 0.5 * np.log(2 * np.pi)  # noqa: E731
  dlogq = lambda z: -(z - mu) / s ** 2  # noqa: E731
  lg = lambda z: 0.5 * logp(z) + 0.5 * logq(z)  # noqa: E731
  dlg = lambda z: 0.5 * dlogp(z) + 0.5 * dlogq(z)  # noqa: E731
  lm = lambda a, c: -(c - a - _ETA1 * dlg(a)) ** 2 / (4 * _ETA1)  # noqa: E731
  z0 = (mu + s * u)[:, None]
  y = z0 + _ETA1 * dlg(z0) + np.sqrt(2 * _ETA1) * u[None, :]
  alpha = np.exp(np.minimum(0, lg(y) - lg(z0) + lm(y, z0) - lm(z0, y)))
  r = lambda z: logp(z) - logq(z)  # noqa: E731
  w = 0.5 * r(z0) + 0.5 * (alpha * r(y) + (1 - alpha) * r(z0))
  return float(dens @ w @ dens)


def _amcvae_gradients(params, num_draws, num_particles, control_variate, reinforce=True):
  def surrogate(p, key):
    mu, log_s, theta = p

    def log_joint(z):
      return (-0.5 * jnp.sum(z ** 2) - jnp.sum((_X1 - theta * z) ** 2) / (2 * _SIG1 ** 2)
              - jnp.log(2 * jnp.pi) - jnp.log(_SIG1))

    k0, k1, k2 = jax.random.split(key, 3)
    w, log_a = jax.vmap(lambda e, u, v: mcvae.mala_ais_bound(
        log_joint, mu[None], log_s[None], e, u, v, _ETA1))(
            jax.random.normal(k0, (num_particles, 1)),
            jax.random.normal(k1, (num_particles, 2, 1)),
            jax.random.uniform(k2, (num_particles, 2)) - 0.5)
    if not reinforce:
      log_a = jax.lax.stop_gradient(log_a)
    return mcvae.amcvae_surrogate(w, log_a, control_variate)

  grads = jax.jit(jax.vmap(jax.grad(surrogate), in_axes=(None, 0)))(
      jnp.asarray(params, jnp.float32), jax.random.split(jax.random.key(7), num_draws))
  grads = np.asarray(grads, np.float64)
  return grads.mean(0), grads.std(0, ddof=1) / np.sqrt(num_draws)  # per coordinate


def test_amcvae_reinforce_gradient_is_unbiased():
  params = np.array([0.3, -0.5, 0.8])  # (mu, log s, theta)
  h = 1e-4
  finite_difference = np.array([
      (_expected_w_by_quadrature(*(params + h * e)) - _expected_w_by_quadrature(*(params - h * e)))
      / (2 * h) for e in np.eye(3)])
  mean, se = [], []
  for particles, cv in ((1, False), (2, True)):
    draws = 40_000 // particles
    grads = _amcvae_gradients(params, draws, particles, cv)
    mean.append(grads[0])
    se.append(grads[1])
  for m, s in zip(mean, se):
    np.testing.assert_array_less(np.abs(m - finite_difference), Z * s + 1e-3)
  # Without the REINFORCE term (accept/reject treated as fixed) the gradient is biased.
  m_rep, se_rep = _amcvae_gradients(params, 40_000, 1, False, reinforce=False)
  assert np.max(np.abs(m_rep - finite_difference) / se_rep) > 10 * Z
  # At the same number of particles (40,000), the leave-one-out control variate lowers
  # the standard error (measured ratio about 1.4 for theta).
  assert se[1][2] * 1.2 < se[0][2], se


@pytest.mark.parametrize("precondition", [False, True])
def test_ais_with_the_exact_proposal_returns_the_evidence_exactly(precondition):
  # log p(x, z) = 7 + log N(z; m, s^2) and q = N(m, s^2): every annealed density is
  # q(z) exp(7 beta), so each particle's log weight is exactly 7 whatever the chain does.
  # Scales far from 1 make a lost change-of-variables Jacobian (sum log s = -1.715 here)
  # visible.
  mean = jnp.array([1.0, -2.0, 0.5])
  log_scale = jnp.log(jnp.array([0.2, 3.0, 0.3]))

  def log_joint(z):
    return 7.0 + mcvae.gaussian_log_prob(z, mean, log_scale)

  for seed in range(3):
    estimate = mcvae.ais_hmc_log_evidence(
        jax.random.key(seed), log_joint, mean, log_scale, num_steps=10, num_particles=4,
        step_size=0.3 if precondition else 0.05, precondition=precondition)
    assert abs(float(estimate) - 7.0) < 0.01, (precondition, float(estimate))


@pytest.mark.parametrize("precondition", [False, True])
def test_ais_recovers_the_log_evidence(precondition):
  log_joint, exact, mean, log_scale = _problem()
  run = jax.jit(lambda key: mcvae.ais_hmc_log_evidence(
      key, log_joint, mean, log_scale, num_steps=200, num_particles=20, step_size=0.15,
      num_leapfrog=3, precondition=precondition))
  values = np.asarray([run(k) for k in jax.random.split(jax.random.key(3), 20)], np.float64)
  m, se = _mean_and_se(values)
  assert abs(m - exact) < Z * se + 0.02, (m, exact, se)
  short = jax.jit(lambda key: mcvae.ais_hmc_log_evidence(
      key, log_joint, mean, log_scale, num_steps=5, num_particles=1))
  few = np.asarray([short(k) for k in jax.random.split(jax.random.key(4), 400)], np.float64)
  m5, se5 = _mean_and_se(few)
  assert m5 < exact + Z * se5  # a lower bound in expectation, looser with 5 steps
  assert exact - m5 > exact - m - Z * np.hypot(se, se5)


def test_bad_input():
  log_joint, _, mean, log_scale = _problem()
  with pytest.raises(ValueError, match="\\(K, d\\)"):
    mcvae.iwae_bound(log_joint, mean, log_scale, jnp.zeros((D,)))
  with pytest.raises(ValueError, match="noise"):
    mcvae.langevin_sis_bound(log_joint, mean, log_scale, jnp.zeros(D), jnp.zeros((3, D + 1)),
                             0.1)
  with pytest.raises(ValueError, match="betas"):
    mcvae.langevin_sis_bound(log_joint, mean, log_scale, jnp.zeros(D), jnp.zeros((3, D)),
                             0.1, betas=jnp.linspace(0, 1, 3))
  with pytest.raises(ValueError, match="num_steps"):
    mcvae.ais_hmc_log_evidence(jax.random.key(0), log_joint, mean, log_scale, num_steps=0)


def test_bernoulli_log_likelihood():
  logits, xb = jnp.array([0.3, -1.2]), jnp.array([1.0, 0.0])
  p = jax.nn.sigmoid(logits)
  np.testing.assert_allclose(mcvae.bernoulli_log_likelihood(logits, xb),
                             np.log(p[0]) + np.log(1 - p[1]), rtol=1e-6)
  means, x = jnp.array([0.2, 0.7]), jnp.array([0.25, 0.5])
  np.testing.assert_allclose(mcvae.gaussian_log_likelihood(means, x, 0.1),
                             np.sum(stats.norm(np.asarray(means), 0.1).logpdf(np.asarray(x))),
                             rtol=1e-5)


def test_network_bad_input():
  from flax import nnx
  with pytest.raises(ValueError, match="\\[0, 1\\]"):
    mcvae.check_images(np.full((2, 4), 3.0))
  with pytest.raises(ValueError, match="pixels"):
    mcvae.check_images(np.zeros((2, 5)), 4)
  # The params where the images belong (ais_nll(images, params, key)): named, where it
  # was "float() argument must be a string or a real number, not 'dict'".
  with pytest.raises(TypeError, match="images has dtype object; data must be numbers"):
    mcvae.check_images({"encoder": np.zeros(3)})
  encoder = mcvae.MLPEncoder(16, 3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="last axis 16"):
    encoder(jnp.zeros((2, 15)))


@pytest.mark.parametrize("estimator", ["iwae_1", "iwae_10", "langevin_sis", "mala_ais"])
def test_each_weight_is_an_unbiased_estimate_of_the_evidence(estimator):
  """Ground truth for the reported log-evidence estimates: each ``log W`` is the log of an
  unbiased estimate of ``p(x)``, so ``E[exp(log W - log p(x))] = 1`` exactly (whatever the
  proposal, K or step size); the bounds above only say ``E[log W] <= log p(x)``. A
  missing Jacobian or kernel term moves the mean ratio away from 1."""
  log_joint, exact, mean, log_scale = _problem()
  # A proposal close enough to the posterior that the ratio's variance is small.
  mean, log_scale = mean - 0.4, log_scale - 0.2

  def one(key):
    k0, k1, k2 = jax.random.split(key, 3)
    if estimator.startswith("iwae"):
      k = int(estimator.split("_")[1])
      return mcvae.iwae_bound(log_joint, mean, log_scale, jax.random.normal(k0, (k, D)))
    if estimator == "langevin_sis":
      return mcvae.langevin_sis_bound(log_joint, mean, log_scale, jax.random.normal(k0, (D,)),
                                      jax.random.normal(k1, (5, D)), 0.02)
    w, _ = mcvae.mala_ais_bound(log_joint, mean, log_scale, jax.random.normal(k0, (D,)),
                                jax.random.normal(k1, (5, D)),
                                jax.random.uniform(k2, (5,)) - 0.5, 0.05)
    return w

  log_w = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(3), 20000)),
                     np.float64)
  ratio, se = _mean_and_se(np.exp(log_w - exact))
  assert se < 0.015, se  # the test can see a bias of a few hundredths of a nat
  assert abs(ratio - 1.0) < Z * se, (ratio, se)
