"""Per-step cost against the number of data N: the estimators' steps must not grow with N.

Mean-field Gaussian BBVI for binary logistic regression on synthetic data with
N = 10^3 ... 10^6 rows and D features, batch B, Adam. Every estimator is timed as in
``step-cost`` (a jitted ``lax.scan`` over steps with the state donated, interleaved
rounds, median). joint_svrg runs with a refresh period longer than the timed window, so
its figure is the cost of a step between refreshes; the refresh itself is a full pass,
O(N) by design, and is reported separately (one full pass, as ``inc`` pays each step).
The SAGA table is N x P, so its step stays flat only if the batch's rows are updated in
place; this benchmark is the check.

Issue 8's criterion: from N = 10^3 to 10^6 the per-step time of naive, cv and
joint_saga grows by at most 1.5x.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import optax

import dsgrad
from dsgrad.bench import _report, _timing
from dsgrad.diagnostics import epoch_batches
from dsgrad.estimators import _common
from dsgrad.models import logistic_regression, synthetic_logistic_data

CRITERION = 1.5
FLAT = ("naive", "cv (App. F)", "joint_saga (App. F)", "joint_saga (logit table)",
        "joint_svrg (App. F), between refreshes")


def _estimators(objective, model, never):
  taylor = dsgrad.approx.gaussian_mean_taylor(model)
  return {
      "naive": dsgrad.naive(),
      "cv (App. F)": dsgrad.cv(objective, taylor),
      "joint_saga (App. F)": dsgrad.joint_saga(objective, taylor),
      "joint_saga (logit table)": dsgrad.joint_saga(objective,
                                                    dsgrad.approx.glm_mean_taylor(model)),
      "joint_svrg (App. F), between refreshes": dsgrad.joint_svrg(objective, taylor,
                                                                  every=never),
  }


def _full_pass_seconds(objective, params, repeats=3):
  """Seconds for one full-data gradient pass (what an SVRG refresh or an inc step costs),
  in the estimators' own chunked pass."""
  noise = objective.sample_noise(jax.random.key(0), 1)  # shared noise: one draw

  @jax.jit
  def full_grad(params):
    return _common.full_pass_mean(
        lambda idx: objective.grad(params, idx, noise, validate=False), objective.num_data,
        4096)

  return _median_seconds(full_grad, (params,), repeats)


def _median_seconds(fn, args, repeats):
  """Median wall-clock of ``fn(*args)`` over ``repeats`` calls after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _gather_seconds(features, batch_size, steps, rounds=3):
  """Seconds per step of the batch's row gather alone (``x[indices]``, summed so that
  it is not optimized away), in the same jitted scan as the estimators' steps."""
  batches = epoch_batches(jax.random.key(2), features.shape[0], batch_size, steps)
  x = jax.numpy.asarray(features)

  @jax.jit
  def run(x, batches):
    return jax.lax.scan(lambda acc, idx: (acc + jax.numpy.sum(x[idx]), None), 0.0,
                        batches)[0]

  return _median_seconds(run, (x, batches), rounds) / steps


def run(sizes, num_features=100, batch_size=100, steps=2000, rounds=3):
  """``{N: {estimator: (seconds per step, table bytes)}}`` and full-pass seconds per N."""
  results, passes, gathers = {}, {}, {}
  for n in sizes:
    x, y, _ = synthetic_logistic_data(jax.random.key(0), n, num_features)
    model = logistic_regression(x, y, name=f"logistic N={n}")
    objective = dsgrad.meanfield_gaussian(model)
    params0 = dsgrad.meanfield_init(model, 0.0, -2.0)
    never = 10 * (steps + 1)
    optimizers = {name: optax.chain(est, optax.adam(1e-3))
                  for name, est in _estimators(objective, model, never).items()}
    print(f"N = {n:,}", flush=True)
    times, memory = _timing.time_per_step(objective, optimizers, params0, batch_size, steps,
                                          rounds=rounds, log=False)
    results[n] = {name: (times[name], memory[name][0]) for name in optimizers}
    passes[n] = _full_pass_seconds(objective, params0)
    gathers[n] = _gather_seconds(x, batch_size, steps, rounds)
    for name, (t, table) in results[n].items():
      print(f"  {name:<40} {1e3 * t:8.3f} ms/step  table {table / 2**20:8.1f} MiB", flush=True)
    print(f"  {'one full pass (SVRG refresh, inc step)':<40} {1e3 * passes[n]:8.3f} ms",
          flush=True)
    print(f"  {'batch row gather alone':<40} {1e3 * gathers[n]:8.3f} ms", flush=True)
  return results, passes, gathers


def format_table(results, passes, gathers, config, figure=None):
  sizes = sorted(results)
  names = list(results[sizes[0]])
  lo, hi = sizes[0], sizes[-1]
  lines = [
      f"Command: `python -m dsgrad.bench scale steps` -- binary logistic regression, synthetic, "
      f"D = {config['num_features']} (intercept included), mean-field Gaussian BBVI, "
      f"B = {config['batch_size']}, Adam; {config['steps']} steps per timed run inside one "
      f"jitted `lax.scan`, median of {config['rounds']} interleaved rounds. joint_svrg's "
      "refresh period is longer than the timed run (its refresh is the full pass in the "
      "last row).",
      "",
      f"Measured: {_report.environment()}",
      "",
  ]
  if figure:
    lines += [f"![step time vs N]({figure})", ""]
  header = "| estimator | " + " | ".join(f"N = {n:,}" for n in sizes)
  header += f" | ratio N={hi:,} / N={lo:,} | criterion (<= {CRITERION}x) | table at N={hi:,} |"
  lines += [header, "| --- |" + " ---: |" * (len(sizes) + 3)]
  for name in names:
    ms = [1e3 * results[n][name][0] for n in sizes]
    ratio = ms[-1] / ms[0]
    verdict = ("met" if ratio <= CRITERION else "**missed**") if name in FLAT else ""
    lines.append(f"| {name} | " + " | ".join(f"{v:.3f} ms" for v in ms)
                 + f" | {ratio:.2f}x | {verdict} | {results[hi][name][1] / 2**20:,.1f} MiB |")
  gather = [1e3 * gathers[n] for n in sizes]
  lines.append("| batch row gather `x[indices]` alone (what every step reads) | " + " | ".join(
      f"{v:.3f} ms" for v in gather) + f" | {gather[-1] / gather[0]:.2f}x | | |")
  full = [1e3 * passes[n] for n in sizes]
  lines.append("| one full pass (SVRG refresh, an inc step) | " + " | ".join(
      f"{v:.3f} ms" for v in full) + f" | {full[-1] / full[0]:.0f}x | O(N) by design | |")
  return "\n".join(lines)


def _figure(results, passes, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  sizes = sorted(results)
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in results[sizes[0]]:
    ax.plot(sizes, [1e3 * results[n][name][0] for n in sizes], marker="o", label=name)
  ax.plot(sizes, [1e3 * passes[n] for n in sizes], marker="s", linestyle="--", color="gray",
          label="one full pass (SVRG refresh / inc)")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("N (number of data)")
  ax.set_ylabel("ms per step")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None):
  """``scale [steps|movielens] [options]``; without a part, both with their defaults."""
  import sys
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] == "movielens":
    from dsgrad.bench import scale_movielens
    return scale_movielens.main(argv[1:])
  if argv and argv[0] == "steps":
    return main_steps(argv[1:])
  if argv and argv[0] in ("-h", "--help"):
    print("usage: python -m dsgrad.bench scale [steps|movielens] [options]\n"
          "  steps      per-step time against N (synthetic logistic regression)\n"
          "  movielens  joint SAGA on a sparse table vs SVRG, naive, cv on MovieLens\n"
          "  (no part)  both, with their default options")
    return 0
  if argv:
    return main_steps(argv)
  from dsgrad.bench import scale_movielens
  return main_steps([]) or scale_movielens.main([])


def main_steps(argv=None):
  parser = argparse.ArgumentParser(prog="python -m dsgrad.bench scale steps",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", default="1000,10000,100000,1000000",
                      help="comma-separated numbers of data N")
  parser.add_argument("--num-features", type=int, default=100,
                      help="D, the intercept included")
  parser.add_argument("--batch-size", type=int, default=100)
  parser.add_argument("--steps", type=int, default=2000, help="steps per timed run")
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  sizes = [int(float(v)) for v in args.sizes.split(",")]
  config = dict(num_features=args.num_features, batch_size=args.batch_size, steps=args.steps,
                rounds=args.rounds)
  results, passes, gathers = run(sizes, args.num_features, args.batch_size, args.steps,
                                 args.rounds)
  figure = None
  if not args.no_write:
    name = f"figures/scale_steps_{jax.default_backend()}.png"
    try:
      _figure(results, passes, _report.docs_path(name))
      figure = name
    except ImportError:
      pass
  table = format_table(results, passes, gathers, config, figure)
  _report.publish(f"scale-steps-{jax.default_backend()}", table, not args.no_write)
  return 0
