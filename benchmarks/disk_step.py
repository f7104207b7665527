"""A user's model on data read from disk: the step cost of the scale suite's models with
their rows memory-mapped (:func:`dsgrad.data.open_memmap`, read per block of steps by
:func:`dsgrad.fit`) against the same rows in memory, in one process.

For each model and estimator, interleaved rounds time ``--steps`` warm steps under
``fit`` (compiled once before the rounds) with the objective on in-memory rows and with
the objective on the same rows from ``.npy`` files; the table gives the median step
time of each, their ratio (target: at most 1.2), and the spread over rounds.

    python -m benchmarks disk-step                          # hierarchical, two_index, mlp
    python -m benchmarks disk-step --models mlp --num-data 10000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import jax
import optax

from benchmarks import _report
from benchmarks import scale_models
from benchmarks import scale_suite
from dsgrad import command_line

ESTIMATORS = ("naive", "cv", "joint_svrg", "joint_saga")


def run(models, estimators, num_data, steps, rounds, batch_size, directory) -> dict:
  results = {}
  for name in models:
    model = scale_models.BUILDERS[name](num_data=num_data)
    disk = scale_models.on_disk(model, directory)
    params = scale_suite._initial_params(model.dim)
    objectives = {"memory": model.objective, "disk": disk.objective}
    results[name] = {"summary": model.summary, "dim": model.dim, "estimators": {}}
    for estimator in estimators:
      prepared = {}
      for where, objective in objectives.items():
        # Joint SVRG never refreshes here: its step alone (the refresh is a full pass,
        # which reads the whole file).
        optimizer = optax.chain(scale_suite._estimator(estimator, objective, True),
                                optax.adam(1e-3))
        # Timed after the first update, which takes joint SVRG's snapshot or fills joint
        # SAGA's table (init reads no data).
        state = scale_suite.first_update(objective, optimizer, params, jax.random.key(0),
                                         batch_size)[0]
        scale_suite._timed_fit(objective, optimizer, params, jax.random.key(0), steps,
                               batch_size, state)  # compiles
        prepared[where] = (objective, optimizer, state)
      times = {where: [] for where in prepared}
      for _ in _report.progress(range(rounds), f"{name}, {estimator}: rounds"):
        for where, (objective, optimizer, state) in prepared.items():
          elapsed = scale_suite._timed_fit(objective, optimizer, params, jax.random.key(0),
                                           steps, batch_size, state)[1]
          times[where].append(elapsed / steps)
      results[name]["estimators"][estimator] = times
    del model, disk
  return results


def render(record) -> str:
  data = record["results"]
  config = data["config"]
  lines = [f"Step time with the rows memory-mapped from `.npy` files against the same rows "
           f"in memory (`dsgrad.fit`, batch {config['batch_size']}, {config['steps']:,} warm "
           f"steps per timed call, median of {config['rounds']} interleaved rounds). "
           f"Target: at most 1.2x. Command: `{record['command']}`; measured: "
           f"{record['environment']}.", "",
           "| model | estimator | in memory (ms) | from disk (ms) | disk / memory | spread "
           "over rounds (memory, disk) |", "|---|---|---|---|---|---|"]
  for name, row in data["results"].items():
    for estimator, times in row["estimators"].items():
      memory, disk = (statistics.median(times[w]) for w in ("memory", "disk"))
      spread = ", ".join(f"{(max(times[w]) - min(times[w])) / statistics.median(times[w]):.0%}"
                         for w in ("memory", "disk"))
      lines.append(f"| {name} | {estimator} | {1e3 * memory:.3f} | {1e3 * disk:.3f} | "
                   f"{disk / memory:.2f}x | {spread} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks disk-step",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=["hierarchical", "two_index", "mlp"])
  parser.add_argument("--estimators", nargs="*", choices=ESTIMATORS,
                      default=["naive", "cv", "joint_svrg"])
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--steps", type=command_line.count(1), default=3000)
  parser.add_argument("--rounds", type=command_line.count(1), default=5)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--directory", default=os.path.join(tempfile.gettempdir(),
                                                           "dsgrad-disk-step"),
                      help="where the .npy files are written (kept between runs)")
  _report.add_output_flags(parser, "disk-step")
  args = parser.parse_args(argv)
  config = {"models": args.models, "estimators": args.estimators, "num_data": args.num_data,
            "steps": args.steps, "rounds": args.rounds, "batch_size": args.batch_size}
  results = run(args.models, args.estimators, args.num_data, args.steps, args.rounds,
                args.batch_size, args.directory)
  section = _report.section_of(args, "disk-step")
  _report.publish(section, None, not args.no_write, render=render,
                  data={"results": results, "config": config})


if __name__ == "__main__":
  main()
