"""What the latent's barrier buys: the warm step of models written with
:func:`dsgrad.objective_from_logdensity`, with and without the optimization barrier that
``log_lik`` receives its latent leaves through, beside a hand-written loop with and without
the same barrier.

Why it exists: on a GPU (an H200, XLA of jax 0.11.2) the hierarchical model's step at 1,000
rows took 1.4 ms against 0.05 ms at 10,000. XLA fused the gradient's sum over the batch for a
latent every row reads (the hyper-mean ``mu``) into the kernel that concatenates the
latent's gradient, one thread per coordinate, so the few threads of that leaf summed the
whole batch serially; the same happens to a hand-written loop. A barrier between
``unravel(z)`` and ``log_lik`` (and, by its transpose, between the leaves' gradients and
their concatenation) keeps each sum its own parallel reduction.

Per model and batch size, in one process, minimum over three interleaved calls of
``--steps`` steps: ``hand`` (scale-step's hand loop), ``hand+barrier`` (the same with the
barrier after ``unravel``), ``fit naive`` / ``fit cv`` (an objective built without the
barrier) and ``... apart`` (with it, dsgrad's default).

    python -m benchmarks leaves-apart
"""

from __future__ import annotations

import argparse

import jax

import dsgrad
from dsgrad import command_line
from dsgrad import logdensity
from benchmarks import _report
from benchmarks import scale_batch
from benchmarks import scale_models

SIZES = {"hierarchical": (1000, 1024, 2000, 4000, 100, 10000), "two_index": (100, 1000, 10000),
         "mlp": (100, 1000)}


def _hand_call(model, batch_size: int, steps: int, barrier: bool):
  if barrier:
    model = model._replace(
        unravel=lambda z, unravel=model.unravel: jax.lax.optimization_barrier(unravel(z)))
  return scale_batch.hand_call(model, batch_size, steps)


def compare(build, sizes, steps: int, cv: bool) -> list[str]:
  """One line per batch size: the minimum ms per step of each variant."""
  logdensity._LEAVES_APART = False
  plain = build()
  logdensity._LEAVES_APART = True
  apart = build()
  lines = []
  for batch_size in sizes:
    calls = {"hand": _hand_call(plain, batch_size, steps, False),
             "hand+barrier": _hand_call(plain, batch_size, steps, True),
             "fit naive": scale_batch.fit_call(plain, batch_size, steps, dsgrad.naive()),
             "fit naive apart": scale_batch.fit_call(apart, batch_size, steps, dsgrad.naive())}
    if cv:
      calls["fit cv"] = scale_batch.fit_call(plain, batch_size, steps, dsgrad.cv(plain.objective))
      calls["fit cv apart"] = scale_batch.fit_call(apart, batch_size, steps, dsgrad.cv(apart.objective))
    times = {label: [] for label in calls}
    for _ in range(3):
      for label, call in calls.items():
        times[label].append(call() / steps)
    lines.append(f"{plain.name} B={batch_size}: " + "  ".join(
        f"{label} {1e3 * min(t):.3f}" for label, t in times.items()))
    print(lines[-1], flush=True)
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks leaves-apart",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(SIZES), default=list(SIZES))
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--steps", type=command_line.count(1), default=300)
  _report.add_output_flags(parser, "leaves-apart")
  args = parser.parse_args(argv)
  lines = ["ms per step, minimum of 3 interleaved calls of "
           f"{args.steps} steps; 'apart': log_lik receives the latent's leaves through "
           "an optimization barrier (dsgrad's default).", ""]
  for name in args.models:
    build = lambda name=name: scale_models.BUILDERS[name](num_data=args.num_data)
    lines += compare(build, SIZES[name], args.steps, cv=name == "hierarchical")
  section = _report.section_of(args, "leaves-apart")
  _report.publish(section, "\n".join(lines), not args.no_write)


if __name__ == "__main__":
  main()
