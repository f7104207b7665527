"""SMISO: stochastic MISO for finite sums of expectations (App. A). An optimizer."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad import checks
from dsgrad import tables
from dsgrad.estimators import _common
from dsgrad.objective import Objective

class SmisoState(NamedTuple):
  """State of :func:`smiso`.

  Attributes:
    table: per-datum iterates ``w_n``, leaves ``(N, *shape)``.
    running_mean: ``w_bar = mean_n w_n``, SMISO's current iterate (params-shaped).
  """

  table: Any
  running_mean: Any


@checks.arguments(objective=checks.objective(),
                  step_size=checks.positive(), alpha=checks.probability(low_open=True),
                  max_table_bytes=checks.byte_budget())
def smiso(objective: Objective, step_size: float, alpha: float = 0.9, *,
          max_table_bytes: int | str | None = "auto") -> optax.GradientTransformationExtraArgs:
  """SMISO (Bietti & Mairal, 2017), the paper's incremental baseline for large data.

  For each distinct datum ``n`` of the batch (Eq. 18-19, 24):

      w_n   <- (1 - alpha) w_n + alpha (w_bar - step_size * grad f(w_bar; n, eps_n))
      w_bar <- w_bar + (1/N) sum_{n in B} (w_n_new - w_n_old)

  The output is the step ``w_bar_new - params``, to be added to the params
  (``optax.apply_updates``). The effective SGD step size is
  ``alpha * |B| * step_size / N`` (Eq. 26).

  SMISO is an optimizer, not a gradient estimator: momentum or adaptive scaling would
  break its unbiasedness (App. A). :func:`dsgrad.checked` verifies each step that
  ``params`` equal its own iterate ``w_bar`` (otherwise a transform after it rescaled its
  step) and raises a ``ValueError`` explaining this. Batches are assumed to hold distinct indices (sampling without
  replacement); repeated indices are counted once.

  Cost per step: ``B`` per-datum gradients (SMISO needs them individually). Memory: the
  table of ``N`` iterates.

  Args:
    objective: the objective whose mini-batch gradient is passed as ``updates``.
    step_size: ``gamma`` (positive).
    alpha: averaging weight in ``(0, 1]`` (the paper uses 0.9).
    max_table_bytes: ``init(params)`` raises ``MemoryError``, before allocating, when the
      per-datum table would exceed this many bytes (``"auto"``: 90% of one device's free
      memory; ``None``: no check), as :func:`dsgrad.joint_saga` does.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with state :class:`SmisoState`.

  Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.full(3, -1.0)}
    >>> opt = dsgrad.smiso(objective, step_size=0.01)  # a complete optimizer
    >>> state = opt.init(params)
    >>> indices = jnp.arange(10)
    >>> noise = objective.sample_noise(jax.random.key(1), 10)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    >>> params = optax.apply_updates(params, updates)
    >>> jax.tree.map(jnp.shape, params)
    {'loc': (3,), 'log_scale': (3,)}

  References:
    Bietti, Mairal (2017). Stochastic optimization with variance reduction for infinite
    datasets with finite sum structure. NeurIPS.
    Wang, Geffner, Domke (2024), App. A, Eq. 17-26.
  """
  n = objective.num_data

  def init_fn(params):
    _common.check_params_fit(objective, params, "smiso")
    _common.check_table_fits(params, n, None, max_table_bytes, "smiso")
    # A copy, so that params and state can both be donated to a jitted step.
    return SmisoState(tables.new_table(params, n), jax.tree.map(jnp.copy, params))

  def update_fn(updates, state, params, *, indices, noise, objective, **extra_args):
    del updates, extra_args  # SMISO steps from its per-datum gradients, computed here
    grads = objective.per_datum_grads(params, indices, noise, validate=False)
    old = tables.gather_rows(state.table, indices, params)
    new = jax.tree.map(lambda o, p, g: (1 - alpha) * o + alpha * (p[None] - step_size * g),
                       old, params, grads)
    first = tables.first_occurrence(indices)
    change = _common.masked_sum(optax.tree.sub(new, old), first)
    running_mean = optax.tree.add(state.running_mean, optax.tree.scale(1.0 / n, change))
    write_at = jnp.where(first, indices, n)  # repeated indices: keep the first, drop others
    table = jax.tree.map(lambda t, v: t.at[write_at].set(v.astype(t.dtype), mode="drop"),
                         state.table, new)
    step = optax.tree.sub(running_mean, params)
    return optax.tree.cast_like(step, params), SmisoState(table, running_mean)

  return _common.transformation(objective, init_fn, update_fn, "smiso")
