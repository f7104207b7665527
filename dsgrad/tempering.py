"""The annealed path between a base density ``q`` and a target ``p``:
``pi_beta(z) ∝ q(z)^(1 - beta) p(z)^beta`` for temperatures ``0 = beta_0 < ... < beta_K = 1``.

Shared by the Monte Carlo VAE bounds (:mod:`dsgrad.mcvae`) and differentiable AIS
(:mod:`dsgrad.annealing`): the temperature schedules (fixed :func:`linear_schedule`, or
learned :func:`schedule_from_logits`) and the diagonal Gaussian density
(:func:`gaussian_log_prob`) that both use as base and momentum distribution.

Example::

    >>> import jax.numpy as jnp
    >>> from dsgrad import tempering
    >>> tempering.linear_schedule(4).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    >>> bool(jnp.allclose(tempering.schedule_from_logits(jnp.zeros(4)),
    ...                   tempering.linear_schedule(4)))
    True

References:
  Neal (2001). Annealed importance sampling. Statistics and Computing.
  Thin et al. (2021). Monte Carlo variational auto-encoders. ICML, Sec. 4.1.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dsgrad import checks

__all__ = ["gaussian_log_prob", "linear_schedule", "schedule_from_logits", "check_schedule"]

_LOG_2PI = math.log(2 * math.pi)


def gaussian_log_prob(z, mean, log_scale) -> jax.Array:
  """``log N(z; mean, diag(exp(log_scale))^2)`` summed over the last axis."""
  std = (z - mean) * jnp.exp(-log_scale)
  return jnp.sum(-0.5 * std ** 2 - log_scale - 0.5 * _LOG_2PI, axis=-1)



@checks.arguments(num_steps=checks.count(0))
def linear_schedule(num_steps: int) -> jax.Array:
  """``beta_k = k / K`` for ``k = 0..K``."""
  return jnp.linspace(0.0, 1.0, num_steps + 1)


def schedule_from_logits(logits) -> jax.Array:
  """A learnable annealing schedule, increasing from 0 to 1 by construction.

  ``beta_k = sum_{i <= k} softmax(logits)_i`` with ``beta_0 = 0``: ``K`` free logits give
  ``K + 1`` temperatures; zero logits give :func:`linear_schedule`. The paper's third
  option, temperatures learned as inference parameters (Sec. 4.1).
  """
  logits = jnp.asarray(logits)
  if logits.ndim != 1:
    raise ValueError(f"schedule logits must be a vector (K,), got shape {logits.shape}")
  increments = jax.nn.softmax(logits)
  betas = jnp.concatenate([jnp.zeros((1,), increments.dtype), jnp.cumsum(increments)])
  return betas.at[-1].set(1.0)


def check_schedule(betas, num_steps: int) -> None:
  """Refuses, by shape, a schedule that is not ``(K + 1,)`` temperatures for ``K`` steps."""
  if betas.shape != (num_steps + 1,):
    raise ValueError(f"betas must have shape (K + 1,) = ({num_steps + 1},), got {betas.shape}")
