"""Wall-clock per optimization step, several optimizers side by side in one process."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import checkify

import dsgrad
from benchmarks import _report
from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad.training.batching import epoch_batches
from dsgrad.training.segments import train_step


class FusedStep(NamedTuple):
  """A contender that replaces the whole step (gradient, estimator, update rule):
  ``init(params) -> state`` and ``step(params, state, indices, noise_key) -> (params,
  state)``, jittable. :func:`time_per_step` times it like the optimizers."""

  init: Callable
  step: Callable


class DeferredChecks(NamedTuple):
  """An optimizer timed as :func:`dsgrad.fit` runs it: its value checks deferred to the
  end of the compiled scan (:func:`dsgrad.checks.deferred`) instead of a conditional
  host callback in every step."""

  optimizer: object

  def init(self, params):
    return self.optimizer.init(params)


class TwoCalls(NamedTuple):
  """An optimizer timed in the two-call form: the naive gradient computed first and
  passed to ``update`` (``train_step(..., fused=False)``), instead of the fused step
  :func:`dsgrad.fit` uses, in which the estimator computes it with its control variate."""

  optimizer: object

  def init(self, params):
    return self.optimizer.init(params)


def time_per_step(objective, optimizers: dict, params0, batch_size: int, steps: int, *,
                  rounds: int = 3, steps_for=None, log: bool = True,
                  compile_seconds: dict | None = None, index_range: int | None = None):
  """Median seconds per step of each optimizer, and its state memory.

  A step is the naive mini-batch gradient, the optimizer (estimator and update rule)
  and the parameter update, run inside one jitted ``lax.scan`` with the carry donated,
  as in a training loop; batches (reshuffled epochs) and noise keys are drawn outside
  the timed region. Round 0 compiles and is discarded; later rounds rotate the order so
  that no optimizer always goes first. Each round starts from the state after one
  update, made before the timed steps: an estimator's first update runs its full passes
  (joint SAGA's mean, joint SVRG's first snapshot), once per run, as ``init`` did before.

  Args:
    objective: the :class:`dsgrad.Objective`, or ``{name: objective}`` with one per
      optimizer (ways of writing one model: the same number of data and params).
    optimizers: ``{name: optax transformation}`` taking ``indices`` and ``noise``.
    params0: initial params (copied for every run).
    batch_size: ``B``.
    steps: steps per timed run.
    rounds: timed rounds (the median is reported).
    steps_for: optional ``name -> steps`` override (e.g. 2 for a full-pass estimator).
    log: print each round's figure.
    compile_seconds: if given, filled with ``{name: seconds}`` to trace and compile each
      runner (ahead of time, before round 0).
    index_range: draw the batches from the first ``index_range`` data only (default all):
      the same program on the same arrays, with rows that stay in cache.

  The objective's data are an argument of the jitted runner (as in :func:`dsgrad.fit`),
  not constants of the program. Host (memory-mapped) data: the batches' rows are read on
  the host before the timed call and passed in, as :func:`dsgrad.fit`'s reader thread
  does while the device computes; the host read is not in the step time (time it with
  :func:`host_read_seconds`).

  Returns:
    ``({name: seconds per step}, {name: (table bytes, state bytes)})``.
  """
  objectives = (objective if isinstance(objective, dict)
                else dict.fromkeys(optimizers, objective))
  num_data = next(iter(objectives.values())).num_data
  keys = jax.random.split(jax.random.key(1), steps)
  batches = epoch_batches(jax.random.key(2), index_range or num_data, batch_size, steps)
  runners, inputs, firsts = {}, {}, {}
  for name, opt in optimizers.items():
    objective = objectives[name]
    host = data_lib.host_leaves(objective)
    inputs[name] = (objective, host)

    deferred = isinstance(opt, DeferredChecks)
    fused = None if not isinstance(opt, TwoCalls) else False

    def step(carry, xs, objective, opt=opt.optimizer if isinstance(opt, (DeferredChecks, TwoCalls))
             else opt, deferred=deferred, fused=fused):
      idx, key, rows = xs
      # As fit's segments do: the program's objective argument, with the step's host rows.
      objective = data_lib.with_batch_rows(objective, idx, rows)
      with checks.deferred() if deferred else contextlib.nullcontext():
        if isinstance(opt, FusedStep):
          return opt.step(*carry, idx, key), None
        return train_step(objective, opt, *carry, idx, key, fused=fused), None

    def run(carry, xs, objective, step=step):
      return jax.lax.scan(lambda c, x: step(c, x, objective), carry, xs)[0]

    runners[name] = jax.jit(checkify.checkify(run) if deferred else run, donate_argnums=0)
    # The estimators' first update runs their full passes (joint SAGA's mean, joint SVRG's
    # snapshot): made before the timed steps, as it is once per run.
    firsts[name] = jax.jit(lambda carry, xs, objective, step=step: step(carry, xs, objective)[0]
                           ) if not deferred else jax.jit(
        lambda carry, xs, objective, opt=opt.optimizer: train_step(
            data_lib.with_batch_rows(objective, xs[0], xs[2]), opt, *carry, xs[0], xs[1]))

  host_rows = {}  # per objective, read once, as fit's reader does
  for objective, host in inputs.values():
    if id(objective) not in host_rows:
      host_rows[id(objective)] = jax.device_put(data_lib.read_rows(host, batches))

  def rows_for(objective, n_steps):
    return {k: v[:n_steps] for k, v in host_rows[id(objective)].items()}

  times = {name: [] for name in optimizers}
  memory = {}
  names = list(optimizers)
  for round_ in _report.progress(range(rounds + 1), "timing rounds (the first warms up)"):
    order = names[round_ % len(names):] + names[:round_ % len(names)]
    for name in order:
      objective, _ = inputs[name]
      n_steps = steps_for(name) if steps_for else steps
      xs = (batches[:n_steps], keys[:n_steps], rows_for(objective, n_steps))
      params = jax.tree.map(jnp.copy, params0)
      state = optimizers[name].init(params)
      first_rows = {k: v[0] for k, v in rows_for(objective, 1).items()}
      params, state = firsts[name]((params, state), (batches[0], keys[0], first_rows), objective)
      memory[name] = dsgrad.table_bytes(state), dsgrad.state_bytes(state)
      jax.block_until_ready(state)
      if round_ == 0 and compile_seconds is not None:
        t0 = time.perf_counter()
        runners[name] = runners[name].lower((params, state), xs, objective).compile()
        compile_seconds[name] = time.perf_counter() - t0
      start = time.perf_counter()
      carry = runners[name]((params, state), xs, objective)
      jax.block_until_ready(carry)
      elapsed = (time.perf_counter() - start) / n_steps
      if round_:
        times[name].append(elapsed)
      if log:
        print(f"  round {round_} {name:<32} {1e3 * elapsed:9.3f} ms/step", flush=True)
      del carry, params, state
  return {name: statistics.median(t) for name, t in times.items()}, memory


def host_read_seconds(objective, batches, rounds: int = 3) -> float:
  """Median seconds per step to read a block of batches' rows of the objective's host
  (memory-mapped) arrays on the host, as :class:`dsgrad.data.RowReader` does; 0 if none."""
  host = data_lib.host_leaves(objective)
  if not host:
    return 0.0
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    data_lib.read_rows(host, batches)
    times.append(time.perf_counter() - start)
  return statistics.median(times) / len(batches)
