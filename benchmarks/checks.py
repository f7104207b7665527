"""What dsgrad's input checks cost: step time with the checks on and off.

``dsgrad.checked(optimizer, objective)`` checks, inside the compiled step, that the
batch's indices lie in ``[0, N)``, that the gradient, params and noise are finite and
that the gradient is the objective's (one extra mini-batch gradient); a failed check
raises through a host callback that sits in a branch taken only on failure.
This benchmark times each estimator's jitted training step (naive gradient, estimator,
Adam) with the checks on and off, side by side
in one process (rounds rotated, median of rounds), and reports the ratio. It also
times the checks that run once: ``init``'s abstract trace of the objective and
approximation at the params, and a checkpoint's SHA-256 (save and restore of the
training state with and without the digest).

Problem: mean-field Gaussian BBVI for binary logistic regression on synthetic data,
``N`` rows, ``D`` features, batch ``B``, at two sizes: the checks' cost is a few fixed
reductions and one branch per step, so its share is largest when the step is tiny.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time

import jax
import optax
from flax import serialization

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from benchmarks._timing import DeferredChecks, time_per_step
from dsgrad.models import logistic_regression, synthetic_logistic_data

ESTIMATORS = ("naive", "cv", "inc", "smiso", "joint_saga", "joint_svrg")


def _optimizer(name: str, objective, checks: bool, lr: float):
  if name == "naive":
    optimizer = optax.chain(dsgrad.naive(), optax.adam(lr))
  elif name == "smiso":
    optimizer = dsgrad.smiso(objective, lr)
  else:
    paper = dict(control_weight=1.0)  # the weight the published table used
    estimator = {"cv": lambda: dsgrad.cv(objective, **paper),
                 "inc": lambda: dsgrad.inc(objective),
                 "joint_saga": lambda: dsgrad.joint_saga(objective, **paper),
                 "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=100, **paper)}[name]()
    optimizer = optax.chain(estimator, optax.adam(lr))
  # The checks of a loop of one's own wrap the optimizer (the estimators hold none).
  return dsgrad.checked(optimizer, objective) if checks else optimizer


def _median_seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def run(sizes=((1_000, 10), (10_000, 100)), batch_size=100, steps=200, rounds=5, lr=1e-2,
        estimators=ESTIMATORS):
  """``(step rows, per-call rows, once rows)``: ``[(N, D, estimator, ms on, ms off,
  ms deferred)]``,
  ``[(estimator, ms per call on, off)]`` and ``[(what, seconds)]`` (the last two at the
  last size)."""
  step_rows = []
  for num_data, num_features in sizes:
    x, y, _ = synthetic_logistic_data(jax.random.key(0), num_data, num_features)
    model = logistic_regression(x, y)
    params0 = dsgrad.meanfield_init(model, 0.0, -2.0)
    step_rows += _step_rows(model, params0, num_data, num_features, batch_size, steps,
                            rounds, lr, estimators)
  return step_rows, _per_call_rows(model, params0, batch_size, steps, rounds, lr), \
      _once_rows(model, params0, lr)


def _per_call_rows(model, params0, batch_size, steps, rounds, lr):
  """``[(estimator, ms per call on, ms per call off)]``: a Python loop calling one jitted
  step per call, blocking only at the end (so JAX may dispatch asynchronously)."""
  from dsgrad.training.batching import epoch_batches
  from dsgrad.training.segments import train_step
  rows = []
  batches = epoch_batches(jax.random.key(2), model.num_data, batch_size, steps)
  keys = jax.random.split(jax.random.key(1), steps)
  objective = dsgrad.meanfield_gaussian(model)
  for name in ("naive", "joint_saga"):
    seconds = {}
    for checks in (True, False):
      opt = _optimizer(name, objective, checks, lr)
      step = jax.jit(lambda p, s, i, k, opt=opt: train_step(objective, opt, p, s, i, k))
      times = []
      for round_ in range(rounds + 1):
        params, state = params0, opt.init(params0)
        params, state = step(params, state, batches[0], keys[0])  # compiled in round 0
        jax.block_until_ready((params, state))
        start = time.perf_counter()
        for t in range(steps):
          params, state = step(params, state, batches[t], keys[t])
        jax.block_until_ready((params, state))
        if round_:
          times.append((time.perf_counter() - start) / steps)
      seconds[checks] = statistics.median(times)
    rows.append((name, 1e3 * seconds[True], 1e3 * seconds[False]))
    print(f"  per call {name:<11} on {rows[-1][1]:.4f} ms  off {rows[-1][2]:.4f} ms",
          flush=True)
  return rows


def _step_rows(model, params0, num_data, num_features, batch_size, steps, rounds, lr,
               estimators):
  rows = []
  for name in estimators:
    # inc stores one noise draw per datum: it needs shared noise.
    objective = dsgrad.meanfield_gaussian(model, shared_noise=name == "inc")
    optimizers = {f"{name} checks on": _optimizer(name, objective, True, lr),
                  f"{name} checks off": _optimizer(name, objective, False, lr),
                  f"{name} checks deferred": DeferredChecks(_optimizer(name, objective, True,
                                                                       lr))}
    seconds, _ = time_per_step(objective, optimizers, params0, batch_size, steps,
                               rounds=rounds)
    on, off, deferred = (1e3 * seconds[f"{name} checks {how}"]
                         for how in ("on", "off", "deferred"))
    rows.append((num_data, num_features, name, on, off, deferred))
    print(f"  N={num_data} D={num_features} {name:<11} on {on:.4f} ms  off {off:.4f} ms  "
          f"deferred {deferred:.4f} ms  ratio {on / off:.3f}", flush=True)
  return rows


def _once_rows(model, params0, lr):
  objective = dsgrad.meanfield_gaussian(model)
  once = []
  approx = dsgrad.approx.gaussian_mean_taylor(model)
  # cv's init is its checks alone (it keeps no state): the objective and the approximation
  # traced at the params.
  once.append(("init check: objective and approximation traced at the params "
               "(`cv(objective, approx).init`)",
               _median_seconds(lambda: dsgrad.cv(objective, approx).init(params0), 7)))
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(lr))
  state = jax.block_until_ready(opt.init(params0))
  payload = serialization.to_bytes(jax.device_get({"params": params0, "opt_state": state}))
  once.append((f"SHA-256 of the joint SAGA training state ({len(payload) / 2**20:.1f} MiB)",
               _median_seconds(lambda: hashlib.sha256(payload).digest(), 7)))
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "state.ckpt")
    once.append(("`checkpoint.save` of that state (serialize, digest, write, fsync, rename)",
                 _median_seconds(lambda: dsgrad.training.checkpoint.save(path, (params0, state)), 5)))
    once.append(("`checkpoint.restore` of that state (read, verify digest, deserialize, "
                 "check entries)",
                 _median_seconds(lambda: dsgrad.training.checkpoint.restore(path, (params0, state)), 5)))
  return once


def format_table(step_rows, per_call, once, config):
  lines = [
      "Command: `python -m benchmarks checks` -- binary logistic regression, synthetic, "
      "mean-field Gaussian BBVI, "
      f"batch {config['batch_size']}; one jitted step = naive gradient + estimator + Adam, "
      f"{config['steps']} steps per timed run inside `lax.scan`, median of "
      f"{config['rounds']} rounds (rotated order, compile round discarded). "
      "\"on\": `dsgrad.checked(optimizer, objective)`, each check a "
      "conditional host callback in the step, as in a loop the user writes; \"deferred\": the "
      "same checks carried out of the compiled scan (`dsgrad.checks.deferred`); \"off\": the "
      "bare optimizer (the estimators' updates hold no checks).",
      "",
      f"Measured: {_report.environment()}",
      "",
      "| N | D | estimator | ms/step, checks on | ms/step, deferred | ms/step, checks off | "
      "on / off | deferred / off | on - off (us) |",
      "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ]
  for n, d, name, on, off, deferred in step_rows:
    lines.append(f"| {n:,} | {d} | {name} | {on:.4f} | {deferred:.4f} | {off:.4f} | "
                 f"{on / off:.3f}x | {deferred / off:.3f}x | {1e3 * (on - off):.1f} |")
  n, d = step_rows[-1][:2]
  lines += ["", f"A Python loop calling one jitted step per call (N = {n:,}, D = {d}; "
            f"{config['steps']} calls, blocking at the end, median of {config['rounds']} "
            "rounds). A program that contains a host callback is dispatched synchronously, "
            "so each call waits for the previous one:", "",
            "| estimator | ms/call, checks on | ms/call, checks off | on / off |",
            "| --- | ---: | ---: | ---: |"]
  for name, on, off in per_call:
    lines.append(f"| {name} | {on:.4f} | {off:.4f} | {on / off:.2f}x |")
  lines += ["", f"Checks that run once (N = {n:,}, D = {d}; median of repeats):", "",
            "| check | seconds |", "| --- | ---: |"]
  for what, seconds in once:
    lines.append(f"| {what} | {seconds:.4f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks checks",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", nargs="+", default=["1000x10", "10000x100"],
                      help="problem sizes NxD")
  parser.add_argument("--batch-size", type=command_line.count(1), default=100, help="B")
  parser.add_argument("--steps", type=command_line.count(1),
                      default=200, help="steps per timed run")
  parser.add_argument("--rounds", type=command_line.count(1), default=5, help="timed rounds")
  parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS),
                      choices=ESTIMATORS)
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  sizes = tuple(tuple(int(v) for v in size.lower().split("x")) for size in args.sizes)
  config = dict(batch_size=args.batch_size, steps=args.steps, rounds=args.rounds)
  step_rows, per_call, once = run(sizes, **config, estimators=tuple(args.estimators))
  table = format_table(step_rows, per_call, once, config)
  section = f"checks-{jax.default_backend()}"
  _report.publish(section, table, not args.no_write)
  if not args.no_write:  # the same table on the page that explains the checks
    print(f"wrote {_report.write_section(section, table, _report.docs_path('errors.md'))}")
  return 0
