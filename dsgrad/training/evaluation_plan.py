"""When :func:`dsgrad.fit` estimates the full-data ELBO, and with how many draws.

An evaluation reads every datum once per Monte Carlo draw, so its cost grows with
``elbo_samples x N`` while a segment's steps cost ``eval_every x B`` data. A run's
natural rhythm, one evaluation an epoch with 100 draws, then costs about 100 epochs of
forward passes per epoch of steps: with 200,000 data (logistic regression, batch 100,
100 epochs, two CPU cores) fit took 25.9 s, of which 2.4 s were steps. Where the user
leaves the rhythm to fit (``eval_every=None``), the evaluations between the first and the
last are therefore planned to cost about a tenth of the steps they follow: fewer draws
(at least two, for a standard error), and where two draws of every datum still cost
more, after the first and every ``k``-th segment only (the first checks early that the
ELBO is finite); where fewer draws would save at most half of each evaluation, they
keep all of them (up to a fifth of the steps: a second program would cost about as
much to compile). The last evaluation, which gives the run's ELBO and
the PSIS k-hat, always has ``elbo_samples`` draws. The evaluations before the last may
take :data:`CHEAP_EVALUATIONS` data-draws between them whatever the run (tens of
milliseconds), so a short run on small data evaluates every segment in full.

The plan depends on the run's sizes only (not on timings), so a resumed run evaluates
where the uninterrupted one does.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from dsgrad import elbo_estimates, psis
from dsgrad.training import batching

DEFAULT_ELBO_SAMPLES = elbo_estimates.SHARED_PROGRAM_DRAWS
"""The last evaluation's draws where :func:`dsgrad.fit` is not given ``elbo_samples``: the
size of the program every run's evaluations share."""

LAST_EVALUATION_SHARE = 0.1
"""The share of ``max_seconds`` that the last evaluation of a run limited in time may take
where :func:`dsgrad.fit` is not given ``elbo_samples``: its draws are as many as that
affords, up to :data:`DEFAULT_ELBO_SAMPLES`. The 100 draws of a softmax regression's ELBO
on 10^6 rows (50 classes, 40 features) took 25 s of a 28 s run, which trained 2.5 s."""

PSIS_DRAWS = 25
"""The fewest draws of which PSIS gives a k-hat (a tail of five)."""

DEFAULT_EVALUATIONS = 100
"""At most this many ELBO evaluations in a :func:`dsgrad.fit` run without ``eval_every``.

One every epoch is the natural rhythm of a short run, but an evaluation (a full pass with
``elbo_samples`` draws) can cost more than an epoch of steps: on 569 data at batch 5 one
took 0.7 ms against 0.37 ms for the epoch's 113 steps, and a 1.5-million-step run spent
28 s in fit for 4.8 s of steps. Counted from step 0 (not from ``start_step``), so a
resumed run has the segments of an uninterrupted one."""

CHEAP_EVALUATIONS = 1_000_000
"""Data-draws (``draws x N``, summed) that the evaluations before a run's last may take
whatever the run: 10-40 ms on two CPU cores for a GLM."""

EVALUATION_SHARE = 0.1
"""What the evaluations between a run's first and last segment may cost, as a fraction
of the steps they follow."""

DRAWS_PER_STEP_DATUM = 2
"""Data-draws of an evaluation (a forward pass) that cost about as much as one datum of a
training step (a gradient, the optimizer's update and the step's fixed cost), the least
measured on two CPU cores: 6-12 for logistic regression (a step of batch 100 costs about
6 us), 2.2 for a Student-t regression written in NumPyro (9 us a step, 40 ns a datum-draw
of its ELBO)."""


UNTIL_STOPPED = 2 ** 31 - 1
"""The ``num_steps`` of a :func:`dsgrad.fit` given ``max_seconds`` and no ``num_steps``: as
many as a step counter holds, and its steps between evaluations when it has no
``eval_every`` (it is evaluated by time: :class:`Evaluations`' ``until_stopped``)."""


def default_eval_every(num_data: int, batch_size: int, num_steps: int) -> int:
  """:func:`dsgrad.fit`'s steps per segment when ``eval_every`` is not given: one epoch,
  or ``num_steps / DEFAULT_EVALUATIONS`` (rounded up) where that is longer."""
  return max(1, num_data // batch_size, -(-num_steps // DEFAULT_EVALUATIONS))


class EvaluationPlan(NamedTuple):
  """A run's segments and evaluations.

  Attributes:
    eval_every: steps per segment; segments end on its multiples counted from step 0.
    every_segments: segments between evaluations (``k``).
    draws: Monte Carlo draws of the evaluations before the last.
    last_draws: draws of the last evaluation (``elbo_samples``).
    fits_time: whether, in a run limited in time, the last evaluation takes fewer draws
      where ``last_draws`` would cost more than :data:`LAST_EVALUATION_SHARE` of it
      (``elbo_samples`` not given).
  """

  eval_every: int
  every_segments: int
  draws: int
  last_draws: int
  fits_time: bool = False

  def evaluates(self, step: int, num_steps: int) -> bool:
    """Whether the segment that ends at ``step`` is followed by an evaluation: the first
    (an early check that the ELBO is finite, and a first value on the progress bar),
    every ``every_segments``-th and the last."""
    return step in (num_steps, self.eval_every) or (
        step % self.eval_every == 0 and (step // self.eval_every) % self.every_segments == 0)


def plan(num_data: int, batch_size: int, num_steps: int | None, eval_every: int | None,
         elbo_samples: int | None) -> EvaluationPlan:
  """The plan of a :func:`dsgrad.fit` call: ``eval_every`` as given (every segment
  evaluated with ``elbo_samples`` draws), or else the default segments with the
  evaluations before the last priced at :data:`EVALUATION_SHARE` of their steps.

  Args:
    num_data: ``N``.
    batch_size: ``B``.
    num_steps: the run's steps, counted from 0; ``None`` for a run until a time limit,
      evaluated by time (:class:`Evaluations`' ``until_stopped``) with the draws of a
      run of ``DEFAULT_EVALUATIONS`` epochs.
    eval_every: fit's argument (``None``: planned here).
    elbo_samples: fit's argument: the last evaluation's draws (0: no evaluation;
      ``None``: :data:`DEFAULT_ELBO_SAMPLES`, fewer where a time limit calls for them).

  Returns:
    An :class:`EvaluationPlan`.

  Example::

    >>> from dsgrad.training.evaluation_plan import plan
    >>> plan(200_000, 100, 200_000, None, 100)[:4]  # two draws every tenth epoch
    (2000, 10, 2, 100)
    >>> plan(1_000, 10, 20_000, None, 100)  # ten draws a segment
    EvaluationPlan(eval_every=200, every_segments=1, draws=10, last_draws=100, fits_time=False)
    >>> plan(20_000, 100, 6_000_000, None, 100)  # 100 draws would save under half
    EvaluationPlan(eval_every=60000, every_segments=1, draws=100, last_draws=100, fits_time=False)
    >>> plan(50, 5, 30, None, 100)  # cheap evaluations: in full
    EvaluationPlan(eval_every=10, every_segments=1, draws=100, last_draws=100, fits_time=False)
  """
  if elbo_samples is None:
    return plan(num_data, batch_size, num_steps, eval_every,
                DEFAULT_ELBO_SAMPLES)._replace(fits_time=True)
  if num_steps is None:
    epochs = plan(num_data, batch_size, DEFAULT_EVALUATIONS * max(1, num_data // batch_size),
                  eval_every, elbo_samples)
    return epochs._replace(eval_every=eval_every or UNTIL_STOPPED, every_segments=1)
  if eval_every is not None or elbo_samples == 0:
    every = eval_every or default_eval_every(num_data, batch_size, num_steps)
    return EvaluationPlan(every, 1, elbo_samples, elbo_samples)
  every = default_eval_every(num_data, batch_size, num_steps)
  before_last = max(1, -(-num_steps // every) - 1)
  allowance = max(CHEAP_EVALUATIONS / before_last,
                  EVALUATION_SHARE * DRAWS_PER_STEP_DATUM * every * batch_size)
  draws = min(elbo_samples, int(allowance // num_data))
  if 2 * draws >= elbo_samples:
    # At most half of each evaluation to save, of the order of what compiling a second
    # program costs (a NumPyro Student-t regression: 1.2 s to compile, 36 ms a 100-draw
    # evaluation of 20,000 data, so 99 halves save 1.8 s).
    return EvaluationPlan(every, 1, elbo_samples, elbo_samples)
  if draws >= 2:
    return EvaluationPlan(every, 1, draws, elbo_samples)
  return EvaluationPlan(every, -(-2 * num_data // int(allowance)), 2, elbo_samples)


FIRST_PIECE = 64
"""Steps a run limited in time takes before it knows its step time: a whole first segment
(an epoch by default) overran a 5 s limit by 2.2x with 3.5 ms steps."""


class Evaluations:
  """A :func:`dsgrad.fit` run's evaluations as they happen: each recorded in the history
  and shown on the progress bar, their time and draws counted (for a run limited in
  time: :meth:`end_within`), and the last one's PSIS k-hat where it can be computed.

  Args:
    objective: the run's objective.
    plan: its :class:`EvaluationPlan`.
    key: the evaluations' key (folded with the step).
    record: the :class:`dsgrad.training.resume.Recorder` of the history.
    bar: ``(n_steps, step, elbo, se, close=False)``, the progress display.
    timed: whether the run is limited in time: then the first segment is always
      followed by an evaluation, which times the evaluations for :meth:`end_within`.
    until_stopped: the ``max_seconds`` of a run of no set length (a step count cannot
      say when to evaluate): an evaluation after the first segment that ends
      ``until_stopped / DEFAULT_EVALUATIONS`` seconds of steps after the last one, or ten
      times the evaluation's own time where that is longer.
  """

  def __init__(self, objective, plan: EvaluationPlan, key, record, bar, timed: bool = False,
               until_stopped: float | None = None):
    self.objective, self.plan, self.key, self.record, self.bar = objective, plan, key, record, bar
    self.timed = timed and plan.last_draws > 0
    self.every_seconds = None if until_stopped is None else until_stopped / DEFAULT_EVALUATIONS
    self.steps_seconds_then = 0.0
    self.trust_check, self.diagnosis = _can_check_trust(objective, plan.last_draws)
    self.k_hat, self.seconds, self.draws = None, 0.0, 0
    # For end_within: the evaluations' seconds without compiles (warm calls), and the
    # compile a first call costs.
    self.warm_seconds, self.compile_seconds = 0.0, 0.0
    self.deadline = None  # of a run limited in time's last evaluation (time.perf_counter)
    self.keeps_full = False  # whether end_within keeps the last evaluation's full draws' time
    self.last_draws = plan.last_draws  # fewer where the plan fits them to the time
    # The step a run limited in time is expected to end at, once its step is timed: the
    # progress bar's total, so that it fills as the time runs out.
    self.expected_end = None

  def after(self, step: int, end: int, length: int, params, step_seconds: float) -> bool:
    """The evaluation after the segment of ``length`` steps that ended at ``step``, where
    the plan has one (``end``: the run's last step); whether there was one."""
    due = self.every_seconds is not None and self.draws and (
        step_seconds - self.steps_seconds_then
        >= max(self.every_seconds, self.last_seconds(in_full=False) / EVALUATION_SHARE))
    left = None if self.expected_end is None else max(0, min(end, self.expected_end) - step)
    if not (due or self.plan.evaluates(step, end) or (self.timed and self.draws == 0)):
      self.bar(length, step, None, None, left=left)
      return False
    self.steps_seconds_then = step_seconds
    draws = self.last_draws if step == end else self.plan.draws
    key = batching.fold_in(self.key, step)
    trust_check = self.trust_check and step == end and draws >= PSIS_DRAWS
    if self.trust_check and step == end and draws < PSIS_DRAWS:
      self.diagnosis = (f"k-hat not computed: the last evaluation took the {draws} draws a "
                        f"tenth of max_seconds affords (k-hat needs {PSIS_DRAWS}); pass "
                        f"elbo_samples={self.plan.last_draws} to have them")
    if (step == end and self.draws and self.deadline is not None
        and time.perf_counter() + self.last_seconds() > self.deadline):
      # The limit is kept: the program already timed, its draws, instead of all of them.
      draws, trust_check = self.plan.draws, False
      self.diagnosis = (f"k-hat not computed: the last evaluation's {self.last_draws} "
                        f"draws would have run past max_seconds; it took {draws}")
    started = time.perf_counter()
    if self.timed and self.draws == 0 and step < end and draws:
      # Its program compiled apart, the run prices a draw warm, and the compile prices
      # the last evaluation's (its draws, PSIS's ratios) where that is another program.
      elbo_estimates.compile_elbo_unchecked(self.objective, params, key, draws,
                                            self.plan.last_draws, self.trust_check)
      self.compile_seconds = time.perf_counter() - started
    running = time.perf_counter()
    value, se, trust = _evaluate(self.objective, params, key, (draws, self.plan.last_draws),
                                 (self.trust_check, trust_check), step)
    warm, took = time.perf_counter() - running, time.perf_counter() - started
    self.seconds, self.draws = self.seconds + took, self.draws + draws
    self.warm_seconds += warm
    if trust is not None:
      self.k_hat, self.diagnosis = trust
    self.record.append(step, step_seconds, value, se)
    self.bar(length, step, value, se, left=left)
    return True

  def end_within(self, max_seconds, elapsed: float, step: int, length: int, end: int,
                 step_seconds: float) -> tuple[int, int]:
    """``(end, steps to run now)`` for a run limited to ``max_seconds``, decided ``elapsed``
    seconds into it, before the segment of ``length`` steps from ``step`` (``end``: the
    run's last step): the segment whole while another fits after it, else half the steps
    the time left affords, timed again after them, and at last the end it affords
    (``step``: none) and what of it this segment runs; room is kept for the last
    evaluation. Timed by ``step_seconds`` per step, 0 before any ran: then a first piece of
    at most :data:`FIRST_PIECE` steps times them (the segment's program runs any count up
    to its length, so no piece compiles anything)."""
    if max_seconds is None:
      return end, length
    # The last evaluation's full draws are given up only past 5% more: its price is a bound.
    self.deadline = time.perf_counter() - elapsed + 1.05 * max_seconds
    if step_seconds == 0:
      return end, min(length, FIRST_PIECE)
    if self.plan.fits_time and self.draws:
      affords = int(LAST_EVALUATION_SHARE * max_seconds / self.last_seconds(draws=1))
      self.last_draws = min(self.plan.last_draws, max(self.plan.draws, affords))
    segment, left = step_seconds * length, max_seconds - elapsed
    # Where the last evaluation in full no longer fits, it takes the timed program's
    # draws (see after): the run trains on to the time that leaves for those. Once its time
    # has been kept, it stays kept: a segment or an evaluation that runs into it ends the
    # steps, where comparing afresh would hand that time to steps and leave the last
    # evaluation only the timed program's draws.
    full = self.last_seconds()
    self.keeps_full = self.keeps_full or (self.draws > 0 and full < left)
    left -= full if self.keeps_full else self.last_seconds(in_full=False)
    fits = max(0, min(end - step, int(left / step_seconds)))  # in this segment and after
    self.expected_end = step + fits
    if 2 * segment <= left:
      return end, length
    half = fits // 2
    if half >= FIRST_PIECE and half * step_seconds > 0.01 * max_seconds:
      # Half of what fits, while that is more than a hundredth of the limit: the step is
      # timed again on more steps (the first ones carry each call's fixed cost) before
      # the last piece is sized.
      return end, min(length, half)
    return step + fits, min(length, fits)

  def last_seconds(self, in_full: bool = True, draws: int | None = None) -> float:
    """The last evaluation's price: 1.5 times its draws warm, plus, ``in_full``, its
    first call's compile: none where it is the program timed (always, where the
    evaluations share one: :func:`dsgrad.elbo_estimates.shares_programs`; the importance
    ratios come from it too, and k-hat compiles nothing), else once. Not ``in_full``:
    the timed program's draws; ``draws``: the price of that many, warm."""
    per_draw = 1.5 * self.warm_seconds / max(1, self.draws)
    if draws is not None or not in_full:
      return per_draw * (self.plan.draws if draws is None else draws)
    same = (self.plan.draws == self.last_draws
            or elbo_estimates.shares_programs(self.objective))
    return (0.0 if same else self.compile_seconds) + per_draw * self.last_draws



def _evaluate(objective, params, key, draws: tuple, trust: tuple, step: int):
  """``(ELBO, its standard error, (k-hat, diagnosis) or None)`` after ``step`` from
  ``draws = (elbo_samples, the last evaluation's)``, on the last evaluation's program
  (with ``trust = (the run's last evaluation gives k-hat, this one does)``: the program
  that also gives the ratios' log q); NaNs where ``elbo_samples`` is 0. An ELBO that is
  not finite is refused with the step."""
  elbo_samples, program_samples = draws
  with_log_q, trust_check = trust
  try:
    if trust_check:
      # The last evaluation's draws (dsgrad.elbo's for the key) also give the importance
      # ratios, so k-hat costs no extra full pass.
      ratios, draws = psis.log_ratios_unchecked(objective, params, key, elbo_samples,
                                                program_samples=program_samples)
      estimate = elbo_estimates.control_variate_mean(draws, draws - ratios)
      try:
        k_hat = float(psis.pareto_k(ratios))
      except ImportError as error:  # installed, but its import failed: the run is kept
        return (*estimate, (None, f"k-hat not computed: {error}"))
      return (*estimate, (k_hat, psis.diagnose(k_hat, elbo_samples, full_rank=isinstance(
          params, dict) and "unit_lower" in params)))
    if not elbo_samples:
      return float("nan"), float("nan"), None
    return (*elbo_estimates.elbo_unchecked(objective, params, key, elbo_samples,
                                           program_samples=program_samples,
                                           with_log_q=with_log_q), None)
  except elbo_estimates.NonFiniteELBO as error:
    # Training cannot mend a model that gives no finite ELBO: stop at the first sign.
    error = elbo_estimates.located(error, objective, params, key)
    raise elbo_estimates.NonFiniteELBO(f"dsgrad.fit, evaluating after step {step}",
                                       error.detail) from None


def _can_check_trust(objective, elbo_samples: int) -> tuple[bool, str]:
  """Whether fit's last evaluation can give the PSIS k-hat, and if not, why."""
  if objective.log_q_offset is None:
    return False, ("k-hat not computed: the objective does not expose log q "
                   "(Objective.log_q_offset)")
  if not objective.shared_noise:
    return False, "k-hat not computed: the objective draws one noise per datum"
  if elbo_samples < 25:
    return False, f"k-hat not computed: it needs elbo_samples >= 25, got {elbo_samples}"
  if missing := psis.arviz_missing("k-hat"):  # else imported beside the first compile
    return False, f"k-hat not computed: {missing}"
  return True, ""
