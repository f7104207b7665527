"""A fit loop for doubly-stochastic objectives: reshuffled epochs, jitted ``lax.scan``
segments, a progress bar with the current ELBO, a history, and checkpoints.

    result = dsgrad.fit(objective, optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2)),
                        params, jax.random.key(0), num_steps=5000, batch_size=100)
    result.params, result.history.elbo

Works with every estimator (and with plain optax optimizers, which ignore the batch's
``indices``/``noise``). Training is a deterministic function of the key: batch ``t`` is
slice ``t`` of the epoch permutations drawn from the key, its noise from the key folded
with ``t``, so a run resumed from a checkpoint continues bit-identically.

References:
  Wang, Geffner, Domke (2024), Sec. 7 (reshuffled epochs, ELBO traces), App. H.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from dsgrad import _checks
from dsgrad import _permutation
from dsgrad import checkpoint as checkpoint_lib
from dsgrad import data as data_lib
from dsgrad import diagnostics
from dsgrad.estimators import _common as estimators_common
from dsgrad import parallel
from dsgrad import resume as resume_lib
from dsgrad.objective import Objective
# Re-exported: fit's checkpoints and history are dsgrad.resume's.
from dsgrad.resume import (History, restore_fit_checkpoint, restore_fit_history,  # noqa: F401
                           run_settings, save_fit_checkpoint, state_fingerprints)


class FitResult(NamedTuple):
  """Returned by :func:`fit`.

  Attributes:
    params: final parameters.
    opt_state: final optimizer (and estimator) state.
    history: a :class:`History`.
    compile_seconds: time spent compiling the training segment.
  """

  params: Any
  opt_state: Any
  history: History
  compile_seconds: float


def batch_indices(key, start, num_steps: int, num_data: int, batch_size: int):
  """Indices of batches ``start, ..., start + num_steps - 1`` of reshuffled epochs.

  Epoch ``e`` is the permutation :func:`epoch_permutation` draws from ``fold_in(key, e)``,
  cut into ``N // B`` batches (the remainder is dropped, as in the paper). Jittable in
  ``start``.

  Returns:
    ``(num_steps, batch_size)`` int32 array.
  """
  _checks.check_batch_size(batch_size, num_data)
  num_epochs = _window_epochs(num_steps, num_data, batch_size)
  first_epoch = start // (num_data // batch_size)
  perms = jax.vmap(lambda e: epoch_permutation(key, e, num_data, batch_size))(
      first_epoch + jnp.arange(num_epochs))
  return _slice_window(perms, start, num_steps, num_data, batch_size)


def epoch_permutation(key, epoch, num_data: int, batch_size: int):
  """Epoch ``epoch``'s data order, ``(N // B * B,)`` int32 (the remainder dropped).

  A uniformly shuffled order from one sort of distinct random integers
  (:mod:`dsgrad._permutation`), not ``jax.random.permutation``, whose sort of pairs on a
  CPU costs more than an epoch of cheap steps at large ``N``. Earlier dsgrad versions
  used ``jax.random.permutation``, so the same key gives other batches than with them."""
  perm = _permutation.permutation(jax.random.fold_in(key, epoch), num_data)
  return perm[:(num_data // batch_size) * batch_size]


def _window_epochs(num_steps: int, num_data: int, batch_size: int) -> int:
  return num_steps // (num_data // batch_size) + 2  # epochs a window of num_steps can touch


def _slice_window(perms, start, num_steps: int, num_data: int, batch_size: int):
  """Batches ``start ...`` from the stacked permutations of the window's epochs."""
  per_epoch = num_data // batch_size
  first_epoch = start // per_epoch
  # int32 offsets whatever jax_enable_x64 says: dynamic_slice wants one index dtype.
  offset = jnp.asarray(start - first_epoch * per_epoch, jnp.int32)
  return jax.lax.dynamic_slice(perms.reshape(-1, batch_size),
                               (offset, jnp.zeros((), jnp.int32)), (num_steps, batch_size))


@functools.lru_cache(maxsize=16)
def _permutation_fn(num_data: int, batch_size: int):
  return jax.jit(lambda k, e: epoch_permutation(k, e, num_data, batch_size))


class _EpochOrders:
  """The epoch permutations of a :func:`fit` run, each computed once on device and kept
  while segments need it (a permutation of N costs O(N log N), which per segment would
  dominate the steps at large N). The stacked window of the latest
  epochs is kept too, placed with ``sharding`` when given (a mesh: every process holds
  the same orders), so that the blocks of one window share one copy."""

  def __init__(self, key, num_data: int, batch_size: int, sharding=None):
    self.key, self.n, self.b, self.sharding = key, num_data, batch_size, sharding
    self.cache: dict = {}
    self.stacked = (None, None)  # (epochs, their stacked permutations)
    self.one = _permutation_fn(num_data, batch_size)

  def window(self, start: int, length: int):
    """``(epochs, N // B * B)``: the permutations a segment at ``start`` slices."""
    first = start // (self.n // self.b)
    wanted = range(first, first + _window_epochs(length, self.n, self.b))
    if self.stacked[0] == wanted:
      return self.stacked[1]
    for epoch in wanted:
      if epoch not in self.cache:
        self.cache[epoch] = self.one(self.key, jnp.int32(epoch))
    for epoch in [e for e in self.cache if e < first]:
      del self.cache[epoch]
    stacked = jnp.stack([self.cache[e] for e in wanted])
    if self.sharding is not None:
      stacked = jax.device_put(np.asarray(stacked), self.sharding)
    self.stacked = (wanted, stacked)
    return stacked


def train_step(objective: Objective, optimizer, params, opt_state, indices, noise_key, *,
               mesh=None):
  """One doubly-stochastic step: draw noise, the naive batch gradient, the optimizer.

  Jittable; the value checks of ``objective.grad`` are off (run them once outside).

  Args:
    objective: the :class:`dsgrad.Objective`.
    optimizer: an optax transformation that accepts ``indices`` and ``noise``
      (a dsgrad estimator chained with an update rule, or :func:`dsgrad.smiso`).
    params: current params.
    opt_state: the optimizer's state.
    indices: ``(B,)`` batch indices.
    noise_key: PRNG key for this step's noise.
    mesh: optional :func:`dsgrad.parallel.data_mesh`: the batch (indices and per-datum
      noise) is split across its devices.

  Returns:
    ``(new params, new optimizer state)``.
  """
  noise = objective.sample_noise(noise_key, indices.shape[0])
  if mesh is not None:
    indices, noise = parallel.constrain_batch(objective, mesh, indices, noise)
  grads = objective.grad(params, indices, noise, validate=False)
  updates, opt_state = optimizer.update(grads, opt_state, params, indices=indices,
                                        noise=noise)
  return optax.apply_updates(params, updates), opt_state


HOST_BLOCK_STEPS = 1000
"""With data on the host (memory-mapped), :func:`fit` reads the rows of this many steps
ahead on a thread while the device runs the previous steps (fewer if a block's rows would
exceed :data:`HOST_BLOCK_BYTES`)."""

HOST_BLOCK_BYTES = 256 * 2**20
"""The most bytes of rows one block of steps holds (two blocks are alive at a time)."""


def host_block_steps(host_data: dict, batch_size: int) -> int:
  """Steps per block of rows read ahead: :data:`HOST_BLOCK_STEPS`, fewer when a block's
  rows (``steps * batch_size`` rows of every host array) would exceed
  :data:`HOST_BLOCK_BYTES`; at least one."""
  step_bytes = sum(batch_size * int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize
                   for a in host_data.values())
  return int(max(1, min(HOST_BLOCK_STEPS, HOST_BLOCK_BYTES // max(step_bytes, 1))))

_SEGMENTS: collections.OrderedDict = collections.OrderedDict()  # compiled segments, LRU


def _compiled_segment(objective: Objective, optimizer, batch_size: int, length: int,
                      example_args, mesh=None, carry_shardings=None):
  """The compiled training segment ``(carry, key, start, data, orders, rows) -> carry``.

  The data are an argument, so on one device the same executable serves successive
  :func:`fit` calls (training in stages, resuming) *and* every objective made by
  :meth:`~dsgrad.Objective.with_data` from the same one, with the same optimizer object:
  the cache key is the objective's structure, not its data."""
  avals = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), example_args)
  key = (objective.structure_key(), optimizer, batch_size, length,
         jax.tree.structure(example_args), tuple(jax.tree.leaves(avals)))
  if mesh is None and key in _SEGMENTS:
    _SEGMENTS.move_to_end(key)
    return _SEGMENTS[key], 0.0
  t0 = time.perf_counter()
  run = _build_segment_fn(objective, optimizer, batch_size, length, mesh, carry_shardings)
  compiled = run.lower(*example_args).compile()
  seconds = time.perf_counter() - t0
  if mesh is None:
    _SEGMENTS[key] = compiled
    while len(_SEGMENTS) > 8:
      _SEGMENTS.popitem(last=False)
  return compiled, seconds


def _build_segment_fn(objective: Objective, optimizer, batch_size: int, length: int,
                      mesh=None, carry_shardings=None):
  host = {k: v for k, v in objective.data_tree().items() if data_lib.is_host(v)}

  def run(carry, key, start, data, orders, rows):
    _, noise_key = jax.random.split(key)
    indices = _slice_window(orders, start, length, objective.num_data, batch_size)
    steps = start + jnp.arange(length)

    def step(carry, xs):
      idx, t, rows_t = xs
      # Host data: the step's rows come in as an argument (read ahead by fit's RowReader).
      with data_lib.batch_rows(objective.data or {}, idx, rows_t):
        return train_step(objective, optimizer, *carry, idx,
                          jax.random.fold_in(noise_key, t), mesh=mesh), None

    with data_lib.bind(objective.data or {}, data_lib.join_host(data, host)):
      return jax.lax.scan(step, carry, (indices, steps, rows))[0]

  return jax.jit(run, donate_argnums=0, out_shardings=carry_shardings)


def _check_fit_arguments(objective, num_steps, batch_size, eval_every, checkpoint_every,
                         checkpoint_path) -> None:
  """Refuses, by name and before anything is compiled or trained, the counts and paths
  :func:`fit` cannot use."""
  def count(label, value, low):
    _checks.check_count(value, label, low)
  count("num_steps", num_steps, 0)
  count("batch_size", batch_size, 1)
  _checks.check_batch_size(batch_size, objective.num_data)
  if eval_every is not None:
    count("eval_every", eval_every, 1)
  count("checkpoint_every", checkpoint_every, 1)
  if checkpoint_path is not None:
    folder = os.path.dirname(os.path.abspath(os.fspath(checkpoint_path)))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
      raise ValueError(f"checkpoint_path {os.fspath(checkpoint_path)!r}: its folder {folder!r} "
                       "does not exist or is not writable")


def fit(objective: Objective, optimizer, params, key, *, num_steps: int, batch_size: int,
        eval_every: int | None = None, elbo_samples: int = 100, progress: bool = True,
        opt_state=None, start_step: int = 0, checkpoint_path: str | os.PathLike | None = None,
        checkpoint_every: int = 1, history: History | None = None,
        resume: bool = False, mesh=None) -> FitResult:
  """Optimizes ``objective`` with ``optimizer`` (an estimator chained with an optax rule).

  Steps run in jitted ``lax.scan`` segments of ``eval_every`` steps with the state
  donated; after each segment the full-data ELBO is estimated with ``elbo_samples``
  Monte Carlo samples (:func:`dsgrad.elbo`, chunked), recorded and shown on the progress
  bar (tqdm when installed, else one printed line per segment).

  Args:
    objective: the doubly-stochastic objective.
    optimizer: an optax transformation; the estimator first in a chain, e.g.
      ``optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))``, or ``dsgrad.smiso``.
      A plain optax optimizer (the naive estimator) works too.
    params: initial parameters.
    key: PRNG key; determines every batch and noise draw.
    num_steps: total steps, counted from 0 (including ``start_step`` already taken).
    batch_size: data per step.
    eval_every: steps per segment (default: one epoch, ``N // batch_size``).
    elbo_samples: Monte Carlo samples per ELBO estimate; 0 to skip evaluation.
    progress: show progress.
    opt_state: state to continue from (default ``optimizer.init(params)``).
    start_step: the step ``params``/``opt_state`` were taken at, when resuming.
    checkpoint_path: if given, ``(params, opt_state, step)`` and the history so far are
      saved there every ``checkpoint_every`` segments and at the end (atomic;
      :mod:`dsgrad.checkpoint`).
    checkpoint_every: segments between checkpoints.
    history: when resuming, the history up to ``start_step``
      (:func:`restore_fit_history`); the returned history continues it, wall-clock too.
    resume: if true and ``checkpoint_path`` exists, continue from it: params, optimizer
      state, step and history are restored (``params`` then only gives the structure),
      so an interrupted run can be restarted with the same call. The checkpoint holds
      the run's settings (number of data, ``batch_size``, ``key``); a call with other
      settings is refused, since it would not continue the same run.
    mesh: optional :func:`dsgrad.parallel.data_mesh`: train data-parallel on its
      devices -- each batch split across them, per-datum tables split by datum,
      everything else replicated (:mod:`dsgrad.parallel`). ``batch_size`` and the
      number of data must be multiples of the number of devices.

  Returns:
    A :class:`FitResult`. Resume with ``restore_fit_checkpoint`` (its step is the
    ``start_step``) and ``restore_fit_history``: the resumed run's parameters and
    history are those of an uninterrupted run (wall-clock aside).

  Raises:
    ValueError: before anything is compiled, on a count that is not an integer of the
      right range (``num_steps >= 0``; ``batch_size``, ``eval_every``,
      ``checkpoint_every >= 1``), ``batch_size`` above the number of data, non-finite
      ``params``, or a ``checkpoint_path`` whose folder is missing or not writable; with ``resume``, a
      checkpoint written with other settings, damaged (checksum), or whose entries,
      shapes or dtypes differ from this optimizer's state.
  """
  _check_fit_arguments(objective, num_steps, batch_size, eval_every, checkpoint_every,
                       checkpoint_path)
  # One run writes a checkpoint path at a time: a second would overwrite its files.
  with _checks.plain_errors(), (checkpoint_lib.exclusive(checkpoint_path)
                                if checkpoint_path is not None else contextlib.nullcontext()):
    optimizer = optax.with_extra_args_support(optimizer)
    settings = run_settings(objective, key, batch_size)
    if checkpoint_path is not None:
      # What determines the state besides the batches: the data themselves (not only N)
      # and the optimizer's program (estimator, its settings, its approximation).
      settings.update(state_fingerprints(objective, optimizer, params, batch_size))
    if resume and checkpoint_path is not None and os.path.exists(checkpoint_path):
      # The template needs shapes only: no initial full pass, no table materialized whole
      # on one device before it is sharded.
      raw = checkpoint_lib.restore_raw(checkpoint_path)
      resume_lib.check_resume_settings(checkpoint_path, raw, settings)
      params, opt_state, start_step = resume_lib.restore_fit_tree(
          checkpoint_path, raw, params,
          jax.eval_shape(optimizer.init, params) if opt_state is None else opt_state)
      history = resume_lib.history_from_raw(raw)
      _checks.value_checks(_checks.finite_checks(
          opt_state, f"the optimizer state restored from checkpoint_path "
          f"{os.fspath(checkpoint_path)!r}"))
    # A NaN start would train silently to a NaN history with a plain optax optimizer.
    _checks.value_checks(_checks.finite_checks(params, "params passed to fit"))
    if num_steps < start_step:
      raise ValueError(f"num_steps={num_steps} is before start_step={start_step}")
    eval_every = int(eval_every or max(1, objective.num_data // batch_size))
    carry_shardings = None
    # The data enter the segments as an argument (device arrays, and int32 handles of host
    # arrays); estimators' init reads this objective's data too.
    data_args, host_data = data_lib.split_host(objective.data_tree())
    reader = data_lib.RowReader(host_data,
                                None if mesh is None else parallel.replicated(mesh))
    if mesh is not None:
      parallel.check_batch_size(batch_size, mesh)
      if opt_state is None:
        params, opt_state = parallel.init_sharded(optimizer, params, mesh, objective)
      else:
        params = jax.device_put(params, parallel.replicated(mesh))
        opt_state = parallel.shard_state(mesh, opt_state)
      carry_shardings = (jax.tree.map(lambda _: parallel.replicated(mesh), params),
                         parallel.state_shardings(mesh, opt_state))
      # Data split by parallel.shard_data stay where they are; the rest is replicated.
      data_args = {k: v if isinstance(v, jax.Array) and isinstance(v.sharding, NamedSharding)
                   and v.sharding.mesh == mesh else jax.device_put(v, parallel.replicated(mesh))
                   for k, v in data_args.items()}
    # Segments donate their carry; copy so that the caller's arrays stay valid. The copies
    # are strongly typed, so that a weakly typed initial value does not make the segments
    # (which return strong types) compile twice.
    params = jax.tree.map(lambda p: jnp.array(p, dtype=jnp.asarray(p).dtype), params)
    with objective.bound():
      estimators_common.check_objective_evaluates(objective, params, "fit")
    if opt_state is None:
      with objective.bound():
        opt_state = optimizer.init(params)
    else:
      opt_state = jax.tree.map(jnp.copy, opt_state)
    estimators_common.check_chain_order(opt_state, "fit")
    compiled_by_length = {}  # one executable per segment length (at most two)
    key, eval_key = jax.random.split(key)
    orders = _EpochOrders(jax.random.split(key)[0], objective.num_data, batch_size,
                          None if mesh is None else parallel.replicated(mesh))

    bar = _progress(progress, num_steps - start_step)
    # The history as lists, one per field, continuing a resumed run's history if given.
    columns = {name: [] for name in History._fields}
    if history is not None:
      if len(history.step) and int(history.step[-1]) != start_step:
        raise ValueError(f"history ends at step {int(history.step[-1])} but start_step is "
                         f"{start_step}; pass the history saved with the checkpoint")
      columns = {name: list(np.asarray(getattr(history, name), np.float64))
                 for name in History._fields}
    as_history = lambda: History(*(np.asarray(columns[k], np.float64) for k in History._fields))
    wall = float(columns["wall_time"][-1]) if columns["wall_time"] else 0.0
    compile_seconds, step, segment = 0.0, start_step, 0

    def blocks(at):
      """The segment starting at step ``at``: its length and its blocks ``(start, steps)``
      (one block, unless host data are read ahead block by block)."""
      length = min(eval_every, num_steps - at)
      cap = min(length, host_block_steps(host_data, batch_size)) if host_data else length
      return length, [(s, min(cap, at + length - s)) for s in range(at, at + length, cap)]

    def block_indices(start, steps):
      return _slice_window(orders.window(start, steps), start, steps, objective.num_data,
                           batch_size)

    if host_data and step < num_steps:
      reader.submit(block_indices(*blocks(step)[1][0]))
    while step < num_steps:
      length, parts = blocks(step)
      for k, (start, steps) in enumerate(parts):
        window = orders.window(start, steps)
        rows = reader.take() if host_data else {}
        if steps not in compiled_by_length:
          compiled_by_length[steps], seconds = _compiled_segment(
              objective, optimizer, batch_size, steps,
              ((params, opt_state), key, jnp.int32(start), data_args, window, rows),
              mesh, carry_shardings)
          compile_seconds += seconds
        t0 = time.perf_counter()
        params, opt_state = compiled_by_length[steps](
            (params, opt_state), key, jnp.int32(start), data_args, window, rows)
        following = (parts[k + 1] if k + 1 < len(parts) else
                     blocks(step + length)[1][0] if step + length < num_steps else None)
        if host_data and following is not None:  # the next block's rows, while this one runs
          reader.submit(block_indices(*following))
        jax.block_until_ready((params, opt_state))
        wall += time.perf_counter() - t0
      step += length
      segment += 1
      value, se = (diagnostics.elbo(objective, params, jax.random.fold_in(eval_key, step),
                                    elbo_samples) if elbo_samples else (float("nan"),) * 2)
      for name, v in zip(History._fields, (step, wall, value, se)):
        columns[name].append(v)
      bar(length, step, value, se)
      if checkpoint_path is not None and (segment % checkpoint_every == 0 or step == num_steps):
        save_fit_checkpoint(checkpoint_path, params, opt_state, step, as_history(),
                            settings=settings)
    bar(0, step, None, None, close=True)
    return FitResult(params, opt_state, as_history(), compile_seconds)


def _progress(enabled: bool, total: int):
  """``update(n_steps, step, elbo, se, close=False)``: tqdm bar, printed lines, or nothing."""
  if not enabled:
    return lambda *a, **k: None
  try:
    from tqdm.auto import tqdm
  except ImportError:
    tqdm = None
  if tqdm is not None:
    bar = tqdm(total=total, unit="step")

    def update(n, step, value, se, close=False):
      if n:
        bar.update(n)
      if value is not None and np.isfinite(value):
        bar.set_postfix(elbo=f"{value:.4g}", se=f"{se:.2g}")
      if close:
        bar.close()
    return update

  def update_lines(n, step, value, se, close=False):
    if n:
      print(f"step {step}: elbo {value:.6g} (se {se:.2g})", flush=True)
  return update_lines
