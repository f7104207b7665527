"""Launch-bound or not: on each scale-suite model (10^6 rows), the warm step at batch sizes
from 10^2 to 10^5 rows, and the full passes at chunk sizes from 10^3 to 10^5 rows.

A step is *fixed-cost-bound* where its time hardly grows with the batch: what does not
grow with the rows sets it, on a GPU its kernels' launches (launch-bound), on a CPU also
the work on every latent (its noise, Adam's update). For each batch
size ``B``, in one process, over interleaved rounds of one epoch's steps (at least 100):

* ``hand naive``: a hand-written optax loop (``lax.scan``, fit's own batches given as an
  index array, one noise draw per step, Adam), as in ``scale-step``;
* ``fit naive`` and ``fit joint SVRG`` (its step, after the first update's snapshot, no
  refresh in the timed calls): :func:`dsgrad.fit` with the estimator before Adam.

Reported: ms per step, rows per microsecond, and the growth of the step's time when the
batch grows tenfold; a step whose time less than doubles for ten times the rows is
fixed-cost-bound at that batch size.

The full passes, for each chunk size ``C`` (the rows one iteration of the pass reads):
joint SVRG's refresh (its first update's extra seconds: the snapshot's full gradient,
``joint_svrg(chunk_size=C)``) and a 100-draw ELBO on all rows (``dsgrad.elbo(...,
chunk_size=C)``), warm.

    python -m benchmarks scale-batch                         # the four suite models
    python -m benchmarks scale-batch --models hierarchical --batch-sizes 100 1000
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from benchmarks import scale_models
from benchmarks import scale_step
from benchmarks import scale_suite

BATCH_SIZES = (100, 1_000, 10_000, 100_000)
CHUNK_SIZES = (1_024, 16_384, 262_144)
LAUNCH_BOUND_GROWTH = 2.0
"""A step whose time grows less than this for ten times the rows is fixed-cost-bound."""
LEARNING_RATE = 1e-3


def steps_per_call(num_data: int, batch_size: int) -> int:
  """One epoch's steps, at least 100 (a timed call of fewer reads per-call costs) and at
  most 1,000."""
  return max(100, min(1_000, num_data // batch_size))


def hand_call(model, batch_size: int, steps: int):
  """A call running ``steps`` warm steps of the hand-written loop (fit's own batches given
  as an index array) and returning its seconds; compiled and run once here, as
  :func:`fit_call`'s are."""
  params = scale_suite._initial_params(model.dim)
  batches = dsgrad.training.batching.epoch_batches(
      jax.random.split(jax.random.key(3))[0], model.num_data, batch_size, steps)
  keys = jax.random.split(jax.random.key(2), steps)
  segment, adam = scale_step._hand(model, batches, LEARNING_RATE, "naive")
  args = (model.data, params, adam.init(params), keys)
  compiled = segment.lower(*args).compile()

  def call():
    started = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - started

  call()  # the first run of a compiled program
  return call


def fit_call(model, batch_size: int, steps: int, estimator):
  """A call running ``steps`` warm steps of :func:`dsgrad.fit` with ``estimator`` before
  Adam, from the state after its first update (joint SVRG's snapshot taken), and returning
  the seconds of the steps; compiled here."""
  params = scale_suite._initial_params(model.dim)
  optimizer = optax.chain(estimator, optax.adam(LEARNING_RATE))
  key = jax.random.key(3)
  state = scale_suite.first_update(model.objective, optimizer, params, key, batch_size)[0]

  def call():
    return scale_suite._timed_fit(model.objective, optimizer, params, key, steps,
                                  batch_size, state)[1]

  call()  # compiles
  return call


def _step_calls(model, batch_size: int, steps: int) -> dict:
  """``{label: call}``, each call running ``steps`` warm steps and returning seconds."""
  return {"hand naive": hand_call(model, batch_size, steps),
          "fit naive": fit_call(model, batch_size, steps, dsgrad.naive()),
          "fit joint SVRG": fit_call(model, batch_size, steps,
                                     dsgrad.joint_svrg(model.objective, every=10**9))}


def _full_passes(model, params, chunk_size: int) -> dict:
  """Seconds of joint SVRG's refresh and of a warm 100-draw ELBO, in chunks of
  ``chunk_size`` rows."""
  optimizer = optax.chain(dsgrad.joint_svrg(model.objective, every=10**9,
                                            chunk_size=chunk_size),
                          optax.adam(LEARNING_RATE))
  refresh = scale_suite.first_update(model.objective, optimizer, params, jax.random.key(3),
                                     1_000)[1]
  key = jax.random.key(5)
  jax.block_until_ready(dsgrad.elbo(model.objective, params, key, num_samples=100,
                                    chunk_size=chunk_size))
  started = time.perf_counter()
  jax.block_until_ready(dsgrad.elbo(model.objective, params, key, num_samples=100,
                                    chunk_size=chunk_size))
  return {"refresh": refresh, "elbo": time.perf_counter() - started}


def run(models, batch_sizes, chunk_sizes, rounds: int, num_data: int) -> dict:
  results = {}
  for name in models:
    model = scale_models.BUILDERS[name](num_data=num_data)
    params = scale_suite._initial_params(model.dim)
    by_batch = {}
    for batch_size in _report.progress(batch_sizes, f"{name}: batch sizes"):
      steps = steps_per_call(model.num_data, batch_size)
      calls = _step_calls(model, batch_size, steps)
      times = {label: [] for label in calls}
      for _ in range(rounds):
        for label, call in calls.items():
          times[label].append(call() / steps)
      by_batch[str(batch_size)] = {"steps": steps, "step_seconds": times}
    passes = {str(c): _full_passes(model, params, c)
              for c in _report.progress(chunk_sizes, f"{name}: chunk sizes")}
    results[name] = {"summary": model.summary, "dim": model.dim,
                     "num_data": model.num_data, "by_batch": by_batch,
                     "full_passes": passes}
    del model
  return results


def _step_table(by_batch: dict) -> list[str]:
  labels = list(next(iter(by_batch.values()))["step_seconds"])
  median = {b: {label: statistics.median(v) for label, v in r["step_seconds"].items()}
            for b, r in by_batch.items()}
  sizes = sorted(median, key=int)
  lines = ["| batch | " + " | ".join(f"{label} ms / step" for label in labels)
           + " | fit naive rows / us | fit naive: time for 10x rows | fixed-cost-bound? |",
           "| ---: | " + " | ".join("---:" for _ in labels) + " | ---: | ---: | --- |"]
  for i, b in enumerate(sizes):
    naive = median[b]["fit naive"]
    growth = (median[sizes[i + 1]]["fit naive"] / naive
              if i + 1 < len(sizes) and int(sizes[i + 1]) == 10 * int(b) else None)
    verdict = ("-" if growth is None else
               "yes" if growth < LAUNCH_BOUND_GROWTH else "no")
    lines.append(f"| {int(b):,} | " + " | ".join(f"{1e3 * median[b][label]:.3f}"
                                                 for label in labels)
                 + f" | {int(b) / (1e6 * naive):,.1f} | "
                 + ("-" if growth is None else f"{growth:.2f}x") + f" | {verdict} |")
  return lines


def render(record) -> str:
  data, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; one epoch's steps per timed call (100 to "
           f"1,000), median of {config['rounds']} interleaved rounds. Fixed-cost-bound: ten "
           f"times the batch costs less than {LAUNCH_BOUND_GROWTH:g}x the time (what does not "
           "grow with the rows sets the step: on a GPU its kernels' launches, on a CPU also "
           "the work on every latent, its noise and Adam's update). Measured: "
           f"{record['environment']}.", ""]
  for name, r in data.items():
    lines += [f"#### {name}: {r['summary']} ({r['dim']:,} latents)", "",
              *_step_table(r["by_batch"]), "",
              "| chunk (rows) | joint SVRG refresh, s | ELBO, 100 draws, s |",
              "| ---: | ---: | ---: |"]
    for chunk, passes in r["full_passes"].items():
      lines.append(f"| {int(chunk):,} | {passes['refresh']:.3f} | {passes['elbo']:.3f} |")
    lines.append("")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks scale-batch",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=["hierarchical", "two_index", "mlp", "wide_glm"])
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--batch-sizes", type=command_line.count(1), nargs="*",
                      default=list(BATCH_SIZES))
  parser.add_argument("--chunk-sizes", type=command_line.count(1), nargs="*",
                      default=list(CHUNK_SIZES))
  parser.add_argument("--rounds", type=command_line.count(1), default=3)
  parser.add_argument("--section", default=None, help="default: scale-batch-<backend>")
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  results = run(args.models, args.batch_sizes, args.chunk_sizes, args.rounds, args.num_data)
  config = {"models": args.models, "batch_sizes": args.batch_sizes,
            "chunk_sizes": args.chunk_sizes, "rounds": args.rounds,
            "num_data": args.num_data}
  section = args.section or f"scale-batch-{jax.default_backend()}"
  _report.publish(section, None, not args.no_write, render=render,
                  data={"results": results, "config": config})


if __name__ == "__main__":
  main()
