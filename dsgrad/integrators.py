"""Leapfrog integrators of Hamiltonian dynamics, shared by every sampler and bound.

Two forms of the same second-order symplectic scheme, written once:

* :func:`velocity_verlet` (kick-drift-kick): half a momentum step, a full position step,
  half a momentum step, ``L`` times. HMC-ECS (:mod:`dsgrad.mcmc.hmcecs`) and the AIS
  evaluation bound (:func:`dsgrad.mcvae.ais_hmc_log_evidence`) use it.
* :func:`position_verlet_step` (drift-kick-drift): half a position step, a full momentum
  step, half a position step, for one step at a time under a target that changes from
  step to step (the annealed chain of :mod:`dsgrad.annealing.dais`).

Both are volume preserving and time reversible, which is what makes the Metropolis
correction of HMC and the importance weights of AIS/DAIS valid. The mass matrix enters
through a function ``inverse_mass(p) = M^{-1} p`` (dense ``inv @ p``, diagonal ``p / m`` or
the identity), so that each caller keeps its own parameterization.

Example::

    >>> import jax.numpy as jnp
    >>> from dsgrad import integrators
    >>> potential = lambda x: (0.5 * jnp.sum(x ** 2), None)  # a standard normal
    >>> value_and_grad = integrators.value_and_grad_with_aux(potential)
    >>> start = integrators.initial_state(jnp.ones(2), jnp.zeros(2), value_and_grad)
    >>> end = integrators.velocity_verlet(start, value_and_grad, 0.1, lambda p: p, 10)
    >>> energy = lambda s: float(s.potential + 0.5 * jnp.sum(s.momentum ** 2))
    >>> abs(energy(end) - energy(start)) < 1e-2  # conserved up to O(step_size ** 2)
    True

References:
  Neal (2011). MCMC using Hamiltonian dynamics. Handbook of MCMC, Sec. 5.2.3.
  Leimkuhler, Reich (2004). Simulating Hamiltonian Dynamics, Ch. 2.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

__all__ = ["IntegratorState", "value_and_grad_with_aux", "initial_state", "velocity_verlet",
           "position_verlet_step"]


class IntegratorState(NamedTuple):
  """A point of the dynamics.

  Attributes:
    position: ``x``.
    momentum: ``p``.
    potential: ``U(x)`` (the negative log density, up to a constant).
    potential_grad: ``grad U(x)``.
    aux: whatever the potential function returns beside its value (e.g. the
      log-likelihood estimate of HMC-ECS), at ``x``.
  """

  position: Any
  momentum: Any
  potential: Any
  potential_grad: Any
  aux: Any


def value_and_grad_with_aux(potential_fn: Callable) -> Callable:
  """``x -> ((U(x), aux), grad U(x))`` from ``potential_fn: x -> (U(x), aux)``."""
  return jax.value_and_grad(potential_fn, has_aux=True)


def initial_state(position, momentum, value_and_grad: Callable) -> IntegratorState:
  """The :class:`IntegratorState` at ``(position, momentum)``."""
  (potential, aux), grad = value_and_grad(position)
  return IntegratorState(position, momentum, potential, grad, aux)


def velocity_verlet(state: IntegratorState, value_and_grad: Callable, step_size,
                    inverse_mass: Callable, num_steps) -> IntegratorState:
  """``num_steps`` kick-drift-kick leapfrog steps from ``state``.

  Args:
    state: the start; its ``potential_grad`` must be ``grad U(position)``.
    value_and_grad: ``x -> ((U(x), aux), grad U(x))`` (:func:`value_and_grad_with_aux`).
    step_size: ``epsilon``.
    inverse_mass: ``p -> M^{-1} p``.
    num_steps: ``L`` (may be traced).

  Returns:
    The :class:`IntegratorState` after ``L`` steps. Cost: ``L`` gradient evaluations.
  """
  def one(_, s: IntegratorState) -> IntegratorState:
    p = s.momentum - 0.5 * step_size * s.potential_grad
    x = s.position + step_size * inverse_mass(p)
    (u, aux), grad = value_and_grad(x)
    p = p - 0.5 * step_size * grad
    return IntegratorState(x, p, u, grad, aux)

  return jax.lax.fori_loop(0, num_steps, one, state)


def position_verlet_step(position, momentum, grad_log_density: Callable, step_size,
                         inverse_mass: Callable):
  """One drift-kick-drift leapfrog step under ``log density``'s gradient.

  Args:
    position: ``x``.
    momentum: ``v``.
    grad_log_density: ``x -> grad log pi(x)`` (the target of this step).
    step_size: ``epsilon``.
    inverse_mass: ``v -> M^{-1} v``.

  Returns:
    ``(x', v')``. Cost: one gradient evaluation.
  """
  half = position + 0.5 * step_size * inverse_mass(momentum)
  momentum = momentum + step_size * grad_log_density(half)
  return half + 0.5 * step_size * inverse_mass(momentum), momentum
