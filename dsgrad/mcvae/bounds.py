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

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from dsgrad import checks
from dsgrad import integrators
# The tempered path's pieces, shared with DAIS; re-exported as dsgrad.mcvae's.
from dsgrad.tempering import (check_schedule, gaussian_log_prob,  # noqa: F401
                              linear_schedule, schedule_from_logits)

LogJoint = Callable[[jax.Array], jax.Array]


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


class LangevinPath(NamedTuple):
  """The SIS chain of :func:`langevin_sis_bound`, for diagnostics and tests.

  Attributes:
    z: ``(K + 1, d)`` the states ``z_0 .. z_K``.
    log_ratios: ``(K,)`` ``log m_k(z_k, z_{k-1}) - log m_k(z_{k-1}, z_k)``.
  """

  z: jax.Array
  log_ratios: jax.Array


def langevin_kernel_log_density(log_gamma: LogJoint, step_size, start, end) -> jax.Array:
  """``log m(start, end) = log N(end; start + eta grad log gamma(start), 2 eta I)`` (Eq. 10).

  ``step_size`` is a scalar or a ``(d,)`` vector (the preconditioned kernel of Eq. 27:
  drift ``eta * grad`` and variance ``2 eta`` per coordinate).
  """
  return _ula_log_density(step_size, start, jax.grad(log_gamma)(start), end)


class _Point(NamedTuple):
  """A chain state with ``log p(x, z)``, ``log q(z | x)`` and their gradients, so that
  each step evaluates the decoder (and its gradient) once."""

  z: jax.Array
  log_p: jax.Array
  grad_p: jax.Array
  log_q: jax.Array
  grad_q: jax.Array


def _evaluator(log_joint: LogJoint, mean, log_scale):
  value_and_grad = jax.value_and_grad(log_joint)
  inv_var = jnp.exp(-2 * log_scale)

  def at(z):
    log_p, grad_p = value_and_grad(z)
    return _Point(z, log_p, grad_p, gaussian_log_prob(z, mean, log_scale),
                  -(z - mean) * inv_var)

  return at


def _log_gamma(beta, point: _Point):
  return beta * point.log_p + (1 - beta) * point.log_q


def _grad_gamma(beta, point: _Point):
  return beta * point.grad_p + (1 - beta) * point.grad_q


def _ula_log_density(step_size, start, grad_start, end):
  """``log N(end; start + eta grad_start, 2 eta)`` (Eq. 10 with the gradient given)."""
  eta = jnp.broadcast_to(step_size, start.shape)
  return jnp.sum(-(end - start - eta * grad_start) ** 2 / (4 * eta)
                 - 0.5 * jnp.log(4 * jnp.pi * eta))


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
    step_size: ``eta > 0``, a scalar or a ``(d,)`` vector (one step per coordinate).
    betas: ``(K + 1,)`` increasing from 0 to 1 (default :func:`linear_schedule`;
      :func:`schedule_from_logits` makes a learnable one).
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
  check_schedule(betas, k)
  at = _evaluator(log_joint, mean, log_scale)
  start = at(mean + jnp.exp(log_scale) * eps0)

  def step(prev, inputs):
    beta, u = inputs
    grad_prev = _grad_gamma(beta, prev)
    z = prev.z + step_size * grad_prev + jnp.sqrt(2 * step_size) * u
    new = at(z)
    ratio = (_ula_log_density(step_size, z, _grad_gamma(beta, new), prev.z)
             - _ula_log_density(step_size, prev.z, grad_prev, z))
    return new, (z, ratio)

  last, (zs, ratios) = jax.lax.scan(step, start, (betas[1:], noise))
  w = last.log_p - start.log_q + jnp.sum(ratios)
  if return_path:
    return w, LangevinPath(jnp.concatenate([start.z[None], zs]), ratios)
  return w


class MalaPath(NamedTuple):
  """The AIS chain of :func:`mala_ais_bound`, for diagnostics and tests.

  Attributes:
    z: ``(K + 1, d)`` the states ``z_0 .. z_K``.
    accepted: ``(K,)`` the accept/reject outcomes ``a_k`` (booleans).
    log_accept_prob: ``(K,)`` ``log alpha_k`` of each proposal.
  """

  z: jax.Array
  accepted: jax.Array
  log_accept_prob: jax.Array


def _log1mexp(x):
  """``log(1 - exp(x))`` for ``x <= 0``, stable (Maechler 2012), finite at ``x = 0``."""
  x = jnp.minimum(x, -1e-7)
  return jnp.where(x > -0.6931, jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def mala_ais_bound(log_joint: LogJoint, mean, log_scale, eps0, noise, accept_noise,
                   step_size, betas=None, return_path: bool = False):
  """The A-MCVAE estimate of ``log p(x)`` and the log probability of its A/R draws (Alg. 2).

  ``z_0 = mean + exp(log_scale) * eps0``; for ``k = 1..K`` a MALA step targeting
  ``gamma_k = q^{1 - beta_k} p^{beta_k}``: the proposal
  ``y = z_{k-1} + eta grad log gamma_k(z_{k-1}) + sqrt(2 eta) u_k`` (Eq. 20) is
  accepted (``a_k = 1``, ``z_k = y``) when ``v_k < alpha_k`` (Eq. 21), else
  ``z_k = z_{k-1}``. It returns

      W     = sum_k (beta_k - beta_{k-1}) [log p(x, z_{k-1}) - log q(z_{k-1} | x)]   (Eq. 9)
      log A = sum_k log alpha_k^{a_k}(z_{k-1}),   alpha^1 = alpha, alpha^0 = 1 - alpha.

  ``exp(W)`` is unbiased for ``p(x)`` (Eq. 23). Given the A/R outcomes, ``W`` is a
  reparameterized function of ``(eps0, u)``; the outcomes' own dependence on the
  parameters is what ``log A`` carries: ``grad E[W] = E[grad W + W grad log A]``
  (Eq. 25). :func:`amcvae_surrogate` turns ``(W, log A)`` of several particles into a
  scalar whose gradient is that estimate, with the leave-one-out control variate of
  Eq. 26.

  Args:
    log_joint: ``z -> log p(x, z)``.
    mean: ``(d,)`` mean of ``q(z | x)``.
    log_scale: ``(d,)`` log standard deviations of ``q(z | x)``.
    eps0: ``(d,)`` standard normal.
    noise: ``(K, d)`` standard normal ``u_1..u_K``.
    accept_noise: ``(K,)`` ``v_k - 1/2`` with ``v_k ~ U(0, 1)`` (centred, so that the
      noise has mean zero as :func:`dsgrad.approx.linearize` requires), in
      ``[-1/2, 1/2]``. Uncentred uniforms would reject every proposal whose ``v_k``
      exceeds 1/2 and bias the bound, so a value outside is refused (a ``ValueError``
      when the noise is concrete; under a trace, ``W`` and ``log A`` are NaN instead).
    step_size: ``eta > 0``, a scalar or a ``(d,)`` vector.
    betas: ``(K + 1,)`` schedule from 0 to 1 (default linear).
    return_path: also return the :class:`MalaPath`.

  Returns:
    ``(W, log_A)`` (and the path).

  Raises:
    ValueError: on noise of the wrong shape, concrete accept noise outside
      ``[-1/2, 1/2]``, or a schedule of the wrong length.
  """
  if noise.ndim != 2 or noise.shape[1:] != eps0.shape:
    raise ValueError(f"noise must have shape (K, {eps0.shape[0]}), got {noise.shape}")
  k = noise.shape[0]
  if accept_noise.shape != (k,):
    raise ValueError(f"accept_noise must have shape (K,) = ({k},), got {accept_noise.shape}")
  outside = jnp.any(jnp.abs(accept_noise) > 0.5)
  if checks.is_concrete(outside) and bool(outside):
    raise ValueError(
        "accept_noise must be centred uniforms v - 1/2 in [-1/2, 1/2] (v ~ U(0, 1)); got "
        f"values in [{float(jnp.min(accept_noise))}, {float(jnp.max(accept_noise))}]")
  betas = linear_schedule(k) if betas is None else jnp.asarray(betas)
  check_schedule(betas, k)
  at = _evaluator(log_joint, mean, log_scale)
  start = at(mean + jnp.exp(log_scale) * eps0)

  def step(carry, inputs):
    point, w, log_a = carry
    beta_prev, beta, u, v = inputs
    w = w + (beta - beta_prev) * (point.log_p - point.log_q)
    grad = _grad_gamma(beta, point)
    proposal = at(point.z + step_size * grad + jnp.sqrt(2 * step_size) * u)
    log_alpha = jnp.minimum(
        0.0, _log_gamma(beta, proposal) - _log_gamma(beta, point)
        + _ula_log_density(step_size, proposal.z, _grad_gamma(beta, proposal), point.z)
        - _ula_log_density(step_size, point.z, grad, proposal.z))
    accept = jnp.log(v + 0.5) < jax.lax.stop_gradient(log_alpha)
    point = jax.tree.map(lambda y, z: jnp.where(accept, y, z), proposal, point)
    log_a = log_a + jnp.where(accept, log_alpha, _log1mexp(log_alpha))
    return (point, w, log_a), (point.z, accept, log_alpha)

  zero = jnp.zeros((), start.z.dtype)
  (_, w, log_a), (zs, accepted, log_alphas) = jax.lax.scan(
      step, (start, zero, zero), (betas[:-1], betas[1:], noise, accept_noise))
  # Under a trace the range cannot raise: a NaN is seen where a biased bound would not be.
  w, log_a = (jnp.where(outside, jnp.nan, x) for x in (w, log_a))
  if return_path:
    return w, log_a, MalaPath(jnp.concatenate([start.z[None], zs]), accepted, log_alphas)
  return w, log_a


def amcvae_surrogate(w, log_a, control_variate: bool = True) -> jax.Array:
  """A scalar whose value is ``mean_i W_i`` and whose gradient is the A-MCVAE estimate.

  For ``n`` particles of one datum, the gradient is
  ``mean_i [grad W_i + (W_i - b_i) grad log A_i]`` (Eq. 25), with the leave-one-out
  baseline ``b_i = mean_{j != i} W_j`` (Eq. 26; independent of particle ``i``, so the
  estimate stays unbiased) when ``control_variate`` and ``n >= 2``, else ``b_i = 0``
  (plain REINFORCE).

  Args:
    w: ``(n,)`` the particles' ``W`` from :func:`mala_ais_bound`.
    log_a: ``(n,)`` their ``log A``.
    control_variate: use the leave-one-out baseline.

  Returns:
    The surrogate scalar.
  """
  w, log_a = jnp.atleast_1d(w), jnp.atleast_1d(log_a)
  n = w.shape[0]
  baseline = jnp.zeros_like(w)
  if control_variate and n >= 2:
    baseline = (jnp.sum(w) - w) / (n - 1)
  score = jax.lax.stop_gradient(w - baseline) * (log_a - jax.lax.stop_gradient(log_a))
  return jnp.mean(w + score)


def _whitened(log_joint: LogJoint, mean, log_scale) -> LogJoint:
  """``v -> log p(x, mean + s * v) + sum(log s)``: the log joint in the coordinates
  ``v = (z - mean) / s`` with the Jacobian of the change of variables, so that its
  integral over ``v`` is the same ``p(x)``.

  The shift, the scales and their log-determinant are computed here, once, so that the
  returned function does not depend on what the caller later rebinds its names to.
  """
  scale = jnp.exp(log_scale)
  log_det = jnp.sum(log_scale)

  def whitened(v):
    return log_joint(mean + scale * v) + log_det

  return whitened


@checks.arguments(key=checks.prng_key(), num_steps=checks.count(1),
                  num_particles=checks.count(1), step_size=checks.positive(),
                  num_leapfrog=checks.count(1))
def ais_hmc_log_evidence(key, log_joint: LogJoint, mean, log_scale, *, num_steps: int,
                         num_particles: int = 1, step_size: float = 0.1,
                         num_leapfrog: int = 3, betas=None,
                         precondition: bool = False) -> jax.Array:
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
    precondition: run the chain in the coordinates ``v = (z - mean) / exp(log_scale)``
      (a mass matrix equal to the proposal's precision), so that one ``step_size``
      suits latents whose posterior scales differ; the estimate targets the same
      ``log p(x)`` (the change of variables is accounted for).

  Returns:
    The scalar estimate of ``log p(x)``.

  Raises:
    ValueError: on ``num_steps < 1``, ``num_particles < 1`` or a wrong schedule.
  """
  if num_steps < 1 or num_particles < 1:
    raise ValueError(f"num_steps and num_particles must be >= 1, got {num_steps}, "
                     f"{num_particles}")
  betas = linear_schedule(num_steps) if betas is None else jnp.asarray(betas)
  check_schedule(betas, num_steps)
  if precondition:
    log_joint = _whitened(log_joint, mean, log_scale)
    mean, log_scale = jnp.zeros_like(mean), jnp.zeros_like(log_scale)

  def log_q(z):
    return gaussian_log_prob(z, mean, log_scale)

  def log_gamma(beta, z):
    return beta * log_joint(z) + (1 - beta) * log_q(z)

  def hmc(key, beta, z):
    k_p, k_u = jax.random.split(key)
    value_and_grad = integrators.value_and_grad_with_aux(
        lambda w: (-log_gamma(beta, w), None))
    p0 = jax.random.normal(k_p, z.shape)
    start = integrators.initial_state(z, p0, value_and_grad)
    end = integrators.velocity_verlet(start, value_and_grad, step_size, lambda p: p,
                                      num_leapfrog)
    w, p = end.position, end.momentum
    log_accept = (-end.potential - 0.5 * jnp.sum(p ** 2)
                  + start.potential + 0.5 * jnp.sum(p0 ** 2))
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
