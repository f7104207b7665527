"""Which way to train this model? Decided by racing the candidates on the user's budget.

A proxy such as "gradient variance times seconds per step" misjudges a budgeted run: once
the variance is small, progress is limited by the number and size of steps, and a
schedule that decays the step size removes much of the noise by itself. So
:func:`recommend` measures what the user will get instead. Each candidate -- an
estimator, a noise control, or an equal-cost use of naive's time -- is the user's own
optimizer with its schedule stretched over the steps that candidate affords in the
budget. Their steps are timed in interleaved rounds. Naive's run then trains alone past
the start, where the cheapest step leads whatever its noise, and every candidate's run
continues from there; those runs are raced by successive halving (naive always races, as
the reference; a candidate within one doubling of naive's pace is not dropped:
:mod:`dsgrad.advice.halving`), and the ELBOs are compared with common random numbers at equal
wall-clock, at several checkpoints of the final round, so that the standard error also
holds one run's jitter from step to step. The advice is naive, said plainly, unless a
candidate beats naive by more than twice the standard error of the difference (Student-t's
margin where that error comes from the spread of a few checkpoints);
:meth:`Recommendation.fit` continues the winner's raced run where it stopped.

Example::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> schedule = lambda steps: optax.adam(optax.cosine_decay_schedule(3e-2, steps))
    >>> advice = dsgrad.recommend(objective, schedule, dsgrad.meanfield_init(model),
    ...                           jax.random.key(1), batch_size=10, budget=2000,
    ...                           budget_in="naive_steps", candidates=("naive", "cv"),
    ...                           share=0.2, progress=False)
    >>> advice.best in {"naive", "cv"}, len(advice.ranking)
    (True, 2)
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from dsgrad.advice import admission
from dsgrad import checks
from dsgrad import diagnostics
from dsgrad.advice import halving
from dsgrad.training import host_data
from dsgrad.advice import race as race_lib
from dsgrad.advice import race_elbo
from dsgrad.advice.candidates import (CANDIDATES, EQUAL_COST, NAIVE_PROGRAMS,  # noqa: F401
                               Candidate, base_contenders, equal_cost_contenders)
from dsgrad.objective import Objective

class Recommendation(NamedTuple):
  """What :func:`recommend` returns; ``str()`` reads as advice.

  Attributes:
    best: the recommended candidate's name.
    ranking: the :class:`Candidate` s, the recommended first.
    reasons: the measurements, in plain words, one per line.
    budget_seconds: the budget in seconds.
    seconds_spent: the wall-clock time :func:`recommend` took.
    runs: ``{name: race lane}``: each raced candidate's run so far (objective, optimizer,
      params, state, steps); :meth:`fit` continues the best one.
    key: the runs' key.
  """

  best: str
  ranking: tuple
  reasons: tuple
  budget_seconds: float
  seconds_spent: float
  runs: dict
  key: Any

  def __str__(self) -> str:
    return "\n".join([f"recommended: {self.best}"] + [f"  {r}" for r in self.reasons])

  def fit(self, name: str | None = None, **fit_kwargs):
    """Continues the recommended candidate's raced run to the end of its schedule with
    :func:`dsgrad.fit` (same key and batches; the schedule spans the whole run, while the
    raced part may have run one built for another length whose step sizes agree with it
    over the race, to spare a compilation: :mod:`dsgrad.advice.step_sizes`). The run began
    as naive's, up to where the race started (``start_at`` of :func:`recommend`).

    Args:
      name: another raced candidate to continue instead of the best.
      **fit_kwargs: passed to :func:`dsgrad.fit` (``eval_every``, ``progress``, ...).

    Returns:
      :func:`dsgrad.fit`'s :class:`~dsgrad.FitResult`.
    """
    from dsgrad.training.loop import fit
    lane = self.runs[name or self.best]
    return fit(lane.contender.objective, lane.run_optimizer(), race_lib.copy_tree(lane.params),
               self.key, num_steps=lane.total_steps, batch_size=lane.contender.batch_size,
               opt_state=race_lib.copy_tree(lane.opt_state), start_step=lane.steps,
               **fit_kwargs)


def _optimizer_factory(optimizer):
  """``num_steps -> transformation``; a factory's result is checked where it is first
  built (a function returning a float or a schedule would fail later, in optax)."""
  if isinstance(optimizer, optax.GradientTransformation):
    return lambda steps: optimizer
  kind = checks.optimizer()

  def make(steps):
    made = optimizer(steps)
    if np.ndim(made) == 0 and np.issubdtype(np.asarray(made).dtype, np.number):
      raise checks.ArgumentError(
          f"dsgrad.recommend: optimizer({steps}) must be an optax transformation, got the "
          f"number {made!r}: a learning-rate schedule? Pass lambda n: optax.adam("
          "optax.cosine_decay_schedule(1e-2, n)), or optax.adam(schedule)")
    return kind.check(made, f"dsgrad.recommend: optimizer({steps})")

  return make


def _candidates(lanes, traces, naive_index, ruled_out):
  naive_trace = traces[naive_index]
  final_f, final_draws = naive_trace[-1][-1]
  target = final_draws.mean()
  origin = naive_trace[0][0][0]  # the race's start: times count from it
  rows = []
  for i, lane in enumerate(lanes):
    f, draws = traces[i][-1][-1]
    # Naive raced every round: its checkpoints of the same round are at the same
    # wall-clock.
    reference = naive_trace[len(traces[i]) - 1]
    gain, gain_se = race_lib.checkpoint_difference(traces[i][-1], reference)
    means = [(ff, d.mean()) for points in traces[i] for ff, d in points]
    # Where naive ended the race no higher than it started (a run at its noise floor),
    # there is no time to reach its ELBO to compare: no ratio.
    ratio = (1.0 if i == naive_index else math.nan if target <= naive_trace[0][0][1].mean()
             else (race_lib.time_to_reach(means, target) - origin) / (final_f - origin))
    rows.append(Candidate(
        lane.contender.name, lane.description, lane.seconds_per_step, lane.total_steps,
        lane.state_bytes, f, *diagnostics.mean_and_standard_error(draws),
        gain if i != naive_index else 0.0, gain_se if i != naive_index else 0.0, ratio,
        rounds=len(traces[i]) - 1,
        gain_factor=race_lib.gain_factor(traces[i][-1], reference)))
  return rows + list(ruled_out)


UNRACED_TIMING_SECONDS = 0.7
"""The most an unraced naive's timing rounds take (seven calls of at most 0.1 s)."""


def _naive_unraced(naive_lane, guess, step_costs, make_optimizer, params, key, budget,
                   budget_in, ruled_out, started, share) -> Recommendation:
  """The advice when naive is the only candidate left: nothing to race it against, so no
  race is spent; its run is set up for the whole budget. With a budget in seconds that
  leaves the share room for it, its step is timed in interleaved rounds of the segment
  already compiled, as a raced lane's is, where ``guess`` came from a segment shorter
  than 0.1 s: one segment timed just after compiling, it ran 8-12% slow on a model of
  10^6 data, and a schedule sized by it ends that much of the budget early."""
  seconds = float(step_costs["naive"]) if step_costs is not None else guess
  room = (budget_in == "seconds" and time.perf_counter() - started + UNRACED_TIMING_SECONDS
          <= share * float(budget))
  if step_costs is None and room and race_lib.TIMING_SEGMENT * guess <= 0.1:
    naive_lane.chunk = race_lib.TIMING_SEGMENT  # the segment compiled for the guess
    seconds = race_lib.time_steps([naive_lane])[0]
  budget_seconds = float(budget) * (seconds if budget_in == "naive_steps" else 1.0)
  lane = naive_lane.restarted(make_optimizer, max(1, int(budget_seconds / seconds)), params, key)
  lane.seconds_per_step = seconds
  best = Candidate("naive", lane.description, seconds, lane.total_steps, lane.state_bytes)
  ranking = (best, *ruled_out)
  spent = time.perf_counter() - started
  reasons = [_budget_line(budget_seconds, spent),
             f"naive: {seconds:.3g} s per step ({lane.total_steps} steps in the "
             "budget); not raced, as no other candidate is left to race against, and no "
             "ELBO estimated (fit's first evaluation checks that it is finite).",
             *_ruled_out_lines(ruled_out), "stay with naive and your decaying step size."]
  return Recommendation("naive", ranking, tuple(reasons), budget_seconds, spent,
                        {"naive": lane}, key)


def _pick(rows) -> Candidate:
  raced = [r for r in rows if not r.note]
  furthest = max(r.rounds for r in raced)
  finalists = [r for r in raced if r.rounds == furthest and r.name != "naive"]
  naive = next(r for r in raced if r.name == "naive")
  winner = max(finalists, key=lambda r: r.gain, default=naive)
  return (winner if winner.gain > winner.gain_factor * winner.gain_se and winner.gain > 0
          else naive)


def _budget_line(budget_seconds, spent) -> str:
  percent = 100 * spent / budget_seconds
  share = f"{percent:.2g}%" if percent < 10 else f"{percent:,.0f}%"  # not "5.7e+03%"
  return f"budget {budget_seconds:.3g} s; this advice took {spent:.3g} s ({share} of it)."


def _ruled_out_lines(rows) -> list:
  """One line per reason, naming every candidate it ruled out."""
  notes: dict = {}
  for r in rows:
    if r.note:
      notes.setdefault(r.note, []).append(r.description)
  return [f"{', '.join(names)}: ruled out ({note})." for note, names in notes.items()]


def _reasons(ranking, best, budget_seconds, spent, estimates_line, origin=0.0) -> list:
  lines = [_budget_line(budget_seconds, spent), estimates_line]
  if origin > 0:
    alone = origin * budget_seconds
    lines.append(f"the race started at {100 * origin:.3g}% of the budget: naive trained "
                 f"alone to there (about {alone:.3g} s of the time above, the first part "
                 "of every candidate's run, the recommended one's too); besides it, the "
                 f"advice took {spent - alone:.3g} s ({100 * (spent - alone) / budget_seconds:.2g}% "
                 "of the budget).")
  naive = next(r for r in ranking if r.name == "naive")
  for r in ranking:
    if r.note:
      continue
    speed = naive.seconds_per_step / r.seconds_per_step
    line = (f"{r.description}: {speed:.3g}x naive's steps per second ({r.budget_steps} steps "
            f"in the budget); raced to {100 * r.raced_fraction:.2g}% of the budget: ELBO "
            f"{r.elbo:.6g} +- {r.elbo_se:.2g}")
    if r.name != "naive":
      reach = ("naive did not gain over the race: no time to reach its ELBO"
               if np.isnan(r.time_ratio) else "did not reach naive's final race ELBO"
               if not np.isfinite(r.time_ratio)
               else f"reached naive's final race ELBO in {r.time_ratio:.2g}x naive's time")
      # The ELBO above is the last checkpoint's; the gain is over the round's checkpoints.
      line += (f", {r.gain:+.4g} +- {r.gain_se:.2g} over naive at equal time (the mean over "
               f"its last round's checkpoints); {reach}")
    lines.append(line + ".")
  lines += _ruled_out_lines(ranking)
  if best.name == "naive":
    lines.append("no candidate beat naive by more than twice its standard error (or "
                 "Student-t's margin, where the error comes from a few checkpoints) at "
                 "equal wall-clock: stay with naive and your decaying step size.")
  else:
    lines.append(f"{best.description} beat naive at equal wall-clock by {best.gain:.4g} "
                 f"+- {best.gain_se:.2g} nats; continue it with Recommendation.fit().")
  return lines


@checks.arguments(optimizer=checks.optimizer(factory=True), params=checks.parameters(),
                  key=checks.prng_key(),
                  batch_size=checks.count(1), budget=checks.positive(),
                  share=checks.probability(low_open=True),
                  memory_share=checks.probability(low_open=True),
                  elbo_samples=checks.count(2), elbo_rows=checks.or_word(checks.count(1), "auto"),
                  max_table_bytes=checks.byte_budget(),
                  start_at=checks.or_word(checks.probability(high_open=True), "auto"))
def recommend(objective: Objective, optimizer, params, key, *, batch_size: int,
              budget: float, budget_in: str = "seconds", approx=None,
              candidates=CANDIDATES, share: float = 0.1, memory_share: float = 0.5,
              elbo_samples: int = 64, elbo_rows: int | str = "auto", progress: bool = True,
              max_table_bytes: int | str | None = "auto",
              step_costs: dict | None = None,
              start_at: float | str = "auto") -> Recommendation:
  """Races ways to train ``objective`` at equal wall-clock and recommends the best.

  Args:
    objective: the user's objective, with its data.
    optimizer: the optax rule chained after the estimator: a transformation (used as it
      is), or a function ``num_steps -> transformation`` whose schedule spans
      ``num_steps`` (e.g. ``lambda n: optax.adam(optax.cosine_decay_schedule(1e-2, n))``),
      stretched over the steps each candidate affords in the budget.
    params: where training starts.
    key: the runs' PRNG key, as :func:`dsgrad.fit` takes it (the races are the first
      steps of those runs).
    batch_size: the batch size training will use.
    budget: the training budget, in ``budget_in`` units.
    budget_in: ``"seconds"`` (wall-clock) or ``"naive_steps"`` (the time naive takes for
      that many steps, as timed here).
    approx: the approximation of the control variates (default: each estimator's).
    candidates: names from :data:`CANDIDATES`; ``"naive"`` is required (the reference).
      Their order is their priority (the default pairs each control variate with a naive
      variant: :data:`CANDIDATES`): they are compiled in that order, two at a time,
      while the share lasts, each priced by what it compiles (naive's step on a variant
      objective at naive's compile time, a control variate at those measured before it);
      one the share cannot pay for is not raced (the advice says so) and the cheaper ones
      after it are still tried.
    share: the fraction of the budget the advice may take: compiling, timing and the
      race together. Compilation is a fixed cost (a candidate compiles one program, two
      where its schedule, built for a guessed step count, sets other step sizes over the
      race than one over the count it affords: :mod:`dsgrad.advice.step_sizes`; about a second
      each for small models on two CPU cores), so a small budget races
      fewer candidates; the race takes what compiling leaves of the share, and at least
      a quarter of it. A candidate whose compile took longer than priced is still raced
      if its timing fits the share (its compile is spent), so the advice can take up to
      a quarter of the share more than the share.
    memory_share: a candidate whose state (computed from shapes, before anything is
      allocated) needs more than this fraction of the free memory is ruled out.
    elbo_samples: Monte Carlo draws per ELBO estimate (common random numbers).
    elbo_rows: the data each draw of an estimate reads: a number (rounded up to whole
      chunks of 4,096 data; at least ``N``: a full pass), or ``"auto"``: a full pass
      where the race's estimates fit a quarter of the share, else as many data drawn at
      random (the same for every candidate; unbiased, their spread in the standard
      errors) as fit (:mod:`dsgrad.advice.race_elbo`). Given
      ``step_costs``, nothing is timed and ``"auto"`` is a full pass.
    progress: show a progress bar over the seconds of the share (tqdm where installed,
      else printed lines) with what is being compiled, timed or raced.
    max_table_bytes: joint SAGA's table limit (:func:`dsgrad.joint_saga`).
    step_costs: optional ``{name: seconds per step}`` to use instead of timing (every
      raced candidate's, naive's included): reproducible advice, e.g. from costs measured
      on the machine that will train. The equal-cost baselines' ``K`` then comes from it.
    start_at: where the race starts, as a fraction of the budget: naive's run trains alone
      to it, and every candidate's run continues from there
      (:meth:`dsgrad.advice.race.Lane.continue_from`), so the race compares the runs after the
      step-limited start, where the cheapest step leads whatever its noise. ``"auto"``:
      as far as the race itself goes (the share left once compiling and timing are
      paid). Naive's steps before it are not part of the share: they are the first part
      of the recommended run.

  Returns:
    A :class:`Recommendation`.

  Raises:
    ValueError: an unknown candidate, no ``"naive"``, an unknown ``budget_in``, a batch
      larger than the data, or settings out of range.

  References:
    Jamieson, Talwalkar (2016), successive halving; Wang, Geffner, Domke (2024), Sec. 7.

  Example: advice for a 20-second run with a cosine schedule; ``advice.fit()`` would then
  continue the winner's raced run to the end of its budget::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 2000, 5)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> advice = dsgrad.recommend(
    ...     dsgrad.meanfield_gaussian(model),
    ...     lambda steps: optax.adam(optax.cosine_decay_schedule(1e-2, steps)),
    ...     dsgrad.meanfield_init(model, 0.0, -1.0), jax.random.key(1), batch_size=20,
    ...     budget=20.0, candidates=("naive", "cv"), progress=False)
    >>> [candidate.name for candidate in advice.ranking] in (["naive", "cv"], ["cv", "naive"])
    True
    >>> print(advice)  # doctest: +ELLIPSIS
    recommended: ...
  """
  started = time.perf_counter()
  unknown = set(candidates) - set(CANDIDATES)
  if unknown or "naive" not in candidates:
    raise ValueError(f"candidates must include 'naive' and be among {CANDIDATES}, got "
                     f"{tuple(candidates)}")
  if budget_in not in ("seconds", "naive_steps"):
    raise ValueError(f"budget_in must be 'seconds' or 'naive_steps', got {budget_in!r}")
  checks.check_batch_size(batch_size, objective.num_data)
  checks.check_objective_evaluates(objective, params, "recommend")
  if step_costs is not None and not all(
      isinstance(c, (int, float, np.floating, np.integer)) and np.isfinite(c) and c > 0
      for c in step_costs.values()):
    raise ValueError(f"step_costs must be positive and finite, got {step_costs}")
  reporter = race_lib.Progress(progress, started)
  try:
    return _advise(objective, optimizer, params, key, batch_size, budget, budget_in, approx,
                   candidates, share, memory_share, (elbo_samples, elbo_rows), reporter,
                   max_table_bytes, step_costs, started, start_at)
  finally:
    reporter.close()


def _advise(objective, optimizer, params, key, batch_size, budget, budget_in, approx,
            candidates, share, memory_share, elbo_settings, progress, max_table_bytes,
            step_costs, started, start_at="auto") -> Recommendation:
  """:func:`recommend`'s work, its arguments checked; ``progress`` a
  :class:`dsgrad.advice.race.Progress`."""
  make_optimizer = _optimizer_factory(optimizer)
  limit = memory_share * (host_data.free_memory_bytes() or float("inf"))
  base = base_contenders(candidates, objective, approx, batch_size, max_table_bytes)
  # Naive's first schedule: its length where the budget or the step costs give it, else
  # an epoch's (its run is restarted once its step has a first rough time).
  naive_steps = (admission.schedule_guesses(budget, budget_in, 1.0, step_costs)("naive", 2)
                 if budget_in == "naive_steps" or step_costs is not None
                 else max(1, objective.num_data // batch_size))
  lanes, ruled_out = admission.build_lanes([c for c in base if c[0] == "naive"],
                                           make_optimizer, params, key, limit,
                                           lambda name: naive_steps)
  naive_lane = lanes[0]
  # One rough time of naive's step: it sizes every lane's timing segments, and naive's
  # timing rounds then run the very program it compiled.
  guess = race_lib.guess_step_seconds(naive_lane) if step_costs is None else None
  others = [name for name in candidates if name != "naive"]
  # The equal-cost baselines' K: the control variates' cost in naive steps where it is
  # given, else 2 (they are compiled beside the control variates, before any is timed;
  # a control-variate step measured 1.3-2.0x naive's on every model timed so far).
  k = admission.equal_cost_k(candidates, step_costs)
  equal_cost = equal_cost_contenders([n for n in others if n in EQUAL_COST], objective,
                                     batch_size, k)
  by_name = {entry[0]: entry for entry in base + equal_cost}
  contenders = [by_name[name] for name in others]
  ledger = None
  if step_costs is None:  # given the step costs, nothing is priced
    ledger = admission.Share(
        share * float(budget) * (guess if budget_in == "naive_steps" else 1.0), started,
        naive_lane, NAIVE_PROGRAMS, naive_restarts=budget_in != "naive_steps")
    progress.set_total(ledger.allowed)
    if all(ledger.left() < ledger.price([name]) for name in others):
      # Nothing else can be compiled: no ELBO is estimated and naive is not timed again.
      ruled_out += admission.never_raced(contenders, share)
      return _naive_unraced(naive_lane, guess, step_costs, make_optimizer, params, key,
                            budget, budget_in, ruled_out, started, share)
  estimates = race_elbo.choose(objective, params, jax.random.fold_in(key, 7919),
                               *elbo_settings, None if ledger is None else ledger.allowed,
                               len(candidates), share)
  if ledger is not None:
    ledger.count_evaluations(estimates.seconds)
  steps_for = admission.schedule_guesses(budget, budget_in, guess, step_costs)
  restarted = None
  if ledger is not None and budget_in == "seconds":
    # Naive's first schedule was an epoch's, there only to time its step; its run gets
    # one over the steps that guess affords, compiled beside the first candidates, so
    # that the program its timing rounds run is its race's too (where the two schedules'
    # step sizes agree over the race: dsgrad.advice.step_sizes), not one compiled more.
    restarted = naive_lane.restarted(make_optimizer, max(1, int(float(budget) / guess)),
                                     params, key)
    restarted.chunk = race_lib.timing_chunk(guess)
  more, more_out = admission.admit(contenders, ledger, guess, make_optimizer, params, key,
                                   limit, lambda name: steps_for(name, k), share, progress,
                                   companion=restarted)
  lanes, ruled_out = lanes + more, ruled_out + more_out
  if len(lanes) == 1:
    return _naive_unraced(naive_lane, guess, step_costs, make_optimizer, params, key, budget,
                          budget_in, ruled_out, started, share)
  if restarted is not None:
    naive_lane = lanes[0] = restarted
  for lane, seconds in zip(lanes, admission.step_seconds(lanes, step_costs, progress, guess)):
    lane.seconds_per_step = seconds
  budget_seconds = float(budget) * (naive_lane.seconds_per_step if budget_in == "naive_steps"
                                    else 1.0)
  return _race(lanes, ruled_out, budget_seconds, params, key, estimates, share, step_costs,
               progress, started, start_at)


def _compile_again(lanes, affords, reach) -> float:
  """The seconds the lanes whose program a schedule over ``affords`` steps, raced to
  ``reach`` of the run, does not keep take to compile again, overlapped."""
  again = [lane for lane, steps in zip(lanes, affords) if not lane.keeps_program(steps, reach)]
  return sum(lane.runner.compile_cost_seconds for lane in again) / admission.compile_overlap()


def _race_share(share, step_costs, committed, budget_seconds) -> float:
  """The race's part of the budget: what ``committed`` seconds (spent, and to be spent on
  compiling and estimates) leave of the share, and at least a quarter of it; given step
  costs, the whole share."""
  if step_costs is not None:
    return share
  return max(share - committed / budget_seconds, 0.25 * share)


def _race_span(race_share, start_at, num_lanes) -> tuple[float, float]:
  """``(origin, end)``, fractions of the budget: where the race starts (``start_at``, or
  with ``"auto"`` as far as the race itself goes; never so late that the race would run
  past the budget) and where it ends."""
  length = halving.halving_fractions(num_lanes, race_share)[0][-1]
  origin = min(race_share if start_at == "auto" else float(start_at), 1.0 - length)
  return origin, origin + length


def _race(lanes, ruled_out, budget_seconds, params, key, estimates, share, step_costs,
          progress, started, start_at="auto") -> Recommendation:
  """The timed lanes stretched over the steps each affords in the budget, raced in what
  is left of the share, and the advice."""
  # The real runs: each schedule spans the steps its candidate affords in the budget. A
  # lane whose first schedule sets the same step sizes as that one over the part of the
  # run the race can reach races with its timing program; the others compile again,
  # about what their timing program took (measured).
  affords = [max(1, int(budget_seconds / lane.seconds_per_step)) for lane in lanes]
  # Timing and compiling come out of the share, the race's compilation too; given step
  # costs, the race is deterministic and takes the whole share.
  # A race after naive's start estimates that start itself (it is not the parameters the
  # estimates were chosen at).
  own_start = start_at == "auto" or float(start_at) > 0
  evaluations = estimates.seconds * race_elbo.estimates_needed(len(lanes), share, own_start)
  spent = time.perf_counter() - started
  # The furthest the race can reach, with nothing compiled again: the schedules are
  # compared up to there.
  widest = _race_share(share, step_costs, spent + evaluations, budget_seconds)
  reach = min(1.0, _race_span(widest, start_at, len(lanes))[1])
  to_compile = _compile_again(lanes, affords, reach)
  lanes = [lane.stretched(steps, params, key, reach) for lane, steps in zip(lanes, affords)]
  spent = time.perf_counter() - started  # the schedules' comparisons included
  race_share = _race_share(share, step_costs, spent + to_compile + evaluations, budget_seconds)
  naive_index = next(i for i, lane in enumerate(lanes) if lane.contender.name == "naive")
  # The race starts after naive alone has run as long as the race may: early in a run the
  # cheapest step leads whatever its noise, so a race from the start favours it (on a
  # hierarchical model of 20,000 data joint SVRG trailed naive at 0.2% of the budget and
  # led every lane from 0.7%; continued from naive at 1%, it led after 0.1% more).
  # Naive's steps before it are the first part of every run, the recommended one's too.
  origin = _race_span(race_share, start_at, len(lanes))[0]
  traces = race_lib.race(lanes, naive_index, estimates.evaluate, race_share, progress,
                         None if origin > 0 else estimates.start,
                         estimate_cost=estimates.seconds / budget_seconds, origin=origin)
  rows = _candidates(lanes, traces, naive_index, ruled_out)
  best = _pick(rows)
  ranking = tuple([best] + sorted((r for r in rows if r is not best),
                                  key=lambda r: (bool(r.note), -r.rounds, -r.gain)))
  spent = time.perf_counter() - started
  reasons = _reasons(ranking, best, budget_seconds, spent, estimates.describe(), origin)
  return Recommendation(best.name, ranking, tuple(reasons),
                        budget_seconds, spent, {lane.contender.name: lane for lane in lanes}, key)
