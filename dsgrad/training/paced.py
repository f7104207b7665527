"""Training paced to a wall-clock budget, on :func:`dsgrad.fit`'s public surface.

:func:`fit_within` trains one estimator for a budget of seconds, compiles included, its
schedule ending with them. The same runs serve :func:`dsgrad.recommend`: a :class:`Run` is
compiled by :func:`dsgrad.compile_fit` (in a thread, beside another run), advanced in
pieces with ``fit(..., start_step=, opt_state=)`` and moved between programs;
:func:`finish` continues one to the budget's end.

A run's schedule spans the budget (at its fraction ``f``, step ``f x length``): a run may
continue another (its params, the user optimizer's state with step counts moved, its own
estimator state afresh), and a run moves to a program of another length at one ``f``.
The user's optimizer is :func:`paced`: to the budget's end its schedule keeps pace with the
clock on any program, of its own length or not (a compile may not fit in what is left).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks, elbo_trust, psis
from dsgrad.estimators import chain
from dsgrad.estimators.naive import naive
from dsgrad.training import progress
from dsgrad.training.loop import compile_fit, fit
from dsgrad.training.resume import History


MAX_LENGTH = 2**30  # steps: fit's counters are int32, and a paced count may pass the end


class Paced(NamedTuple):
  """The user optimizer's state; the schedule position its step counts are set to before
  each update; the position's move a step: ``rate``, its fraction carried."""

  inner: Any
  position: jax.Array
  carry: jax.Array
  rate: jax.Array


def paced(inner) -> optax.GradientTransformationExtraArgs:
  """``inner`` (an optax transformation) with its step counts (schedules', Adam's bias
  correction) set to a position that moves ``rate`` a step (1 to start): one program
  follows its schedule at the pace :meth:`Run.use` sets between calls."""
  inner = optax.with_extra_args_support(inner)

  def init(params):
    return Paced(inner.init(params), jnp.zeros([], jnp.int32), jnp.zeros([]), jnp.ones([]))

  def update(updates, state, params=None, **extra):
    updates, inner_state = inner.update(updates, unpaced(state), params, **extra)
    move = jnp.floor(state.carry + state.rate)
    return updates, state._replace(inner=inner_state, carry=state.carry + state.rate - move,
                                   position=state.position + move.astype(jnp.int32))

  return optax.GradientTransformationExtraArgs(init, update)


def unpaced(state: Paced):
  """The user optimizer's own state in ``state``, its step counts at the position."""
  try:  # optax's step counters, where it keeps any
    return optax.tree_utils.tree_set(state.inner, count=state.position)
  except KeyError:
    return state.inner


class Program(NamedTuple):
  """The estimator chained with the user's optimizer over ``length`` steps (whole
  segments), compiled for segments of ``segment`` steps."""

  length: int
  segment: int
  optimizer: Any


class Setup(NamedTuple):
  """What a run trains: its ``name``, the ``objective`` its steps use, the ``estimator``
  chained before the user's optimizer, and the ``batch_size``."""

  name: str
  objective: Any
  estimator: Any
  batch_size: int


class Run:
  """A :class:`Setup`'s run (or a recommend candidate's, which has the same fields) with
  the user's ``make_optimizer`` (``num_steps -> transformation``), ``key`` and starting
  ``params``: its program, params, optimizer state, step, and its steps' seconds
  (compiles, setup and evaluations excluded)."""

  def __init__(self, contender, make_optimizer, key, params):
    self.contender, self.make_optimizer, self.key = contender, make_optimizer, key
    self.start_params, self.program, self.params, self.opt_state = params, None, None, None
    self.step, self.steps_run, self.seconds = 0, 0, 0.0
    self.timings, self.earlier_rate = [], None  # (steps, seconds) per advance on program
    self.mark, self.first_seconds, self.compile_seconds = (0.0, 0), 0.0, 0.0  # start_race

  name = property(lambda self: self.contender.name)
  batch_size = property(lambda self: self.contender.batch_size)

  @property
  def seconds_per_step(self) -> float | None:
    """The program's step time, the median over its calls (a slow spell of a shared machine
    moves one call, not the median; the cold first call left out), else the previous one's."""
    timed = self.timings[1:] or self.timings
    return float(np.median([s / n for n, s in timed])) if timed else self.earlier_rate

  def compile(self, length: int, segment: int) -> Program:
    """Builds and compiles this run's :class:`Program` over ``length`` steps."""
    length = min(max(1, -(-int(length) // segment)), MAX_LENGTH // segment) * segment
    optimizer = optax.chain(self.contender.estimator, paced(self.make_optimizer(length)))
    started = time.perf_counter()
    seconds = compile_fit(self.contender.objective, optimizer, self.start_params, self.key,
                          num_steps=length, batch_size=self.batch_size, elbo_samples=0,
                          segment_steps=segment)
    # settle budgets a compile's call, tracing too (1.2 s where compile_fit reported 0 s
    # for a program its cache held), and the longest so far: a cached one is no guide.
    seconds = max(seconds, time.perf_counter() - started)
    self.compile_seconds = max(self.compile_seconds, seconds)
    return Program(length, segment, optimizer)

  def use(self, program: Program, fraction: float, seconds_left: float | None = None) -> None:
    """Continues on ``program`` at ``fraction`` of the budget: the step, and the user
    optimizer's step counts, moved to that fraction of its length (whole segments; at
    least one left); with ``seconds_left``, its counts paced to reach the end by then. A
    transformation given as it is (no ``num_steps``) keeps its counts: the steps run."""
    step = position = min(int(fraction * program.length) // program.segment * program.segment,
                          program.length - program.segment)
    rate = 1.0
    if seconds_left is not None:
      steps = max(1, int(seconds_left / self.seconds_per_step))
      rate = min(program.length, (program.length - step) / steps)
      if rate < 1:  # fit would stop at the program's end: its steps start earlier, new draws
        step = max(0, program.length - steps) // program.segment * program.segment
        self.key = jax.random.fold_in(self.key, step)
        rate = (program.length - position) / (program.length - step)
    if getattr(self.make_optimizer, "fixed", False):  # a transformation: its counts are run
      position, rate = self.opt_state[1].position, 1.0
    self.opt_state = (self.opt_state[0], self.opt_state[1]._replace(
        position=jnp.asarray(position, jnp.int32), carry=jnp.zeros([]), rate=jnp.asarray(rate)))
    if program is not self.program:
      self.earlier_rate, self.timings = self.seconds_per_step, []
    self.program, self.step = program, step

  def start(self, program: Program) -> None:
    """Starts the user's run on ``program``, from the optimizer's initial state."""
    self.params = jax.tree.map(jnp.copy, self.start_params)
    self.opt_state = program.optimizer.init(self.params)
    self.use(program, 0.0)

  def start_timed(self, budget: float, segment: int = 64) -> float:
    """Starts on a schedule longer than any run (its step sizes barely move until it has
    its own) and times it (a cold call, then a tenth of a second): returns its compile's
    seconds."""
    self.start(self.compile(int(budget / 1e-6), segment))
    self.advance(2 * segment)
    self.advance(round(0.1 / self.seconds_per_step))
    return self.compile_seconds

  def continue_from(self, other: "Run", program: Program, fraction: float) -> None:
    """Continues ``other``'s run on ``program`` at ``fraction`` of the budget: ``other``'s
    params, user-optimizer state and steps run, this run's estimator state made afresh at
    those params (its first update fills a table or takes a snapshot)."""
    self.params, self.steps_run = jax.tree.map(jnp.copy, other.params), other.steps_run
    fresh = program.optimizer.init(self.params)
    self.opt_state = (fresh[0], jax.tree.map(jnp.copy, other.opt_state[1]))
    self.use(program, fraction)

  def advance(self, steps: int) -> None:
    """Runs ``steps`` more steps (whole segments, at least one) with :func:`dsgrad.fit`;
    interrupted (Ctrl-C), the run keeps those that ran."""
    steps = max(self.program.segment, steps // self.program.segment * self.program.segment)
    try:
      result = self.fit(num_steps=self.step + steps, elbo_samples=0, progress=False)
    except progress.Interrupted as stop:  # untimed: what follows times its own steps
      self.params, self.opt_state, self.steps_run, self.step = (
          stop.result.params, stop.result.opt_state, self.steps_run + stop.step - self.step,
          stop.step)
      raise
    self.took(result)

  def took(self, result) -> None:
    """Continues from ``result``, this run's :meth:`fit` from where it was; its steps timed."""
    steps = result.step - self.step
    self.params, self.opt_state, self.step = result.params, result.opt_state, result.step
    self.steps_run, self.seconds = self.steps_run + steps, self.seconds + result.timing.steps
    self.timings.append((steps, result.timing.steps))

  def start_race(self, first_update: bool) -> None:
    """Marks the race's start; with ``first_update``, after a segment whose first update
    fills a table or takes a snapshot (its extra time is charged by epoch of steps)."""
    if first_update:
      before = self.seconds
      self.advance(self.program.segment)
      self.first_seconds = self.seconds - before
    self.mark, self.timings = (self.seconds, self.steps_run), []

  def raced_seconds(self) -> float:
    """The race's seconds: its steps', and its first update's extra time by epoch."""
    seconds, steps = self.seconds - self.mark[0], self.steps_run - self.mark[1]
    extra = max(0.0, self.first_seconds - self.program.segment * (self.seconds_per_step or 0))
    epoch = max(1, self.contender.objective.num_data // self.batch_size)
    return seconds + extra * min(1.0, steps / epoch)

  def advance_for(self, seconds: float) -> None:
    """About ``seconds`` of steps (two segments first where its step is not timed yet)."""
    if self.seconds_per_step is None:
      before = self.seconds
      self.advance(2 * self.program.segment)
      seconds -= self.seconds - before
    if seconds > 0.5 * self.program.segment * self.seconds_per_step:
      self.advance(round(seconds / self.seconds_per_step))

  def fit(self, **fit_kwargs):
    """:func:`dsgrad.fit` of this run from where it is, on its program (of its length)."""
    settings = {"num_steps": self.program.length, "segment_steps": self.program.segment,
                **fit_kwargs}
    return fit(self.contender.objective, self.program.optimizer, self.params, self.key,
               batch_size=self.batch_size, opt_state=self.opt_state, start_step=self.step,
               **settings)

  def settle(self, budget: float, spent) -> None:
    """Puts the run at the fraction ``spent() / budget`` of a schedule over the steps it
    affords in ``budget``: its own or, shorter or over 25% longer with four compiles' time
    left (a compile cannot be stopped), one a tenth longer compiled in a thread as the run
    goes on; paced to end with the budget either way."""
    # Timed again where four calls of a segment or more fit twice in what is left: a race's
    if (left := budget - spent()) > 8 * self.program.segment * self.seconds_per_step:
      self.earlier_rate, self.timings = self.seconds_per_step, []  # steps shared the cores
      for _ in range(4):  # with compiles; here the median of three warm calls
        self.advance(round(min(0.2, 0.05 * left) / self.seconds_per_step))
    for _ in range(2):  # the second on its own step time: longer segments run faster
      affords, program = min(int(budget / self.seconds_per_step), MAX_LENGTH), self.program
      # Segments of at least a hundredth of the budget: their fixed cost is spread, and a
      # run limited in time still stops within a hundredth of it.
      segment = max(program.segment, round(0.01 * budget / self.seconds_per_step))
      # Paced, a longer program ends with the budget too; a shorter one would end before it.
      # A compile cannot be stopped, and its program is timed on four segments: both must
      # fit in what is left, with as much again for the run.
      if (0.97 * affords <= program.length <= 1.25 * affords or budget - spent()
          < 4 * self.compile_seconds + 8 * segment * self.seconds_per_step):
        break
      with concurrent.futures.ThreadPoolExecutor(1) as thread:
        future = thread.submit(self.compile, 1.1 * affords, segment)
        while not future.done():  # steps of about a fifth of a second
          self.advance(round(0.2 / self.seconds_per_step))
      self.use(future.result(), spent() / budget)
      for _ in range(4):  # timed on its own segments: the first runs cold, three give a median
        if budget - spent() < 4 * segment * self.seconds_per_step:
          break  # the rest is the run's
        self.advance(round(0.2 / self.seconds_per_step))
    self.use(self.program, spent() / budget, seconds_left=budget - spent())


FIXED = ("num_steps", "max_seconds", "batch_size", "opt_state", "start_step", "segment_steps")
""":func:`dsgrad.fit`'s settings that :func:`finish` sets itself, to the budget's end."""


def finish(run: Run, budget: float, spent_before: float, who: str, **fit_kwargs):
  """Continues ``run`` (started or not) with :func:`dsgrad.fit` to the end of ``budget``
  seconds, of which ``spent_before`` are gone, on a schedule over the steps it affords
  (:meth:`Run.settle`). ``fit_kwargs``: fit's others (``elbo_samples``, ``progress``, ...);
  ``who`` names the caller in errors. Returns fit's :class:`~dsgrad.FitResult`, timed for
  this call, its ``step`` and ``history.step`` in steps run, its ``opt_state``
  ``(estimator state, the user optimizer's state at the schedule's position)``."""
  if fixed := set(fit_kwargs) & set(FIXED):  # the run's, to the end
    raise TypeError(f"{who} sets {sorted(fixed)} itself: pass fit's others")
  if fit_kwargs.get("resume"):  # its key and pace belong to the call that wrote it
    raise ValueError("a paced run (Recommendation.fit, dsgrad.fit_within) does not resume: "
                     "read its checkpoint's params back (dsgrad.restore_fit_checkpoint(path, "
                     "params, None)) and start a new call from them")
  entered, stepped = time.perf_counter(), run.seconds
  spent = lambda: spent_before + time.perf_counter() - entered
  importing = psis.import_beside()  # for fit's k-hat: beside the first compile, where one
  compiled = run.start_timed(budget) if run.program is None else 0.0
  importing.join()  # before the time left is shared
  if run.seconds_per_step is None:  # recommend interrupted before its steps were timed
    run.advance(2 * run.program.segment)
  run.settle(budget, spent)
  # fit's evaluations take time the pace would give to steps (its schedule then ends
  # early: at 0.81 of it in a minute on 2M rows read from disk). The first half prices
  # them (two draws each: no k-hat yet); the second is paced on the time they leave.
  samples, begun = fit_kwargs.get("elbo_samples"), (run.step, run.steps_run)
  settled = run.seconds - stepped  # this call's steps so far: its history counts them too
  # One bar over both pieces: the first's total and end (left=0) are not the run's; an
  # interrupt's close is.
  asked = fit_kwargs.get("progress", True)  # True, False or a display of the caller's
  shown = asked and progress.elbo_bar(asked, None)
  first = run.fit(max_seconds=max(1e-3, (budget - spent()) / 2), **{
      **fit_kwargs, "elbo_samples": 2 if samples is None else min(2, samples),
      "progress": shown and (lambda n, step, value, se, close=False, left=None: shown(
          n, step, value, se, close=close and left is None))})
  f, run.timings = first.timing, []  # its step time alone paces what is left
  run.took(first)
  at = max(spent() / budget, (run.step + run.program.segment) / run.program.length)
  if at * run.program.length < run.program.length - run.program.segment:  # else as paced
    run.use(run.program, at, seconds_left=(1 - f.evaluations / max(f.total, 1e-9)) * (
        budget - spent()))
  before, stepped = time.perf_counter() - entered, run.seconds - stepped
  resumed = (run.step, run.steps_run)  # the step moves back where the program is short
  result = run.fit(max_seconds=max(1e-3, budget - spent()), **{**fit_kwargs, "progress": shown})
  history = History(*map(np.concatenate, zip(_counted(first.history, *begun, wall=settled),
                                              _counted(result.history, *resumed,
                                                       wall=settled + first.timing.steps))))
  t = result.timing  # the other time before fit (compiles beside steps) counts as setup
  # The trace judged from your params: a run that diverged in a race looks steady here.
  warned = elbo_trust.run_warnings(run.contender.objective, history, run.start_params, run.key)
  for message in (m for m in warned if fit_kwargs.get("progress", True)
                  and m not in result.warnings):  # fit printed its own
    print("warning: " + message, flush=True)
  estimator_state, pace = result.opt_state
  return result._replace(opt_state=(estimator_state, unpaced(pace)), history=history,
                         step=resumed[1] + result.step - resumed[0], timing=t._replace(
      total=t.total + before, steps=t.steps + stepped, compile=t.compile + f.compile + compiled,
      evaluations=t.evaluations + f.evaluations,
      setup=t.setup + before - stepped - f.compile - f.evaluations - compiled),
      warnings=tuple(dict.fromkeys(result.warnings + warned)))


def _counted(history: History, step: int, steps_run: int, wall: float = 0.0) -> History:
  """A piece's ``history`` from program ``step``, where the run had ``steps_run`` steps, in
  steps run (a program's step index jumps where the run moves to a program of another
  length), its steps' seconds after ``wall``."""
  return history._replace(step=history.step - step + steps_run, wall_time=history.wall_time + wall)


@checks.arguments(objective=checks.objective(), optimizer=checks.optimizer(factory=True),
                  params=checks.parameters(), key=checks.prng_key(), seconds=checks.positive(),
                  batch_size=checks.count(1), estimator=checks.optional(checks.estimator()))
def fit_within(objective, optimizer, params, key, *, seconds: float, batch_size: int,
               estimator=None, **fit_kwargs):
  """:func:`dsgrad.fit` in ``seconds`` of wall-clock, compiles included, with your schedule
  ending with them: ``estimator`` (naive by default) chained with ``optimizer(num_steps)``,
  its step counts paced to the clock as :meth:`dsgrad.Recommendation.fit` paces the
  recommended run (with no race). Returns fit's :class:`~dsgrad.FitResult`, as that method
  does.

  Raises:
    ValueError: ``optimizer`` holds an estimator (pass it as ``estimator``).
    TypeError: a setting of fit's that ``seconds`` sets (``num_steps``, ``max_seconds``, ...).

  Example::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 1000, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> result = dsgrad.fit_within(
    ...     objective, lambda n: optax.adam(optax.cosine_decay_schedule(1e-2, n)),
    ...     dsgrad.meanfield_init(objective), jax.random.key(1), seconds=3.0, batch_size=50,
    ...     estimator=dsgrad.joint_svrg(objective), progress=False)  # about 3 s in all
    >>> bool(result.history.step[-1] == result.step > 0)  # counted in steps run
    True
  """
  make, who = checks.optimizer_factory(optimizer, "dsgrad.fit_within"), "dsgrad.fit_within"
  if chain.holds_estimator(jax.eval_shape(make(2).init, params)):
    raise ValueError(f"{who}: optimizer holds a dsgrad estimator; pass it as estimator= and "
                     "leave the rule chained after it (e.g. optax.adam) in optimizer")
  if fixed := set(fit_kwargs) & set(FIXED):
    raise TypeError(f"{who} sets {sorted(fixed)} itself from seconds=: pass fit's others")
  setup = Setup("fit_within", objective, naive() if estimator is None else estimator, batch_size)
  return finish(Run(setup, make, key, params), seconds, 0.0, who, **fit_kwargs)
