"""Which way to train this model? Decided by racing the candidates inside the user's budget.

Naive trains at once while a thread compiles each candidate's program and the ELBO
estimates. At ``race_at`` of the budget each compiled candidate continues naive's run
(:mod:`dsgrad.training.paced`) for the same seconds, in :data:`PIECES` interleaved pieces;
their ELBOs are estimated with common random numbers. The largest gain over naive beyond
twice its standard error wins (:func:`verdict`), else naive; :meth:`Recommendation.fit`
continues the winner. The race costs ``share`` of the budget; too small a share: naive.

Example::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 2000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> advice = dsgrad.recommend(
    ...     dsgrad.meanfield_gaussian(model),
    ...     lambda steps: optax.adam(optax.cosine_decay_schedule(1e-2, steps)),
    ...     dsgrad.meanfield_init(model), jax.random.key(1), batch_size=20, budget=3.0,
    ...     candidates=("naive", "cv"), progress=False)
    >>> advice.best, advice.ranking[1].why_not  # three seconds are too small to race in
    ('naive', 'not raced: the budget is too small to race (0.3 s of advice for 1 candidate)')
    >>> result = advice.fit(progress=False)  # naive, over the rest of the three seconds
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import NamedTuple

import jax

from dsgrad import checks, elbo_estimates, elbo_trust
from dsgrad.estimators import chain
from dsgrad.advice.candidates import CANDIDATES, DEFAULT_CANDIDATES, Candidate, Contender, build
from dsgrad.training import paced, progress as progress_lib
from dsgrad.training.resume import History

MIN_RACE_SECONDS = 1.0  # the least share per candidate: a shorter piece is within jitter
PIECES = 3  # taken by the runs in turn: a slow spell of the machine hits all of them
ESTIMATES_SHARE = 0.3  # of the share, for the race's ELBO estimates
MAX_ESTIMATE_CALLS = 16  # of elbo_samples draws each, on all the data, per run
SEGMENTS_PER_PIECE = 8  # a run stops within half a segment of its piece's time

COST_GUESS = {"naive": 1.0, "path_derivative": 1.2, "naive_batch": 2.0, "naive_samples": 2.0,
              "rqmc": 2.0, "cv": 1.7, "joint_svrg": 1.7, "joint_saga": 1.7}
"""A candidate's step in naive steps before it is timed (1.1-1.35 for the path derivative,
1.3-2.0 for the others on the held-out models, two CPU cores): its first schedule's length."""


class Recommendation(NamedTuple):
  """What :func:`recommend` returns; ``str()`` reads as advice.

  Attributes:
    best: the recommended candidate's name.
    ranking: every :class:`~dsgrad.advice.candidates.Candidate`: the recommended first,
      then the raced by gain, then those not raced (``why_not`` says why).
    reasons: the measurements and the verdict, in plain words, one per line.
    budget_seconds: the budget of :func:`recommend` and :meth:`fit` together.
    seconds_spent: the wall-clock time :func:`recommend` took.
    runs: ``{name: dsgrad.training.paced.Run}``: the raced runs where they stopped (naive's
      not yet started where nothing raced); :meth:`fit` continues one.
    progress: :func:`recommend`'s ``progress``, :meth:`fit`'s unless it is given its own.
  """

  best: str
  ranking: tuple
  reasons: tuple
  budget_seconds: float
  seconds_spent: float
  runs: dict
  progress: bool = True

  def __str__(self) -> str:
    return "\n".join([f"recommended: {self.best}"] + [f"  {r}" for r in self.reasons])

  def fit(self, name: str | None = None, **fit_kwargs):
    """Continues the recommended run (or the raced run ``name``) to the budget's end with
    :func:`dsgrad.fit` (``fit_kwargs``: ``elbo_samples``, ``progress`` (default:
    recommend's), ...) on a schedule
    over the steps it affords (recompiled, time permitting, where its own is too short or
    over 25% too long; :func:`dsgrad.training.paced.finish`). Returns fit's
    :class:`~dsgrad.FitResult`, timed for this call; its ``step`` and ``history.step`` count
    the run's steps (naive's and the race's included); ``opt_state`` is
    ``optax.chain(estimator, your optimizer)``'s, your step counts where the schedule stands
    (``runs[name].contender.estimator``). Called again, it continues the same run from
    where the last call left it, for as long again (the budget less the advice's time)."""
    run = self.runs.get(name or self.best)
    if run is None:
      raise ValueError(f"{name!r} did not race: Recommendation.fit continues {sorted(self.runs)}")
    return paced.finish(run, self.budget_seconds, self.seconds_spent, "Recommendation.fit",
                        **{"progress": self.progress, **fit_kwargs})


class _Race:
  """The race: the runs, the thread that compiles, the clock and the display."""

  def __init__(self, runs: dict, objective, budget: float, share: float, key, say, started):
    self.runs, self.objective, self.budget, self.key, self.say = runs, objective, budget, key, say
    self.naive, self.others = runs["naive"], [r for n, r in runs.items() if n != "naive"]
    self.piece = share * budget * (1 - ESTIMATES_SHARE) / len(self.others) / PIECES
    self.estimates_seconds = ESTIMATES_SHARE * share * budget / len(runs)
    self.thread, self.jobs = concurrent.futures.ThreadPoolExecutor(1), {}
    self.started, self.rows = started, objective.num_data

  elapsed = lambda self: time.perf_counter() - self.started

  def prepare(self, elbo_samples: int) -> None:
    """Naive starts and is timed; the programs and the estimates compile in the thread."""
    self.naive.start_timed(self.budget)
    step = self.naive.seconds_per_step
    self.say(f"naive: {step:.3g} s a step; compiling the candidates beside its training")
    segment = lambda seconds: max(1, round(self.piece / (SEGMENTS_PER_PIECE * seconds)))
    self.jobs["naive"] = self.thread.submit(self.naive.compile, self.budget / step, segment(step))
    program = elbo_estimates.sampled_elbo_draws(self.objective, elbo_samples, 4096)  # chunks
    self.estimates = self.thread.submit(  # compiled here, timed in _evaluator
        lambda: (jax.block_until_ready(program(self.naive.start_params, self.key, 1)), program)[1])
    for run in self.others:
      guess = step * COST_GUESS[run.name]
      self.jobs[run.name] = self.thread.submit(run.compile, self.budget / guess, segment(guess))

  def _evaluator(self):
    """``params -> ELBO draws`` within the estimates' part of the share: all the data, up
    to :data:`MAX_ESTIMATE_CALLS` calls, where one full pass fits, else as many rows."""
    program, n = self.estimates.result(), self.objective.num_data
    timed = min(n, 16 * 4096)
    at = lambda params: program(params, self.key, timed)  # a model not finite stops here
    draws = at(self.naive.params)
    diverged = not jax.numpy.isfinite(draws).all() and bool(
        jax.numpy.isfinite(at(self.naive.start_params)).all())  # naive's run, not the model
    elbo_estimates.finite_elbo_draws(draws, (
        f"dsgrad.recommend, at naive's params {self.naive.step:,} steps from yours (where it "
        "is finite: a step size too large diverges so)") if diverged else "dsgrad.recommend",
        locate=(self.objective, self.naive.params, self.key))
    started = time.perf_counter()
    jax.block_until_ready(at(self.naive.params))
    per_row = (time.perf_counter() - started) / timed
    calls = int(min(MAX_ESTIMATE_CALLS, self.estimates_seconds / (per_row * n)))
    self.rows = n if calls >= 1 else max(timed, int(self.estimates_seconds / per_row))
    keys = [jax.random.fold_in(self.key, i) for i in range(max(1, calls))]

    return lambda params: elbo_estimates.finite_elbo_draws(jax.numpy.concatenate(
        [program(params, key, self.rows) for key in keys]), "dsgrad.recommend",
        locate=(self.objective, params, self.key))

  def train_naive(self, race_at: float) -> None:
    """Naive trains (on its own program once compiled) until the race: at ``race_at`` of
    the budget, or once the candidates are compiled, and at half of it at the latest."""
    job = self.jobs["naive"]

    def move():  # onto naive's own program, once compiled
      if job.done() and self.naive.program is not job.result():
        self.naive.use(job.result(), self.elapsed() / self.budget)

    # The race (every run's pieces, one after another) ends by three quarters of the budget.
    latest = min(0.5 * self.budget, 0.75 * self.budget - len(self.runs) * PIECES * self.piece)
    while (left := (latest if not all(j.done() for j in self.jobs.values())
                    else min(latest, race_at * self.budget)) - self.elapsed()) > 0:
      move()  # then a piece of half a second at most, none past the race's start
      self.naive.advance(round(min(0.5, left) / self.naive.seconds_per_step))
    move()

  def race(self) -> tuple[dict, dict]:
    """Every compiled candidate continues naive's run; ``({name: [its ELBO draws where the
    race ends]}, {name: why not raced})``."""
    fraction, skipped, raced = self.elapsed() / self.budget, {}, [self.naive]
    for run in self.others:
      job = self.jobs[run.name]
      if not job.done():
        skipped[run.name] = f"still compiling when the race began, at {self.elapsed():.3g} s"
      elif job.exception() is not None:
        skipped[run.name] = f"failed to compile: {str(job.exception()).splitlines()[0]}"
      else:
        run.continue_from(self.naive, job.result(), fraction)
        raced.append(run)
    for job in self.jobs.values():  # those not started; the estimates' are needed
      job.cancel()
    self.thread.shutdown(wait=False)
    evaluate = self._evaluator()
    if len(raced) == 1:
      return {}, skipped
    self.say(f"racing {', '.join(run.name for run in raced)} from {fraction:.0%} of the budget")
    for piece in range(PIECES + 1):  # 0: the start (naive's step timed in the race)
      for run in list(raced):
        try:
          run.advance_for(piece * self.piece - run.raced_seconds()) if piece else \
              run.start_race(first_update=run is not self.naive)
        except ValueError as error:  # an update not finite: the candidate leaves the race
          if run is self.naive:
            raise
          raced.remove(run)
          skipped[run.name] = f"from naive's state, {str(error).splitlines()[0]}"
    return {run.name: [evaluate(run.params)] for run in raced}, skipped


def _rows(runs: dict, draws: dict, skipped: dict, ruled_out: list) -> list:
  """The :class:`Candidate` rows: measured for the raced (with ``draws``), else why not."""
  rows = []
  for name, run in runs.items():
    row = run.contender.candidate
    if name in draws and len(draws) > 1:
      gain, se = elbo_estimates.paired_gain(draws[name], draws["naive"])
      row = row._replace(steps_per_second=1 / run.seconds_per_step, gain=gain, gain_se=se,
                         raced=True)
    elif name in skipped:
      row = row._replace(why_not=f"not raced: {skipped[name]}")
    rows.append(row)
  return rows + [c._replace(why_not=f"ruled out: {c.why_not}") for c in ruled_out]


SETTLING = ("joint_svrg", "joint_saga")
"""Control variates at a recent snapshot of the run: the noise they remove grows as it
settles (a larger batch's share stays), the better bet where the race ties them."""


def verdict(rows: list, draws: dict | None = None) -> Candidate:
  """The raced candidate with the largest gain over naive beyond twice its error, or naive;
  with the race's ``draws``, a :data:`SETTLING` winner within twice the paired error of
  that one in its place."""
  winners = [r for r in rows if r.raced and r.name != "naive" and r.gain > 2 * r.gain_se]
  leader = max(winners, key=lambda r: r.gain, default=next(r for r in rows if r.name == "naive"))
  if not draws or leader.name in SETTLING:
    return leader
  gaps = {r.name: elbo_estimates.paired_gain(draws[r.name], draws[leader.name])
          for r in winners if r.name in SETTLING}
  close = [r for r in winners if r.name in gaps and gaps[r.name][0] > -2 * gaps[r.name][1]]
  return max(close, key=lambda r: r.gain, default=leader)


def _reasons(best: Candidate, rows: list, budget: float, spent: float, race_line: str,
             diverged: tuple) -> list:
  lines = [f"budget {budget:.3g} s; this advice took {spent:.3g} s, naive's training "
           "included (the first part of every run)."] + [race_line] * bool(race_line)
  naive = next(r for r in rows if r.name == "naive")  # wherever the user listed it
  for r in (r for r in rows if r is not naive):
    lines.append(f"{r.describe()}: " + (
        f"{r.steps_per_second / naive.steps_per_second:.3g}x naive's steps per second; "
        f"{r.gain:+.4g} +- {r.gain_se:.2g} nats over naive at equal time." if r.raced
        else f"{r.why_not}."))
  tied = best.gain is not None and best.gain < max(r.gain or 0.0 for r in rows)
  if diverged:
    verdict_line = (f"naive's own run cannot be trusted: {diverged[0]}; every candidate raced "
                    "from it, so the race compares nothing: fix that and ask again.")
  elif best.name == "naive":
    verdict_line = ("no candidate beat naive by more than twice its standard error" if any(
        r.raced for r in rows) else "no candidate raced") + ": stay with naive and your " \
        "decaying step size."
  else:
    verdict_line = (f"{best.name} beat naive by {best.gain:.4g} +- {best.gain_se:.2g} nats, "
                    "more than twice its standard error, " + ("tied with the most (a control "
                    "variate at a recent snapshot: the better bet)" if tied else "the most of "
                    "any") + ": continue it with Recommendation.fit().")
  return lines + [verdict_line]


@checks.arguments(objective=checks.objective(),
                  optimizer=checks.optimizer(factory=True), params=checks.parameters(),
                  key=checks.prng_key(), batch_size=checks.count(1), budget=checks.positive(),
                  share=checks.probability(low_open=True), race_at=checks.probability(high_open=True),
                  memory_share=checks.probability(low_open=True), elbo_samples=checks.count(2),
                  max_table_bytes=checks.byte_budget(), approx=checks.approximation())
def recommend(objective, optimizer, params, key, *, batch_size: int, budget: float,
              candidates=DEFAULT_CANDIDATES, approx=None, share: float = 0.1,
              race_at: float = 0.2, elbo_samples: int = 4, memory_share: float = 0.5,
              max_table_bytes: int | str | None = "auto", progress: bool = True) -> Recommendation:
  """Races ways to train ``objective`` inside a wall-clock budget and recommends the best.

  Args:
    objective: the user's objective, with its data.
    optimizer: the optax rule chained after the estimator: a function ``num_steps ->
      transformation`` whose schedule spans ``num_steps`` (e.g. ``lambda n: optax.adam(
      optax.cosine_decay_schedule(1e-2, n))``), built for the steps each run affords, or
      a transformation (used as it is: its step counts are the steps each run took).
    params: where training starts.
    key: the runs' PRNG key (batches and noise), as :func:`dsgrad.fit` takes it.
    batch_size: the batch size training will use.
    budget: seconds for :func:`recommend` and :meth:`Recommendation.fit` together.
    candidates: names from :data:`~dsgrad.advice.candidates.CANDIDATES`, ``"naive"``
      among them (the reference); compiled in this order.
    approx: the control variates' approximation (default: each estimator's).
    share: the fraction of the budget the advice may cost: the candidates' race pieces
      that do not win, and the ELBO estimates.
    race_at: where the race starts, as a fraction of the budget (naive trains alone to
      there: early in a run the cheapest step leads whatever its noise).
    elbo_samples: Monte Carlo draws per call of the race's ELBO estimate, on all the data
      where it fits (calls repeated as time allows): the same noise in every run cancels
      in their differences, a sample of the rows would not.
    memory_share: a candidate whose state needs more than this fraction of the free
      memory is ruled out (computed from shapes, before anything is allocated).
    max_table_bytes: joint SAGA's table limit (:func:`dsgrad.joint_saga`).
    progress: print what is being compiled and raced.

  Returns:
    A :class:`Recommendation`.

  Raises:
    TypeError: an unknown keyword (the message gives the signature), or no optimizer.
    ValueError: an unknown candidate, no ``"naive"``, or a setting out of range.
    dsgrad.Interrupted: on Ctrl-C before the race ends; its ``result`` is the advice of
      naive, holding naive's run so far, which ``result.fit()`` continues in the budget left.

  References:
    Wang, Geffner, Domke (2024), Sec. 7 (the estimators compared at equal wall-clock).
  """
  started = time.perf_counter()
  if isinstance(candidates, str) or set(candidates) - set(CANDIDATES) or "naive" not in candidates:
    raise ValueError(f"dsgrad.recommend: candidates must be names among {CANDIDATES}, "
                     f"'naive' one of them, got {candidates!r}")
  checks.check_batch_size(batch_size, objective.num_data, "dsgrad.recommend")
  checks.check_floating_params(params, "dsgrad.recommend", full_precision=True)
  checks.check_objective_evaluates(objective, params, "recommend")
  # Below a race's least share nothing but naive will run: its rivals' states are not sized.
  may_race = share * budget >= MIN_RACE_SECONDS
  built = build(candidates, objective, params, batch_size, approx, max_table_bytes,
                memory_share if may_race else None)
  make = checks.optimizer_factory(optimizer, "dsgrad.recommend")
  if chain.holds_estimator(jax.eval_shape(make(2).init, params)):  # shapes: nothing allocated
    raise ValueError("dsgrad.recommend: optimizer holds a dsgrad estimator; it is the rule "
                     "chained after each candidate's estimator (e.g. optax.adam): leave it out")
  chain.check_descends(make(2), None, params, "dsgrad.recommend")  # one rule, its own state
  runs = {c.candidate.name: paced.Run(c, make, key, params)
          for c in built if isinstance(c, Contender)}
  bar = progress_lib.bar(progress, None, "s", "recommend")
  say = lambda text: bar(0, status=text, line=f"recommend: {text}")
  try:
    draws, skipped, race_line, interrupted = {}, {}, "", False
    if share * budget < MIN_RACE_SECONDS * max(1, len(runs) - 1) or len(runs) == 1:
      skipped = dict.fromkeys(set(runs) - {"naive"}, (
          f"the budget is too small to race ({share * budget:.2g} s of advice for "
          f"{len(runs) - 1} candidate{'s' * (len(runs) > 2)})"))
    else:
      race = _Race(runs, objective, budget, share, jax.random.fold_in(key, 7919), say, started)
      try:
        race.prepare(elbo_samples)
        race.train_naive(race_at)
        draws, skipped = race.race()
      except KeyboardInterrupt:  # Ctrl-C: naive's run so far, the first part of any, is kept
        race.thread.shutdown(wait=False, cancel_futures=True)  # a compile under way ends alone
        interrupted, skipped = True, dict.fromkeys(set(runs) - {"naive"}, "interrupted")
      if len(draws) > 1:
        race_line = (f"each run raced {PIECES * race.piece:.3g} s of steps from naive's run, in "
                     f"{PIECES} pieces; then {len(draws['naive'][0])} ELBO draws of each, with "
                     f"common noise, on {race.rows:,} of the {objective.num_data:,} data.")
    rows = _rows(runs, draws, skipped, [c for c in built if isinstance(c, Candidate)])
    diverged = ()
    if "naive" in draws:  # every candidate raced from naive's run: if it diverged, they did too
      elbo, se = elbo_estimates.mean_and_standard_error(draws["naive"])
      diverged = elbo_trust.run_warnings(
          objective, History([runs["naive"].step], [0.0], [elbo], [se]), params, key)
    best = next(r for r in rows if r.name == "naive") if diverged else verdict(rows, draws)
    ranking = [best] + sorted((r for r in rows if r is not best),
                              key=lambda r: (not r.raced, -(r.gain or 0.0)))
    spent = time.perf_counter() - started
    kept = {name: run for name, run in runs.items() if name in draws} or {"naive": runs["naive"]}
    advice = Recommendation(best.name, tuple(ranking), tuple(_reasons(
        best, rows, budget, spent, race_line, diverged)), budget, spent, kept, progress)
    if interrupted:
      raise progress_lib.Interrupted(
          f"dsgrad.recommend interrupted after {spent:.3g} s; naive's run so far is kept: its "
          ".result, this advice, continues it with .fit() (or .resume())", advice,
          kept["naive"].step, None, lambda stop, **kw: stop.result.fit(**kw)) from None
    return advice
  finally:
    bar(0, close=True)


@checks.arguments(key=checks.prng_key(), batch_size=checks.count(1), budget=checks.positive())
def recommend_and_fit(objective, optimizer, params, key, *, batch_size: int, budget: float,
                      fit_kwargs: dict | None = None, **recommend_kwargs):
  """:func:`recommend`, then :meth:`Recommendation.fit` (``fit_kwargs``; ``progress`` as
  given to recommend unless set there): the budget in one call. Returns ``(advice, fit)``."""
  advice = recommend(objective, optimizer, params, key, batch_size=batch_size, budget=budget,
                     **recommend_kwargs)
  return advice, advice.fit(**(fit_kwargs or {}))
