"""The joint control variate, SAGA version (Eq. 5, Alg. 1)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad import checks
from dsgrad import tables
from dsgrad.approx import base as approx_lib
from dsgrad.estimators import _common, _weights
from dsgrad.objective import Objective, per_datum


class JointSagaState(NamedTuple):
  """State of :func:`joint_saga`.

  Attributes:
    count: number of updates taken (int32 scalar).
    table: per-datum parameters ``w^n`` (the paper's ``W``), leaves ``(N, *shape)``:
      the parameters at the last step datum ``n`` was in the batch. With an
      approximation that has :class:`dsgrad.approx.DatumStatistics`, the per-datum
      statistics ``s_n`` of those parameters instead (e.g. ``(N, K)`` logits).
    running_mean: ``G = mean_n E_xi grad f~(w^n; n, xi)`` over the table, params-shaped
      (with statistics: the mean of the per-datum part only).
    control_weight: ``()`` for a fixed weight, else the
      :class:`dsgrad.estimators.AdaptiveWeightState`.
    data_digest: :func:`dsgrad.tables.data_digest` of the data ``G`` was computed on.
      :func:`dsgrad.fit` given this state with other data (a ``with_data`` copy) has the
      next update fill ``G`` again (:func:`dsgrad.tables.for_data`): ``G`` of other data
      would bias every step after it. Under your own loop, start a fresh state instead.
  """

  count: jax.Array
  table: Any
  running_mean: Any
  control_weight: Any = ()
  data_digest: Any = ()


def _as_stored(params, table):
  """``params`` rounded to the table's dtypes and read back in their own dtypes."""
  return jax.tree.map(lambda p, t: p.astype(t.dtype).astype(p.dtype), params, table)


def _output(updates, control, state, new_table, running_mean, warmup_steps, weight):
  """``updates + c * control`` (the naive ``updates`` during warm-up) and the next state."""
  control_weight, horizon = weight
  corrected, weight_state = _weights.apply(control_weight, horizon, state.control_weight,
                                           updates, control)
  in_warmup = state.count < warmup_steps
  out = jax.tree.map(lambda u, c: jnp.where(in_warmup, u, c), updates, corrected)
  # The table is still being filled during warm-up: its control says nothing about the
  # one that follows, so the adaptive weight's moments start after it.
  weight_state = jax.tree.map(lambda old, new: jnp.where(in_warmup, old, new),
                              state.control_weight, weight_state)
  new_state = JointSagaState(optax.safe_increment(state.count), new_table, running_mean,
                             weight_state, state.data_digest)
  return optax.tree.cast_like(out, updates), new_state


@checks.arguments(objective=checks.objective(), approx=checks.approximation(),
                  control_weight=checks.or_word(checks.probability(), "adaptive"),
                  warmup_steps=checks.count(0), chunk_size=checks.optional(checks.count(1)),
                  table_dtype=checks.optional(checks.floating_dtype()),
                  control_weight_horizon=checks.positive(),
                  max_table_bytes=checks.byte_budget())
def joint_saga(objective: Objective, approx: approx_lib.Approximation | None = None, *,
               warmup_steps: int = 0, chunk_size: int | None = None, table_dtype: Any = None,
               control_weight: float | str = "adaptive", control_weight_horizon: float = 100,
               max_table_bytes: int | str | None = "auto"
               ) -> optax.GradientTransformationExtraArgs:
  """The joint control variate with a SAGA table: reduces subsampling *and* MC noise.

  For a batch ``B`` with noise ``eps`` and table rows ``w^n`` it returns
  (Eq. 5, mini-batch form of Alg. 1)

      g + G - mean_{n in B} grad f~(w^n; n, eps_n)

  where ``g`` is the incoming naive gradient and ``G`` the running mean of the table's
  noise-integrated approximate gradients; then it updates
  ``G += (1/N) sum_{n in B, distinct} (E grad f~(w; n) - E grad f~(w^n; n))`` and
  ``w^n = w`` for ``n in B``. The invariant ``G = mean_n E grad f~(w^n; n)`` holds
  exactly (repeated indices in a batch are counted once), so the estimator is unbiased
  for any table. Its variance ``V[grad f(w; n, eps) - grad f~(w^n; n, eps)]`` (Eq. 6)
  vanishes when ``f~ = f`` and the table has caught up with ``w``.

  Table initialization: ``init(params)`` fills every row with ``params`` and computes
  ``G`` exactly by one chunked pass over the data. The paper (Alg. 1) instead fills the
  table during one epoch of the naive estimator: ``warmup_steps = ceil(N / B)`` with
  reshuffled epochs does that -- for the first ``warmup_steps`` updates the output is
  the naive gradient while the table and ``G`` are updated as usual. Prefer it when the
  parameters move far from their initial values within the first epoch: rows still at the
  initial parameters keep the estimator unbiased but can add variance instead of removing
  it (measured: on 10^6 rows, 3,000 steps of batch 100 -- under a third of an epoch --
  Adam 0.01, joint SAGA without warm-up ended at an ELBO of -298,286 against naive's
  -128,886; ``control_weight="adaptive"`` brought it to -178,175;
  ``python docs/scripts/saga_before_one_epoch.py 1000000``).

  Compact tables: when ``approx.statistics`` is set (e.g.
  :func:`dsgrad.approx.glm_mean_taylor`), row ``n`` stores only the statistic the
  approximation needs (for a GLM the ``K`` logits at the stored mean) and the
  data-independent part of ``f~`` is taken at the current parameters. Memory falls from
  ``N x (number of params)`` to ``N x K`` and the step does no row traffic to speak of.
  :func:`dsgrad.approx.sparse_linearize` does the same for models whose likelihood
  terms read ``k`` coordinates each (MovieLens: ``N x 2k`` instead of ``N x 2d``).

  Several devices: the table is split by datum across a
  :func:`dsgrad.training.parallel.data_mesh` (see :func:`dsgrad.fit`'s ``mesh``).

  Cost per step (parameter table): ``approx.grad_and_expected`` at ``B`` table rows (one JVP of the
  gradient each, vectorized) and ``approx.expected_grad`` for the ``B`` data at ``w``
  (one weighted batch call when ``approx.through_objective``, else ``B`` per-datum
  calls) -- the paper's "one gradient and two Hessian-vector products" (Sec. 7.3) --
  plus a gather and an in-place scatter of ``B`` rows. On a CPU the row traffic alone
  costs several naive steps (docs/benchmarks.md). Memory: the table, ``N x (number of params)`` values
  (see :func:`dsgrad.table_bytes`); ``table_dtype`` stores it in lower precision. For
  a network this is ``N`` copies of its weights (a 45,000-parameter VAE on 1,500 images:
  0.25 GiB; a 1M-parameter one on MNIST's 60,000: 224 GiB), so ``init`` refuses a table
  that would not fit (``max_table_bytes``).

  Args:
    objective: the objective whose gradient is passed as ``updates``.
    approx: the approximation ``f~``; default: the objective's own
      (``objective.table_approximation``: for the mean-field objective of a model that
      declares which coordinates each datum reads, :func:`dsgrad.objective_from_logdensity`'s
      ``reads``, :func:`dsgrad.approx.sparse_linearize`, a table of those only), else
      :func:`dsgrad.approx.linearize` (a table of parameters).
    warmup_steps: number of initial updates that output the naive gradient.
    chunk_size: data per chunk in the initial full pass; default (``None``):
      :func:`dsgrad.tables.full_pass_chunk` (64 MiB of rows, 1,024 to 16,384 of them).
    table_dtype: dtype of the stored table (default: the params' dtypes). Rows are
      read back in the params' dtype; ``G`` is kept consistent with the stored
      (rounded) rows, so the estimator stays unbiased.
    control_weight: ``c`` in ``g + c (G - mean grad f~(w^n))``: ``"adaptive"`` (the
      default; per coordinate, from earlier steps, see :func:`dsgrad.cv`), or a fixed number in
      ``[0, 1]`` (``1``: the paper's estimator).
    control_weight_horizon: horizon of the adaptive weight's moving averages, in steps.
    max_table_bytes: ``init(params)`` raises ``MemoryError`` (naming the table's size
      and the alternatives) when the parameter table would exceed this many bytes.
      ``"auto"``: 90% of the free memory of one device (the host's free memory on CPU);
      ``None``: no check. Checked when ``init`` runs on concrete parameters (not under
      ``jit`` / ``eval_shape``, so :func:`dsgrad.training.parallel.init_sharded`, which splits
      the table across devices, is not refused).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with state :class:`JointSagaState`.
    ``update`` needs ``params`` and the batch's ``indices=`` and ``noise=``; put it first
    in an ``optax.chain``. Donate the state to ``jit`` so the table is updated in place.

  Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.full(3, -1.0)}
    >>> opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
    >>> state = opt.init(params)
    >>> indices = jnp.arange(10)
    >>> noise = objective.sample_noise(jax.random.key(1), 10)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    >>> params = optax.apply_updates(params, updates)
    >>> jax.tree.map(jnp.shape, params)
    {'loc': (3,), 'log_scale': (3,)}

  References:
    Wang, Geffner, Domke (2024), Eq. 5-6, Alg. 1, App. E (Alg. 3).
    Defazio, Bach, Lacoste-Julien (2014). SAGA. NeurIPS.
  """
  approx = approx or (objective.table_approximation(objective)
                      if objective.table_approximation is not None else approx_lib.linearize())
  _weights.check_horizon(control_weight_horizon, "joint_saga")
  weight = (control_weight, control_weight_horizon)
  chunk_size = tables.full_pass_chunk(objective.data, chunk_size)
  kind = (_statistics_table(objective, approx, chunk_size, table_dtype)
          if approx.statistics is not None else
          _parameter_table(objective, approx, chunk_size, table_dtype, max_table_bytes))

  def init_fn(params):
    _common.check_params_fit(objective, params, "joint_saga", approx)
    if not _common.has_leaves(params):  # optax.tree.map_params placeholder
      return JointSagaState(jnp.zeros([], jnp.int32), tables.EMPTY_TABLE, params,
                            _weights.init(control_weight, params), jnp.zeros([], jnp.uint32))
    # G (and a table of statistics) are filled by the first update, from the data it is
    # handed: the state reads no data.
    table = kind.init(params)
    return JointSagaState(jnp.zeros([], jnp.int32), table, jax.tree.map(jnp.zeros_like, params),
                          _weights.init(control_weight, params), jnp.zeros([], jnp.uint32))

  def update_fn(updates, state, params, *, indices, noise, objective, **extra_args):
    del extra_args
    def fill():
      table, mean = kind.fill(objective, params, state.table)
      return (table, optax.tree.cast_like(mean, state.running_mean),
              tables.data_digest(objective))

    table, running_mean, digest = jax.lax.cond(
        state.count == 0, fill, lambda: (state.table, state.running_mean, state.data_digest))
    state = state._replace(table=table, running_mean=running_mean, data_digest=digest)
    g, control, new_table, change = kind.step(objective, updates, state, params, indices,
                                              noise)
    # G += (1/N) sum over the batch's distinct data of (E grad f~ now - E grad f~ at the
    # rows replaced): G stays the mean over the table, so the estimator stays unbiased.
    running_mean = optax.tree.add(state.running_mean,
                                  optax.tree.scale(1.0 / objective.num_data, change))
    return _output(g, control, state, new_table, running_mean, warmup_steps, weight)

  return _common.transformation(objective, init_fn, update_fn, "joint_saga")


class _TableKind(NamedTuple):
  """What one kind of SAGA table stores per datum, and how a step reads and writes it.

  Attributes:
    init: ``params -> table``, made without reading data.
    fill: ``(objective, params, table) -> (table, running_mean)``: every row from
      ``params`` and ``G`` the mean of the rows' expected approximate gradients (a chunked
      full pass), at the first update.
    step: ``(objective, updates, state, params, indices, noise) -> (updates, control,
      new_table, change)``: the naive gradient (``updates``, or computed here when
      ``None``), the control ``G - mean_b grad f~(row_b; n_b, eps_b)`` (in expectation
      zero), the table with the batch's rows replaced, and ``sum_b first_b (E grad f~ now
      - E grad f~ at the old row)`` for the update of ``G``.
  """

  init: Any
  fill: Any
  step: Any


def _parameter_table(objective: Objective, approx, chunk_size, table_dtype, max_table_bytes
                     ) -> _TableKind:
  """Row ``n`` holds the parameters ``w^n`` at the last step datum ``n`` was drawn."""
  n = objective.num_data

  def init(params):
    _common.check_table_fits(params, n, table_dtype, max_table_bytes, "joint_saga", objective)
    _common.warn_of_declared_coordinates(objective, params, n, table_dtype)
    return tables.new_table(params, n, table_dtype)

  def fill(objective, params, table):
    # Every row set to params: G is the mean over the rows as they are stored, and a
    # table filled again (a state continued on other data) holds older rows.
    stored = _as_stored(params, table)
    table = jax.tree.map(lambda t, p: jnp.broadcast_to(p.astype(t.dtype), t.shape), table,
                         stored)
    return table, tables.full_pass_mean(
        lambda idx: approx.expected_grad(objective, stored, idx), n, chunk_size)

  def step(objective, updates, state, params, indices, noise):
    updates = _common.naive_gradient(objective, updates, params, indices, noise)
    rows = tables.gather_rows(state.table, indices, params)
    g_rows, e_rows = per_datum(lambda p, i, e: approx.grad_and_expected(objective, p, i, e),
                               objective, params_axis=0)(rows, indices, noise)
    control = optax.tree.sub(state.running_mean,
                             jax.tree.map(lambda x: jnp.mean(x, 0), g_rows))
    new_table = tables.set_rows(state.table, indices, params)
    # The expectation at w is taken at the value actually stored (differs only for a
    # low-precision table), keeping G equal to the mean over the stored table.
    stored = _as_stored(params, state.table)
    first = tables.first_occurrence(indices)
    if approx.through_objective:
      # sum_b first_b E grad f~(w; n_b) as one batch call on the reweighted objective:
      # shared params, so no per-datum gradients are formed.
      weights = first.astype(jax.tree.leaves(params)[0].dtype)
      e_now_sum = optax.tree.scale(indices.shape[0], approx.expected_grad(
          _common.reweighted(objective, weights), stored, indices))
    else:
      e_now = jax.vmap(lambda i: approx.expected_grad(objective, stored, i[None]))(indices)
      e_now_sum = _common.masked_sum(e_now, first)
    change = optax.tree.sub(e_now_sum, _common.masked_sum(e_rows, first))
    return updates, control, new_table, change

  return _TableKind(init, fill, step)


def _statistics_table(objective: Objective, approx, chunk_size, table_dtype) -> _TableKind:
  """Row ``n`` holds the per-datum statistics ``s_n`` the approximation needs
  (``approx.statistics``: a GLM's logits, a sparse model's ``k`` coordinates).

  The same estimator as the parameter table's with ``f~`` split as
  ``d_n(s_n, w, eps) + c(w, eps)``: the control is
  ``G - mean_b d_b(s_b, w, eps_b) + E c(w) - c(w, eps)``, with ``G = mean_n E d_n(s_n)``.
  """
  stats_fns = approx.statistics
  n = objective.num_data

  def stored(values):
    if table_dtype is None:
      return values
    return jax.tree.map(lambda v: v.astype(table_dtype).astype(v.dtype), values)

  def statistics_at(objective, params, indices):
    return stats_fns.statistics(params, objective.rows(indices))

  def init(params):
    spec = jax.eval_shape(lambda: statistics_at(objective, params,
                                                jnp.zeros((n,), jnp.int32)))
    return jax.tree.map(lambda v: jnp.zeros(v.shape, table_dtype or v.dtype), spec)

  def fill(objective, params, table):
    exact = tables.full_pass_rows(lambda idx: statistics_at(objective, params, idx), n,
                                   chunk_size)
    table = jax.tree.map(lambda t, v: v.astype(t.dtype), table, exact)
    dtype = jax.tree.leaves(params)[0].dtype

    def chunk_mean(idx):
      stats = jax.tree.map(lambda t, v: t[idx].astype(v.dtype), table, exact)
      weights = jnp.full(idx.shape, 1.0 / idx.shape[0], dtype)
      return stats_fns.datum_expected(objective, params, stats, objective.rows(idx), weights)

    return table, tables.full_pass_mean(chunk_mean, n, chunk_size)

  def step(objective, updates, state, params, indices, noise):
    dtype = jax.tree.leaves(params)[0].dtype
    first = tables.first_occurrence(indices).astype(dtype)
    fused = approx.fused_for(objective) if updates is None else None
    if fused is not None:  # one read of the batch for the gradient and the approximation
      old_rows = jax.tree.map(lambda t: t[indices].astype(dtype), state.table)
      updates, d_old, new_rows, change = fused.at_statistics(
          objective, params, old_rows, indices, noise, first, stored)
    else:
      updates = _common.naive_gradient(objective, updates, params, indices, noise)
      rows = objective.rows(indices)
      new_rows = stored(stats_fns.statistics(params, rows))
      old_rows = jax.tree.map(lambda t, v: t[indices].astype(v.dtype), state.table, new_rows)
      uniform = jnp.full(indices.shape, 1.0 / indices.shape[0], dtype)
      d_old, _ = stats_fns.datum_terms(objective, params, old_rows, rows, noise, uniform)
      if stats_fns.expected_change is not None:
        change = stats_fns.expected_change(objective, params, new_rows, old_rows, rows,
                                           first)
      else:  # one call on the stacked rows with weights (+first, -first)
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), new_rows, old_rows)
        change = stats_fns.datum_expected(objective, params, both,
                                          jax.tree.map(lambda r: jnp.concatenate([r, r]), rows),
                                          jnp.concatenate([first, -first]))
    c_now, c_expected = stats_fns.global_terms(objective, params, noise)
    expected = stats_fns.expectation(params, state.running_mean)
    control = optax.tree.add(optax.tree.sub(expected, d_old),
                             optax.tree.sub(c_expected, c_now))
    return updates, control, tables.set_row_values(state.table, indices, new_rows), change

  return _TableKind(init, fill, step)
