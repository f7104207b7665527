"""Which candidates :func:`dsgrad.recommend` can afford to race: their lanes built where
their state fits in memory, each priced by what it compiles and admitted in priority order
while the share lasts (:class:`Share`), their steps timed, and the length of
each one's first schedule guessed so that its timing program can also be its race's."""

from __future__ import annotations

import time

import numpy as np
import optax

from dsgrad.advice import race as race_lib
from dsgrad.advice.candidates import NAIVE_PROGRAMS, Candidate, cost_guess


def build_lanes(contenders, make_optimizer, params, key, memory_limit, steps_for):
  """Lanes for the contenders whose state fits, each with its schedule over
  ``steps_for(name)`` steps; ``(lanes, ruled_out)``."""
  lanes, ruled_out = [], []
  for name, contender, description, note in contenders:
    if contender is None:
      ruled_out.append(Candidate(name, description, note=note))
      continue
    steps = steps_for(contender.name)
    probe = optax.chain(contender.estimator, make_optimizer(steps))
    try:
      size = race_lib.state_bytes_before_allocation(probe.init, params)
    except MemoryError as error:
      ruled_out.append(Candidate(contender.name, description, note=str(error).split(". ")[0]))
      continue
    if size > memory_limit:
      ruled_out.append(Candidate(
          contender.name, description, state_bytes=size,
          note=f"its state needs {size / 2**20:.4g} MiB, more than the "
               f"{memory_limit / 2**20:.4g} MiB allowed (memory_share of what is free)"))
      continue
    lanes.append(race_lib.Lane(contender, make_optimizer, steps, params, key, description,
                               size))
  return lanes, ruled_out


def step_seconds(lanes, step_costs, progress, step_guess=None) -> list:
  """Each lane's seconds per step: timed in interleaved rounds, or read from
  ``step_costs``."""
  if step_costs is None:
    progress(f"timing {len(lanes)} candidates")
    return race_lib.time_steps(lanes, step_guess=step_guess)
  missing = [lane.contender.name for lane in lanes if lane.contender.name not in step_costs]
  if missing:
    raise ValueError(f"step_costs has no cost for {missing}")
  # recommend has checked that every cost is positive and finite.
  return [float(step_costs[lane.contender.name]) for lane in lanes]


def not_raced(name, description, share, reason) -> Candidate:
  """The row of a candidate the share cannot pay for, with ``reason``."""
  return Candidate(name, description, note=(
      f"not raced: {reason} would take this advice past share = {share:g} of the budget "
      "(give fewer candidates, a larger budget or a larger share)"))


def never_raced(entries, share) -> list:
  """Rows for contender entries that will not race: their own note, else the share's."""
  return [Candidate(n, d, note=note) if c is None else not_raced(n, d, share, "compiling it")
          for n, c, d, note in entries]


def admit(contenders, ledger, guess, make_optimizer, params, key, memory_limit, steps_for,
          share, progress, companion=None):
  """Compiles the contenders' programs (timed, then raced) in priority order, two at a
  time where compilations overlap, while the share lasts; ``(lanes, ruled_out)``.

  Each pair is priced before it compiles (:meth:`Share.price`), and a
  contender the share cannot pay for is passed over for the cheaper ones after it; after
  a pair compiled, its measured compile times price what is left, and a lane whose timing
  and estimates would no longer fit the whole share, the race's quarter included, is let
  go (the last first). Given ``ledger=None`` (step costs
  passed in) every contender that fits in memory is admitted, compiled by the race.
  ``companion``, a lane already priced (naive's restarted run), is compiled beside the
  first contenders that compile, and not at all where none does."""
  if ledger is None:
    return build_lanes(contenders, make_optimizer, params, key, memory_limit, steps_for)
  lanes, ruled_out = [], []
  pending = [c for c in contenders if c[1] is not None]
  ruled_out += never_raced([c for c in contenders if c[1] is None], share)
  group = 2 if compile_overlap() > 1 else 1
  while pending:
    batch, pending = pending[:group], pending[group:]
    if len(batch) > 1 and ledger.left() < ledger.price([c[0] for c in batch]):
      batch, pending = batch[:1], batch[1:] + pending
    # A pair that fits is priced together (compiling overlaps), not by its first alone.
    if len(batch) == 1 and ledger.left() < ledger.price([batch[0][0]]):
      ruled_out.append(not_raced(batch[0][0], batch[0][2], share, "compiling it"))
      continue
    fresh, out = build_lanes(batch, make_optimizer, params, key, memory_limit, steps_for)
    ruled_out += out
    if not fresh:
      continue
    progress("compiling " + ", ".join(lane.contender.name for lane in fresh))
    for lane in fresh:
      lane.chunk = race_lib.timing_chunk(guess)
    extra, companion = ([companion] if companion is not None else []), None
    race_lib.prepare_all(fresh + extra, [lane.chunk for lane in fresh + extra])
    if extra:
      ledger.restart_compiled()
    for lane in fresh:
      ledger.compiled(lane)
    # Their compile is spent: a lane is let go only if its timing rounds and estimates
    # do not fit even the race's quarter of the share.
    while fresh and ledger.left(whole=True) < 0:
      lane = fresh.pop()
      ledger.release(lane)
      ruled_out.append(not_raced(
          lane.contender.name, lane.description, share,
          f"its program took {lane.runner.compile_seconds:.2g} s to compile; its race"))
    lanes += fresh
  return lanes, ruled_out


def equal_cost_k(candidates, step_costs) -> int:
  """The equal-cost baselines' ``K``: the control variates' median cost in naive steps
  where ``step_costs`` gives them, else 2 (at least 2)."""
  given = step_costs or {}
  controls = [float(given[name]) for name in candidates
              if name not in NAIVE_PROGRAMS and name in given]
  if not controls or "naive" not in given:
    return 2
  return max(2, int(round(float(np.median(controls)) / float(given["naive"]))))


def schedule_guesses(budget, budget_in, guess, step_costs):
  """``steps_for(name, k)``: the length of a candidate's first schedule, the steps it
  affords in the budget at the given step cost, or at a guess of it
  (:func:`dsgrad.advice.candidates.cost_guess`, ``k`` the equal-cost baselines')."""
  if step_costs is not None:
    unit = float(step_costs.get("naive", 1.0)) if budget_in == "naive_steps" else 1.0
    # A name without a cost is refused with its reason before anything is timed.
    return lambda name, k: max(1, int(float(budget) * unit / float(step_costs.get(name, unit))))
  seconds = float(budget) * (guess if budget_in == "naive_steps" else 1.0)
  return lambda name, k: max(1, int(seconds / (guess * cost_guess(name, k))))


def compile_overlap() -> float:
  """How much the lanes' compilations overlap in threads: measured 1.6-fold on two CPU
  cores (tracing holds the interpreter lock, XLA's compiler does not); none on one."""
  return 1.6 if race_lib.usable_cpus() > 1 else 1.0


# Each raced lane, besides compiling, runs its timing rounds (five rounds of about 0.05 s,
# after two warm-up segments) and sets up its state twice.
LANE_OVERHEAD_SECONDS = 0.35


class Share:
  """The advice's time share as it is spent: what has gone, and what the lanes admitted so
  far will still cost (their timing rounds and ELBO estimates; a lane races with its
  timing program, unless its schedule was guessed too far from its length and it compiles
  again, which the race's part of the share absorbs). A quarter of the share is kept for
  the race itself (:func:`dsgrad.recommend`). A lane whose compile took longer than
  priced is kept while its timing rounds and ELBO estimates fit the whole share (its
  compile is spent either way, and a race in the rest is better than none), so the
  advice can take up to a quarter of the share more than the share.

  A lane not yet compiled is priced by what it compiles. One whose program is naive's
  step on the objective or a variant of it (``naive_like``: more samples, a larger batch,
  the path derivative) at naive's compile time (measured 0.9-1.3x naive's on three
  held-out models on two CPU cores). Another (a control variate) at the median compile
  time measured on the control variates compiled so far; before any, at twice naive's
  (on two CPU cores: 1.2-1.9x on a held-out MLP, 1.6-2.2x on the main job's logistic
  regression, 2-3x on a hierarchical model). A lane compiles once, for its timing and its
  race, when its first schedule was guessed close enough (:meth:`dsgrad.advice.race.Lane.stretched`).

  Args:
    allowed: the share, in seconds.
    started: when the advice started (``time.perf_counter()``).
    naive_lane: naive's lane, its timing program compiled.
    naive_like: the names of the candidates whose program is naive's step.
    naive_restarts: whether naive's run compiles again after its first timing (its first
      schedule's length was not known: a budget in seconds).
  """

  def __init__(self, allowed: float, started: float, naive_lane, naive_like=(),
               naive_restarts: bool = True):
    self.allowed, self.started = allowed, started
    # Priced as compiled without JAX's persistent cache: a program it served says
    # nothing of one of other sizes.
    self.naive_compile = naive_lane.runner.compile_cost_seconds
    self.naive_like = frozenset(naive_like)
    self.per_lane = LANE_OVERHEAD_SECONDS
    self.measured: list = []  # the control variates' compile times
    # Naive's run compiles again for its timing rounds and race (its first program's
    # schedule was an epoch's), beside the first candidates that compile.
    self.naive_restart = self.naive_compile / compile_overlap() if naive_restarts else 0.0
    self.owed = self.per_lane + self.naive_restart

  def count_evaluations(self, eval_seconds: float) -> None:
    """Adds to each lane's cost its ELBO estimates (after its first round, and after a
    second if it stays), at ``eval_seconds`` each, and the final round's checkpoints
    (naive's and a finalist's)."""
    self.owed += (2 + 2 * (race_lib.FINAL_CHECKPOINTS - 1)) * eval_seconds
    self.per_lane += 2 * eval_seconds

  def left(self, whole: bool = False) -> float:
    """Seconds of the share left to admit lanes with: three quarters of it (the rest is
    the race's), or with ``whole`` all of it."""
    part = 1.0 if whole else 0.75
    return part * self.allowed - (time.perf_counter() - self.started) - self.owed

  def compile_guess(self, name: str) -> float:
    """The seconds a candidate's program is expected to take to compile."""
    if name in self.naive_like:
      return self.naive_compile
    return float(np.median(self.measured)) if self.measured else 2 * self.naive_compile

  def price(self, names) -> float:
    """The whole cost of the candidates ``names`` compiled together: their programs
    (overlapped only when there are several), their timing rounds and ELBO estimates."""
    together = compile_overlap() if len(names) > 1 else 1.0
    return sum(self.compile_guess(name) / together + self.per_lane for name in names)

  def compiled(self, lane) -> None:
    if lane.contender.name not in self.naive_like:
      self.measured.append(lane.runner.compile_cost_seconds)
    self.owed += self.per_lane  # its timing rounds and ELBO estimates

  def release(self, lane) -> None:
    self.owed -= self.per_lane

  def restart_compiled(self) -> None:
    """Naive's second program has compiled: its time is spent, no longer owed."""
    self.owed -= self.naive_restart
    self.naive_restart = 0.0
