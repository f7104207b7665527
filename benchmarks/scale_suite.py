"""The scale suite: where dsgrad pays. Four models at 10^6 rows, written as users write them
(:mod:`benchmarks.scale_models`), each contender given the same wall-clock budget.

For each model and reported seed, every contender trains from the same initial
parameters with batch ``B`` and Adam on a cosine schedule over the steps its budget
affords, at the peak step size tuned for the hand-written loop on a seed that is not
reported (the step size naive is tuned to, for every estimator):

* ``hand``: a hand-written optax loop (``lax.scan``, the batch drawn with
  ``jax.random.randint``, one noise draw per step), its budget of steps timed on a probe;
* ``naive``, ``cv``, ``joint_svrg`` (one refresh an epoch, ``N / B`` steps), ``joint_saga``
  (where its table fits): :func:`dsgrad.fit` with the estimator chained before Adam, the
  approximation each one defaults to (``linearize``), the fused step where ``fit`` takes it;
  joint SAGA's table holds the coordinates each row reads where the model declares them
  (``sparse_linearize``: the hierarchical and count models), else the parameters;
* the equal-cost naive baselines: naive with a ``K``-times batch and naive with ``K``
  noise samples per step, ``K`` a control variate's measured cost in naive steps;
* ``follow``: :func:`dsgrad.recommend` given the tuned schedule and the budget, then
  :meth:`dsgrad.Recommendation.fit`, timed end to end, compiles included.

Each run is cut into pieces; between pieces (outside the timed steps) the full-data ELBO
is estimated with the same noise for every contender and piece (common random numbers),
so traces of ELBO against seconds compare pairwise. Reported: the time each contender
takes to reach the hand loop's final ELBO, the ELBO at equal time minus the hand loop's
(paired standard error), the step time, its spread over the pieces (does a warm step
repeat within 10%?), and the compile and full-pass costs.

Resumable: a model and seed already measured with the same code (the last commit that
touched ``dsgrad/`` or this suite) and settings are read back from the data file, not run
again.

    python -m benchmarks scale-suite                        # all four models, 60 s, seeds 0 1
    python -m benchmarks scale-suite --models mlp --budget 300 --contenders hand naive cv follow
    python -m benchmarks scale-suite --models hierarchical --data-on-disk /tmp/rows  # memmaps
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from benchmarks import scale_models

CONTENDERS = ("hand", "naive", "cv", "joint_svrg", "joint_saga", "naive_batch",
              "naive_samples", "follow")
PEAKS = (1e-3, 3e-3, 1e-2)
PROBE_SECONDS = 1.0
"""A probe's one timed call runs at least this long (it is lengthened until it does): over
1,000 steps, a call's once-an-epoch cost read a 58 us MLP step as 119 us, and the run sized
from it ended at half its budget; repeating short calls did not help, since each paid it."""


def _longer(steps: int, seconds: float) -> int:
  """A probe length whose call should take :data:`PROBE_SECONDS`, from one that took
  ``seconds``."""
  return int(steps * min(100.0, 1.2 * PROBE_SECONDS / max(seconds, 1e-3))) + 1


def _probe_step(timed, steps: int) -> float:
  """Seconds per step from ``timed(steps)`` (one call's seconds): an untimed call compiles
  each length, lengthened until a timed call takes :data:`PROBE_SECONDS`. (The faster of
  two such calls read the wide GLM's steps 4-22% faster than its runs' median step, joint
  SVRG's refreshes aside, and every run there stopped with its schedule unfinished.)"""
  while True:
    timed(steps)  # compiles this length
    elapsed = timed(steps)
    if elapsed >= PROBE_SECONDS:
      return elapsed / steps
    steps = _longer(steps, elapsed)


PIECES = 12
"""Pieces of each run, an ELBO estimate after each: the traces' resolution."""
TRACE_DRAWS = 8
FINAL_DRAWS = 48
MAX_TABLE_BYTES = 4 * 2**30
"""Joint SAGA's table above this is ruled out (the machine has 24 GiB beside the data)."""


def code_version() -> str:
  """The last commit that changed dsgrad or the suite (data-file commits do not count), with
  a mark where those files have uncommitted changes."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = ["dsgrad", "benchmarks/scale_suite.py", "benchmarks/scale_models.py"]
  try:
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", *paths], cwd=root,
                            capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=root,
                           capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return commit + ("+changes" if dirty else "")


def _cosine(peak: float, steps: int):
  return optax.adam(optax.cosine_decay_schedule(peak, max(int(steps), 1), 0.01))


def _initial_params(dim: int) -> dict:
  return {"loc": jnp.zeros(dim), "log_scale": jnp.full(dim, -2.0)}


def _hand_gradient(model, batch_size: int):
  """``(data, params, key) -> grads``: the hand-written loop's step before its optimizer:
  a batch drawn with ``randint``, one noise draw, the gradient of the hand loss."""
  loss, d, n = scale_models.hand_loss(model), model.dim, model.num_data

  def gradient(data, params, key):
    k_batch, k_noise = jax.random.split(key)
    idx = jax.random.randint(k_batch, (batch_size,), 0, n)
    rows = jax.tree.map(lambda a: a[idx], data)
    return jax.grad(loss)(params, rows, jax.random.normal(k_noise, (d,)))

  return gradient


class _PlainLoop:
  """A plain-JAX loop (the hand loss's gradient, SGD, batches by ``randint``) timed for
  about :data:`PLAIN_SECONDS` at each piece's ends: the machine's speed then, beside
  which a contender's piece is read (a slow spell of a shared machine slows both)."""

  def __init__(self, model, batch_size: int):
    gradient = _hand_gradient(model, batch_size)

    def run(data, params, keys):
      def step(p, k):
        return jax.tree.map(lambda a, g: a - 1e-9 * g, p, gradient(data, p, k)), None
      return jax.lax.scan(step, params, keys)[0]

    self.run, self.data, self.params = jax.jit(run), model.data, _initial_params(model.dim)
    self.keys = None  # the loop's length, set (and compiled) on the first timing

  def _timed(self) -> float:
    started = time.perf_counter()
    jax.block_until_ready(self.run(self.data, self.params, self.keys))
    return time.perf_counter() - started

  def seconds_per_step(self) -> float:
    if self.keys is None:  # lengthened until a call takes PLAIN_SECONDS, each compiled once
      self.keys = jax.random.split(jax.random.key(0), 100)
      self._timed()
      while (elapsed := self._timed()) < PLAIN_SECONDS:
        longer = int(len(self.keys) * min(100.0, 1.2 * PLAIN_SECONDS / max(elapsed, 1e-4)))
        self.keys = jax.random.split(jax.random.key(0), longer + 1)
        self._timed()
    return self._timed() / len(self.keys)


PLAIN_SECONDS = 0.2


class _Evaluator:
  """The full-data ELBO's draws with one noise key for every contender and piece, and,
  where given, the plain loop's speed at each estimate."""

  def __init__(self, objective, seed: int, plain: _PlainLoop | None = None):
    self.objective, self.key, self.plain = objective, jax.random.key(10_000 + seed), plain

  def plain_rate(self) -> float:
    return self.plain.seconds_per_step() if self.plain is not None else float("nan")

  def draws(self, params, num: int):
    if not bool(dsgrad.checks.all_finite(params)):
      return None
    try:
      return dsgrad.diagnostics.finite_elbo_draws(dsgrad.diagnostics.elbo_draws(
          self.objective, num)(params, self.key), "the scale suite")
    except dsgrad.diagnostics.NonFiniteELBO:
      return None

  def mean(self, params) -> float:
    draws = self.draws(params, TRACE_DRAWS)
    return float("nan") if draws is None else float(np.mean(draws))


def _steps_in(budget: float, step_seconds: float) -> int:
  """The steps ``budget`` seconds afford, a multiple of :data:`PIECES` (equal pieces: one
  compiled program serves them all, none compiles inside the timed run)."""
  return max(1, int(budget / step_seconds) // PIECES) * PIECES


def _piece_stops(total: int, pieces: int = PIECES) -> list:
  """The ends of ``pieces`` equal pieces of ``total`` steps."""
  return [total // pieces * (i + 1) for i in range(pieces)]


def _finish(row: dict, evaluator, params, budget: float) -> dict:
  draws = evaluator.draws(params, FINAL_DRAWS)
  row["diverged"] = draws is None
  row["draws"] = None if draws is None else [float(v) for v in draws]
  row["seconds"] = row["trace"][-1][0]
  piece_rates = row.pop("piece_rates", [])
  # The warm pieces' seconds per step: the first may carry one-off work.
  warm = piece_rates[1:] if len(piece_rates) > 2 else piece_rates
  row["step_seconds"] = float(np.median(warm)) if warm else float("nan")
  row["step_spread"] = (float(max(warm) / min(warm) - 1) if warm and min(warm) > 0
                        else float("nan"))
  # Each piece beside the plain loop's speed at its two ends (their mean).
  plain = row.pop("plain_rates", [])
  if len(plain) == len(piece_rates) + 1 and np.all(np.isfinite(plain)):
    ends = (np.asarray(plain[:-1]) + np.asarray(plain[1:])) / 2
    relative = (np.asarray(piece_rates) / ends)[len(piece_rates) - len(warm):]
    row["plain_rates"] = [float(v) for v in plain]
    row["step_spread_vs_plain"] = float(relative.max() / relative.min() - 1)
  row["budget_seconds"] = budget
  return row


def _next_piece_over(seconds: float, rates: list, total: int, stop: int,
                     budget: float) -> bool:
  """Whether the next piece, at the last piece's speed, would end past 1.05 budgets: the
  probe underestimated the step (or the machine slowed), and the budget ends the run, its
  schedule unfinished, rather than granting it more time than the others. The hand loop
  and dsgrad's contenders stop by this same rule."""
  return stop < total and seconds + rates[-1] * (total // PIECES) > 1.05 * budget


def run_hand(model, peak, budget, batch_size, key, evaluator, probe_steps=2000) -> tuple:
  """The hand-written loop: ``(row, final params)``."""
  gradient, d = _hand_gradient(model, batch_size), model.dim

  def segment(adam):
    def step(data, carry, k):
      params, state = carry
      updates, state = adam.update(gradient(data, params, k), state, params)
      return (optax.apply_updates(params, updates), state), None
    # The data are an argument: as constants, XLA would fold gigabytes into the program.
    return jax.jit(lambda data, p, s, ks: jax.lax.scan(
        lambda c, k: step(data, c, k), (p, s), ks)[0])

  params = _initial_params(d)
  probe = segment(optax.adam(peak))
  state = optax.adam(peak).init(params)

  def timed(steps):
    keys = jax.random.split(jax.random.key(1), steps)
    started = time.perf_counter()
    jax.block_until_ready(probe(model.data, params, state, keys))
    return time.perf_counter() - started

  total = _steps_in(budget, _probe_step(timed, probe_steps))
  adam = _cosine(peak, total)
  run = segment(adam)
  state = adam.init(params)
  all_keys = jax.random.split(key, total)
  compile_started = time.perf_counter()
  stops = _piece_stops(total, PIECES)
  run = run.lower(model.data, params, state, all_keys[:stops[0]]).compile()
  compile_seconds = time.perf_counter() - compile_started
  trace, seconds, at = [(0.0, evaluator.mean(params))], 0.0, 0
  rates, plain = [], [evaluator.plain_rate()]
  for stop in stops:
    started = time.perf_counter()
    params, state = jax.block_until_ready(run(model.data, params, state,
                                                  all_keys[at:stop]))
    elapsed = time.perf_counter() - started
    seconds += elapsed
    rates.append(elapsed / (stop - at))
    at = stop
    trace.append((seconds, evaluator.mean(params)))
    plain.append(evaluator.plain_rate())
    if _next_piece_over(seconds, rates, total, stop, budget):
      break
  row = {"steps": at, "scheduled_steps": total, "trace": trace,
         "compile_seconds": compile_seconds, "piece_rates": rates, "plain_rates": plain,
         "peak": peak}
  return _finish(row, evaluator, params, budget), params


def _estimator(name: str, objective, every_never: bool = False):
  """The named estimator; joint SVRG refreshes once an epoch (its default), or, for a
  probe of its step alone, never."""
  if name in ("naive", "naive_batch", "naive_samples"):
    return dsgrad.naive()
  if name == "cv":
    return dsgrad.cv(objective)
  if name == "joint_svrg":
    return dsgrad.joint_svrg(objective, every=10**9 if every_never else None)
  if name == "joint_saga":
    return dsgrad.joint_saga(objective, _saga_approx(objective))
  raise ValueError(name)


def _saga_approx(objective):
  """The table a user picks: the declared coordinates where the model says which latent
  rows a data row reads (``reads``), else the parameters (``linearize``)."""
  model = (objective.source or (None, None))[1]
  if getattr(model, "sparse", None) is not None:
    return dsgrad.approx.sparse_linearize(objective)
  return dsgrad.approx.linearize()


def _timed_fit(objective, optimizer, params, key, steps, batch_size, opt_state=None,
               start_step=0):
  result = dsgrad.fit(objective, optimizer, params, key, num_steps=start_step + steps,
                      batch_size=batch_size, opt_state=opt_state, start_step=start_step,
                      elbo_samples=0, progress=False, eval_every=steps)
  return result, float(result.history.wall_time[-1]) if len(result.history.wall_time) else 0.0


def first_update(objective, optimizer, params, key, batch_size) -> tuple:
  """``(state after one update, that update's extra seconds)``: an estimator's first
  update takes joint SVRG's snapshot or fills joint SAGA's table (a full pass; ``init``
  reads no data), later ones do not. Timing from the initial state would put that pass
  in every timed call (it read a 0.05 ms MLP step as 0.1 ms, and runs sized from it ended
  at two thirds of their budget)."""
  fresh = optimizer.init(params)
  _timed_fit(objective, optimizer, params, key, 1, batch_size, fresh)  # compiles
  first, first_seconds = _timed_fit(objective, optimizer, params, key, 1, batch_size, fresh)
  later_seconds = _timed_fit(objective, optimizer, params, key, 1, batch_size,
                             first.opt_state)[1]
  return first.opt_state, max(0.0, first_seconds - later_seconds)


def _probe(objective, estimator, peak, params, batch_size, key, probe_steps) -> tuple:
  """``(seconds per warm step, seconds of the first update's full pass)`` of
  ``chain(estimator, adam(peak))`` under ``fit``, timed after the first update."""
  optimizer = optax.chain(estimator, optax.adam(peak))
  state, first_seconds = first_update(objective, optimizer, params, key, batch_size)
  step = _probe_step(lambda steps: _timed_fit(objective, optimizer, params, key, steps,
                                              batch_size, state)[1], probe_steps)
  return step, first_seconds


def run_fit(name, model, peak, budget, batch_size, key, evaluator, k,
            probe_steps=1000) -> dict:
  """A dsgrad contender under :func:`dsgrad.fit`: ``row``."""
  objective = model.objective
  batch = batch_size * (k if name == "naive_batch" else 1)
  train_objective = (dsgrad.multi_sample(objective, k) if name == "naive_samples"
                     else objective)
  params = _initial_params(model.dim)
  if name == "joint_saga":
    # The state's size from shapes alone, before anything is allocated.
    shapes = jax.eval_shape(dsgrad.joint_saga(objective, _saga_approx(objective),
                                              max_table_bytes=None).init, params)
    needed = dsgrad.state_bytes(shapes)
    if needed > MAX_TABLE_BYTES:
      return {"ruled_out": f"its table needs {_report.format_bytes(needed)} (more than "
              f"{_report.format_bytes(MAX_TABLE_BYTES)} beside the data on this machine)"}
  step, init_seconds = _probe(train_objective, _estimator(name, train_objective, True),
                              peak, params, batch, key, probe_steps)
  # Joint SVRG refreshes once an epoch, a full pass like its first: amortized per step.
  refresh = init_seconds if name == "joint_svrg" else 0.0
  total = _steps_in(budget - init_seconds, step + refresh / max(1, model.num_data // batch))
  optimizer = optax.chain(_estimator(name, train_objective), _cosine(peak, total))
  state = optimizer.init(params)  # the first update's full pass is in the first piece
  seconds, at = 0.0, 0
  trace, rates, compile_seconds = [(0.0, evaluator.mean(params))], [], 0.0
  plain = [evaluator.plain_rate()]
  for stop in _piece_stops(total, PIECES):
    result, elapsed = _timed_fit(train_objective, optimizer, params, key, stop - at, batch,
                                 state, at)
    params, state = result.params, result.opt_state
    compile_seconds += result.compile_seconds
    seconds += elapsed
    rates.append(elapsed / (stop - at))
    at = stop
    trace.append((seconds, evaluator.mean(params)))
    plain.append(evaluator.plain_rate())
    if not math.isfinite(trace[-1][1]) or _next_piece_over(seconds, rates, total, stop,
                                                          budget):
      break
  row = {"steps": at, "scheduled_steps": total, "trace": trace, "batch_size": batch,
         "compile_seconds": compile_seconds, "init_seconds": init_seconds,
         "probe_step_seconds": step, "refresh_seconds": refresh, "piece_rates": rates,
         "plain_rates": plain}
  return _finish(row, evaluator, params, budget)


def run_follow(model, peak, budget, batch_size, key, evaluator) -> dict:
  """``recommend`` then ``Recommendation.fit()`` in the budget, timed end to end."""
  params = _initial_params(model.dim)
  started = time.perf_counter()
  advice = dsgrad.recommend(model.objective, lambda steps: _cosine(peak, steps), params, key,
                            batch_size=batch_size, budget=budget, progress=False)
  advised = time.perf_counter() - started
  result = advice.fit(progress=False, elbo_samples=TRACE_DRAWS)
  total = time.perf_counter() - started
  history = result.history
  trace = [(0.0, evaluator.mean(params))]
  trace += [(advised + float(t), float(e)) for t, e in zip(history.wall_time, history.elbo)
            if np.isfinite(e)]
  row = {"pick": advice.best, "advice_seconds": advised, "end_to_end_seconds": total,
         "raced": [c.name for c in advice.ranking if c.raced],
         "candidates": [c._asdict() for c in advice.ranking],
         "reasons": list(advice.reasons), "trace": trace, "steps": int(result.step),
         "compile_seconds": float(result.compile_seconds), "piece_rates": []}
  row = _finish(row, evaluator, result.params, budget)
  row["seconds"] = total
  return row


def tune_peak(model, budget, batch_size, tune_seed, peaks) -> tuple:
  """The hand loop's peak with the best final ELBO on ``tune_seed`` (not reported)."""
  evaluator = _Evaluator(model.objective, tune_seed)
  tuning = {}
  for peak in _report.progress(peaks, f"{model.name}: tuning the hand loop"):
    row, _ = run_hand(model, peak, budget, batch_size, jax.random.key(tune_seed), evaluator)
    tuning[str(peak)] = (float(np.mean(row["draws"])) if row["draws"] is not None
                         else float("-inf"))
  return float(max(tuning, key=tuning.get)), tuning


def run_seed(model, peak, budget, batch_size, seed, contenders) -> dict:
  evaluator = _Evaluator(model.objective, seed, _PlainLoop(model, batch_size))
  key = jax.random.key(seed)
  rows = {}
  bar = _report.progress(contenders, f"{model.name}, seed {seed}")
  for name in bar:
    bar.set_postfix_str(name)
    if name == "hand":
      rows[name], _ = run_hand(model, peak, budget, batch_size, key, evaluator)
    elif name == "follow":
      rows[name] = run_follow(model, peak, budget, batch_size, key, evaluator)
    else:
      k = _equal_cost_k(rows)
      try:
        rows[name] = run_fit(name, model, peak, budget, batch_size, key, evaluator, k)
      except (ValueError, MemoryError) as error:  # refused by dsgrad: the reason is the row
        rows[name] = {"ruled_out": str(error).split("\n")[0][:300]}
    row = rows[name]
    print(f"  {model.name} seed {seed} {name}: " + (
        f"ruled out: {row['ruled_out']}" if "ruled_out" in row else
        f"{row['steps']:,} steps, {row['seconds']:.1f} s, final ELBO "
        f"{np.mean(row['draws']) if row['draws'] else float('nan'):.1f}"), flush=True)
  return {"contenders": rows, "equal_cost_k": _equal_cost_k(rows)}


def _equal_cost_k(rows) -> int:
  """A control variate's step in naive steps (cv's, else joint SVRG's), at least 2."""
  naive = rows.get("naive", {}).get("step_seconds")
  other = next((rows[n]["step_seconds"] for n in ("cv", "joint_svrg")
                if n in rows and "step_seconds" in rows[n]), None)
  if not naive or not other or not np.isfinite(naive) or not np.isfinite(other):
    return 2
  return max(2, int(round(other / naive)))


# ---------------------------------------------------------------------------------------
# Reading the results.

def time_to_reach(trace, target) -> float:
  """Seconds at which an ELBO trace (``(seconds, ELBO)``) first reaches ``target``."""
  for (t0, e0), (t1, e1) in zip(trace, trace[1:]):
    if e1 >= target:
      return t1 if e1 == e0 else t0 + (t1 - t0) * float(np.clip((target - e0) / (e1 - e0), 0, 1))
  return math.inf


def _paired(row, hand) -> tuple:
  if row.get("draws") is None or hand.get("draws") is None:
    return float("nan"), float("nan")
  return dsgrad.diagnostics.mean_and_standard_error(
      np.asarray(row["draws"]) - np.asarray(hand["draws"]))


LABELS = {"hand": "hand-written optax loop", "naive": "dsgrad naive", "cv": "cv (linearize)",
          "joint_svrg": "joint SVRG (linearize, every N/B)", "joint_saga": "joint SAGA",
          "naive_batch": "naive, K x batch", "naive_samples": "naive, K samples",
          "follow": "follow the advice (recommend + fit)"}


def _plain_spread(row) -> float:
  """The plain loop's own spread over a run's piece ends: how much the machine varied."""
  plain = row.get("plain_rates")
  return float(max(plain) / min(plain) - 1) if plain else float("nan")


def _percents(values) -> str:
  """``"5%; 17%"`` by seed, or ``"n/a"`` where none was measured."""
  if not np.isfinite(values).any():
    return "n/a"
  return "; ".join(f"{100 * v:.0f}%" if np.isfinite(v) else "n/a" for v in values)


def render(record) -> str:
  results, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; budget {config['budget']:g} s of steps per "
           f"contender, batch {config['batch_size']}, Adam with a cosine schedule to 1% of a "
           f"peak tuned for the hand loop on seed {config['tune_seed']} among "
           f"{config['peaks']} (every contender uses it), seeds {config['seeds']}. ELBO: "
           f"{FINAL_DRAWS} draws at the end, {TRACE_DRAWS} along the run, the same noise for "
           "every contender (paired). Time to target: the seconds of steps (plus the "
           "estimator's initial full pass; for 'follow', recommend's time too) at which a run "
           "reached the hand loop's final ELBO, from its trace (linear between "
           f"{PIECES} pieces); '-' where it did not. A run marked '(over)' took more than 1.05 "
           "budgets of steps (a step slower than its probe said, or the machine slowed): its "
           "final ELBO is not at equal time; its time to target still is.", "",
           f"Measured: {record['environment']}; code {record['results'].get('code', '?')}", ""]
  for name, r in results.items():
    lines += [f"#### {name}: {r['summary']}", "",
              f"{r['dim']:,} latents; " + (
                  f"tuned peak {r['peak']:g} (final ELBO by peak on the tuning seed: "
                  + ", ".join(f"{p}: {v:.1f}" for p, v in r["tuning"].items()) + ")."
                  if r["tuning"] else f"peak {r['peak']:g}, given (not tuned in this run)."),
              "",
              "| contender | steps | seconds run, by seed | ms / step | spread over pieces, by seed | "
              "the plain loop's spread, by seed | compile s | full passes s | "
              "ELBO - hand at the run's end (paired se), by seed | "
              "time to hand's final ELBO, s, by seed |",
              "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    seeds = r["seeds"]
    names = [n for n in LABELS if any(n in s["contenders"] for s in seeds.values())]
    for c in names:
      rows = [s["contenders"].get(c) for s in seeds.values()]
      if all(row is None or "ruled_out" in row for row in rows):
        reason = next(row["ruled_out"] for row in rows if row)
        lines.append(f"| {LABELS[c]} | ruled out: {reason} | | | | | | | | |")
        continue
      ok = [row for row in rows if row and "ruled_out" not in row]
      k = next(iter(seeds.values()))["equal_cost_k"]
      label = LABELS[c].replace("K", str(k)) if c.startswith("naive_") else LABELS[c]
      if c == "follow":
        label += " (picks: " + ", ".join(row["pick"] for row in ok) + ")"
      diffs, times = [], []
      for s in seeds.values():
        row, hand = s["contenders"].get(c), s["contenders"].get("hand")
        if not row or "ruled_out" in row:
          continue
        if row.get("diverged"):
          diffs.append("diverged")
        elif c == "hand" or hand is None:  # a run without the hand loop: the ELBO itself
          diffs.append(f"{np.mean(row['draws']):.1f}" + " (ELBO)" * (hand is None))
        else:
          gain, se = _paired(row, hand)
          diffs.append(f"{gain:+.1f} ({se:.1f})")
        # The hand loop's last trace point: every trace is estimated with the same noise.
        target = hand["trace"][-1][1] if hand else np.inf
        reached = time_to_reach(row["trace"], target)
        times.append(f"{reached:.1f}" if np.isfinite(reached) else "-")
      steps = "/".join(f"{row['steps']:,}" for row in ok)
      # A run past 1.05 budgets is marked: its end is not at equal time (its trace is).
      ran = "; ".join(f"{row['seconds']:.1f}" + (" (over)" if row["seconds"] > 1.05 *
                                                   row["budget_seconds"] else "")
                      for row in ok)
      ms = np.median([row["step_seconds"] * 1e3 for row in ok])
      compile_s = np.median([row["compile_seconds"] for row in ok])
      passes = np.median([row.get("init_seconds", 0.0) + row.get("refresh_seconds", 0.0)
                          * row["steps"] / max(1, r["num_data"] // row.get("batch_size", 1))
                          for row in ok])
      # By seed: a slow spell of the machine hits one run, not the contender.
      spread_cell = _percents([row["step_spread"] for row in ok])
      plain_cell = _percents([_plain_spread(row) for row in ok])
      ms_cell = f"{ms:.3f}" if np.isfinite(ms) else "n/a"
      lines.append(f"| {label} | {steps} | {ran} | {ms_cell} | {spread_cell} | {plain_cell} | "
                   f"{compile_s:.1f} | "
                   f"{passes:.2f} | {'; '.join(diffs)} | {'; '.join(times)} |")
    follow = [s["contenders"]["follow"] for s in seeds.values() if "follow" in s["contenders"]]
    if follow:
      lines += ["", "Follow the advice: " + "; ".join(
          f"recommend {f['advice_seconds']:.1f} s, then fit: {f['end_to_end_seconds']:.1f} s "
          f"end to end ({f['end_to_end_seconds'] / f['budget_seconds']:.2f} budgets), pick "
          f"{f['pick']}" for f in follow) + "."]
    figure = figure_path(config.get("section") or f"scale_suite_{_backend(record)}", name)
    lines += ["", f"![ELBO against seconds, {name}]({figure})", ""]
  advice = advice_rows(results)
  if advice:
    lines += ["#### Following the advice", "",
              "Per model and seed: what recommend raced and picked, recommend + fit against "
              "the budget, and final ELBOs against the best other contender's and the hand "
              "loop's (paired standard errors): the pick's own run over the whole budget "
              "(the choice; '-' where the suite ran it with other settings), and 'follow' "
              "(recommend, then the pick continued: the choice with its cost).", "",
              "| model | seed | pick | control variates raced | recommend + fit / budget | "
              "best contender | pick's run - best (se) | pick's run - hand (se) | "
              "follow - best (se) | follow - hand (se) |",
              "| --- | --- | --- | --- | ---: | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in advice]
  return "\n".join(lines)


def advice_rows(results) -> list:
  """The table of 'follow' against the other contenders, one row per model and seed: the
  pick's own equal-time run (the choice) and 'follow' (the choice, its cost included)."""
  rows = []
  gap = lambda row, other: "{:+.1f} ({:.1f})".format(*_paired(row, other)) if row else "-"
  for name, r in results.items():
    for seed, s in r["seeds"].items():
      follow, hand = s["contenders"].get("follow"), s["contenders"].get("hand")
      if not follow or "raced" not in follow or not hand or follow.get("draws") is None:
        continue  # (runs of the advice before it recorded what it raced are not shown)
      others = {c: row for c, row in s["contenders"].items() if c not in ("follow", "hand")
                and row.get("draws") is not None and row["seconds"] <= 1.05 * row["budget_seconds"]}
      best = max(others, key=lambda c: np.mean(others[c]["draws"]), default=None)
      picked = s["contenders"].get(follow["pick"])  # the same settings as the advice's pick?
      pick_batch = next((c["batch_size"] for c in follow["candidates"]
                         if c["name"] == follow["pick"]), None)
      if picked and picked.get("batch_size", pick_batch) != pick_batch:
        picked = None
      raced = [c for c in follow.get("raced", []) if c in ("cv", "joint_svrg", "joint_saga")]
      rows.append([name, str(seed), follow["pick"], ", ".join(raced) or "none",
                   f"{follow['end_to_end_seconds'] / follow['budget_seconds']:.3f}",
                   LABELS.get(best, "-"), gap(picked, others.get(best)) if best else "-",
                   gap(picked, hand), gap(follow, others.get(best)) if best else "-",
                   gap(follow, hand)])
  return rows


def _backend(record) -> str:
  """The backend a record was measured on (records before it was kept: from the
  environment line)."""
  config = record["results"]["config"]
  return config.get("backend") or ("gpu" if "backend gpu" in record["environment"] else "cpu")


def figure_path(section: str, name: str) -> str:
  """A model's figure, relative to the docs folder: one per section (records made before
  the section was kept name it ``scale_suite_<backend>``)."""
  return f"figures/{section}_{name}.png"


def plot(name, r, path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  seed, s = next(iter(r["seeds"].items()))
  hand = s["contenders"].get("hand")  # without it (a run of some contenders): the ELBO
  target = float(hand["trace"][-1][1]) if hand else 0.0
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for c, row in s["contenders"].items():
    if "ruled_out" in row or not row.get("trace"):
      continue
    t, e = np.asarray(row["trace"]).T
    ax.plot(t, np.asarray(e) - target, marker=".", label=LABELS[c],
            lw=2.5 if c == "hand" else 1.5)
  ax.set_yscale("symlog", linthresh=10)
  ax.axhline(0, color="k", lw=0.5)
  ax.set_xlabel("seconds (steps; follow: recommend + fit)")
  ax.set_ylabel("ELBO - hand loop's final ELBO (nats)")
  ax.set_title(f"{name} (seed {seed}): {r['summary']}", fontsize=8)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _previous(section: str, config: dict, code: str) -> dict:
  """Models already measured with this code and settings: ``{model: result}``."""
  path = os.path.join(_report.out_dir(), "data", f"{section}.json")
  if not os.path.exists(path):
    return {}
  runs = json.load(open(path))
  if not runs:
    return {}
  last = runs[-1]["results"]
  same = {k: v for k, v in last["config"].items() if k != "models"} == {
      k: v for k, v in config.items() if k != "models"}
  return dict(last["results"]) if same and last.get("code") == code else {}


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks scale-suite",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=list(scale_models.BUILDERS))
  parser.add_argument("--contenders", nargs="*", choices=CONTENDERS, default=list(CONTENDERS))
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--budget", type=command_line.positive(),
                      default=60.0, help="seconds per contender")
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--seeds", type=command_line.count(0), nargs="*", default=[0, 1])
  parser.add_argument("--tune-seed", type=command_line.count(0), default=100)
  parser.add_argument("--peaks", type=command_line.positive(), nargs="*", default=list(PEAKS))
  parser.add_argument("--peak", type=command_line.positive(), default=None,
                      help="use this peak instead of tuning (e.g. one tuned at a shorter "
                           "budget on the tuning seed); recorded as given")
  parser.add_argument("--data-on-disk", default=None, metavar="DIR",
                      help="dsgrad's contenders read the rows from .npy files written to DIR "
                           "(memory-mapped); the hand loop keeps them in memory")
  parser.add_argument("--section", default=None, help="default: scale-suite-<backend>")
  parser.add_argument("--peak-for", nargs="*", default=[], metavar="MODEL=PEAK",
                      help="a model's peak, tuned before (not tuned again in this run)")
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  given = {k: float(v) for k, v in (item.split("=") for item in args.peak_for)}
  if args.tune_seed in args.seeds:
    parser.error("the tuning seed must not be a reported seed")
  config = {"budget": args.budget, "batch_size": args.batch_size, "seeds": args.seeds,
            "tune_seed": args.tune_seed, "peaks": [args.peak] if args.peak else args.peaks, "num_data": args.num_data,
            "contenders": args.contenders, "models": args.models,
            "backend": jax.default_backend(), "data_on_disk": bool(args.data_on_disk),
            "peak_for": given}
  section = args.section or (f"scale-suite-{jax.default_backend()}"
                             + ("-disk" if args.data_on_disk else ""))
  config["section"] = section
  code = code_version()
  results = {} if args.no_write else _previous(section, config, code)
  for name in args.models:
    if name in results and set(map(str, args.seeds)) <= set(results[name]["seeds"]):
      print(f"{name}: measured with code {code} and these settings: skipped", flush=True)
      continue
    model = scale_models.BUILDERS[name](num_data=args.num_data)
    if args.data_on_disk:
      model = scale_models.on_disk(model, args.data_on_disk)
    if args.peak or name in given:
      peak, tuning = given.get(name, args.peak), {}
    else:
      peak, tuning = tune_peak(model, args.budget, args.batch_size, args.tune_seed,
                               args.peaks)
    print(f"{name}: tuned peak {peak} ({tuning})", flush=True)
    results[name] = {"summary": model.summary, "dim": model.dim, "num_data": model.num_data,
                     "peak": peak, "tuning": tuning, "seeds": {}}
    for seed in args.seeds:
      results[name]["seeds"][str(seed)] = run_seed(model, peak, args.budget, args.batch_size,
                                                   seed, args.contenders)
      if not args.no_write:  # after each seed: a long run stopped part-way keeps it
        plot(name, results[name],
             _report.docs_path(figure_path(section, name)))
        _report.publish(section, None, True, render=render,
                        data={"results": results, "config": config, "code": code})
    del model
  if args.no_write:
    print(render(_report.new_record({"results": results, "config": config, "code": code},
                                    render)))


if __name__ == "__main__":
  main()
