"""A fit loop for doubly-stochastic objectives: reshuffled epochs, jitted ``lax.scan``
segments, a progress bar with the current ELBO, a history, and checkpoints.

    result = dsgrad.fit(objective, optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2)),
                        params, jax.random.key(0), num_steps=5000, batch_size=100)
    result.params, result.history.elbo

Works with every estimator (and with plain optax optimizers, which ignore the batch's
``indices``/``noise``). Training is a deterministic function of the key: batch ``t`` is
slice ``t`` of the epoch permutations drawn from the key, its noise from the key folded
with ``t``, so a run resumed from a checkpoint continues bit-identically.

Its parts live by concept: the batches in :mod:`dsgrad.training.batching`, the steps in
:mod:`dsgrad.training.segments`, checkpoints and resumes in :mod:`dsgrad.training.resume`.

References:
  Wang, Geffner, Domke (2024), Sec. 7 (reshuffled epochs, ELBO traces), App. H.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time

import jax
import jax.numpy as jnp
import optax

from dsgrad import checks, elbo_estimates, elbo_trust, psis, tables
from dsgrad.estimators.chain import check_chain_order, check_descends
from dsgrad.estimators.checked import check_state
from dsgrad.objective import Objective
from dsgrad.training import batching, checkpoint as checkpoint_lib, cpu_threads, evaluation_plan
from dsgrad.training import parallel
from dsgrad.training import host_data, progress as progress_lib, resume as resume_lib, segments
from dsgrad.training.progress import Interrupted
from dsgrad.training import fit_result
from dsgrad.training.fit_result import FitResult, FitTiming  # noqa: F401  re-exported
# Re-exported: fit's checkpoints and history are dsgrad.training.resume's.
from dsgrad.training.resume import (History, restore_fit_checkpoint, restore_fit_history,  # noqa: F401
                           run_settings, save_fit_checkpoint, state_fingerprints)
from dsgrad.training.evaluation_plan import DEFAULT_EVALUATIONS, default_eval_every  # noqa: F401


RESUME_CHANGES = ("num_steps", "progress", "elbo_samples", "eval_every", "checkpoint_path",
                  "checkpoint_every", "max_seconds")
"""What an interrupted fit's ``resume`` may change: the rest (objective, optimizer, key, batch
size, mesh) decides the batches and the state, and another value would not continue the run."""


def _resume(call: dict, stop: Interrupted, **changes) -> "FitResult":
  """Continues an interrupted :func:`fit` from ``stop.result`` (``Interrupted.resume``)."""
  other = sorted(set(changes) - set(RESUME_CHANGES))
  if other:
    raise TypeError(f"resume() of an interrupted dsgrad.fit can change "
                    f"{', '.join(RESUME_CHANGES)}; not {', '.join(other)}, which would not "
                    "continue this run")
  call = {**call, **changes}
  objective, optimizer, key = (call.pop(k) for k in ("objective", "optimizer", "key"))
  return fit(objective, optimizer, stop.result.params, key, opt_state=stop.result.opt_state,
             start_step=stop.step, history=stop.result.history, **call)


def _interrupted(runner, history: History, settings: dict, call: dict) -> KeyboardInterrupt:
  """The exception for an interrupt: :class:`Interrupted` with the state after the last
  block of steps, or a plain ``KeyboardInterrupt`` where none ran (nothing was trained)."""
  reached = runner.reached()
  if reached is None:
    return KeyboardInterrupt()
  params, opt_state, step = reached
  saved, of = call["checkpoint_path"], (f" of {call['num_steps']}" if call["num_steps"]
                                          is not None else "")
  if saved is not None:
    save_fit_checkpoint(saved, params, opt_state, step, history, settings=settings)
  message = (f"fit interrupted at step {step}{of}; the run so far is kept: "
             "catch dsgrad.Interrupted and take its .result (in a notebook, "
             "sys.last_value.result), or call its .resume() to continue to the end"
             + (f"; saved to {os.fspath(saved)!r}, where the same call with resume=True "
                "continues" if saved is not None else ""))
  result = FitResult(params, opt_state, history, runner.compile_seconds, None,
                     f"k-hat not computed: the run was interrupted at step {step}")
  return Interrupted(message, result, step, call["num_steps"], functools.partial(_resume, call))


def _check_start(params, num_steps: int, start_step: int) -> None:
  """Refuses params (given or restored) and a step that no run can start from."""
  if not jax.tree.leaves(params) or hasattr(params, "num_data"):  # None, a model: a slip
    raise TypeError("dsgrad.fit: params must be the variational parameters (a pytree of "
                    f"float arrays, e.g. dsgrad.meanfield_init(model)), got {type(params)}")
  checks.check_floating_params(params, "dsgrad.fit", full_precision=True)
  # A NaN start would train silently to a NaN history with a plain optax optimizer.
  checks.value_checks(checks.finite_checks(params, "params passed to fit"))
  if num_steps < start_step:
    raise ValueError(f"num_steps={num_steps} (all steps) is before the run's step {start_step}")


def _check_fit_arguments(objective, batch_size, checkpoint_path, resume, start_step, every):
  """Refuses, by name and before anything is compiled or trained, the counts and paths
  :func:`fit` cannot use (their kinds: fit's argument declarations)."""
  checks.check_batch_size(batch_size, objective.num_data, "dsgrad.fit")
  resume_lib.check_checkpoint_path(checkpoint_path, resume, start_step, every)


_ELBO_SAMPLES = checks.optional(checks.count(2, also=(0,)))


@checks.arguments(objective=checks.objective(), optimizer=checks.optimizer(),
                  key=checks.prng_key(), num_steps=checks.optional(checks.count(0)),
                  batch_size=checks.count(1), eval_every=checks.optional(checks.count(1)),
                  elbo_samples=_ELBO_SAMPLES, start_step=checks.count(0),
                  checkpoint_every=checks.optional(checks.count(1)),
                  max_seconds=checks.optional(checks.positive()),
                  segment_steps=checks.optional(checks.count(1)))
def fit(objective: Objective, optimizer, params, key, *, num_steps: int | None = None,
        batch_size: int, eval_every: int | None = None, elbo_samples: int | None = None,
        progress: bool = True,
        opt_state=None, start_step: int = 0, checkpoint_path: str | os.PathLike | None = None,
        checkpoint_every: int | None = None, history: History | None = None,
        resume: bool = False, mesh=None, max_seconds: float | None = None,
        segment_steps: int | None = None) -> FitResult:
  """Optimizes ``objective`` with ``optimizer`` (an estimator chained with an optax rule).

  Steps run in jitted ``lax.scan`` segments of ``eval_every`` steps with the state
  donated; after a segment the full-data ELBO is estimated by Monte Carlo
  (:func:`dsgrad.elbo`, chunked), recorded and shown on the progress bar (tqdm when
  installed, else one printed line per evaluation).

  Args:
    objective: the doubly-stochastic objective.
    optimizer: an optax transformation; the estimator first in a chain, e.g.
      ``optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))``, or ``dsgrad.smiso``.
      A plain optax optimizer (the naive estimator) works too.
    params: initial parameters.
    key: PRNG key; determines every batch and noise draw.
    num_steps: total steps, counted from 0 (including ``start_step`` already taken).
      ``num_steps == start_step`` takes no step and evaluates nothing (the history is
      the one passed in); :func:`dsgrad.elbo` estimates the ELBO at given params.
      ``None`` (with ``max_seconds`` only): train until the time is up, with an ELBO
      evaluation every ``1 / DEFAULT_EVALUATIONS`` of it (or, where that is longer, ten
      times the evaluation's own time), each ending a period for ``checkpoint_every``.
    batch_size: data per step.
    eval_every: steps per segment, each followed by an ELBO evaluation with
      ``elbo_samples`` draws. By default segments are one epoch, ``N // batch_size``, or
      ``num_steps / DEFAULT_EVALUATIONS`` where that is longer, and the evaluations
      before the last are planned to cost about a tenth of the steps: fewer draws (at
      least 2), or every few segments where two draws of every datum cost more
      (:mod:`dsgrad.training.evaluation_plan`; with 200,000 data, 100 draws an epoch cost 9 times
      the steps).
    elbo_samples: Monte Carlo samples of the last ELBO estimate (the run's ELBO and
      k-hat), and of the others up to the plan above; 0 to skip evaluation. Default: 100,
      or with ``max_seconds`` as many as a tenth of it affords (k-hat needs 25).
    progress: show progress; or a function as ``dsgrad.training.progress.elbo_bar`` makes.
    opt_state: state to continue from (default ``optimizer.init(params)``).
    start_step: the step ``params``/``opt_state`` were taken at, when resuming.
    checkpoint_path: if given, ``(params, opt_state, step)`` and the history so far are
      saved there every ``checkpoint_every`` segments and at the end (atomic;
      :mod:`dsgrad.training.checkpoint`).
    checkpoint_every: segments between checkpoints (default 1; only with a checkpoint_path).
    history: when resuming, the history up to ``start_step``
      (:func:`restore_fit_history`, or a :class:`Interrupted`'s, which can end before
      it); the returned history continues it, wall-clock too.
    resume: if true and ``checkpoint_path`` exists, continue from it: params, optimizer
      state, step and history are restored (``params`` then only gives the structure),
      so an interrupted run can be restarted with the same call. The checkpoint holds
      the run's settings (number of data, ``batch_size``, ``key``); a call with other
      settings is refused, since it would not continue the same run.
    mesh: optional :func:`dsgrad.training.parallel.data_mesh`: train data-parallel on its
      devices -- each batch split across them, per-datum tables split by datum,
      everything else replicated (:mod:`dsgrad.training.parallel`). ``batch_size`` and the
      number of data must be multiples of the number of devices.
    max_seconds: optional wall-clock limit of the call, compiles and evaluations
      included: the run stops at the step where its steps, and the last evaluation after
      them, fill it (timed by the steps before: a first 64, and an evaluation after them,
      always run, the evaluation twice: cold, then warm; the segments' program runs any
      count of steps). Where the last evaluation's draws would not fit, it takes the draws
      of the program already timed, without k-hat (``FitResult.diagnosis`` says so; a
      limit that leaves no time to train cannot be kept whole: the first 64 steps and their
      evaluation always run). ``FitResult.step`` says where it stopped; the
      schedule is the optimizer's, so size ``num_steps`` to the time (as
      :func:`dsgrad.recommend` does) for a schedule that ends with the run.
    segment_steps: steps per compiled segment, where they should be fewer than
      ``eval_every`` (which is then rounded up to a multiple of it, or must be one where
      given): a finer ``max_seconds`` stop, or the same program for runs with other
      evaluation rhythms. ``checkpoint_every`` then counts evaluation periods.

  Returns:
    A :class:`FitResult`. Resume with ``restore_fit_checkpoint`` (its step is the
    ``start_step``) and ``restore_fit_history``: the resumed run's parameters and
    history are those of an uninterrupted run (wall-clock aside).

  Raises:
    ValueError: before anything is compiled, on a count that is not an integer of the
      right range (``num_steps >= 0``; ``batch_size``, ``eval_every``,
      ``checkpoint_every >= 1``), ``batch_size`` above the number of data, non-finite
      ``params``, a ``checkpoint_path`` whose folder is missing or not writable, or that
      is not a regular file (a folder, a FIFO), or (without ``resume``, from step 0)
      holds a file; with ``resume``, a
      checkpoint written with other settings, damaged (checksum), or whose entries,
      shapes or dtypes differ from this optimizer's state. After a segment, when an
      estimator's value check failed during it (a non-finite gradient, params or
      noise), with the check's message and the first step it failed at: the checks
      travel out of the compiled segment as one small code per step
      (:func:`dsgrad.checks.collected`) instead of a host callback per step. Such an
      error, and one of an ELBO that is not finite, holds the run up to its last finite
      state as ``.result``, a :class:`FitResult` (for a step's, where the params and
      optimizer state take more than 64 MiB, the params where its block of steps began).
    Interrupted: on an interrupt (Ctrl-C), once the block of steps running has ended:
      a ``KeyboardInterrupt`` that holds the run so far (``.result``, ``.resume()``),
      saved to ``checkpoint_path`` too when given.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> import optax
    >>> optimizer = optax.chain(dsgrad.joint_svrg(objective, every=10), optax.adam(1e-2))
    >>> result = dsgrad.fit(objective, optimizer, params, jax.random.key(1), num_steps=100,
    ...                     batch_size=10, elbo_samples=20, progress=False)
    >>> result.history.step.tolist()  # an ELBO evaluation per epoch of N / B steps
    [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    >>> bool(result.history.elbo[-1] > result.history.elbo[0])
    True
  """
  entered = time.perf_counter()
  _check_fit_arguments(objective, batch_size, checkpoint_path, resume, start_step, checkpoint_every)
  cpu_threads.warn_if_split()
  # One run writes a checkpoint path at a time: a second would overwrite its files.
  with checks.plain_errors(), (checkpoint_lib.exclusive(checkpoint_path)
                                if checkpoint_path is not None else contextlib.nullcontext()):
    optimizer = optax.with_extra_args_support(optimizer)
    settings = run_settings(objective, key, batch_size,
                            None if checkpoint_path is None else (optimizer, params))
    if resume and checkpoint_path and (found := checkpoint_lib.latest(checkpoint_path)):
      params, opt_state, start_step, history = _restore(found, settings, optimizer,
                                                        params, opt_state)
    num_steps_given, num_steps = num_steps, _steps(num_steps, max_seconds)
    _check_start(params, num_steps, start_step)
    segment_steps_given = segment_steps
    evaluation, segment_steps = _plan(objective, batch_size, num_steps_given, eval_every,
                                      elbo_samples, segment_steps, max_seconds)
    eval_every_given, eval_every = eval_every, evaluation.eval_every
    start_params = params  # for a divergence's note and warning: _initial_state copies them
    params, opt_state, placement = _initial_state(objective, optimizer, params, opt_state,
                                                  batch_size, mesh)
    run_key, eval_key = batching.split_in_two(key)
    runner = segments.SegmentRunner(objective, optimizer, batch_size, run_key, mesh=mesh,
        program_steps=min(segment_steps, num_steps - start_step), **placement)
    record = resume_lib.Recorder(history, start_step)
    total = None if num_steps_given is None else num_steps - start_step  # None: until stopped
    # No total before a timed run's step is timed: num_steps far beyond it read as hours.
    evaluations = evaluation_plan.Evaluations(objective, evaluation, eval_key, record,
        progress_lib.elbo_bar(progress, None if max_seconds is not None else total),
        timed=max_seconds is not None, until_stopped=max_seconds if total is None else None)
    step, periods, end = start_step, 0, num_steps  # end: earlier where max_seconds stops it
    evaluate = lambda length: evaluations.after(step, end, length, params, runner.step_seconds)

    if record.lacks(step) and evaluation.evaluates(step, num_steps):
      evaluate(0)  # an interrupt came at a segment's end, before its evaluation
    try:  # a Ctrl-C in a program's host read is an interrupt too
      with host_data.reads_interruptible():
        while step < end:
          end, length = evaluations.end_within(  # 0 steps: stopped by max_seconds
              max_seconds, time.perf_counter() - entered, step,
              _segment_length(step, segment_steps, num_steps), num_steps,
              runner.step_seconds / max(1, step - start_step))
          if length:
            following = ((step + length, _segment_length(step + length, segment_steps, end))
                         if step + length < end else None)
            params, opt_state = runner.run(params, opt_state, step, length, following)
            step += length
          evaluated = evaluate(length)
          ended = length and (evaluated if total is None else step % eval_every == 0)  # a period
          periods += bool(ended)
          if checkpoint_path is not None and (step == end or (
              ended and periods % (checkpoint_every or 1) == 0)):
            save_fit_checkpoint(checkpoint_path, params, opt_state, step, record.history(),
                                settings=settings)
    except (segments.NonFiniteStep, elbo_estimates.NonFiniteELBO) as error:
      elbo_trust.note_divergence(error, objective, start_params, eval_key,
                                 getattr(error, "step", step) - start_step)  # the failing step
      raise fit_result.with_run_so_far(error, runner, (params, opt_state, step, start_step), record)
    except KeyboardInterrupt:
      evaluations.bar(0, step, None, None, close=True)
      raise _interrupted(runner, record.history(), settings, dict(
          objective=objective, optimizer=optimizer, key=key, num_steps=num_steps_given,
          batch_size=batch_size, eval_every=eval_every_given, elbo_samples=elbo_samples,
          progress=progress, checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
          mesh=mesh, max_seconds=max_seconds, segment_steps=segment_steps_given)) from None
    evaluations.bar(0, step, None, None, close=True, left=0)  # full: the run's end, reached
    history = record.history()
    k_hat, diagnosis = evaluations.k_hat, evaluations.diagnosis
    trace_warnings = _report(progress, k_hat, diagnosis, elbo_trust.run_warnings(
        objective, history, start_params, eval_key, start_step))
    return FitResult(params, opt_state, history, runner.compile_seconds, k_hat,
                     diagnosis, _timing(entered, runner, evaluations.seconds), trace_warnings,
                     step)


@checks.arguments(objective=checks.objective(),
                  optimizer=checks.optimizer(), key=checks.prng_key(), num_steps=checks.count(0),
                  batch_size=checks.count(1), eval_every=checks.optional(checks.count(1)),
                  elbo_samples=_ELBO_SAMPLES, start_step=checks.count(0),
                  segment_steps=checks.optional(checks.count(1)))
def compile_fit(objective: Objective, optimizer, params, key, *, num_steps: int,
                batch_size: int, eval_every: int | None = None, elbo_samples: int | None = None,
                opt_state=None, start_step: int = 0, segment_steps: int | None = None) -> float:
  """Compiles the training segments that :func:`fit` with the same arguments and the same
  optimizer object will run, and runs none of them: that fit then starts at once. Safe to
  call in a thread while another run trains (tracing takes a lock; XLA's compilation
  overlaps the other run's steps), which is how :func:`dsgrad.recommend` prepares its
  candidates without waiting for them.

  It takes the arguments :func:`fit` will be called with that decide the programs:
  ``objective``, ``optimizer``, ``params``, ``key``, ``num_steps``, ``batch_size``,
  ``eval_every``, ``elbo_samples``, ``opt_state``, ``start_step``, ``segment_steps`` (the
  segment lengths follow from the step counts and the evaluation plan).

  Returns:
    The seconds spent compiling (0.0 where every program was compiled before).

  Example::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective, params = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)
    >>> optimizer = optax.adam(1e-2)
    >>> settings = dict(num_steps=50, batch_size=10, elbo_samples=0)
    >>> seconds = dsgrad.compile_fit(objective, optimizer, params, jax.random.key(1), **settings)
    >>> result = dsgrad.fit(objective, optimizer, params, jax.random.key(1), progress=False,
    ...                     **settings)
    >>> seconds > 0, result.compile_seconds
    (True, 0.0)
  """
  optimizer = optax.with_extra_args_support(optimizer)
  _check_fit_arguments(objective, batch_size, None, False, 0, None)
  every = _plan(objective, batch_size, num_steps, eval_every, elbo_samples, segment_steps)[1]
  # fit's checks of its start and its evaluations' keys are small programs to compile too.
  _check_start(params, num_steps, start_step)
  params, opt_state, _ = _initial_state(objective, optimizer, params, opt_state, batch_size, None)
  run_key, eval_key = batching.split_in_two(key)
  batching.fold_in(eval_key, start_step)
  runner = segments.SegmentRunner(objective, optimizer, batch_size, run_key,
                                  program_steps=min(every, num_steps - start_step))
  # Every segment, the first and the last included, runs on the one program this compiles.
  runner.prepare(params, opt_state, start_step, _segment_length(start_step, every, num_steps))
  return runner.compile_seconds


def _report(progress: bool, k_hat, diagnosis: str, trace_warnings: tuple) -> tuple:
  """Prints, with ``progress``, the k-hat diagnosis and the trace's warnings (returned)."""
  if progress and k_hat is not None:
    print(("warning: " if k_hat >= psis.K_HAT_BAD else "") + diagnosis, flush=True)
  for message in trace_warnings if progress else ():
    print("warning: " + message, flush=True)
  return trace_warnings


def _timing(entered: float, runner, evaluation_seconds: float) -> FitTiming:
  """fit's :class:`FitTiming` at its return (setup: not steps, compiles or evaluations)."""
  total = time.perf_counter() - entered
  return FitTiming(total, runner.step_seconds, runner.compile_seconds, evaluation_seconds,
                   total - runner.step_seconds - runner.compile_seconds - evaluation_seconds)


def _restore(checkpoint_path, settings: dict, optimizer, params, opt_state):
  """``(params, opt_state, step, history)`` from a checkpoint written by a run with the
  same ``settings``. The template needs shapes only: no initial full pass, no table
  materialized whole on one device before it is sharded."""
  raw = checkpoint_lib.restore_raw(checkpoint_path)
  resume_lib.check_resume_settings(checkpoint_path, raw, settings)
  template = jax.eval_shape(optimizer.init, params) if opt_state is None else opt_state
  params, opt_state, step = resume_lib.restore_fit_tree(checkpoint_path, raw, params, template)
  checks.value_checks(checks.finite_checks(
      opt_state, f"the optimizer state restored from checkpoint_path "
      f"{os.fspath(checkpoint_path)!r}"))
  return params, opt_state, step, resume_lib.history_from_raw(raw)


def _initial_state(objective, optimizer, params, opt_state, batch_size: int, mesh):
  """Fresh copies of ``(params, opt_state)`` (``optimizer.init`` when no state is given),
  placed on ``mesh`` when given, and the segments' placement arguments."""
  placement = {}
  if mesh is None:  # unsharded: a sharded state spreads over the devices' memories
    host_data.check_training_state_fits(optimizer, params, objective.num_data, "dsgrad.fit")
  else:
    parallel.check_batch_size(batch_size, mesh)
    if opt_state is None:
      params, opt_state = parallel.init_sharded(optimizer, params, mesh)
    else:
      params = jax.device_put(params, parallel.replicated(mesh))
      opt_state = parallel.shard_state(mesh, opt_state)
    placement = dict(
        carry_shardings=(jax.tree.map(lambda _: parallel.replicated(mesh), params),
                         parallel.state_shardings(mesh, opt_state)),
        objective_arg=parallel.place_data(mesh, objective))
  # Segments donate their carry: copies keep the caller's arrays valid, strongly typed so
  # that a weakly typed initial value does not compile the segments twice.
  params = jax.tree.map(lambda p: jnp.array(p, dtype=jnp.asarray(p).dtype), params)
  checks.check_objective_evaluates(objective, params, "fit")
  fresh = opt_state is None
  if not fresh:  # a state passed in or restored: the one this optimizer's init makes
    check_state(optax.with_extra_args_support(optimizer), opt_state, params, "dsgrad.fit")
  opt_state = (optimizer.init(params) if fresh  # full-data means of other data made again
               else tables.for_data(jax.tree.map(jnp.copy, opt_state), objective))
  check_chain_order(opt_state, "fit", steps=True)  # first: it names a missing update rule
  check_descends(optimizer, opt_state, params, "fit", fresh)
  return params, opt_state, placement


def _plan(objective: Objective, batch_size: int, num_steps, eval_every, elbo_samples,
          segment_steps, max_seconds=None) -> tuple:
  """``(evaluation plan, steps per segment)``: of ``eval_every`` steps, or ``segment_steps``
  (at most 4,096 with only ``max_seconds``: the first segment runs before a step is timed)."""
  plan = evaluation_plan.plan(objective.num_data, batch_size, num_steps, eval_every, elbo_samples)
  if segment_steps is None and eval_every is None and max_seconds is not None:
    segment_steps = min(plan.eval_every, 4096)
  elif segment_steps is None:
    return plan, plan.eval_every
  if eval_every is not None and eval_every % segment_steps:
    raise ValueError(f"eval_every={eval_every} must be a multiple of segment_steps="
                     f"{segment_steps}: evaluations come at a segment's end")
  return plan._replace(eval_every=-(-plan.eval_every // segment_steps) * segment_steps), \
      segment_steps


def _steps(num_steps: int | None, max_seconds) -> int:
  """fit's ``num_steps``, or where none is given (with ``max_seconds``: a run until then) as
  many as a step counter holds."""
  if num_steps is not None:
    return num_steps
  if max_seconds is None:
    raise TypeError("dsgrad.fit needs num_steps, or max_seconds to train until that many "
                    "seconds have passed")
  return evaluation_plan.UNTIL_STOPPED


def _segment_length(step: int, eval_every: int, num_steps: int) -> int:
  """Steps from ``step`` to the next multiple of ``eval_every`` (or the run's end): a
  run resumed where an interrupt stopped it, between evaluations, evaluates where the
  uninterrupted run does."""
  return min(eval_every - step % eval_every, num_steps - step)
