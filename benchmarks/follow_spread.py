"""How far one equal-time result moves when nothing but the run is repeated: the scale
suite's ``follow`` (recommend, then :meth:`dsgrad.Recommendation.fit`) and ``hand`` rows,
each run again from the same state on the same seed.

The suite reports a contender's final ELBO minus the hand loop's with a standard error over
the ELBO's Monte Carlo draws (common noise, paired). That error says how well the ELBO of
*those* parameters is known, not how far another run of the same contender, with the same
seed, budget and code, would end: on the hierarchical model the follow row moved by
thousands of nats between two runs of the same command. This benchmark measures that
spread beside the draw error, per model and seed:

* ``hand``: :func:`benchmarks.scale_suite.run_hand` ``--repeats`` times, the same key;
* ``follow``: :func:`dsgrad.recommend` once, then its pick continued ``--repeats`` times,
  each from a copy of the run where the advice left it, with the same time left
  (``Recommendation.fit``, as the suite calls it);
* ``follow, one call``: the same continuations as one ``fit`` call after the run settles,
  which is how ``Recommendation.fit`` continued a run before it priced ``fit``'s
  evaluations in a first half of the time left (a labelled variant, to tell a change of
  that pace from the spread).

The continuations alternate between the two variants; before them, each variant runs once
with a few seconds left, unreported, so that neither is the one that compiles the
evaluations' programs. Every final ELBO has the suite's draws and noise.

    python -m benchmarks follow-spread --xla-cores 1 --models hierarchical --seeds 0 1
"""

from __future__ import annotations

import argparse
import copy
import time

import jax
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from dsgrad.training import paced
from benchmarks import _report
from benchmarks import scale_models
from benchmarks import scale_suite

WARM_UP_SECONDS = 4.0
"""The time left to each variant's unreported first continuation."""


def _one_call(advice: dsgrad.Recommendation, **fit_kwargs):
  """The pick continued as one ``fit`` call once the run has settled."""
  run = advice.runs[advice.best]
  entered = time.perf_counter()
  spent = lambda: advice.seconds_spent + time.perf_counter() - entered
  if run.seconds_per_step is None:  # recommend stopped before its steps were timed
    run.advance(2 * run.program.segment)
  run.settle(advice.budget_seconds, spent)
  result = run.fit(max_seconds=max(1e-3, advice.budget_seconds - spent()), **fit_kwargs)
  estimator_state, pace = result.opt_state
  return result._replace(opt_state=(estimator_state, paced.unpaced(pace)))


VARIANTS = {"follow": lambda advice: advice.fit(progress=False,
                                                 elbo_samples=scale_suite.TRACE_DRAWS),
            "follow, one call": lambda advice: _one_call(
                advice, progress=False, elbo_samples=scale_suite.TRACE_DRAWS)}


def _continue(advice, spent: float, variant: str) -> tuple:
  """``variant`` from a copy of the pick's run, ``spent`` of the budget gone: ``(result,
  seconds, the schedule's position at the end)``."""
  run = copy.copy(advice.runs[advice.best])
  run.timings = list(run.timings)
  copied = advice._replace(runs={advice.best: run}, seconds_spent=spent)
  started = time.perf_counter()
  result = VARIANTS[variant](copied)
  seconds = time.perf_counter() - started
  counts = [int(c) for _, c in optax.tree_utils.tree_get_all_with_path(result.opt_state,
                                                                        "count")]
  return result, seconds, max(counts, default=0) / run.program.length


def run_seed(model, peak, budget, batch_size, seed, repeats) -> dict:
  evaluator = scale_suite._Evaluator(model.objective, seed)
  key = jax.random.key(seed)
  rows = {"hand": []}
  for _ in range(repeats):
    row, _ = scale_suite.run_hand(model, peak, budget, batch_size, key, evaluator)
    rows["hand"].append({"draws": row["draws"], "seconds": row["seconds"],
                         "steps": row["steps"]})
    print(f"  {model.name} seed {seed} hand: {np.mean(row['draws']):.1f}", flush=True)
  params = scale_suite._initial_params(model.dim)
  started = time.perf_counter()
  advice = dsgrad.recommend(model.objective, lambda steps: scale_suite._cosine(peak, steps),
                            params, key, batch_size=batch_size, budget=budget, progress=False)
  spent = time.perf_counter() - started
  # One call continues a started run (nothing raced: naive, not started, has none).
  variants = [v for v in VARIANTS if advice.runs[advice.best].program is not None
              or v == "follow"]
  for variant in variants:  # unreported: compiles the evaluations' programs
    _continue(advice, budget - WARM_UP_SECONDS, variant)
  rows.update({variant: [] for variant in variants})
  for _ in range(repeats):
    for variant in variants:
      result, seconds, position = _continue(advice, spent, variant)
      draws = evaluator.draws(result.params, scale_suite.FINAL_DRAWS)
      rows[variant].append({
          "draws": None if draws is None else [float(v) for v in draws],
          "seconds": spent + seconds, "position": position,
          "steps_seconds": float(result.timing.steps)})
      print(f"  {model.name} seed {seed} {variant}: "
            f"{np.mean(draws) if draws is not None else float('nan'):.1f}, position "
            f"{position:.3f}", flush=True)
  return {"pick": advice.best, "advice_seconds": spent, "contenders": rows}


def _paired(a: dict, b: dict) -> tuple:
  """``a`` minus ``b``'s final ELBO and the paired standard error of the difference."""
  if a["draws"] is None or b["draws"] is None:
    return float("nan"), float("nan")
  d = np.asarray(a["draws"]) - np.asarray(b["draws"])
  return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))


def render(record) -> str:
  results, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; budget {config['budget']:g} s, batch "
           f"{config['batch_size']}, peak {config['peaks']}, {config['repeats']} repeats; "
           f"final ELBO from {scale_suite.FINAL_DRAWS} draws with the suite's common noise. "
           "'minus hand': the i-th repeat minus the hand loop's i-th (the suite's column), "
           "with its paired standard error over the draws; 'sd': the standard deviation "
           "over repeats of the final ELBO and of that difference.", "",
           "| model | seed | pick | contender | final ELBO, by repeat | sd | minus hand "
           "(paired se), by repeat | sd | schedule position, by repeat | seconds, by repeat |",
           "| --- | --- | --- | --- | --- | ---: | --- | ---: | --- | --- |"]
  notes = []
  for name, seeds in results.items():
    for seed, s in seeds.items():
      hands, finals = s["contenders"]["hand"], {}
      for contender, reps in s["contenders"].items():
        finals[contender] = [np.mean(r["draws"]) if r["draws"] else float("nan") for r in reps]
        gaps = [_paired(r, h) for r, h in zip(reps, hands)]
        lines.append(
            f"| {name} | {seed} | {s['pick']} | {contender} | "
            + "; ".join(f"{v:,.1f}" for v in finals[contender])
            + f" | {np.std(finals[contender], ddof=1):,.1f} | "
            + ("- | -" if contender == "hand" else "; ".join(
                f"{g:+,.1f} ({e:.1f})" for g, e in gaps)
               + f" | {np.std([g for g, _ in gaps], ddof=1):,.1f}") + " | "
            + "; ".join(f"{r['position']:.3f}" if "position" in r else "-" for r in reps)
            + " | " + "; ".join(f"{r['seconds']:.1f}" for r in reps) + " |")
      a, b = (np.asarray(finals.get(v, [])) for v in VARIANTS)
      if len(a) > 1 and len(b) > 1:
        se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        notes.append(f"{name} seed {seed}: recommend {s['advice_seconds']:.1f} s; "
                     f"{' minus '.join(VARIANTS)}: {a.mean() - b.mean():+,.1f} ({se:,.1f})")
  lines += ["", "Per seed (recommend ran once; its time is in the follow rows' seconds), "
            "and the mean final ELBO of the shipped continuation minus the one-call one "
            "(standard error from their spreads over repeats): " + "; ".join(notes) + "."]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks follow-spread",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=["hierarchical"])
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--budget", type=command_line.positive(), default=60.0)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--seeds", type=command_line.count(0), nargs="*", default=[0, 1])
  parser.add_argument("--repeats", type=command_line.count(2), default=3)
  parser.add_argument("--peak-for", nargs="*", default=["hierarchical=0.003",
                                                        "wide_glm=0.001"],
                      help="MODEL=PEAK: the suite's tuned peaks (tuning is not repeated)")
  _report.add_output_flags(parser, "follow-spread")
  args = parser.parse_args(argv)
  peaks = dict(item.split("=") for item in args.peak_for)
  if missing := [m for m in args.models if m not in peaks]:
    parser.error(f"no --peak-for given for {missing}")
  results = {}
  for name in args.models:
    model = scale_models.BUILDERS[name](num_data=args.num_data)
    results[name] = {str(seed): run_seed(model, float(peaks[name]), args.budget,
                                         args.batch_size, seed, args.repeats)
                     for seed in args.seeds}
    del model
  config = {"budget": args.budget, "batch_size": args.batch_size, "repeats": args.repeats,
            "peaks": {m: float(peaks[m]) for m in args.models}, "seeds": args.seeds}
  section = _report.section_of(args, "follow-spread")
  _report.publish(section, None, not args.no_write, render=render, data={
      "results": results, "config": config, "code": scale_suite.code_version()})


if __name__ == "__main__":
  main()
