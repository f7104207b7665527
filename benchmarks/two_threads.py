"""Whether a step's time repeats across processes, in plain JAX (no dsgrad): the
hierarchical model's mini-batch gradient, its JVP in the noise direction (the ``cv``
control variate's arithmetic), the step's noise draw alone (``d`` standard normals,
which the gradient includes) and the kind of loop that assembles a flat gradient from a
pytree's pieces, alone (an add of a ``concatenate`` of a reduction and a ``(10 groups,
3)`` array: 600,003 numbers at the default sizes), written with ``jax.jit`` alone, timed
in several fresh processes in three settings: XLA free to use every core; the process
pinned to one (``taskset``-like affinity set before JAX starts); and
``dsgrad.pin_xla_threads(1)`` first (XLA's compute pool of one thread on one core, every
other thread on all; the programs are still plain JAX).

Each process compiles the programs, warms them up, and times ``--calls`` calls in
``--repeats`` repeats; the table gives each process's median milliseconds per call, and
how many of the compiled program's loops XLA split over threads.

    python -m benchmarks two-threads                     # 5 processes each way
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks import _report
from dsgrad import command_line

CHILD = r'''
import json, os, sys, time
cores = sys.argv[1]
every_core = os.sched_getaffinity(0)
if cores == "one":
  os.sched_setaffinity(0, {min(every_core)})
import jax, jax.numpy as jnp
if cores == "xla_one":  # XLA's compute pool on one core, every other thread on all
  import dsgrad
  dsgrad.pin_xla_threads(1)
from benchmarks import _plain_hierarchical as plain
num_data, groups, batch, calls, repeats = map(int, sys.argv[2:7])
model = plain.build(num_data, groups, batch)
loss, params, idx, d = model
gradient = plain.gradient(model)

@jax.jit
def gradient_and_jvp(params, idx, key):
  eps = jax.random.normal(key, (d,))
  return jax.jvp(lambda e: jax.grad(loss)(params, idx, e), (jnp.zeros(d),), (eps,))

@jax.jit
def noise_draw(params, idx, key):
  return jax.random.normal(key, (d,))

@jax.jit
def concatenate(params, idx, key):  # arrays as arguments: XLA folds no constant away
  return params["c"] + jnp.concatenate([jnp.sum(params["rows"], 0), params["raw"].ravel()])

PROGRAMS = (("gradient", gradient), ("gradient and JVP", gradient_and_jvp),
            ("noise draw alone", noise_draw), ("concatenate alone", concatenate))
out = {"cores_visible": len(os.sched_getaffinity(0)), "split": {}}
for name, fn in PROGRAMS:
  args = (dict(c=jnp.ones(30 * groups + 3), raw=jnp.ones((10 * groups, 3)),
               rows=jnp.ones((32, 3)))
          if fn is concatenate else params, idx)
  text = fn.lower(*args, jax.random.key(0)).compile().as_text()
  out["split"][name] = text.count("outer_dimension_partitions")
  jax.block_until_ready(fn(*args, jax.random.key(0)))
  times = []
  for r in range(repeats):
    started = time.perf_counter()
    for i in range(calls):
      result = fn(*args, jax.random.key(i))
    jax.block_until_ready(result)
    times.append((time.perf_counter() - started) / calls * 1e3)
  out[name] = times
print(json.dumps(out))
'''


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ importable
PROGRAM_NAMES = ("gradient", "gradient and JVP", "noise draw alone", "concatenate alone")
SETTINGS = {"XLA on one core": "one core; the caller on all"}


def run(processes, num_data, groups, batch, calls, repeats) -> dict:
  results = {"all cores": [], "one core": [], "XLA on one core": []}
  # Alternate the two settings, so that a slow spell of the machine hits both.
  for _ in _report.progress(range(processes), "processes (each way)"):
    for label, cores in (("all cores", "all"), ("one core", "one"),
                         ("XLA on one core", "xla_one")):
      child = subprocess.run(
          [sys.executable, "-c", CHILD, cores, str(num_data), str(groups), str(batch),
           str(calls), str(repeats)], capture_output=True, text=True, timeout=600,
          env=dict(os.environ, XLA_FLAGS="", PYTHONPATH=ROOT))
      if child.returncode:
        raise RuntimeError(child.stderr[-2000:])
      results[label].append(json.loads(child.stdout.strip().splitlines()[-1]))
  return results


def render(record) -> str:
  data, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; plain JAX (no dsgrad), the hierarchical "
           f"model at N = {config['num_data']:,}, {config['groups']:,} groups, batch "
           f"{config['batch']}; per process: median ms per call over {config['repeats']} "
           f"repeats of {config['calls']} calls after a warm-up. Measured: "
           f"{record['environment']}.", "",
           "| program | XLA's threads | loops split | ms per call, one number per process "
           "| slowest / fastest process |", "| --- | --- | ---: | --- | ---: |"]
  for program in PROGRAM_NAMES:
    for label, runs in data.items():
      if program not in runs[0]:  # runs made before it was timed
        continue
      medians = [statistics.median(r[program]) for r in runs]
      split = sorted({r["split"][program] for r in runs}) if "split" in runs[0] else ["-"]
      lines.append(f"| {program} | {SETTINGS.get(label, label)} "
                   f"({runs[0]['cores_visible']} visible) | "
                   + ", ".join(map(str, split)) + " | "
                   + ", ".join(f"{m:.2f}" for m in medians)
                   + f" | {max(medians) / min(medians):.2f}x |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks two-threads",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--processes", type=command_line.count(1), default=5)
  parser.add_argument("--num-data", type=command_line.count(1), default=200_000)
  parser.add_argument("--groups", type=command_line.count(1), default=20_000)
  parser.add_argument("--batch", type=command_line.count(1), default=1000)
  parser.add_argument("--calls", type=command_line.count(1), default=20)
  parser.add_argument("--repeats", type=command_line.count(1), default=4)
  parser.add_argument("--section", default="two-threads-cpu")
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  config = {"processes": args.processes, "num_data": args.num_data, "groups": args.groups,
            "batch": args.batch, "calls": args.calls, "repeats": args.repeats}
  results = run(args.processes, args.num_data, args.groups, args.batch, args.calls,
                args.repeats)
  _report.publish(args.section, None, not args.no_write, render=render,
                  data={"results": results, "config": config})


if __name__ == "__main__":
  main()
