"""HMC with energy-conserving subsampling (HMC-ECS): perturbed and signed.

HMC-within-Gibbs on ``(theta, u)`` (Alg. 1): first the subsample ``u`` is updated by a
pseudo-marginal Metropolis-Hastings step with a correlated proposal (Eq. 3.5), then
``theta`` by HMC whose leapfrog dynamics *and* acceptance use the same estimated
Hamiltonian ``U_hat(theta) + K(p)`` with ``U_hat = -log |L_hat(theta; u)| - log p(theta)``
for the current ``u`` (Eq. 3.3-3.7). With the perturbed scheme the chain targets a
slightly perturbed posterior; with the block-Poisson scheme it targets ``|L_hat|`` and
expectations are sign-corrected (:func:`dsgrad.mcmc.signed_mean`).

The API follows BlackJAX: :func:`init` and :func:`build_kernel` are pure and jit-able,
states are NamedTuples, PRNG keys are explicit; :func:`dsgrad.mcmc.sample` adds warm-up
and a progress bar.

References:
  Dang, Quiroz, Kohn, Tran, Villani (2019). Hamiltonian Monte Carlo with energy
  conserving subsampling. JMLR 20. Sec. 3 (Alg. 1), 4, 5.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dsgrad import checks
from dsgrad import integrators
from dsgrad.mcmc.proxy import TaylorProxy
from dsgrad.mcmc.subsample import SubsampleScheme
from dsgrad.models.base import Model


class HMCECSState(NamedTuple):
  """State of the HMC-ECS chain.

  Attributes:
    position: ``(d,)`` current ``theta``.
    subsample: the current ``u`` (scheme-specific).
    log_likelihood: ``log |L_hat(theta; u)|`` at the current position and subsample.
    sign: sign of ``L_hat`` (always 1 for the perturbed scheme).
    potential: ``U_hat = -log |L_hat| - log p(theta)``.
    potential_grad: ``(d,)`` its gradient.
  """

  position: jax.Array
  subsample: Any
  log_likelihood: jax.Array
  sign: jax.Array
  potential: jax.Array
  potential_grad: jax.Array


class HMCECSInfo(NamedTuple):
  """Per-iteration diagnostics.

  Attributes:
    acceptance_rate: ``min(1, exp(-Delta H))`` of the HMC proposal.
    is_accepted: whether ``theta`` moved.
    subsample_accepted: whether the proposed subsample was accepted.
    energy_change: ``Delta H`` of the proposal (estimated Hamiltonian).
    num_integration_steps: leapfrog steps ``L``.
    num_evaluations: data log-likelihood (with gradient) evaluations this iteration.
  """

  acceptance_rate: jax.Array
  is_accepted: jax.Array
  subsample_accepted: jax.Array
  energy_change: jax.Array
  num_integration_steps: jax.Array
  num_evaluations: jax.Array


class HMCParameters(NamedTuple):
  """Tuning of the HMC move.

  Attributes:
    step_size: leapfrog step ``epsilon``.
    num_integration_steps: ``L`` (int32 scalar; may vary during warm-up).
    inverse_mass_matrix: ``(d, d)`` ``M^{-1}``.
    mass_cholesky: ``(d, d)`` lower Cholesky factor of ``M`` (momentum ``p = chol z``).
  """

  step_size: jax.Array
  num_integration_steps: jax.Array
  inverse_mass_matrix: jax.Array
  mass_cholesky: jax.Array


def hmc_parameters(step_size: float, num_integration_steps: int, mass_matrix=None,
                   dim: int | None = None) -> HMCParameters:
  """Builds :class:`HMCParameters` from a mass matrix ``M`` (default identity of ``dim``).

  The Cholesky factor and the inverse are computed here, once, outside any loop.
  """
  if mass_matrix is None:
    if dim is None:
      raise ValueError("pass mass_matrix or dim")
    mass_matrix = jnp.eye(dim)
  mass_matrix = jnp.asarray(mass_matrix, jnp.float32)
  if mass_matrix.ndim != 2 or mass_matrix.shape[0] != mass_matrix.shape[1]:
    raise ValueError(f"mass_matrix must be square, got shape {mass_matrix.shape}")
  chol = jnp.linalg.cholesky(mass_matrix)
  if not bool(jnp.all(jnp.isfinite(chol))):
    raise ValueError("mass_matrix is not positive definite")
  inverse = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(mass_matrix.shape[0]))
  checks.check_positive(step_size, "step_size")
  if not float(step_size) > 0:
    raise ValueError(f"step_size must be positive, got {step_size}")
  if int(num_integration_steps) < 1:
    raise ValueError(f"num_integration_steps must be at least 1, got {num_integration_steps}")
  return HMCParameters(jnp.asarray(step_size, jnp.float32),
                       jnp.asarray(num_integration_steps, jnp.int32), inverse, chol)


def _potential_fn(model: Model, scheme: SubsampleScheme, proxy: TaylorProxy, subsample):
  def potential(theta):
    log_lik, sign = scheme.log_likelihood(proxy, theta, subsample)
    return -log_lik - model.log_prior(theta), (log_lik, sign)
  return potential


def init(model: Model, scheme: SubsampleScheme, proxy: TaylorProxy, position,
         key) -> HMCECSState:
  """The chain's state at ``position`` with a fresh subsample drawn with ``key``.

  Raises:
    ValueError: if ``position`` does not have shape ``(d,)``.
  """
  position = jnp.asarray(position)
  if position.shape != (model.latent_dim,):
    raise ValueError(f"position must have shape ({model.latent_dim},), got {position.shape}")
  return reset(model, scheme, proxy, position, scheme.init(key))


def reset(model: Model, scheme: SubsampleScheme, proxy: TaylorProxy, position,
          subsample) -> HMCECSState:
  """The state at ``(position, subsample)`` recomputed (e.g. after the proxy changed)."""
  (potential, (log_lik, sign)), grad = jax.value_and_grad(
      _potential_fn(model, scheme, proxy, subsample), has_aux=True)(position)
  return HMCECSState(position, subsample, log_lik, sign, potential, grad)


def build_kernel(model: Model, scheme: SubsampleScheme):
  """The HMC-ECS transition ``kernel(key, state, proxy, parameters) -> (state, info)``.

  One iteration of Alg. 1: the pseudo-marginal subsample update, then ``L`` leapfrog
  steps on the estimated Hamiltonian for the (new) subsample and a Metropolis
  correction with the same Hamiltonian. Pure and jit-able; ``proxy`` and
  ``parameters`` are arguments so that warm-up can change them without recompiling.
  """

  def kernel(key, state: HMCECSState, proxy: TaylorProxy, params: HMCParameters):
    k_u, k_u_accept, k_p, k_accept = jax.random.split(key, 4)

    # 1. u | theta: pseudo-marginal MH with a correlated proposal (Eq. 3.5).
    if scheme.fixed:
      take_u = jnp.asarray(False)
    else:
      proposal = scheme.propose(k_u, state.subsample)
      candidate = reset(model, scheme, proxy, state.position, proposal)
      log_ratio = candidate.log_likelihood - state.log_likelihood
      take_u = jnp.log(jax.random.uniform(k_u_accept)) < log_ratio
      state = jax.tree.map(lambda new, old: jnp.where(take_u, new, old), candidate, state)

    # 2. theta, p | u: HMC on the estimated Hamiltonian (Eq. 3.6-3.7).
    potential = _potential_fn(model, scheme, proxy, state.subsample)
    inv_mass = params.inverse_mass_matrix
    momentum = params.mass_cholesky @ jax.random.normal(k_p, state.position.shape)
    kinetic0 = 0.5 * momentum @ inv_mass @ momentum
    start = integrators.IntegratorState(state.position, momentum, state.potential,
                                        state.potential_grad,
                                        (state.log_likelihood, state.sign))
    end = integrators.velocity_verlet(
        start, integrators.value_and_grad_with_aux(potential), params.step_size,
        lambda p: inv_mass @ p, params.num_integration_steps)
    theta, p, u_new, grad, (log_lik, sign) = end
    energy_change = (u_new + 0.5 * p @ inv_mass @ p) - (state.potential + kinetic0)
    energy_change = jnp.where(jnp.isnan(energy_change), jnp.inf, energy_change)
    accept_prob = jnp.minimum(1.0, jnp.exp(-energy_change))
    take = jax.random.uniform(k_accept) < accept_prob
    moved = HMCECSState(theta, state.subsample, log_lik, sign, u_new, grad)
    state = jax.tree.map(lambda new, old: jnp.where(take, new, old), moved, state)

    evaluations = scheme.evaluations(state.subsample) * (
        params.num_integration_steps + (0 if scheme.fixed else 1))
    info = HMCECSInfo(accept_prob, take, take_u, energy_change, params.num_integration_steps,
                      evaluations)
    return state, info

  return kernel


class SamplingAlgorithm(NamedTuple):
  """``init(position, key) -> state`` and ``step(key, state) -> (state, info)``."""

  init: Any
  step: Any


def hmcecs(model: Model, proxy: TaylorProxy, scheme: SubsampleScheme,
           parameters: HMCParameters) -> SamplingAlgorithm:
  """HMC-ECS with fixed tuning, as a BlackJAX-style pair of pure functions.

  Args:
    model: the model.
    proxy: the Taylor control variates (:func:`dsgrad.mcmc.taylor_proxy`).
    scheme: :func:`dsgrad.mcmc.perturbed` or :func:`dsgrad.mcmc.block_poisson`.
    parameters: :func:`hmc_parameters`.

  Returns:
    A :class:`SamplingAlgorithm`; jit ``step`` yourself or use :func:`dsgrad.mcmc.sample`.
  """
  kernel = build_kernel(model, scheme)
  return SamplingAlgorithm(
      lambda position, key: init(model, scheme, proxy, position, key),
      lambda key, state: kernel(key, state, proxy, parameters))
