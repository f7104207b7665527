"""Control-variate weights: fixed, or adapted from the moments of earlier steps.

Every control-variate estimator returns ``g + c * control`` with ``g`` the naive
gradient and ``control`` a zero-mean correction (``E grad f~ - grad f~`` for ``cv``,
``G - mean grad f~(w^n)`` for joint SAGA, ``g_bar - grad f~(w~)`` for joint SVRG). The
paper uses ``c = 1``. Any ``c`` chosen independently of the current draw keeps the
estimator unbiased, and the variance of the trace,

    tr V[g + c control] = tr V[g] + 2 c tr Cov(g, control) + c^2 tr V[control],

is smallest, coordinate by coordinate, at ``c_j* = -Cov(g_j, control_j) / V[control_j]``.
With ``control_weight="adaptive"`` each parameter coordinate gets its own ``c_j``,
estimated from exponential moving averages of ``(g - mean g) * control`` and
``control^2`` over the *earlier* steps (horizon ``H`` steps: decay ``1 - 1/H``) and
clipped to ``[0, 1]``: ``1`` is the paper's estimator, ``0`` the naive one. A poor
approximation, whose control adds more variance than it removes, is thereby switched off
instead of making the estimator worse than naive (up to the estimation error of ``c``).

Per coordinate rather than per parameter leaf: with per-group latents (a hierarchical
model's group effects, a rating model's per-user effects), joint SVRG's control on a
group's coordinates is, at every step where none of the group's rows is in the batch, the
snapshot's full-data gradient -- a constant push, up to an epoch old, uncorrelated with
the naive gradient, which Adam turns into a step of the full step size every step. One
weight for the whole leaf, set by its shared coordinates, kept that push: on a Poisson
model with per-user and per-item effects (50,000 rows, 3,500 effects, batch 5, 10,000
steps an epoch, two epochs of Adam with a cosine decay from 0.01) joint SVRG ended 13,000
nats below naive. Per coordinate, the push's weight goes to zero where it does not track
the gradient, and the same run ended 2,100 nats above naive
(``tests/test_per_group_stability.py`` checks a smaller case). Memory: three
params-sized moments and the weight.

References:
  Ross (2013), Simulation, Sec. 9.2 (the variance-minimizing control-variate coefficient).
  Geffner, Domke (2018). Using large ensembles of control variates for variational
  inference. NeurIPS.
  Paisley, Blei, Jordan (2012). Variational Bayesian inference with stochastic search. ICML.
"""

from __future__ import annotations

from typing import Any, NamedTuple


import jax
import jax.numpy as jnp
import optax

from dsgrad import checks


class AdaptiveWeightState(NamedTuple):
  """Moments behind ``control_weight="adaptive"``.

  Attributes:
    weight: per-coordinate ``c`` (params-shaped) for the *next* update, computed from
      earlier steps only.
    grad_mean: moving average of the naive gradient (params-shaped).
    cross: moving average of ``(g - grad_mean) * control`` (params-shaped).
    control_sq: moving average of ``control^2`` (params-shaped).
    count: updates seen (int32).
  """

  weight: Any
  grad_mean: Any
  cross: Any
  control_sq: Any
  count: jax.Array


def check_horizon(horizon, estimator: str) -> None:
  """Refuses a horizon below one step, naming the argument (the factories' declared kinds
  check the weight itself and that the horizon is positive)."""
  if horizon < 1:
    raise ValueError(f"dsgrad.{estimator}: control_weight_horizon must be >= 1 (steps), "
                     f"got {horizon!r}")


def init(control_weight, params):
  """``()`` for a fixed weight (no state); :class:`AdaptiveWeightState` otherwise."""
  if control_weight != "adaptive":
    return ()
  def filled(value):
    return jax.tree.map(lambda p: jnp.full(jnp.shape(p), value, jnp.result_type(p)), params)

  # Distinct buffers, so that the state can be donated.
  return AdaptiveWeightState(filled(1.0), optax.tree.zeros_like(params), filled(0.0),
                             filled(0.0), jnp.zeros([], jnp.int32))


def apply(control_weight, horizon, weight_state, updates, control):
  """``updates + c * control`` and the next weight state.

  Args:
    control_weight: a number (fixed ``c``) or ``"adaptive"``.
    horizon: the moving averages' horizon in steps (adaptive only).
    weight_state: from :func:`init`.
    updates: the naive gradient ``g``.
    control: the zero-mean control term.

  Returns:
    ``(estimate, new_weight_state)``.
  """
  if control_weight != "adaptive":
    if control_weight == 1:
      return optax.tree.add(updates, control), weight_state
    return optax.tree.add(updates, optax.tree.scale(control_weight, control)), weight_state
  s = weight_state
  out = jax.tree.map(lambda g, c, w: g + w.astype(c.dtype) * c, updates, control, s.weight)
  decay = 1.0 - 1.0 / horizon
  count = optax.safe_increment(s.count)
  # Bias-corrected mean of the earlier gradients (zero before the first step).
  seen = s.count.astype(jnp.float32)
  correction = jnp.where(s.count > 0, 1.0 / (1.0 - decay ** jnp.maximum(seen, 1.0)), 0.0)

  def ema(old, new):
    return decay * old + (1.0 - decay) * new

  cross = jax.tree.map(
      lambda m, g, c, gm: ema(m, (g - correction.astype(gm.dtype) * gm) * c),
      s.cross, updates, control, s.grad_mean)
  control_sq = jax.tree.map(lambda m, c: ema(m, c * c), s.control_sq, control)
  grad_mean = jax.tree.map(ema, s.grad_mean, updates)

  def leaf_weight(x, v, w):
    best = jnp.clip(-x / jnp.where(v > 0, v, 1.0), 0.0, 1.0)
    return jnp.where(v > 0, best, 1.0).astype(w.dtype)

  weight = jax.tree.map(leaf_weight, cross, control_sq, s.weight)
  return out, AdaptiveWeightState(weight, grad_mean, cross, control_sq, count)
