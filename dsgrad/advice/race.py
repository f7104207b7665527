"""Training runs raced at equal wall-clock: each contender's real run, cut short.

A contender is an objective, an optimizer (the user's, with its schedule stretched over
the steps the contender affords in the budget) and a batch size. Racing it means running
the *first part* of that very run, in :func:`dsgrad.fit`'s compiled segments with fit's
batches and noise: after a fraction ``f`` of its steps every contender has spent ``f`` of
the budget, so their ELBOs compare at equal wall-clock, and the winner's run can be
continued by :func:`dsgrad.fit` (same key, ``start_step``) without starting again.

Time per step is the median of interleaved timing rounds (every contender once per
round), so that a slow spell of a shared machine hits all of them alike.

References:
  Jamieson, Talwalkar (2016). Non-stochastic best arm identification and hyperparameter
  optimization. AISTATS (successive halving).
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import stats

from dsgrad import diagnostics
from dsgrad.advice import halving
from dsgrad.training import progress as progress_lib
from dsgrad.training import segments
from dsgrad.advice import step_sizes
from dsgrad import tables
from dsgrad.objective import Objective


class Contender(NamedTuple):
  """One way to train, as raced.

  Attributes:
    name: its label.
    objective: the objective it steps on (the user's, or a variant of it: path derivative,
      more samples per datum).
    estimator: the dsgrad estimator chained before the user's optimizer.
    batch_size: data per step.
  """

  name: str
  objective: Objective
  estimator: Any
  batch_size: int


class Lane:
  """A contender's run in progress: its optimizer, steps taken, params and state.

  ``total_steps`` is the run's length; ``schedule_steps`` the length its optimizer's
  schedule was built for (the same, unless :meth:`stretched` kept a schedule built from a
  guess of the length). ``description`` and ``state_bytes`` say what it is and what its
  state costs; ``seconds_per_step`` and ``chunk`` are set by :func:`time_steps`."""

  def __init__(self, contender: Contender, make_optimizer: Callable, total_steps: int,
               params, key, description: str = "", state_bytes: int = 0,
               reuse: "Lane | None" = None):
    self.contender, self.total_steps = contender, int(total_steps)
    self.schedule_steps, self.make_optimizer = self.total_steps, make_optimizer
    self.description, self.state_bytes = description or contender.name, int(state_bytes)
    self.seconds_per_step = math.nan
    inner = make_optimizer(self.total_steps)
    if reuse is not None and reuse.inner is inner:
      # The same transformation (no schedule to stretch): the same chain object, so the
      # programs compiled for the old lane serve this one (cached by optimizer).
      self.inner, self.optimizer = inner, reuse.optimizer
    else:
      self.inner = inner
      self.optimizer = optax.with_extra_args_support(optax.chain(contender.estimator, inner))
    # dsgrad.fit runs its steps on split(key)[0] (the other half evaluates): the same
    # here, so that fit(..., key, start_step=steps) continues this very run.
    self.runner = segments.SegmentRunner(contender.objective, self.optimizer,
                                         contender.batch_size, jax.random.split(key)[0])
    self.params = copy_tree(params)
    self.opt_state = self.optimizer.init(self.params)
    self.steps = 0
    # Steps per compiled segment (every advance is whole chunks): set by the timing, or
    # by the race where step costs were given instead.
    self.chunk: int | None = None
    self.trace: list = []  # per round raced: [(fraction, ELBO draws), ...] (see race)
    self.same_steps: dict = {}  # keeps_program's comparisons

  def advance_to(self, fraction: float) -> None:
    """Runs whole chunks of steps up to ``fraction`` of its run (at least one chunk, at
    most the run), dispatched back to back: one compiled segment length per lane,
    whatever the rounds ask."""
    chunks = max(1, round((fraction * self.total_steps - self.steps) / self.chunk))
    whole = min(chunks, (self.total_steps - self.steps) // self.chunk)
    if whole > 0:
      self.params, self.opt_state = self.runner.run_calls(self.params, self.opt_state,
                                                          self.steps, self.chunk, whole)
      self.steps += whole * self.chunk
    if chunks > whole and self.steps < self.total_steps:  # the run's last, shorter segment
      length = self.total_steps - self.steps
      self.params, self.opt_state = self.runner.run(self.params, self.opt_state, self.steps,
                                                    length)
      self.steps += length

  def continue_from(self, other: "Lane", fraction: float) -> None:
    """Puts this lane, not yet advanced, where ``other``'s run is at ``fraction`` of the
    budget: ``other``'s params, this lane's step count at that fraction of its own run
    (its batches and its schedule are where its own run would be), and ``other``'s
    optimizer state with every step count (an integer scalar equal to ``other``'s steps)
    moved to this lane's. The estimator's state is built afresh at those params. Where the
    two optimizers' states differ in structure, this lane's optimizer starts afresh."""
    self.params, self.steps = copy_tree(other.params), int(round(fraction * self.total_steps))
    fresh = self.optimizer.init(self.params)
    carried = other.opt_state[1] if isinstance(other.opt_state, tuple) else None
    if (not isinstance(fresh, tuple) or len(fresh) != 2 or
        jax.tree.structure(carried) != jax.tree.structure(fresh[1])):
      self.opt_state = fresh
      return

    def moved(x):
      counts = (x.ndim == 0 and jnp.issubdtype(x.dtype, jnp.integer)
                and int(x) == other.steps)
      return jnp.array(self.steps, x.dtype) if counts else x

    self.opt_state = (fresh[0], jax.tree.map(moved, copy_tree(carried)))

  def restarted(self, make_optimizer: Callable, total_steps: int, params, key) -> "Lane":
    """The same contender's run from ``params`` with a schedule over ``total_steps``,
    keeping what was measured (description, state size, step time, chunk)."""
    lane = Lane(self.contender, make_optimizer, total_steps, params, key, self.description,
                self.state_bytes, reuse=self)
    lane.seconds_per_step, lane.chunk = self.seconds_per_step, self.chunk
    return lane

  def stretched(self, total_steps: int, params, key, reach: float) -> "Lane":
    """This lane, not yet advanced, as a run of ``total_steps``: itself (its compiled
    programs kept) where :meth:`keeps_program` says so for a race to ``reach`` of the
    run, else :meth:`restarted` (compiled again)."""
    if self.keeps_program(total_steps, reach):
      self.total_steps = int(total_steps)
      return self
    return self.restarted(self.make_optimizer, total_steps, params, key)

  def keeps_program(self, total_steps: int, reach: float) -> bool:
    """Whether a run of ``total_steps`` raced to ``reach`` (a fraction of it) can keep this
    lane's compiled program: it has not run, and its schedule, built for
    ``schedule_steps``, sets the same step sizes as one over ``total_steps`` up to there
    (:func:`dsgrad.advice.step_sizes.same_steps`)."""
    if self.steps != 0:
      return False
    if self.schedule_steps == int(total_steps):
      return True
    key = (int(total_steps), float(reach))
    if key not in self.same_steps:  # compared once per length and reach
      inner = self.make_optimizer(int(total_steps))
      self.same_steps[key] = inner is self.inner or step_sizes.same_steps(
          self.inner, inner, self.params, math.ceil(reach * total_steps))
    return self.same_steps[key]

  def run_optimizer(self):
    """The optimizer that continues this run to its end: its own, or, where its schedule
    was built for another length (:meth:`stretched`), one whose schedule spans the run."""
    inner = self.make_optimizer(self.total_steps)
    if inner is self.inner or self.schedule_steps == self.total_steps:
      return self.optimizer
    return optax.with_extra_args_support(optax.chain(self.contender.estimator, inner))

  def prepare(self, length: int) -> None:
    """Compiles this lane's segment of ``length`` steps (see :func:`prepare_all`)."""
    self.runner.prepare(self.params, self.opt_state, self.steps, length)

  @property
  def fraction(self) -> float:
    return self.steps / self.total_steps


def prepare_all(lanes: list, lengths: list) -> None:
  """Compiles every lane's segment of its length, several at once: tracing holds the
  interpreter (and is done one lane at a time: ``segments._TRACING``) but XLA's compiler
  does not, so on a machine of several cores the lanes' compilations overlap instead of
  queueing."""
  workers = max(1, min(len(lanes), usable_cpus()))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    for future in [pool.submit(lane.prepare, n) for lane, n in zip(lanes, lengths)]:
      future.result()


def copy_tree(tree):
  """A strongly typed copy: the segments donate their carry."""
  return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.asarray(x).dtype), tree)


def state_bytes_before_allocation(optimizer_init, params) -> int:
  """Bytes of ``optimizer_init(params)``'s state, from shapes alone (nothing allocated)."""
  return tables.tree_bytes(jax.eval_shape(optimizer_init, params))


def usable_cpus(cgroup_file: str = "/sys/fs/cgroup/cpu.max") -> int:
  """The CPU cores this process may run on: those of its affinity mask (``taskset``,
  a container's cpuset), fewer where a cgroup v2 quota allows less (``docker --cpus``).
  ``os.cpu_count()`` counts the machine's, which priced two cores' overlapped compiles
  on a process confined to one."""
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
  cpus = cpus or os.cpu_count() or 1
  try:
    with open(cgroup_file) as f:
      quota, period = f.read().split()[:2]
    if quota != "max":
      cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
  except (OSError, ValueError):
    pass
  return cpus


TIMING_SEGMENT = 256
"""Steps per timing segment (fewer for a slow step, :func:`timing_chunk`). A call of a
compiled segment has a fixed cost beside its steps, about 50-60 us on a CPU core whatever
the model (measured for a 1-step segment of the Student-t regression of ``python -m
benchmarks advice``); a run's long segments do not pay it per step, so a timing must not
either: at 64 steps of 3.5 us it made the step time 25% high, and the run's schedule that
much too short. Short enough that a fast step's first timing (naive's guess) compiles the
very program its timing rounds then run; calls are dispatched back to back."""


def guess_step_seconds(lane: "Lane", length: int = TIMING_SEGMENT) -> float:
  """A rough time per step of ``lane``: one segment of ``length`` steps (compiling it),
  then the median of three rounds of as many as last about 0.015 s, dispatched back to
  back; the lane's run is not advanced. One round of 0.03 s read a 4 us step 2.7 times
  too slow (logistic regression, 200 data, two CPU cores), and naive's race schedule,
  built for the steps that guess affords, then differed from its run's."""
  before = lane.runner.step_seconds
  lane.runner.run(copy_tree(lane.params), copy_tree(lane.opt_state), 0, length)
  single = max(lane.runner.step_seconds - before, 1e-7)
  calls = int(np.clip(round(0.015 / single), 1, 100))
  rounds = [lane.runner.seconds_per_step(copy_tree(lane.params), copy_tree(lane.opt_state),
                                         length, calls) for _ in range(3)]
  return max(float(np.median(rounds)), 1e-9)


def timing_chunk(step_guess: float, round_seconds: float = 0.05) -> int:
  """Steps per timing segment for a step of about ``step_guess`` seconds:
  :data:`TIMING_SEGMENT`, or fewer where that many would last more than half a round."""
  return int(np.clip(round_seconds / 2 / step_guess, 1, TIMING_SEGMENT))


def race_chunk(seconds_per_step: float, first_round_steps: float) -> int:
  """Steps per race segment: about 25 ms of steps (few calls), and at most an eighth of
  the first round, so that the rounds end within half a chunk of their mark and the
  lanes' times stay within 6% of each other."""
  longest = np.clip(0.025 / seconds_per_step, 1, 20_000)
  return int(np.clip(first_round_steps / 8, 1, longest))


def time_steps(lanes: list, rounds: int = 5, round_seconds: float = 0.05,
               step_guess: float | None = None) -> list:
  """Seconds per step of each lane's step, the median of ``rounds`` interleaved rounds.

  Every lane runs segments of its ``chunk`` steps (set here from ``step_guess``, a rough
  time per step, when it is given: :func:`timing_chunk`). The lanes' segments are
  compiled together first (:func:`prepare_all`), then each lane runs one segment
  uncounted and, in each round, as many segments as last about ``round_seconds``,
  dispatched back to back (:meth:`dsgrad.training.segments.SegmentRunner.seconds_per_step`). The
  lanes' runs are not advanced: every timed step starts from a copy of the lane's
  current carry.
  """
  for lane in lanes:
    if step_guess is not None:
      lane.chunk = timing_chunk(step_guess, round_seconds)
    elif lane.chunk is None:  # never timed nor raced: sized by its own step, if known
      known = np.isfinite(lane.seconds_per_step)
      lane.chunk = timing_chunk(lane.seconds_per_step, round_seconds) if known else 1
  prepare_all(lanes, [lane.chunk for lane in lanes])
  calls = []
  for lane in lanes:
    for _ in range(2):  # the first call warms up, the second sizes the rounds
      carry = (copy_tree(lane.params), copy_tree(lane.opt_state))
      seconds = lane.runner.seconds_per_step(*carry, lane.chunk, 1) * lane.chunk
    calls.append(int(np.clip(round(round_seconds / seconds), 1, 1000)))
  times = [[] for _ in lanes]
  for _ in range(rounds):
    for i, lane in enumerate(lanes):
      carry = (copy_tree(lane.params), copy_tree(lane.opt_state))
      times[i].append(lane.runner.seconds_per_step(*carry, lane.chunk, calls[i]))
  return [float(np.median(t)) for t in times]


def elbo_draws(objective: Objective, params, key, num_samples: int) -> np.ndarray:
  """The full-data ELBO's Monte Carlo draws at ``params``; the same ``key`` for every
  contender gives common random numbers, so their differences are precise."""
  return diagnostics.finite_elbo_draws(diagnostics.elbo_draws(objective, num_samples)(params, key),
                                      "dsgrad.recommend")


def paired_difference(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
  """``(mean(a - b), its standard error)`` for draws made with common random numbers."""
  return diagnostics.mean_and_standard_error(np.subtract(a, b))


def time_to_reach(trace: list, target: float) -> float:
  """The fraction of its run at which a lane's ELBO trace (``(fraction, mean ELBO)``
  pairs, from the start) first reaches ``target``, interpolated linearly; ``inf`` if
  it does not within the trace."""
  for (f0, e0), (f1, e1) in zip(trace, trace[1:]):
    if e1 >= target:
      if e1 == e0:
        return f1
      return f0 + (f1 - f0) * float(np.clip((target - e0) / (e1 - e0), 0.0, 1.0))
  return math.inf


FINAL_CHECKPOINTS = 4
"""ELBO estimates in the last half of the final round: one run's ELBO jitters from step to
step (a noise floor), by more than one estimate's standard error; the spread of the
paired differences over these checkpoints measures that jitter too."""


def race(lanes: list, reference: int, evaluate: Callable, share: float,
         progress: Callable[[str], None], start=None, estimate_cost: float = 0.0,
         origin: float = 0.0) -> dict:
  """Successive halving over ``lanes`` (``reference``, naive, always races); ``progress``
  is told which lane races (a :class:`Progress`). A lane outside the better half stays
  while it is within one doubling of naive's pace and the share allows
  (:mod:`dsgrad.advice.halving`).

  Args:
    estimate_cost: one ELBO estimate's time as a fraction of the budget: the estimates of
      lanes kept beyond the plan come out of ``share`` (the plan's own are priced by the
      caller).
    origin: where the race starts, as a fraction of the budget: naive's run first trains
      alone to it and every other lane continues from there (:meth:`Lane.continue_from`),
      so that the race compares the runs after their step-limited start. ``share`` is
      what the lanes spend after it; naive's steps before it belong to every run.

  Returns:
    ``{lane index: [[(fraction, draws), ...], ...]}`` for every lane: per round it took
    part in (round 0 is the start), the fraction of its run and its ELBO draws (from
    ``evaluate(params)``) at the round's checkpoints: the round's end, and in the final
    round :data:`FINAL_CHECKPOINTS` points over its last half. Every lane of a round has
    its checkpoints at the same fractions (equal wall-clock).
    ``start``, the draws at the lanes' common start, if already evaluated (at
    ``origin`` 0).
  """
  fractions, counts = halving.halving_fractions(len(lanes), share)
  planned = halving.estimates_planned(counts, FINAL_CHECKPOINTS)
  # The race runs each lane's timing segment (compiled already, unless the lane was
  # restarted for its schedule), dispatched back to back.
  for lane in lanes:
    if lane.chunk is None:  # not timed here: step costs were given
      lane.chunk = race_chunk(lane.seconds_per_step, fractions[0] * lane.total_steps)
  prepare_all(lanes, [lane.chunk for lane in lanes])
  if origin > 0:
    progress(f"naive trains alone to {100 * origin:.2g}% of the budget")
    lanes[reference].advance_to(origin)
    origin = lanes[reference].fraction  # whole chunks
    for i, lane in enumerate(lanes):
      if i != reference:
        lane.continue_from(lanes[reference], origin)
    start = None
  start = evaluate(lanes[reference].params) if start is None else start
  for lane in lanes:
    lane.trace.append([(origin, start)])
  fractions = [origin + f for f in fractions]
  alive, made, replanned, halfway = list(range(len(lanes))), 0, False, None
  for r in range(len(counts)):
    fraction, last = fractions[r], r + 1 == len(counts)
    before = fractions[r - 1] if r else origin
    marks = ([fraction - (fraction - before) / 2 * (1 - j / FINAL_CHECKPOINTS)
              for j in range(1, FINAL_CHECKPOINTS + 1)] if last else [fraction])
    for i in alive:
      progress(f"round {r + 1}/{len(counts)}: racing {lanes[i].contender.name} "
               f"to {100 * fraction:.2g}% of its run")
      if r == 0 and not last and i == reference:  # naive's pace: where it was at half the time
        lanes[i].advance_to((origin + fraction) / 2)
        halfway, made = evaluate(lanes[i].params), made + 1
      points = []
      for mark in marks:
        lanes[i].advance_to(mark)
        points.append((lanes[i].fraction, evaluate(lanes[i].params)))
      lanes[i].trace.append(points)
    made += len(alive) * len(marks)
    if last:
      break
    naive_before = halfway if r == 0 else lanes[reference].trace[-2][-1][1]
    ranked = sorted((i for i in alive if i != reference),
                    key=lambda i: -lanes[i].trace[-1][-1][1].mean())
    close = [i for i in ranked if halving.within_one_doubling(
        *paired_difference(lanes[i].trace[-1][-1][1], naive_before))]
    later = counts[r + 2:]

    def remaining(num_next, later=later):
      future = halving.round_estimates([num_next, *later], FINAL_CHECKPOINTS)
      extra = max(0, made + future - planned)
      spent = sum(lane.fraction - origin for lane in lanes)
      return share - spent - estimate_cost * extra

    kept, plan = halving.survivors(ranked, counts[r + 1] - 1, close, fraction - origin,
                                   later, remaining, replanned)
    if plan is not None:
      fractions[r + 1:], replanned = [origin + f for f in plan], True
    alive = [reference] + kept
  return {i: lane.trace for i, lane in enumerate(lanes)}


def _checkpoint_errors(points: list, reference: list) -> tuple:
  """``(the paired differences' means, one per checkpoint; the standard error of their
  mean from the estimates' own errors; the one from their spread, 0 for one checkpoint)``."""
  pairs = [paired_difference(a, b) for (_, a), (_, b) in zip(points, reference)]
  means = np.array([m for m, _ in pairs])
  own = float(np.sqrt(np.mean([e ** 2 for _, e in pairs]) / len(pairs)))
  spread = float(means.std(ddof=1) / np.sqrt(len(pairs))) if len(pairs) > 1 else 0.0
  return means, own, spread


def checkpoint_difference(points: list, reference: list) -> tuple[float, float]:
  """``(gain, se)``: the mean over a round's checkpoints of a lane's ELBO minus the
  reference's at the same checkpoints (common random numbers), and its standard error:
  the larger of the estimates' own (averaged over the checkpoints) and, with several
  checkpoints, the one from the differences' spread (which also holds the runs' jitter)."""
  means, own, spread = _checkpoint_errors(points, reference)
  return float(means.mean()), max(own, spread)


def gain_factor(points: list, reference: list) -> float:
  """How many standard errors of :func:`checkpoint_difference` a gain must exceed to be
  a win at about 95% (one-sided 97.5%): 2 where the estimates' own error (many Monte
  Carlo draws) is the larger, else Student-t's quantile for the checkpoints less one
  degrees of freedom (3.18 for four): an error measured from four differences is itself
  uncertain, and 2 of them would be an 86% interval."""
  means, own, spread = _checkpoint_errors(points, reference)
  return 2.0 if own >= spread else max(2.0, float(stats.t.ppf(0.975, len(means) - 1)))


class Progress:
  """What :func:`recommend` is doing, against the time it may take: the one progress
  display (:func:`dsgrad.training.progress.bar`) over the seconds of its share, with the
  current activity beside it (a printed line where tqdm is not installed)."""

  def __init__(self, enabled: bool, started: float):
    self.started, self.shown, self.total = started, 0.0, None
    self.update = progress_lib.bar(enabled, None, "s", desc="dsgrad.recommend")

  def set_total(self, seconds: float) -> None:
    # The share in seconds is known once naive's step is timed (a budget in naive steps).
    self.total = seconds
    self.update(total=seconds)

  def __call__(self, message: str) -> None:
    elapsed = time.perf_counter() - self.started
    shown = min(elapsed, self.total) if self.total else elapsed  # the bar ends at its total
    self.update(shown - self.shown, status=message, line=f"dsgrad.recommend: {message}")
    self.shown = shown

  def close(self) -> None:
    self("done")
    self.update(close=True)
