"""Schedule-free Adam beside a cosine schedule paced to the clock, at equal wall-clock, on
the scale suite's models.

A cosine schedule counts steps, so over a time budget its step count is paced to the clock
(:func:`dsgrad.fit_within`); a schedule-free optimizer (``optax.contrib.schedule_free_adamw``)
needs no step count, and ``fit(max_seconds=)`` runs it as it is. Its iterate ``y``, where
the gradients are taken (what ``fit`` reports), and its average ``x``, what its authors
evaluate (``optax.contrib.schedule_free_eval_params``), are both estimated.

Contenders, for naive and for joint SVRG (refreshed once an epoch), each given the same
seconds end to end (compiles and ``fit``'s evaluations included), data, initial params,
batch and key:

* ``paced cosine``: ``fit_within`` with Adam and a cosine decay to 1% of the peak (the
  scale suite's schedule and its tuned peak, given with ``--peak-for``);
* ``schedule-free, y`` and ``schedule-free, x``: one ``fit(max_seconds=)`` with
  ``schedule_free_adamw`` (b1 0.9, no warm-up, no weight decay), its learning rate the
  best of ``--sf-peaks`` for naive on seed 100 (not reported; the better of ``x`` and
  ``y``), or given with ``--sf-peak-for``.

Final ELBO: the suite's 48 draws with its common noise; each contender minus naive with
the paced cosine, with the paired standard error over the draws.

    python -m benchmarks schedule-free --xla-cores 1 --models wide_glm hierarchical

References:
  Defazio, Yang, Mehta, Mishchenko, Khaled, Cutkosky (2024), The Road Less Scheduled,
  Sec. 2 (``y``, ``z`` and ``x``; evaluation at ``x``).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from benchmarks import scale_models
from benchmarks import scale_suite

ESTIMATORS = ("naive", "joint_svrg")
SF_PEAKS = (1e-3, 3e-3, 1e-2)
TUNE_SEED = 100


def _estimator(name: str, objective):
  return dsgrad.naive() if name == "naive" else dsgrad.joint_svrg(objective)


def run_paced(model, estimator: str, peak: float, budget: float, batch_size: int, key) -> dict:
  """``fit_within`` with a cosine schedule: ``{"params", "steps", "seconds"}``."""
  started = time.perf_counter()
  result = dsgrad.fit_within(
      model.objective, lambda steps: scale_suite._cosine(peak, steps),
      scale_suite._initial_params(model.dim), key, seconds=budget, batch_size=batch_size,
      estimator=_estimator(estimator, model.objective), elbo_samples=scale_suite.TRACE_DRAWS,
      progress=False)
  return {"params": result.params, "steps": int(result.step),
          "seconds": time.perf_counter() - started}


def run_schedule_free(model, estimator: str, rate: float, budget: float, batch_size: int,
                      key) -> dict:
  """``fit(max_seconds=)`` with schedule-free Adam: ``{"params" (y), "average" (x), ...}``."""
  optimizer = optax.chain(_estimator(estimator, model.objective),
                          optax.contrib.schedule_free_adamw(rate))
  started = time.perf_counter()
  result = dsgrad.fit(model.objective, optimizer, scale_suite._initial_params(model.dim), key,
                      batch_size=batch_size, max_seconds=budget,
                      elbo_samples=scale_suite.TRACE_DRAWS, progress=False)
  seconds = time.perf_counter() - started
  average = optax.contrib.schedule_free_eval_params(result.opt_state[1], result.params)
  return {"params": result.params, "average": average, "steps": int(result.step),
          "seconds": seconds}


def _mean(draws) -> float:
  return float("-inf") if draws is None else float(np.mean(draws))


def tune_rate(model, budget, batch_size, rates) -> tuple:
  """The schedule-free rate whose naive run ends best (``x`` or ``y``) on the tuning seed."""
  evaluator = scale_suite._Evaluator(model.objective, TUNE_SEED)
  tuning = {}
  for rate in _report.progress(rates, f"{model.name}: tuning schedule-free"):
    run = run_schedule_free(model, "naive", rate, budget, batch_size,
                            jax.random.key(TUNE_SEED))
    tuning[str(rate)] = max(_mean(evaluator.draws(run["params"], scale_suite.FINAL_DRAWS)),
                            _mean(evaluator.draws(run["average"], scale_suite.FINAL_DRAWS)))
  return float(max(tuning, key=tuning.get)), tuning


def _row(evaluator, params, run) -> dict:
  draws = evaluator.draws(params, scale_suite.FINAL_DRAWS)
  return {"draws": None if draws is None else [float(v) for v in draws],
          "steps": run["steps"], "seconds": run["seconds"]}


def run_seed(model, peak, rate, budget, batch_size, seed) -> dict:
  evaluator, key, rows = scale_suite._Evaluator(model.objective, seed), jax.random.key(seed), {}
  for estimator in ESTIMATORS:
    paced = run_paced(model, estimator, peak, budget, batch_size, key)
    rows[f"{estimator}, paced cosine"] = _row(evaluator, paced["params"], paced)
    free = run_schedule_free(model, estimator, rate, budget, batch_size, key)
    rows[f"{estimator}, schedule-free, y"] = _row(evaluator, free["params"], free)
    rows[f"{estimator}, schedule-free, x"] = _row(evaluator, free["average"], free)
    for name in (f"{estimator}, paced cosine", f"{estimator}, schedule-free, x"):
      print(f"  {model.name} seed {seed} {name}: {_mean(rows[name]['draws']):,.1f}, "
            f"{rows[name]['steps']:,} steps in {rows[name]['seconds']:.1f} s", flush=True)
  return rows


def _paired(a: dict, b: dict) -> str:
  if a["draws"] is None or b["draws"] is None:
    return "diverged"
  d = np.asarray(a["draws"]) - np.asarray(b["draws"])
  return f"{d.mean():+,.1f} ({d.std(ddof=1) / np.sqrt(len(d)):.1f})"


def render(record) -> str:
  results, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; budget {config['budget']:g} s end to end per "
           f"contender (compiles and fit's evaluations included), batch "
           f"{config['batch_size']}, seeds {config['seeds']}; cosine peaks {config['peaks']} "
           f"(the scale suite's, given); final ELBO from {scale_suite.FINAL_DRAWS} draws with "
           "the suite's common noise, minus naive with the paced cosine (paired standard "
           "error). Schedule-free rates: " + "; ".join(
               f"{m}: {r['rate']:g} ({r['how']})" for m, r in config["rates"].items())
           + f". Measured: {record['environment']}."]
  for name, seeds in results.items():
    lines += ["", f"#### {name}", "", "| contender | steps, by seed | seconds, by seed | "
              "ELBO minus naive, paced cosine (paired se), by seed |",
              "| --- | --- | --- | --- |"]
    for contender in seeds[next(iter(seeds))]:
      runs = [seeds[s][contender] for s in seeds]
      base = [seeds[s]["naive, paced cosine"] for s in seeds]
      gaps = ("reference: " + "; ".join(f"{_mean(r['draws']):,.1f}" for r in runs)
              if contender == "naive, paced cosine"
              else "; ".join(_paired(r, b) for r, b in zip(runs, base)))
      lines.append(f"| {contender} | " + "/".join(f"{r['steps']:,}" for r in runs) + " | "
                   + "; ".join(f"{r['seconds']:.1f}" for r in runs) + f" | {gaps} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks schedule-free",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=["wide_glm", "hierarchical"])
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--budget", type=command_line.positive(), default=60.0)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--seeds", type=command_line.count(0), nargs="*", default=[0, 1])
  parser.add_argument("--peak-for", nargs="*", default=["hierarchical=0.003",
                                                        "wide_glm=0.001"],
                      help="MODEL=PEAK: the scale suite's tuned cosine peaks")
  parser.add_argument("--sf-peaks", type=command_line.positive(), nargs="*",
                      default=list(SF_PEAKS), help="schedule-free rates tried on seed 100")
  parser.add_argument("--sf-peak-for", nargs="*", default=[],
                      help="MODEL=RATE: a schedule-free rate given (no tuning)")
  _report.add_output_flags(parser, "schedule-free")
  args = parser.parse_args(argv)
  peaks, given = dict(i.split("=") for i in args.peak_for), dict(
      i.split("=") for i in args.sf_peak_for)
  if missing := [m for m in args.models if m not in peaks]:
    parser.error(f"no --peak-for given for {missing}")
  results, rates = {}, {}
  for name in args.models:
    model = scale_models.BUILDERS[name](num_data=args.num_data)
    if name in given:
      rates[name] = {"rate": float(given[name]), "how": "given"}
    else:
      rate, tuning = tune_rate(model, args.budget, args.batch_size, args.sf_peaks)
      rates[name] = {"rate": rate, "how": f"tuned on seed {TUNE_SEED} among {args.sf_peaks}",
                     "tuning": tuning}
    results[name] = {str(seed): run_seed(model, float(peaks[name]), rates[name]["rate"],
                                         args.budget, args.batch_size, seed)
                     for seed in args.seeds}
    del model
  config = {"budget": args.budget, "batch_size": args.batch_size, "seeds": args.seeds,
            "peaks": {m: float(peaks[m]) for m in args.models}, "rates": rates}
  section = _report.section_of(args, "schedule-free")
  _report.publish(section, None, not args.no_write, render=render, data={
      "results": results, "config": config, "code": scale_suite.code_version()})


if __name__ == "__main__":
  main()
