"""Differentiable annealed importance sampling (DAIS): the log weight of one chain.

From a Gaussian base ``q0(z)``, ``K`` steps of *uncorrected* underdamped HMC -- one
leapfrog step each, then partial momentum refreshment ``v <- gamma v + sqrt(1 - gamma^2) u``
-- move ``z`` along the annealing path ``log pi_k = beta_k log guide(z) + (1 - beta_k)
log q0(z)``. The log weight (Lemma 1)

    log w = log target(z_K) - log q0(z_0) + sum_k [log N(v_hat_k; 0, M) - log N(v_k; 0, M)]

(kinetic-energy differences across each leapfrog step) has ``E[log w] <= log Z`` and is a
reparameterized function of the noise, so its gradient in the base, the step size, the
temperatures, ``gamma``, the mass and the model is the DAIS gradient.

``guide`` drives the dynamics and ``target`` is evaluated once at the end. DAIS: both are
the full log joint. SL-DAIS: ``guide`` is the prior times a surrogate likelihood and
``target`` an unbiased mini-batch estimate of the log joint. With ``K = 0`` the log
weight is the base ELBO integrand ``log target(z_0) - log q0(z_0)``.

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML. Lemma 1, Alg. 1, Eq. 9-10.
  Geffner, Domke (2021). MCMC variational inference via uncorrected Hamiltonian
  annealing. NeurIPS. Zhang et al. (2021). Differentiable annealed importance sampling.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from dsgrad import checks
from dsgrad import integrators
from dsgrad.tempering import gaussian_log_prob, schedule_from_logits


class ChainSettings(NamedTuple):
  """The chain's constrained settings, from :func:`chain_settings`.

  Attributes:
    step_size: ``(K,)`` step sizes ``eta_k = clip(eta + kappa beta_k, 0, eta_max)``.
    refresh: ``gamma`` in ``(0, 1)``, the momentum kept at each refreshment.
    betas: ``(K + 1,)`` inverse temperatures, increasing from 0 to 1.
    mass: ``(d,)`` positive diagonal mass matrix ``M``.
    momentum_sd: ``(d,)`` standard deviation of the momenta, or ``None`` for ``sqrt(M)``
      (Hamiltonian dynamics with kinetic energy ``v^T M^-1 v / 2``, the paper's Alg. 3).
      NumPyro's ``AutoDAIS`` draws momenta with standard deviation ``M`` while its
      leapfrog still divides by ``M``; passing ``momentum_sd=M`` reproduces that chain.
      Any choice gives a valid bound (the refreshment keeps the momentum distribution).
  """

  step_size: jax.Array
  refresh: jax.Array
  betas: jax.Array
  mass: jax.Array
  momentum_sd: jax.Array | None = None


@checks.arguments(num_steps=checks.count(0), dim=checks.count(1),
                  step_size=checks.positive(), eta_max=checks.positive(),
                  refresh=checks.probability(low_open=True, high_open=True))
def init_chain_params(num_steps: int, dim: int, *, step_size: float = 0.01,
                      eta_max: float = 0.25, refresh: float = 0.9) -> dict:
  """Unconstrained chain parameters: ``eta = eta_max sigmoid(raw)`` and a slope ``kappa``
  (zero) for the step sizes ``eta_k = clip(eta + kappa beta_k, 0, eta_max)`` (the paper's
  App. A.6 parameterization, as NumPyro's ``AutoDAIS``), ``gamma = sigmoid(raw)``,
  schedule logits (zero: linear), ``log`` of a unit mass.

  Raises:
    ValueError: ``num_steps < 0``, ``eta_max <= 0``, a step size outside
      ``(0, eta_max)`` or ``refresh`` outside ``(0, 1)``.
  """
  if num_steps < 0:
    raise ValueError(f"the number of annealing steps K must be >= 0, got {num_steps}")
  if not eta_max > 0:
    raise ValueError(f"eta_max must be positive, got {eta_max}")
  if not 0 < step_size < eta_max:
    raise ValueError(f"step_size must lie in (0, eta_max={eta_max}), got {step_size}")
  if not 0 < refresh < 1:
    raise ValueError(f"refresh (gamma) must lie in (0, 1), got {refresh}")
  logit = lambda p: math.log(p / (1 - p))  # noqa: E731
  return {"step_size_raw": jnp.asarray(logit(step_size / eta_max), jnp.float32),
          "step_size_slope": jnp.zeros((), jnp.float32),
          "refresh_raw": jnp.asarray(logit(refresh), jnp.float32),
          "schedule_logits": jnp.zeros((num_steps,), jnp.float32),
          "log_mass": jnp.zeros((dim,), jnp.float32)}


@checks.arguments(eta_max=checks.positive())
def chain_settings(chain_params: dict, eta_max: float) -> ChainSettings:
  """Constrained :class:`ChainSettings` from :func:`init_chain_params`-shaped params
  (params without ``step_size_slope`` have a constant step size)."""
  betas = schedule_from_logits(chain_params["schedule_logits"])
  eta = eta_max * jax.nn.sigmoid(chain_params["step_size_raw"])
  slope = chain_params.get("step_size_slope", jnp.zeros((), eta.dtype))
  return ChainSettings(jnp.clip(eta + slope * betas[1:], 0.0, eta_max),
                       jax.nn.sigmoid(chain_params["refresh_raw"]), betas,
                       jnp.exp(chain_params["log_mass"]))


class DaisPath(NamedTuple):
  """The chain of :func:`dais_log_weight`: ``z`` ``(K + 1, d)`` and the ``K`` kinetic-energy
  differences."""

  z: jax.Array
  kinetic_terms: jax.Array


def dais_log_weight(guide: Callable, target: Callable, base_sample, base_log_prob: Callable,
                    momentum_noise, settings: ChainSettings, return_path: bool = False):
  """``log w`` of one DAIS chain (Lemma 1; Alg. 1 without the data subsampling).

  Args:
    guide: ``z -> log guide(z)``, the unnormalized log density the dynamics anneal to.
    target: ``z -> log target(z)``, evaluated once at ``z_K`` (an unbiased estimate of
      the log joint is allowed: the bound then holds in expectation over it too).
    base_sample: ``z_0``, a reparameterized draw from ``q0``.
    base_log_prob: ``z -> log q0(z)``.
    momentum_noise: ``(K, d)`` standard normal: row 0 draws the initial momentum, row
      ``k`` the refreshment after step ``k`` (the last row's refreshment is not used).
    settings: the chain's :class:`ChainSettings` (``betas`` of length ``K + 1``).
    return_path: also return the :class:`DaisPath`.

  Returns:
    ``log w`` (and the path).

  Raises:
    ValueError: noise that is not ``(K, d)``, or ``betas`` not of length ``K + 1``.
  """
  k = momentum_noise.shape[0] if momentum_noise.ndim == 2 else -1
  if momentum_noise.ndim != 2 or momentum_noise.shape[1:] != base_sample.shape:
    raise ValueError(f"momentum_noise must have shape (K, {base_sample.shape[0]}), got "
                     f"{momentum_noise.shape}")
  if settings.betas.shape != (k + 1,):
    raise ValueError(f"the schedule has {settings.betas.shape[0]} temperatures for K = {k} "
                     f"steps; it needs K + 1")
  step_sizes = jnp.broadcast_to(settings.step_size, (k,))
  gamma, mass = settings.refresh, settings.mass
  if settings.momentum_sd is None:
    momentum_sd, log_momentum_sd = jnp.sqrt(mass), 0.5 * jnp.log(mass)
  else:
    momentum_sd = jnp.broadcast_to(settings.momentum_sd, mass.shape)
    log_momentum_sd = jnp.log(momentum_sd)
  zero = jnp.zeros_like(mass)
  momentum_log_prob = lambda v: gaussian_log_prob(v, zero, log_momentum_sd)  # noqa: E731
  log_w0 = -base_log_prob(base_sample)
  if k == 0:
    out = log_w0 + target(base_sample)
    return (out, DaisPath(base_sample[None], jnp.zeros((0,)))) if return_path else out
  grad_guide, grad_base = jax.grad(guide), jax.grad(base_log_prob)

  def step(carry, inputs):
    z, v = carry
    beta, eta, refresh_noise = inputs
    z, v_hat = integrators.position_verlet_step(
        z, v, lambda x: beta * grad_guide(x) + (1 - beta) * grad_base(x), eta,
        lambda u: u / mass)
    kinetic = momentum_log_prob(v_hat) - momentum_log_prob(v)
    v = gamma * v_hat + jnp.sqrt(1 - gamma ** 2) * momentum_sd * refresh_noise
    return (z, v), (z, kinetic)

  v0 = momentum_sd * momentum_noise[0]
  refresh = jnp.concatenate([momentum_noise[1:], jnp.zeros_like(momentum_noise[:1])])
  (z_k, _), (zs, kinetic) = jax.lax.scan(step, (base_sample, v0),
                                         (settings.betas[1:], step_sizes, refresh))
  out = log_w0 + target(z_k) + jnp.sum(kinetic)
  if return_path:
    return out, DaisPath(jnp.concatenate([base_sample[None], zs]), kinetic)
  return out
