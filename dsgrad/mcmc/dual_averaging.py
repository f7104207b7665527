"""Dual averaging of an HMC step size towards a target acceptance rate.

References:
  Hoffman, Gelman (2014). The No-U-Turn sampler. JMLR (Sec. 3.2, Alg. 5).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dsgrad import checks


class DualAveraging(NamedTuple):
  """Dual-averaging state for the step size (Hoffman & Gelman 2014, Alg. 5)."""

  log_step: jax.Array
  log_step_avg: jax.Array
  error_sum: jax.Array
  count: jax.Array
  mu: jax.Array


# One program: run eagerly, its logarithms and sum were a small program each.
@jax.jit
def dual_averaging_init(step_size) -> DualAveraging:
  """Starts at ``step_size`` and shrinks towards ``log(10 step_size)`` (``mu``)."""
  log_step = jnp.log(jnp.asarray(step_size, jnp.float32))
  zero = jnp.zeros((), jnp.float32)  # float32 under jax_enable_x64 too, as the step size
  return DualAveraging(log_step, log_step, zero, zero, log_step + jnp.log(10.0))


@checks.arguments(target=checks.probability(low_open=True, high_open=True),
                  gamma=checks.positive(), t0=checks.positive(allow_zero=True),
                  kappa=checks.positive())
def dual_averaging_update(state: DualAveraging, accept_prob, target: float = 0.8,
                          gamma: float = 0.05, t0: float = 10.0,
                          kappa: float = 0.75) -> DualAveraging:
  """One update towards acceptance ``target``."""
  count = state.count + 1
  weight = 1.0 / (count + t0)
  error_sum = (1 - weight) * state.error_sum + weight * (target - accept_prob)
  log_step = state.mu - jnp.sqrt(count) / gamma * error_sum
  eta = count ** (-kappa)
  log_step_avg = eta * log_step + (1 - eta) * state.log_step_avg
  return DualAveraging(log_step, log_step_avg, error_sum, count, state.mu)


def integration_steps(step_size, trajectory_length, max_steps):
  """``L = ceil(trajectory_length / step_size)``, clipped to ``[1, max_steps]``."""
  return jnp.clip(jnp.ceil(trajectory_length / step_size), 1, max_steps).astype(jnp.int32)
