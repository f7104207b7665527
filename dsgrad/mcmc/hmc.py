"""Fixed-length Hamiltonian Monte Carlo on a given potential, as a kernel other samplers
compose with (BlackJAX's ``hmc.build_kernel`` shape: the potential and the tuning are
arguments of the kernel, not of its construction).

HMC-ECS (:mod:`dsgrad.mcmc.hmcecs`) is a Gibbs sampler whose ``theta`` move is any such
kernel run on the estimated potential of the current subsample; this one is its default.
The potential returns an auxiliary value (HMC-ECS: the likelihood estimate and its
sign), carried in the state and evaluated at the accepted position.

Example::

    >>> import jax, jax.numpy as jnp
    >>> from dsgrad.mcmc import hmc, hmc_parameters
    >>> potential = lambda x: (0.5 * jnp.sum(x ** 2), ())
    >>> kernel = hmc.build_kernel()
    >>> state = hmc.init(jnp.zeros(2), potential)
    >>> params = hmc_parameters(0.5, 4, dim=2)
    >>> state, info = jax.jit(kernel, static_argnums=2)(jax.random.key(0), state, potential,
    ...                                                  params)
    >>> state.position.shape, bool(0 <= info.acceptance_rate <= 1)
    ((2,), True)

References:
  Neal (2011), MCMC using Hamiltonian dynamics, Sec. 5.2 (the transition).
  Cabezas et al. (2024), BlackJAX: composable Bayesian inference in JAX (the kernel API).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from dsgrad import integrators


class HMCState(NamedTuple):
  """A position with its potential, gradient and the potential's auxiliary value."""

  position: jax.Array
  potential: jax.Array
  potential_grad: jax.Array
  aux: Any


class HMCInfo(NamedTuple):
  """One HMC transition's diagnostics.

  Attributes:
    acceptance_rate: ``min(1, exp(-Delta H))``.
    is_accepted: whether the position moved.
    energy_change: ``Delta H`` (``inf`` for a NaN energy: a divergence is rejected).
    num_integration_steps: leapfrog steps ``L``.
  """

  acceptance_rate: jax.Array
  is_accepted: jax.Array
  energy_change: jax.Array
  num_integration_steps: jax.Array


def mass_apply(matrix, vector):
  """``matrix @ vector`` for a dense ``(d, d)`` factor of the mass matrix, or, for a
  diagonal one stored as its ``(d,)`` diagonal (as BlackJAX stores it), their product:
  ``O(d)`` instead of ``O(d^2)``, which at a few thousand latents is most of a leapfrog
  step."""
  return matrix * vector if matrix.ndim == 1 else matrix @ vector


def init(position, potential_fn: Callable) -> HMCState:
  """The state at ``position`` for ``potential_fn(theta) -> (U, aux)``."""
  (potential, aux), grad = jax.value_and_grad(potential_fn, has_aux=True)(position)
  return HMCState(position, potential, grad, aux)


def build_kernel(integrator: Callable = integrators.velocity_verlet):
  """The transition ``kernel(key, state, potential_fn, params) -> (state, info)``.

  ``params`` holds ``step_size``, ``num_integration_steps``, ``inverse_mass_matrix`` and
  ``mass_cholesky`` (:func:`dsgrad.mcmc.hmc_parameters`; both ``(d,)`` diagonals for a
  diagonal mass matrix, else ``(d, d)``). The momentum is drawn as
  ``chol(M) z``; ``integrator`` runs ``L`` steps of the dynamics and the move is accepted
  with the Metropolis probability of the Hamiltonian ``U + p^T M^{-1} p / 2``.
  """

  def kernel(key, state: HMCState, potential_fn: Callable, params) -> tuple:
    k_momentum, k_accept = jax.random.split(key)
    inv_mass = params.inverse_mass_matrix
    momentum = mass_apply(params.mass_cholesky, jax.random.normal(
        k_momentum, state.position.shape, state.position.dtype))
    start = integrators.IntegratorState(state.position, momentum, state.potential,
                                        state.potential_grad, state.aux)
    velocity = lambda p: mass_apply(inv_mass, p)  # noqa: E731
    end = integrator(start, integrators.value_and_grad_with_aux(potential_fn),
                     params.step_size, velocity, params.num_integration_steps)
    energy_change = ((end.potential + 0.5 * end.momentum @ velocity(end.momentum))
                     - (state.potential + 0.5 * momentum @ velocity(momentum)))
    energy_change = jnp.where(jnp.isnan(energy_change), jnp.inf, energy_change)
    accept_prob = jnp.minimum(1.0, jnp.exp(-energy_change))
    take = jax.random.uniform(k_accept) < accept_prob
    moved = HMCState(end.position, end.potential, end.potential_grad, end.aux)
    state = jax.tree.map(lambda new, old: jnp.where(take, new, old), moved, state)
    return state, HMCInfo(accept_prob, take, energy_change, params.num_integration_steps)

  return kernel
