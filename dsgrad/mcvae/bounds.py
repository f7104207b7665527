"""Monte Carlo estimators of the log evidence ``log p(x)`` of one datum.

Each function takes the unnormalized log joint ``log_joint(z) = log p(x, z)`` of a datum
and the Gaussian proposal ``q(z | x) = N(mean, diag(exp(log_scale))^2)`` (an encoder's
output), and returns ``log p_hat(x)`` for the given noise: an estimate whose
exponential is unbiased for ``p(x)``, so its expectation is a lower bound of
``log p(x)`` (Eq. 1). All are differentiable in the encoder and decoder parameters
through the reparameterized noise (the AIS evaluation estimator excepted: it is for
evaluation).

* :func:`vae_bound` -- one importance sample (the standard ELBO integrand);
* :func:`iwae_bound` -- ``K`` importance samples (Burda et al. 2015);
* :func:`langevin_sis_bound` -- L-MCVAE: SIS along the annealing path
  ``gamma_k = q^{1 - beta_k} p^{beta_k}`` with unadjusted Langevin kernels and backward
  kernels equal to the forward ones (Alg. 1, Eq. 14);
* :func:`ais_hmc_log_evidence` -- AIS with HMC transitions, the evaluation estimator
  (Sec. 4.3; Wu et al. 2016).

References:
  Thin, Kotelevskii, Durmus, Panov, Moulines, Doucet (2021). Monte Carlo variational
  auto-encoders. ICML. Sec. 2-3, Alg. 1, Eq. 1-14.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

_LOG_2PI = math.log(2 * math.pi)

LogJoint = Callable[[jax.Array], jax.Array]


def gaussian_log_prob(z, mean, log_scale) -> jax.Array:
  """``log N(z; mean, diag(exp(log_scale))^2)`` summed over the last axis."""
  std = (z - mean) * jnp.exp(-log_scale)
  return jnp.sum(-0.5 * std ** 2 - log_scale - 0.5 * _LOG_2PI, axis=-1)


def vae_bound(log_joint: LogJoint, mean, log_scale, eps) -> jax.Array:
  """``log p(x, z) - log q(z | x)`` at ``z = mean + exp(log_scale) * eps``, ``eps ~ N(0, I)``."""
  z = mean + jnp.exp(log_scale) * eps
  return log_joint(z) - gaussian_log_prob(z, mean, log_scale)


def iwae_bound(log_joint: LogJoint, mean, log_scale, eps) -> jax.Array:
  """``log (1/K) sum_i p(x, z_i) / q(z_i | x)`` for ``eps`` of shape ``(K, d)``.

  Raises:
    ValueError: if ``eps`` is not ``(K, d)`` with ``K >= 1``.
  """
  if eps.ndim != 2 or eps.shape[0] < 1:
    raise ValueError(f"iwae_bound needs eps of shape (K, d), got {eps.shape}")
  log_w = jax.vmap(lambda e: vae_bound(log_joint, mean, log_scale, e))(eps)
  return jax.scipy.special.logsumexp(log_w) - jnp.log(eps.shape[0])


def linear_schedule(num_steps: int) -> jax.Array:
  """``beta_k = k / K`` for ``k = 0..K``."""
  return jnp.linspace(0.0, 1.0, num_steps + 1)


def _check_schedule(betas, num_steps):
  if betas.shape != (num_steps + 1,):
    raise ValueError(f"betas must have shape (K + 1,) = ({num_steps + 1},), got {betas.shape}")


class LangevinPath(NamedTuple):
  """The SIS chain of :func:`langevin_sis_bound`, for diagnostics and tests.

  Attributes:
    z: ``(K + 1, d)`` the states ``z_0 .. z_K``.
    log_ratios: ``(K,)`` ``log m_k(z_k, z_{k-1}) - log m_k(z_{k-1}, z_k)``.
  """

  z: jax.Array
  log_ratios: jax.Array


def langevin_kernel_log_density(log_gamma: LogJoint, step_size, start, end) -> jax.Array:
  """``log m(start, end) = log N(end; start + eta grad log gamma(start), 2 eta I)`` (Eq. 10)."""
  drift = start + step_size * jax.grad(log_gamma)(start)
  d = start.shape[-1]
  return (-jnp.sum((end - drift) ** 2) / (4 * step_size)
          - 0.5 * d * jnp.log(4 * jnp.pi * step_size))


def langevin_sis_bound(log_joint: LogJoint, mean, log_scale, eps0, noise, step_size,
                       betas=None, return_path: bool = False):
  """The L-MCVAE estimate of ``log p(x)`` (Alg. 1, Eq. 14).

  ``z_0 = mean + exp(log_scale) * eps0``; for ``k = 1..K``,
  ``z_k = z_{k-1} + eta grad log gamma_k(z_{k-1}) + sqrt(2 eta) u_k`` with
  ``log gamma_k = beta_k log p(x, .) + (1 - beta_k) log q(. | x)``, and

      W = log p(x, z_K) - log q(z_0 | x) + sum_k [log m_k(z_k, z_{k-1}) - log m_k(z_{k-1}, z_k)].

  ``exp(W)`` is unbiased for ``p(x)`` (the backward kernels are the forward ULA
  kernels), and ``W`` is a reparameterized function of ``(eps0, u)``: its gradient in
  the encoder/decoder parameters (and in ``step_size`` and ``betas``) is the L-MCVAE
  gradient. With ``K = 0`` it is :func:`vae_bound`.

  Args:
    log_joint: ``z -> log p(x, z)``.
    mean: ``(d,)`` mean of the proposal ``q(z | x)``.
    log_scale: ``(d,)`` log standard deviations of the proposal.
    eps0: ``(d,)`` standard normal.
    noise: ``(K, d)`` standard normal ``u_1..u_K``.
    step_size: ``eta > 0``.
    betas: ``(K + 1,)`` increasing from 0 to 1 (default :func:`linear_schedule`).
    return_path: also return the :class:`LangevinPath`.

  Returns:
    ``W`` (and the path).

  Raises:
    ValueError: on ``noise`` that is not ``(K, d)`` or a schedule of the wrong length.
  """
  if noise.ndim != 2 or noise.shape[1:] != eps0.shape:
    raise ValueError(f"noise must have shape (K, {eps0.shape[0]}), got {noise.shape}")
  k = noise.shape[0]
  betas = linear_schedule(k) if betas is None else jnp.asarray(betas)
  _check_schedule(betas, k)
  z0 = mean + jnp.exp(log_scale) * eps0

  def log_q(z):
    return gaussian_log_prob(z, mean, log_scale)

  def step(z_prev, inputs):
    beta, u = inputs

    def log_gamma(z):
      return beta * log_joint(z) + (1 - beta) * log_q(z)

    z = z_prev + step_size * jax.grad(log_gamma)(z_prev) + jnp.sqrt(2 * step_size) * u
    ratio = (langevin_kernel_log_density(log_gamma, step_size, z, z_prev)
             - langevin_kernel_log_density(log_gamma, step_size, z_prev, z))
    return z, (z, ratio)

  z_last, (zs, ratios) = jax.lax.scan(step, z0, (betas[1:], noise))
  w = log_joint(z_last) - log_q(z0) + jnp.sum(ratios)
  if return_path:
    return w, LangevinPath(jnp.concatenate([z0[None], zs]), ratios)
  return w


def ais_hmc_log_evidence(key, log_joint: LogJoint, mean, log_scale, *, num_steps: int,
                         num_particles: int = 1, step_size: float = 0.1,
                         num_leapfrog: int = 3, betas=None) -> jax.Array:
  """AIS estimate of ``log p(x)`` with HMC transitions, starting from ``q(z | x)``.

  The evaluation estimator of Sec. 4.3 (the paper: ``K = 5`` HMC steps of 3 leapfrog
  steps each; pass many more for a tight estimate): particles start at
  ``z_0 ~ q``, move by one Metropolis-adjusted HMC step targeting ``gamma_k`` at each
  ``k``, and accumulate ``log gamma_k(z_{k-1}) - log gamma_{k-1}(z_{k-1})`` (Eq. 9);
  the estimate is ``logsumexp`` of the particles' log weights minus
  ``log num_particles``. Not meant to be differentiated.

  Args:
    key: PRNG key.
    log_joint: ``z -> log p(x, z)``.
    mean: ``(d,)`` mean of the proposal ``q(z | x)``.
    log_scale: ``(d,)`` log standard deviations of the proposal.
    num_steps: ``K >= 1`` annealing steps.
    num_particles: independent AIS runs averaged (in ``p``, not in ``log p``).
    step_size: HMC leapfrog step.
    num_leapfrog: leapfrog steps per HMC transition.
    betas: ``(K + 1,)`` schedule (default linear).

  Returns:
    The scalar estimate of ``log p(x)``.

  Raises:
    ValueError: on ``num_steps < 1``, ``num_particles < 1`` or a wrong schedule.
  """
  if num_steps < 1 or num_particles < 1:
    raise ValueError(f"num_steps and num_particles must be >= 1, got {num_steps}, "
                     f"{num_particles}")
  betas = linear_schedule(num_steps) if betas is None else jnp.asarray(betas)
  _check_schedule(betas, num_steps)

  def log_q(z):
    return gaussian_log_prob(z, mean, log_scale)

  def log_gamma(beta, z):
    return beta * log_joint(z) + (1 - beta) * log_q(z)

  def hmc(key, beta, z):
    k_p, k_u = jax.random.split(key)
    grad = jax.grad(lambda w: log_gamma(beta, w))
    p0 = jax.random.normal(k_p, z.shape)

    def leapfrog(_, carry):
      w, p = carry
      p = p + 0.5 * step_size * grad(w)
      w = w + step_size * p
      p = p + 0.5 * step_size * grad(w)
      return w, p

    w, p = jax.lax.fori_loop(0, num_leapfrog, leapfrog, (z, p0))
    log_accept = (log_gamma(beta, w) - 0.5 * jnp.sum(p ** 2)
                  - log_gamma(beta, z) + 0.5 * jnp.sum(p0 ** 2))
    take = jnp.log(jax.random.uniform(k_u)) < log_accept
    return jnp.where(take, w, z)

  def particle(key):
    k0, k_steps = jax.random.split(key)
    z0 = mean + jnp.exp(log_scale) * jax.random.normal(k0, mean.shape)

    def body(carry, inputs):
      z, log_w = carry
      k, beta_prev, beta = inputs
      log_w = log_w + log_gamma(beta, z) - log_gamma(beta_prev, z)
      return (hmc(k, beta, z), log_w), None

    keys = jax.random.split(k_steps, num_steps)
    (_, log_w), _ = jax.lax.scan(body, (z0, jnp.zeros(())), (keys, betas[:-1], betas[1:]))
    return log_w

  log_ws = jax.vmap(particle)(jax.random.split(key, num_particles))
  return jax.scipy.special.logsumexp(log_ws) - jnp.log(num_particles)
