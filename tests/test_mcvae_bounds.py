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


def test_iwae_is_a_lower_bound_that_tightens_with_k():
  log_joint, exact, mean, log_scale = _problem()
  gaps = []
  for k in (1, 10, 100):
    eps = jax.random.normal(jax.random.key(k), (4000, k, D))
    values = jax.jit(jax.vmap(lambda e: mcvae.iwae_bound(log_joint, mean, log_scale, e)))(eps)
    m, se = _mean_and_se(values)
    assert m < exact + Z * se, (k, m, exact)
    gaps.append((exact - m, se))
  assert gaps[0][0] > 0.05  # the proposal is poor: the K = 1 gap is visible
  for (g_small, se_small), (g_big, se_big) in zip(gaps, gaps[1:]):
    assert g_big + Z * np.hypot(se_small, se_big) < g_small, gaps
  # K = 1 is the VAE bound.
  eps = jax.random.normal(jax.random.key(0), (5, D))
  np.testing.assert_allclose(
      jax.vmap(lambda e: mcvae.iwae_bound(log_joint, mean, log_scale, e[None]))(eps),
      jax.vmap(lambda e: mcvae.vae_bound(log_joint, mean, log_scale, e))(eps), rtol=1e-6)


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
  means = []
  for k in (0, 5, 20):
    keys = jax.random.split(jax.random.key(10 + k), 6000)

    def one(key, k=k):
      k0, k1 = jax.random.split(key)
      return mcvae.langevin_sis_bound(log_joint, mean, log_scale,
                                      jax.random.normal(k0, (D,)),
                                      jax.random.normal(k1, (k, D)), 0.02)

    m, se = _mean_and_se(jax.jit(jax.vmap(one))(keys))
    assert m < exact + Z * se, (k, m, exact)
    means.append((m, se))
  for (m_small, se_small), (m_big, se_big) in zip(means, means[1:]):
    assert m_big - Z * np.hypot(se_small, se_big) > m_small, means


def test_ais_recovers_the_log_evidence():
  log_joint, exact, mean, log_scale = _problem()
  run = jax.jit(lambda key: mcvae.ais_hmc_log_evidence(
      key, log_joint, mean, log_scale, num_steps=200, num_particles=20, step_size=0.15,
      num_leapfrog=3))
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


def test_mlp_networks_give_a_differentiable_bound():
  from flax import nnx
  rngs = nnx.Rngs(0)
  encoder = mcvae.MLPEncoder(16, 3, (8,), rngs=rngs)
  decoder = mcvae.MLPDecoder(3, 16, (8,), rngs=rngs)
  x = jnp.asarray(mcvae.check_images((np.arange(32).reshape(2, 4, 4) % 2).astype(float), 16))

  def loss(encoder, decoder):
    mean, log_scale = encoder(x)

    def one(xi, m, s, e):
      def log_joint(z):
        return (mcvae.gaussian_log_prob(z, jnp.zeros(3), jnp.zeros(3))
                + mcvae.bernoulli_log_likelihood(decoder(z), xi))
      return mcvae.iwae_bound(log_joint, m, s, e)

    eps = jax.random.normal(jax.random.key(0), (2, 5, 3))
    return -jnp.mean(jax.vmap(one)(x, mean, log_scale, eps))

  value, (g_enc, g_dec) = nnx.value_and_grad(loss, argnums=(0, 1))(encoder, decoder)
  assert np.isfinite(float(value)) and float(value) > 0
  for grads in (g_enc, g_dec):
    leaves = jax.tree.leaves(nnx.to_pure_dict(grads))
    assert leaves and all(np.all(np.isfinite(g)) for g in leaves)
    assert any(np.any(g != 0) for g in leaves)
  # The Bernoulli likelihood against its definition.
  logits, xb = jnp.array([0.3, -1.2]), jnp.array([1.0, 0.0])
  p = jax.nn.sigmoid(logits)
  np.testing.assert_allclose(mcvae.bernoulli_log_likelihood(logits, xb),
                             np.log(p[0]) + np.log(1 - p[1]), rtol=1e-6)


def test_network_bad_input():
  from flax import nnx
  with pytest.raises(ValueError, match="\\[0, 1\\]"):
    mcvae.check_images(np.full((2, 4), 3.0))
  with pytest.raises(ValueError, match="pixels"):
    mcvae.check_images(np.zeros((2, 5)), 4)
  encoder = mcvae.MLPEncoder(16, 3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="last axis 16"):
    encoder(jnp.zeros((2, 15)))
