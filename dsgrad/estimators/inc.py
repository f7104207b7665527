"""The incremental-gradient estimator for doubly-stochastic objectives (Eq. 13)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad import checks
from dsgrad import tables
from dsgrad.estimators import _common
from dsgrad.objective import Objective, per_datum


class IncState(NamedTuple):
  """State of :func:`inc`.

  Attributes:
    table: per-datum parameters ``w^n``, leaves ``(N, *shape)``.
  """

  table: Any


@checks.arguments(objective=checks.objective(),
                  chunk_size=checks.count(1), max_table_bytes=checks.byte_budget())
def inc(objective: Objective, *, chunk_size: int = 1024,
        max_table_bytes: int | str | None = "auto"
        ) -> optax.GradientTransformationExtraArgs:
  """SAGA applied at a fixed noise draw (Eq. 13): controls subsampling noise only.

      g + mean_m grad f(w^m; m, eps) - mean_{n in B} grad f(w^n; n, eps)

  The middle term depends on the fresh noise ``eps``, so it cannot be kept as a running
  mean: every step makes a full pass over the table (in chunks inside ``jit``). That is
  the paper's point -- ``inc`` is a baseline for small data sets; its variance is at
  least ``V_eps[grad f(w; eps)]`` (Eq. 14).

  The same ``eps`` must serve every datum, so the objective must share one noise draw
  across the batch (``objective.shared_noise``).

  Cost per step: ``N + B`` per-datum gradients at table rows. Memory: the table.

  Args:
    objective: an objective with ``shared_noise=True``.
    chunk_size: data per chunk of the full pass.
    max_table_bytes: ``init(params)`` raises ``MemoryError``, before allocating, when the
      per-datum table would exceed this many bytes (``"auto"``: 90% of one device's free
      memory; ``None``: no check), as :func:`dsgrad.joint_saga` does.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with state :class:`IncState`.

  Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y), shared_noise=True)
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.full(3, -1.0)}
    >>> opt = optax.chain(dsgrad.inc(objective), optax.adam(1e-2))
    >>> state = opt.init(params)
    >>> indices = jnp.arange(10)
    >>> noise = objective.sample_noise(jax.random.key(1), 10)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    >>> params = optax.apply_updates(params, updates)
    >>> jax.tree.map(jnp.shape, params)
    {'loc': (3,), 'log_scale': (3,)}

  References:
    Wang, Geffner, Domke (2024), Eq. 13-14, App. C.2.
  """
  if not objective.shared_noise:
    raise ValueError("dsgrad.inc needs one noise draw shared by all data (Eq. 13 uses the "
                     "same eps for every datum); build the objective with shared_noise=True")
  n = objective.num_data

  def grads_at_rows(objective, rows, indices, noise):
    return per_datum(lambda p, i, e: objective.grad(p, i, e, validate=False), objective,
                     params_axis=0)(rows, indices, noise)

  def init_fn(params):
    _common.check_params_fit(objective, params, "inc")
    _common.check_table_fits(params, n, None, max_table_bytes, "inc")
    return IncState(tables.new_table(params, n))

  def update_fn(updates, state, params, *, indices, noise, objective, **extra_args):
    del extra_args
    g = _common.naive_gradient(objective, updates, params, indices, noise)

    def table_mean(idx):
      rows = tables.gather_rows(state.table, idx, params)
      return jax.tree.map(lambda x: jnp.mean(x, 0), grads_at_rows(objective, rows, idx, noise))

    full = tables.full_pass_mean(table_mean, n, chunk_size)
    batch = table_mean(indices)
    out = optax.tree.add(g, optax.tree.sub(full, batch))
    new_state = IncState(tables.set_rows(state.table, indices, params))
    return optax.tree.cast_like(out, g), new_state

  return _common.transformation(objective, init_fn, update_fn, "inc")
