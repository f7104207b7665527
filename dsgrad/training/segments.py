"""Training segments: many steps in one compiled loop, fed with reshuffled epochs.

A segment is one program ``(carry, key, start, count, objective, orders, rows) -> carry``
of ``length`` steps: it slices its batches from the epoch orders
(:mod:`dsgrad.training.batching`), folds the step number into the noise key and runs
:func:`train_step` ``count <= length`` times, with the ``(params, opt_state)`` carry
donated; a run's shorter segments (its last) run on its full segments' program. The
objective is an argument, so its data are (:mod:`dsgrad.data`) and one executable serves
every objective of the same structure (:meth:`~dsgrad.Objective.with_data` copies,
resumed and staged runs); it lives in :mod:`dsgrad.training.compile_cache`.

Where the carry is small (:data:`CHECK_AT_END_BYTES`), the steps' finiteness check
(:func:`train_step`'s, on each update) is settled once per segment: the program checks
that the params are finite at its end, keeps its input carry (no donation), and only if
they are not is the segment run again from that carry with every step checked, to name
the failing check and step (and once more up to it: the run's last finite state). A
per-step check kept the gradient from fusing with the update: up to an eighth of a naive
step on a CPU (``python -m benchmarks fit-overhead``); the end check costs nothing.

Data kept on the host (memory-mapped, :class:`dsgrad.data.HostArray`) cannot be
gathered on the device: :class:`SegmentRunner` cuts a segment into blocks of at most
:func:`host_block_steps` steps, and a thread reads the next block's rows while the device
runs the current one. A block's rows are kept until its checks are settled, so that the
checks can move to its end as in memory (the block runs again, checked, where they fail).

Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> optimizer = optax.with_extra_args_support(optax.adam(1e-2))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)}
    >>> runner = dsgrad.training.segments.SegmentRunner(objective, optimizer, 10, jax.random.key(1))
    >>> params, state = runner.run(params, optimizer.init(params), 0, 20)
    >>> runner.compile_seconds > 0, params["loc"].shape
    (True, (3,))
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks, tables
from dsgrad import data as data_lib
from dsgrad.training import batching, compile_cache, parallel
from dsgrad.training import host_data as host_data_lib
from dsgrad.objective import Objective
from dsgrad.estimators import chain as chain_lib
from dsgrad.estimators import checked as checked_lib


def train_step(objective: Objective, optimizer, params, opt_state, indices, noise_key, *,
               mesh=None, fused: bool | None = None):
  """One doubly-stochastic step: draw noise, the naive batch gradient, the optimizer.

  Jittable. It checks that the indices are a 1-D integer batch in ``[0, N)`` (JAX would
  clamp or wrap one past the end onto another row) and that the update is finite (a NaN
  from the gradient, the estimator's terms or the update rule is named at its step). The
  objective is a pytree whose leaves are its data: jit the step with the objective as an
  argument (``jax.jit(functools.partial(train_step, optimizer=opt))`` or a wrapper) and
  the data are arguments of the compiled program, handed to the estimator as
  ``update(..., objective=objective)``; one compilation serves every ``with_data`` copy.

  Args:
    objective: the :class:`dsgrad.Objective`.
    optimizer: an optax transformation that accepts ``indices`` and ``noise``
      (a dsgrad estimator chained with an update rule, or :func:`dsgrad.smiso`).
    params: current params.
    opt_state: the optimizer's state.
    indices: ``(B,)`` batch indices.
    noise_key: PRNG key for this step's noise.
    mesh: optional :func:`dsgrad.training.parallel.data_mesh`: the batch (indices and per-datum
      noise) is split across its devices.
    fused: ``True``: :func:`dsgrad.fused_update`: let the estimator first
      in the chain compute the naive gradient itself, in one program with its control
      variate (:class:`dsgrad.approx.FusedTerms`); ``False``: compute the gradient here
      and pass it (the two-call form; the same numbers); ``None`` (default): fused when
      the optimizer's first transformation is a dsgrad estimator.

  Returns:
    ``(new params, new optimizer state)``.
  """
  noise = objective.sample_noise(noise_key, checks.check_indices_static(indices))
  if mesh is not None:
    indices, noise = parallel.constrain_batch(objective, mesh, indices, noise)
  # Structure only: free, at trace time.
  chain_lib.check_chain_order(opt_state, "dsgrad.train_step", steps=True)
  if fused is None:
    fused = chain_lib.computes_own_gradient(opt_state)
  try:
    if fused:
      # The estimator computes the naive gradient in the same program as its control
      # variate, from one read of the batch (the same numbers as the two-call form).
      updates, opt_state = chain_lib.fused_update(optimizer, opt_state, params,
                                                  indices=indices, noise=noise,
                                                  objective=objective)
    else:
      grads = objective.grad(params, indices, noise, validate=False)
      # The estimators compute with the objective handed to them: under the caller's jit
      # it carries the data as arguments, as the gradient above does.
      updates, opt_state = optimizer.update(grads, opt_state, params, indices=indices,
                                            noise=noise, objective=objective)
  except Exception as error:  # at trace time, so the passing path pays nothing
    named = chain_lib.named_missing_arguments(error, "dsgrad.train_step") if isinstance(
        error, TypeError) else error
    if named is not error:  # an update that needs what a step does not pass
      raise named from error
    # Another optimizer's state fails inside optax ("'EmptyState' object has no attribute
    # 'mu'"): named, with the first array that differs, where it is the cause.
    try:
      checked_lib.check_state(optimizer, opt_state, params, "dsgrad.train_step")
    except ValueError as mismatch:
      raise mismatch from error
    except Exception:  # noqa: BLE001  not even comparable: the update's own error says more
      pass
    raise
  # The noise is finite by construction, so a NaN in the gradient, the estimator's terms
  # or the update rule shows here, at its step (fit settles both checks once a segment).
  checks.value_checks(checks.index_checks(indices, objective.num_data) + checks.finite_checks(
      updates, "the step's update", UPDATE_NOT_FINITE_WHERE if chain_lib.holds_estimator(
          opt_state) else ", from the gradient or the update rule (a step size too large?)"))
  return optax.apply_updates(params, updates), opt_state


UPDATE_NOT_FINITE_WHERE = (
    ", from the gradient, the estimator's terms or the update rule (a control variate's "
    "approximation differentiates the log density twice, so a NaN curvature, as of a normal "
    "cdf at +-inf, shows there and not in the gradient: dsgrad.naive() in its place tells "
    "them apart)")
"""Where a step's non-finite update can come from where a control variate is in the chain."""


HOST_BLOCK_STEPS = 1000
"""With data on the host (memory-mapped), the rows of this many steps (at most) are read
ahead on a thread while the device runs the previous steps."""

HOST_BLOCK_BYTES = 256 * 2**20
"""The most bytes of rows one block of steps holds (two blocks are alive at a time)."""


def host_block_steps(host_data: dict, batch_size: int) -> int:
  """Steps per block of rows read ahead: :data:`HOST_BLOCK_STEPS`, fewer (at least one)
  where a block's rows would exceed :data:`HOST_BLOCK_BYTES`."""
  step_bytes = sum(batch_size * int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize
                   for a in host_data.values())
  return int(max(1, min(HOST_BLOCK_STEPS, HOST_BLOCK_BYTES // max(step_bytes, 1))))


CHECK_AT_END_BYTES = 64 * 2**20
"""A run whose carry (params and optimizer state) is at most this many bytes settles its
range and finiteness checks once per segment (the module's docstring); a larger one, such
as a big SAGA table, checks every step and donates its carry, so that its memory is not
doubled."""

PARAMS_NOT_FINITE = "the params became non-finite (NaN or inf) during a segment"
"""The end-of-segment check's message: the runner runs the segment again, checked."""


def segment_program(objective: Objective, optimizer, batch_size: int, length: int,
                    mesh=None, carry_shardings=None, *, finite_at_end: bool = False):
  """``(program, messages)``: the jitted (not yet compiled) segment ``(carry, key, start,
  count, objective, orders, rows) -> (failure, carry)`` of the ``count`` (at most
  ``length``) steps from step ``start``, and the list its tracing fills with its checks'
  messages. ``failure`` is ``[code, step]`` of the first value check that failed
  (:class:`Failure` names it): code ``i + 1`` is ``messages[i]``, ``-1``
  :data:`PARAMS_NOT_FINITE`, ``0`` none. ``count`` is an argument so that one program
  serves a run's full segments and its shorter ones (the last, a resumed run's first):
  a segment program compiles once per run, not twice.

  ``orders`` is the window :meth:`dsgrad.training.batching.EpochOrders.window` gives for
  ``(start, length)``; ``objective`` one of ``objective``'s structure (its data are the
  program's arguments); ``rows`` the host arrays' rows of every step
  (``{path: (length, B, ...)}``, :func:`dsgrad.data.host_leaves`; past ``count``, any),
  ``{}`` without host data.

  With ``finite_at_end``, the steps' range and finiteness checks
  (:func:`dsgrad.checks.is_range_or_finite_check`) are replaced by one check that the
  params are finite after the last step (message :data:`PARAMS_NOT_FINITE`), and the
  carry is not donated, so that the caller can run the segment again from it without
  ``finite_at_end`` to find the failing step. Other checks still run per step.
  """
  # Filled while the scan's body is traced: the per-step checks' messages, and those of
  # the checks settled at the segment's end instead.
  messages, settled = [], []

  def run(carry, key, start, count, objective_arg, orders, rows):
    _, noise_key = jax.random.split(key)
    indices = batching.slice_window(orders, start, length, objective.num_data, batch_size)
    steps = start + jnp.arange(length)

    # Step t's noise key is fold_in(noise_key, t) (so a resumed run draws the same
    # noise), derived for the whole segment in one vectorized call rather than one
    # serial hash per step.
    keys = jax.vmap(lambda t: jax.random.fold_in(noise_key, t))(steps)

    def step(carry, xs):
      idx, t, key_t, rows_t = xs
      # A host array's view also holds this step's rows, read ahead and handed over, so
      # that the step makes no host read.
      step_objective = data_lib.with_batch_rows(objective_arg, idx, rows_t)
      # The value checks travel out as one small code per step instead of a host round
      # trip per step (a GPU synchronization each); SegmentRunner raises them.
      with checks.collected() as found:
        carry = train_step(step_objective, optimizer, *carry, idx, key_t, mesh=mesh)
      if finite_at_end:
        # Unused, these checks' reductions are compiled away.
        settled[:] = [m for _, m in found if checks.is_range_or_finite_check(m)]
        found = [(bad, m) for bad, m in found if not checks.is_range_or_finite_check(m)]
      messages[:] = [message for _, message in found]
      return carry, checks.failure_code(found)

    # lax.scan's loop, with a bound known only when it runs: `count` iterations.
    xs = (indices, steps, keys, rows)

    def body(t, state):
      carry, codes = state
      carry, code = step(carry, jax.tree.map(lambda a: a[t], xs))
      return carry, codes if code is None else codes.at[t].set(code)

    carry, codes = jax.lax.fori_loop(0, count, body, (carry, jnp.zeros((length,), jnp.int32)))
    # [code, step] of the first failure: an ordinary output (a checkify error would make
    # the program's cache key differ at every compile, so that JAX's persistent
    # compilation cache never served it). Without per-step checks (no `messages` once the
    # step is traced), 0: `codes` is then a constant, whose search XLA folded at compile
    # time (2 s per 10^5 steps).
    first = jnp.argmax(codes != 0) if messages else 0
    failure = jnp.stack([codes[first], steps[first]])
    if settled:  # checked first: the per-step checks that remain come after
      failure = jnp.where(checks.all_finite(carry[0]), failure,
                          jnp.array([-1, 0], jnp.int32))
    return failure, carry

  out_shardings = (None if carry_shardings is None
                   else (parallel.replicated(mesh), carry_shardings))
  program = jax.jit(run, donate_argnums=() if finite_at_end else 0,
                    out_shardings=out_shardings)
  return program, messages


class NonFiniteStep(ValueError):
  """A training step whose gradient, update or params are not finite (NaN or inf): the
  message names what, ``step`` the first step known to fail, ``indices`` its batch and
  ``noise_key`` its noise's key (both ``None``: the params overflowed, each update finite),
  ``last_finite`` ``(params, opt_state, step)`` before it (``opt_state`` ``None``: donated)."""

  def __init__(self, message: str, step: int, indices=None, noise_key=None):
    super().__init__(message)
    self.step, self.indices, self.noise_key, self.last_finite = step, indices, noise_key, None


class Failure(NamedTuple):
  """A segment's first failed check: ``codes`` (``[code, step]``, as the program returned
  it, maybe not yet computed) and the messages its codes number."""

  codes: jax.Array
  messages: tuple

  def message(self) -> str | None:
    """The failure's message ending ``(at step t)``, :data:`PARAMS_NOT_FINITE`, or
    ``None`` when nothing failed (waits for the program)."""
    code, step = (int(v) for v in np.asarray(self.codes))
    if code == 0:
      return None
    if code == -1:
      return PARAMS_NOT_FINITE
    return f"{self.messages[code - 1]} (at step {step})"

  def non_finite(self) -> bool:
    """Whether the failed check is one of values that are not finite (waits for the
    program)."""
    code = int(np.asarray(self.codes)[0])
    return code == -1 or (code > 0 and checks.NON_FINITE in self.messages[code - 1])


class _Compiled(NamedTuple):
  """A compiled segment and its checks' messages; calling it gives ``(Failure, carry)``."""

  executable: Any
  messages: tuple

  def __call__(self, *args):
    codes, carry = self.executable(*args)
    return Failure(codes, self.messages), carry


_TRACING = threading.Lock()
"""Held while a segment is traced and lowered: tracing runs the user's model code, which
need not be thread-safe (a NumPyro model's effect handlers share one global stack, and
two models traced at once by two threads mixed their sites: :func:`dsgrad.recommend`
compiles in a thread beside a run), and holds the interpreter anyway; XLA's compilation,
which does not, still overlaps."""


def compiled_segment(objective: Objective, optimizer, batch_size: int, length: int,
                     example_args, mesh=None, carry_shardings=None, *,
                     finite_at_end: bool = False):
  """:func:`segment_program` compiled for ``example_args``; ``(executable, seconds spent
  compiling)`` (:func:`dsgrad.training.compile_cache.get_or_build`).

  On one device the executable is cached (:mod:`dsgrad.training.compile_cache`) under the
  objective's structure, not its data, and under the program's text, so successive
  :func:`dsgrad.fit` calls, :meth:`~dsgrad.Objective.with_data` copies and optimizers made
  again with the same settings share it."""
  def build():
    program, messages = segment_program(objective, optimizer, batch_size, length, mesh,
                                        carry_shardings, finite_at_end=finite_at_end)
    if mesh is None:
      return _Compiled(compile_cache.compiled_as_text(program, example_args, not finite_at_end,
                                                      _TRACING), tuple(messages))
    with _TRACING:
      lowered = program.lower(*example_args)
    return _Compiled(lowered.compile(), tuple(messages))
  if mesh is not None:  # placed on this mesh's devices: not shared
    t0 = time.perf_counter()
    return build(), time.perf_counter() - t0
  avals = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), example_args)
  key = ("fit segment", jax.tree.structure(objective), optimizer, batch_size, length,
         finite_at_end, jax.tree.structure(example_args), tuple(jax.tree.leaves(avals)))
  return compile_cache.get_or_build(key, build)


class SegmentRunner:
  """Runs the segments of one training run: the epoch orders of ``key``, one executable
  for segments of up to ``program_steps`` steps, and, with host data, the rows of the
  next block read while the device runs the current one.

  Args:
    objective: the objective, with its data.
    optimizer: an optax transformation that accepts ``indices`` and ``noise``.
    batch_size: data per step.
    key: the run's PRNG key; the batches come from ``split(key)[0]`` and step ``t``'s
      noise from ``fold_in(split(key)[1], t)``.
    mesh: optional :func:`dsgrad.training.parallel.data_mesh`.
    carry_shardings: with ``mesh``, the shardings of ``(params, opt_state)``.
    objective_arg: the objective to pass (default: ``objective``, placed as it is).
    program_steps: the length of the program that runs every segment (or host block) of
      at most that many steps; default: one program per length.

  Attributes:
    compile_seconds: seconds spent compiling so far (the segments and their epoch orders).
    step_seconds: total time spent running steps so far (compilation excluded).
  """

  def __init__(self, objective: Objective, optimizer, batch_size: int, key, *, mesh=None,
               carry_shardings=None, objective_arg=None, program_steps: int | None = None):
    self.objective, self.optimizer, self.batch_size = objective, optimizer, batch_size
    self.program_steps = program_steps
    self.key, self.mesh, self.carry_shardings = key, mesh, carry_shardings
    self.host_data = data_lib.host_leaves(objective)
    self.objective_arg = objective if objective_arg is None else objective_arg
    replicated = None if mesh is None else parallel.replicated(mesh)
    self.orders = batching.EpochOrders(batching.split_in_two(key)[0], objective.num_data,
                                       batch_size, replicated)
    self.reader = data_lib.RowReader(self.host_data, replicated)
    self.block = (host_block_steps(self.host_data, batch_size) if self.host_data else None)
    self.pending = None  # the block whose rows the reader is reading
    self.executables: dict = {}  # by program length (one per run with program_steps)
    self.checked: dict = {}  # by program length: every step checked, to run one again
    # Whether the range and finiteness checks are settled at each block's end, decided on
    # the first carry (a block read from the host is kept until its checks are settled).
    self.finite_at_end = None
    self.segment_compile_seconds = self.step_seconds = 0.0
    self.last_block = None  # set by run(): see reached()

  @property
  def compile_seconds(self) -> float:
    return self.segment_compile_seconds + self.orders.compile_seconds

  def _indices(self, start: int, steps: int):
    """The batch indices of ``steps`` steps from ``start``, from its program's window."""
    window = self.orders.window(start, steps, self._length(steps), host=self.orders.on_host)
    return batching.slice_window(window, start, steps, self.objective.num_data, self.batch_size)

  def _length(self, steps: int) -> int:
    """The program length for ``steps`` steps: ``program_steps`` (at most a host block)."""
    longest = self.program_steps or steps
    return max(steps, min(longest, self.block) if self.block else longest)

  def _read_ahead(self, start: int, steps: int) -> None:
    if self.host_data and self.pending != (start, steps):
      self.reader.submit(self._indices(start, steps), self._length(steps))
      self.pending = (start, steps)

  def blocks(self, start: int, length: int) -> list:
    """The ``(start, steps)`` blocks of a segment: one, unless host rows are read ahead."""
    cap = min(length, self.block) if self.block else length
    return [(s, min(cap, start + length - s)) for s in range(start, start + length, cap)]

  def prepare(self, params, opt_state, start: int, length: int) -> None:
    """Compiles the executables :meth:`run` of the same segment will use, running nothing
    (safe from several threads, one runner each); host rows are stood in for by shapes."""
    for at, steps in self.blocks(start, length):
      rows = {k: jax.ShapeDtypeStruct((self._length(steps), self.batch_size, *a.shape[1:]),
                                      a.dtype) for k, a in self.host_data.items()}
      self._executable(self._length(steps), self._args((params, opt_state), at, steps, rows))

  def _args(self, carry, at: int, steps: int, rows) -> tuple:
    window = self.orders.window(at, steps, self._length(steps))
    return (carry, self.key, jnp.int32(at), jnp.int32(steps), self.objective_arg, window, rows)

  def _executable(self, steps: int, args, checked: bool = False):
    """The compiled segment program of ``steps`` steps (``checked``: every step checked)."""
    if self.finite_at_end is None:
      self.finite_at_end = tables.tree_bytes(args[0]) <= CHECK_AT_END_BYTES
    at_end = self.finite_at_end and not checked
    # Without checks at the end, the usual executables already check every step.
    cache = self.checked if checked and self.finite_at_end else self.executables
    if steps not in cache:
      cache[steps], seconds = compiled_segment(
          self.objective, self.optimizer, self.batch_size, steps, args, self.mesh,
          self.carry_shardings, finite_at_end=at_end)
      self.segment_compile_seconds += seconds
    return cache[steps]

  def _settle(self, error, carry, at: int, steps: int, rows) -> None:
    """Raises the failed value check ``error`` of the call of ``steps`` steps from step
    ``at``, from ``carry`` (kept when the checks are settled at the end) on ``rows``. Where
    the params became non-finite, the call runs again from ``carry`` with every step
    checked, to raise the failing check with its step, then up to that step (``last_finite``)."""
    message = error.message()
    if message and self.host_data:  # a row of a file, not the maths, may be at fault
      host_data_lib.check_finite_rows(self.host_data, self._indices(at, steps))
    replay_from = None  # the block's input, kept by its program: for the last finite state
    if message == PARAMS_NOT_FINITE:
      replay_from = jax.tree.map(jnp.copy, carry)  # the checked program donates its input
      args = self._args(carry, at, steps, rows)
      error = self._executable(self._length(steps), args, checked=True)(*args)[0]
      message = error.message() or (
          f"{PARAMS_NOT_FINITE} (steps {at} to {at + steps - 1}) while every step's update "
          "was finite: adding an update to the params overflowed (a step size too large?)")
    if not message:
      return
    at_step = error.non_finite()  # else the params overflowed while every update was finite
    if not (at_step or message.startswith(PARAMS_NOT_FINITE)):
      raise ValueError(message)
    step = int(np.asarray(error.codes)[1]) if at_step else at
    batch = ((np.asarray(self._indices(step, 1))[0],  # its rows and noise key, as run() draws
              batching.fold_in(batching.split_in_two(self.key)[1], step)) if at_step else ())
    failure = NonFiniteStep(message, step, *batch)
    if replay_from is not None:  # the steps before the failing one, again: finite, the same
      args = self._args(replay_from, at, steps, rows)
      args = (*args[:3], jnp.int32(step - at), *args[4:])
      failure.last_finite = (*self._executable(self._length(steps), args)(*args)[1], step)
    elif carry is not None and carry[1] is None:  # a donated carry: run() copied the params
      failure.last_finite = (carry[0], None, at)
    raise failure

  def reached(self):
    """``(params, opt_state, step)`` after the last block :meth:`run` called, waited for
    and its checks settled (a failed one raises), for a run interrupted; ``None`` when no
    block ran, or the interrupt came between a call and its result (its input donated)."""
    if self.last_block is None:
      return None
    params, opt_state, error, carry, at, steps, rows = self.last_block
    if any(leaf.is_deleted() for leaf in jax.tree.leaves((params, opt_state))
           if isinstance(leaf, jax.Array)):
      return None
    jax.block_until_ready((params, opt_state))
    if error is not None:
      self._settle(error, carry, at, steps, rows)
    return params, opt_state, at + steps

  def run(self, params, opt_state, start: int, length: int, following=None):
    """Steps ``start .. start + length - 1``; returns ``(params, opt_state)``, ready.

    ``following``, the ``(start, length)`` of the next segment, lets the rows of its first
    block be read while this segment's last block runs."""
    parts = self.blocks(start, length)
    parts_next = self.blocks(*following)[:1] if following is not None else []
    for k, (at, steps) in enumerate(parts):
      # The block's time counts its batches' epoch orders and host rows (a run's work,
      # which a loop given its batches would not do), not its compilation.
      t0, compiling = time.perf_counter(), self.compile_seconds
      self._read_ahead(at, steps)
      rows = self.reader.take() if self.host_data else {}
      self.pending = None
      carry = (params, opt_state)
      args = self._args(carry, at, steps, rows)
      program = self._executable(self._length(steps), args)
      kept = carry if self.finite_at_end else (jax.tree.map(jnp.copy, params), None)  # donated
      upcoming = parts[k + 1:] or parts_next
      if upcoming:
        # The next block's rows, read while this one runs. Its batch indices are computed
        # before this block's steps are queued: after, they would wait for those steps.
        self._read_ahead(*upcoming[0])
      error, (params, opt_state) = program(*args)
      # What an interrupt keeps (:meth:`reached`): this block's result, its checks unsettled.
      self.last_block = (params, opt_state, error, kept, at, steps, rows)
      jax.block_until_ready((params, opt_state))
      self.step_seconds += time.perf_counter() - t0 - (self.compile_seconds - compiling)
      self._settle(error, kept, at, steps, rows)
      self.last_block = (params, opt_state, None, None, at, steps, None)  # settled
    return params, opt_state
