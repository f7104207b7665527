"""What :func:`dsgrad.fit` returns: the run's parameters, state, history and timing, and
the run a divergence stopped, kept on the error it raises.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dsgrad.training.resume import History
from dsgrad.training.segments import NonFiniteStep


class FitTiming(NamedTuple):
  """Where a :func:`fit` call's wall-clock went, in seconds; the parts add up to ``total``.

  Attributes:
    total: the call, from entry to return.
    steps: running the training steps (their batches' epoch orders and host reads
      included), as ``history.wall_time`` counts them.
    compile: compiling the training segments.
    evaluations: the ELBO evaluations and the last one's k-hat, compiles included.
    setup: the rest: argument and value checks, the estimator's initial state (a SAGA
      table's or an SVRG snapshot's full pass), copies, checkpoints.
  """

  total: float
  steps: float
  compile: float
  evaluations: float
  setup: float


class FitResult(NamedTuple):
  """Returned by :func:`fit`.

  Attributes:
    params: final parameters.
    opt_state: final optimizer (and estimator) state.
    history: a :class:`History`.
    compile_seconds: time spent compiling the training segment.
    pareto_k: how far to trust the approximation at the end: PSIS k-hat of the final
      ELBO evaluation's draws (:mod:`dsgrad.psis`; below 0.5 good, from 0.7 the
      approximation misses part of the posterior). ``None`` when it was not computed:
      ``elbo_samples < 25``, an objective that does not expose ``log q``
      (``Objective.log_q_offset``) or draws one noise per datum, or arviz-stats (the
      ``diagnostics`` extra) not installed.
    diagnosis: one sentence on ``pareto_k`` (:func:`dsgrad.psis.diagnose`), or why it
      was not computed.
    timing: a :class:`FitTiming`: the call's seconds split into steps, compiling,
      evaluations and setup (``None`` in an interrupted run's result).
    warnings: sentences on what makes the ELBO trace untrustworthy
      (:func:`dsgrad.elbo_trust.elbo_trace_warnings`: an estimate above the model's
      log evidence bound, a jump of orders of magnitude or an ELBO without bound, a run
      that ended far below its best); empty when none. Printed with ``progress``.
    step: the step the run ended at: ``num_steps``, or earlier where ``max_seconds``
      stopped it.
  """

  params: Any
  opt_state: Any
  history: History
  compile_seconds: float
  pareto_k: float | None = None
  diagnosis: str = ""
  timing: FitTiming | None = None
  warnings: tuple = ()
  step: int | None = None


def with_run_so_far(error, runner, state: tuple, record) -> Exception:
  """``error`` (a step or an ELBO that was not finite), given the run up to its last
  finite state as ``error.result``, a :class:`FitResult`, with a note saying so: nothing
  trained is lost. A step's failure keeps it where the program kept its input (a carry of
  up to :data:`dsgrad.training.segments.CHECK_AT_END_BYTES`), else the params alone at
  the start of the failing block of steps (``opt_state`` ``None``); an ELBO's, the params
  it was estimated at. Where no step ran before the failure, nothing is added.

  Args:
    error: the exception, to raise.
    runner: the run's :class:`~dsgrad.training.segments.SegmentRunner`.
    state: ``(params, opt_state, step, start_step)`` after the run's last segment.
    record: the run's :class:`~dsgrad.training.resume.Recorder` (its history).

  Returns:
    ``error``.
  """
  step_failed = isinstance(error, NonFiniteStep)  # else the ELBO at finite params
  last = error.last_finite if step_failed else state[:3]
  if last is None or last[2] <= state[3]:
    return error
  error.result = FitResult(last[0], last[1], record.history(), runner.compile_seconds, None,
                           f"k-hat not computed: the run stopped at step {last[2]}", step=last[2])
  if last[1] is None:  # a carry the program donates: the params alone were copied
    kept = (f"The run's params after step {last[2]}, where the failing block of steps began, "
            "are kept (its optimizer state, too large to copy, is not)")
  else:
    what = "its last finite one" if step_failed else "its params finite, the ELBO there not"
    kept = f"The run's state after step {last[2]} ({what}) is kept"
  error.add_note(f"{kept}: catch the error and take its .result (params, opt_state, history; "
                 "in a notebook sys.last_value.result), e.g. to continue it with a smaller "
                 "step size.")
  return error
