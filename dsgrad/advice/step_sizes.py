"""Whether two optimizers take the same steps over the first part of a run: the test that
lets a raced lane keep the program compiled for its timing.

:func:`dsgrad.recommend` compiles each candidate's segment with the user's schedule built
for a guessed run length; once the step is timed, the length it affords is known, and
compiling again costs about a second per candidate. Keeping the program is harmless where
the two schedules set the same step sizes over the part of the run the race covers (a
cosine decay over ``T`` and over ``2 T`` differ by a quarter of a percent over its first
4%, by 1.8% over its first 10%), and wrong where they do not (a warm-up over a fraction
of the run, or a race that reaches far into a decay). A schedule is a function hidden
inside an optax transformation, so what is compared is what the transformations do: the
update each makes at a step count, from a fresh state whose step counts are set there, on
the same gradient.

Example::

    >>> import jax.numpy as jnp, optax
    >>> from dsgrad.advice import step_sizes
    >>> params = {"w": jnp.zeros(3)}
    >>> cosine = lambda steps: optax.adam(optax.cosine_decay_schedule(1e-2, steps))
    >>> step_sizes.same_steps(cosine(1000), cosine(2000), params, last_step=40)
    True
    >>> warm_up = lambda steps: optax.adam(optax.linear_schedule(0.0, 1e-2, steps // 10))
    >>> step_sizes.same_steps(warm_up(1000), warm_up(2000), params, last_step=40)
    False
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MATCH = 0.025
"""Largest relative difference of two updates for which their step sizes count as the
same. The rule before this test kept a program whose schedule was built for a length
within 30% of the run's, whatever the schedule: for a cosine decay over a race to 10% of
the run that is up to 1.0%, to 18% (about the furthest a race in a 10% share reaches)
3.3%. A schedule built for twice the steps stays within it over a race to 10% (1.8%
apart); a warm-up over a tenth of the run does not."""

PROBES = 9
"""Step counts compared, evenly spaced over the range."""


def at_step(state, step):
  """``state`` with every integer scalar (optax's step counts) set to ``step`` (an integer,
  traced or not)."""

  def moved(x):
    if isinstance(x, jax.Array | np.ndarray) and x.ndim == 0 and jnp.issubdtype(
        x.dtype, jnp.integer):
      return jnp.asarray(step).astype(x.dtype)
    return x

  return jax.tree.map(moved, state)


def _updates_at(transformation, grads, params, steps):
  """The updates at each of ``steps`` from the fresh state, stacked on a leading axis."""
  state = transformation.init(params)
  return jax.vmap(lambda step: transformation.update(grads, at_step(state, step), params)[0])(
      steps)


def _norms(stacked):
  """The norm of each of the stacked update trees (leading axis)."""
  squares = [jnp.sum(jnp.square(x.reshape(x.shape[0], -1)), axis=1)
             for x in jax.tree.leaves(stacked)]
  return jnp.sqrt(sum(squares))


def largest_difference(first, second, params, last_step: int, probes: int = PROBES) -> float:
  """The largest relative difference between the updates of two optax transformations at
  ``probes`` step counts evenly spaced over ``0 .. last_step``, each from its fresh state
  with the step counts set there, on a gradient of ones shaped like ``params``. One
  compiled program (about 0.1 s on a CPU core; evaluated op by op, the first comparison
  took 0.9 s, each operation compiled on its own).

  Returns:
    ``max |u1 - u2| / max(|u1|, |u2|)`` over the step counts where either update is not
    zero (norms over the whole update); 0 where the two agree at every one, ``inf`` where
    both are zero at every one.
  """
  steps = np.unique(np.linspace(0, max(int(last_step), 0), probes).round()).astype(np.int32)

  def gap(params, steps):
    grads = jax.tree.map(jnp.ones_like, params)
    u1, u2 = (_updates_at(t, grads, params, steps) for t in (first, second))
    scale = jnp.maximum(_norms(u1), _norms(u2))
    apart = _norms(jax.tree.map(jnp.subtract, u1, u2))
    worst = jnp.max(jnp.where(scale > 0, apart / jnp.where(scale > 0, scale, 1.0), 0.0))
    # Updates that are zero at every probe (optax.MultiSteps with its inner count moved
    # too) say nothing of the step sizes: not the same.
    return jnp.where(jnp.any(scale > 0), worst, jnp.inf)

  return float(jax.jit(gap)(params, jnp.asarray(steps)))


def same_steps(first, second, params, last_step: int, match: float = MATCH) -> bool:
  """Whether ``first`` and ``second`` make the same updates, within ``match``, at every
  step count up to ``last_step`` (:func:`largest_difference`). A transformation whose
  update needs more than gradients, state and params (optax's ``value=`` for
  ``reduce_on_plateau``), or cannot be vectorized over its step count, cannot be compared
  this way: not the same, so the caller compiles again, as it would without this test."""
  try:
    return largest_difference(first, second, params, last_step) <= match
  except (TypeError, ValueError):
    return False
