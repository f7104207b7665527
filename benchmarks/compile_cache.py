"""What JAX's persistent compilation cache saves a user who runs the same script again.

dsgrad's programs take the data as arguments, so a program compiled in one process is
found again in the next by JAX's persistent compilation cache
(``jax.config.update("jax_compilation_cache_dir", ...)``), which is off unless the user
turns it on. Each condition runs in a fresh process on the scale suite's models (the same
shapes, so the same programs):

* ``no cache``: the cache off;
* ``cache, first run``: the cache on, its folder empty (it is filled);
* ``cache, second run``: the cache on, the folder the first run filled.

In each process: the seconds of ``dsgrad.compile_fit`` (tracing, lowering and compiling,
measured around the call) for naive, cv and joint SVRG chained with Adam over a cosine
schedule; then ``dsgrad.fit_within`` with joint SVRG for ``--seconds``, its steps run and
its compile time, where the budget includes the compiles.

    python -m benchmarks compile-cache --models hierarchical wide_glm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import _report, scale_models

ESTIMATORS = ("naive", "cv", "joint_svrg")
CONDITIONS = ("no cache", "cache, first run", "cache, second run")


def child(model_name: str, num_data: int, seconds: float, batch_size: int) -> dict:
  """One process's measurements (the cache as the environment set it up)."""
  import jax
  import optax

  import dsgrad
  from benchmarks import scale_suite
  model = scale_models.BUILDERS[model_name](num_data=num_data)
  objective, params = model.objective, scale_suite._initial_params(model.dim)
  schedule = lambda n: optax.adam(optax.cosine_decay_schedule(1e-3, n, 0.01))  # noqa: E731
  compiles = {}
  for name in ESTIMATORS:
    estimator = dsgrad.naive() if name == "naive" else getattr(dsgrad, name)(objective)
    started = time.perf_counter()
    dsgrad.compile_fit(objective, optax.chain(estimator, schedule(20_000)), params,
                       jax.random.key(0), num_steps=20_000, batch_size=batch_size,
                       elbo_samples=0)
    compiles[name] = time.perf_counter() - started
  started = time.perf_counter()
  result = dsgrad.fit_within(objective, schedule, params, jax.random.key(1), seconds=seconds,
                             batch_size=batch_size, estimator=dsgrad.joint_svrg(objective),
                             progress=False, elbo_samples=8)
  return {"compile_seconds": compiles, "fit_within": {
      "steps": int(result.step), "seconds": time.perf_counter() - started,
      "compile": float(result.timing.compile), "steps_seconds": float(result.timing.steps)}}


def run_condition(condition: str, folder: str, args, model_name: str) -> dict:
  """:func:`child` in a fresh process, the cache set up as ``condition`` says."""
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if condition != "no cache":
    env["JAX_COMPILATION_CACHE_DIR"] = folder
    # Every program, however quick to compile: a fit compiles several small ones.
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  command = [sys.executable, "-m", "benchmarks.compile_cache", "--child", model_name,
             "--num-data", str(args.num_data), "--seconds", str(args.seconds),
             "--batch-size", str(args.batch_size)]
  out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def render(record) -> str:
  results, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; {config['num_data']:,} rows, batch "
           f"{config['batch_size']}, fit_within {config['seconds']:g} s with joint SVRG; each "
           "condition a fresh process. Compile: seconds around `dsgrad.compile_fit` (tracing, "
           "lowering, compiling) for the estimator chained with Adam over a cosine schedule. "
           f"Measured: {record['environment']}.", "",
           "| model | condition | " + " | ".join(f"compile {e} (s)" for e in ESTIMATORS)
           + " | fit_within steps | fit_within compile (s) | fit_within seconds |",
           "| --- | --- |" + " ---: |" * (len(ESTIMATORS) + 3)]
  for model_name, conditions in results.items():
    for condition in CONDITIONS:
      r = conditions[condition]
      f = r["fit_within"]
      lines.append(f"| {model_name} | {condition} | " + " | ".join(
          f"{r['compile_seconds'][e]:.2f}" for e in ESTIMATORS)
          + f" | {f['steps']:,} | {f['compile']:.2f} | {f['seconds']:.1f} |")

  def ratio(c, *path):
    return _at(c["cache, second run"], path) / _at(c["no cache"], path)

  lines += ["", "Second run against no cache: " + "; ".join(
      f"{m}: compile " + ", ".join(f"{e} {ratio(c, 'compile_seconds', e):.2f}x" for e in ESTIMATORS)
      + f", fit_within steps {ratio(c, 'fit_within', 'steps'):.2f}x"
      for m, c in results.items()) + "."]
  return "\n".join(lines)


def _at(tree: dict, path) -> float:
  """The number at ``path`` (names, outermost first) in a nested dict."""
  for name in path:
    tree = tree[name]
  return tree


def main(argv=None):
  from dsgrad import command_line
  parser = argparse.ArgumentParser(prog="python -m benchmarks compile-cache",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=["hierarchical", "wide_glm"])
  parser.add_argument("--num-data", type=command_line.count(1), default=200_000)
  parser.add_argument("--seconds", type=command_line.positive(), default=10.0)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  _report.add_output_flags(parser, "compile-cache")
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(child(args.child, args.num_data, args.seconds, args.batch_size)))
    return
  results = {}
  for model_name in args.models:
    with tempfile.TemporaryDirectory(prefix="dsgrad-compile-cache-") as folder:
      results[model_name] = {}
      for condition in CONDITIONS:
        results[model_name][condition] = run_condition(condition, folder, args, model_name)
        print(model_name, condition, results[model_name][condition], flush=True)
  config = {"num_data": args.num_data, "seconds": args.seconds, "batch_size": args.batch_size}
  section = _report.section_of(args, "compile-cache")
  _report.publish(section, None, not args.no_write, render=render,
                  data={"results": results, "config": config})


if __name__ == "__main__":
  main()
