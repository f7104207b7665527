"""The joint control variate paper's experiments, side by side (``python -m benchmarks paper``).

The large tasks (``mnist``, ``ppca``, ``tennis``, ``movielens``, or ``large`` for all
four) live in :mod:`benchmarks.paper_large`.

Subcommand ``uci``: Sonar and Australian, Bayesian logistic regression with mean-field
Gaussian BBVI, batch 5, plain SGD, the step-size grid of App. D, estimators naive / cv /
inc / joint (SAGA; App. F approximation for cv and joint, table initialised by one naive
epoch as in Alg. 1), several seeds. Every (step size, seed) run of one estimator trains
in one vmapped, jitted ``lax.scan``. It reports

* the final ELBO against the step size and the ELBO trace under the best step size per
  iteration (Fig. 3, first row), as PNG figures and a table;
* how many iterations each estimator needs to reach naive's final ELBO (the claim: joint
  needs at most 1/5 of naive's);
* at the optimization endpoint of the Table 1 step size (5e-4), each estimator's
  gradient variance next to the bounds of Eq. 10 (``V_n``) and Eq. 14 (``V_eps``), and the
  Table 1 decomposition.

ELBOs are full-data Monte Carlo estimates (500 samples along the traces, 5,000 at the
end, as the paper). Data: ``../shared/data/`` by default (``--data-dir``).

References:
  Wang, Geffner, Domke (2024), Sec. 7, Fig. 2-3, Table 1, App. D.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _grid, _report, paper_large
from dsgrad.diagnostics import estimator_samples, total_variance

UCI_STEP_SIZES = (7.5e-3, 5e-3, 2.5e-3, 1e-3, 5e-4, 1e-4, 5e-5, 2.5e-5, 1e-5)
ESTIMATORS = ("naive", "cv", "inc", "joint", "cv_taylor2", "joint_taylor2",
              "joint_taylor2_adaptive", "joint_probit", "joint_probit_adaptive")
PAPER_TABLE1 = {"sonar": (4.04e4, 2.02e4, 1.16e4), "australian": (9.16e4, 8.61e4, 2.07e3)}


def _uci_problem(name, data_dir):
  loader = {"sonar": dsgrad.datasets.load_sonar,
            "australian": dsgrad.datasets.load_australian}[name]
  file = {"sonar": "sonar.all-data", "australian": "australian.dat"}[name]
  x, y = loader(os.path.join(data_dir, file))
  model = dsgrad.models.logistic_regression(dsgrad.datasets.add_intercept(x), y, name=name)
  return model, dsgrad.meanfield_gaussian(model)


def _with_sgd(estimator):
  """``step_size -> optax.chain(estimator, optax.sgd(step_size))`` for the grid trainer."""
  return lambda lr: optax.chain(estimator, optax.sgd(lr))


def _estimator(name, objective, model, warmup):
  taylor = dsgrad.approx.gaussian_mean_taylor(model)
  taylor2 = dsgrad.approx.gaussian_taylor(model)  # second order: scales too (Eq. 65-67)
  # The paper's estimators use c = 1 (rows named _adaptive override it).
  off = dict(control_weight=1.0)
  adaptive = dict(control_weight="adaptive")
  return {
      "naive": lambda: dsgrad.naive(),
      "cv": lambda: dsgrad.cv(objective, taylor, **off),
      "inc": lambda: dsgrad.inc(objective),
      "joint": lambda: dsgrad.joint_saga(objective, taylor, warmup_steps=warmup, **off),
      "cv_taylor2": lambda: dsgrad.cv(objective, taylor2, **off),
      "joint_taylor2": lambda: dsgrad.joint_saga(objective, taylor2, warmup_steps=warmup,
                                                 **off),
      "joint_taylor2_adaptive": lambda: dsgrad.joint_saga(
          objective, taylor2, warmup_steps=warmup, **adaptive),
      # loc: the sigmoid's probit mixture (closed-form expectation); scales: second order.
      "joint_probit": lambda: dsgrad.joint_saga(
          objective, dsgrad.approx.logistic_probit(model), warmup_steps=warmup, **off),
      "joint_probit_adaptive": lambda: dsgrad.joint_saga(
          objective, dsgrad.approx.logistic_probit(model), warmup_steps=warmup,
          **adaptive),
  }[name]()


def run_uci(dataset, data_dir, *, num_steps, num_evals, seeds, step_sizes, batch_size=5,
            estimators=ESTIMATORS):
  model, objective = _uci_problem(dataset, data_dir)
  params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  warmup = model.num_data // batch_size
  keys = jax.random.split(jax.random.key(0), seeds)
  elbo_trace = _grid.elbo_many(objective, 500)
  elbo_final = _grid.elbo_many(objective, 5000)
  results, endpoint = {}, {}
  for name in _report.progress(estimators, f"{dataset}: estimators"):
    est = _estimator(name, objective, model, warmup)
    train = _grid.trainer(_with_sgd(est), objective,
                          params0, batch_size, num_steps, num_evals)
    t0 = time.perf_counter()
    traces, states = _grid.run_grid(train, step_sizes, keys)   # leaves (L, S, E, ...)
    jax.block_until_ready(traces)
    seconds = time.perf_counter() - t0
    flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[3:]), traces)
    values = np.asarray(elbo_trace(flat, jax.random.key(1)), np.float64)
    values = values.reshape(len(step_sizes), seeds, num_evals)
    last = jax.tree.map(lambda a: a[:, :, -1].reshape((-1,) + a.shape[3:]), traces)
    final = np.asarray(elbo_final(last, jax.random.key(2)), np.float64).reshape(len(step_sizes), seeds)
    # A run has diverged once any parameter is non-finite or beyond 1e3 in size (data are
    # standardized): its Monte Carlo "ELBO" is then meaningless (overflowing scales can
    # even give large positive values) and it counts as nan from there on.
    sane = _grid.diverged_mask(traces)
    values = np.where(sane, values, np.nan)
    final = np.where(sane[:, :, -1], final, np.nan)
    results[name] = dict(trace=values, final=final, seconds=seconds)
    # The Table 1 step size (5e-4), seed 0: params and estimator state at the endpoint.
    i = int(np.argmin(np.abs(np.asarray(step_sizes) - 5e-4)))
    endpoint[name] = (jax.tree.map(lambda a: a[i, 0, -1], traces),
                      jax.tree.map(lambda a: a[i, 0], states), est)
    print(f"  {dataset} {name:<6} {seconds:7.1f} s for {len(step_sizes)} x {seeds} runs", flush=True)
  variances = _endpoint_variances(objective, endpoint, batch_size)
  var_trace = _variance_traces(objective, model, params0, batch_size, num_steps, warmup,
                               estimators)
  return model, results, variances, var_trace


def _variance_traces(objective, model, params0, batch_size, num_steps, warmup, estimators,
                     step_size=5e-4, points=10, draws=1000):
  """Fig. 2: each estimator's gradient variance along its own trajectory (step size
  5e-4, seed 0) at ``points`` evenly spaced iterations, with ``V_n`` and ``V_eps`` at
  the same parameters."""
  out = {}
  for name in _report.progress(estimators, "variance along the trajectories"):
    est = _estimator(name, objective, model, warmup)
    train = _grid.trainer(_with_sgd(est), objective,
                          params0, batch_size, num_steps, points, keep_states=True)
    (params, states), _ = jax.jit(train)(step_size, jax.random.key(0))
    rows = []
    for e in range(points):
      p = jax.tree.map(lambda a: a[e], params)
      s = jax.tree.map(lambda a: a[e], states)
      var, _ = total_variance(estimator_samples(est, s[0], p, objective,
                                                jax.random.key(10 + e), draws, batch_size))
      bounds = dsgrad.variance_decomposition(objective, p, jax.random.key(20 + e), batch_size,
                                             num_draws=draws, full_draws=100)
      rows.append((var, bounds["V_n"], bounds["V_eps"]))
    out[name] = np.asarray(rows)
    print(f"  variance trace {name} done", flush=True)
  return dict(steps=(np.arange(points) + 1) * (num_steps // points), values=out)


def _variance_figure(dataset, var_trace, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  steps, values = var_trace["steps"], var_trace["values"]
  for i, (name, v) in enumerate(values.items()):
    ax.plot(steps, v[:, 0], "o-", color=f"C{i}", label=name)
  joint = values["joint_taylor2"] if "joint_taylor2" in values else values["joint"]
  ax.plot(steps, joint[:, 1], "--", color="gray", label="V_n (Eq. 10), at joint_taylor2's params")
  ax.plot(steps, joint[:, 2], ":", color="black",
          label="V_eps (Eq. 14), at joint_taylor2's params")
  ax.set(yscale="log", xlabel="iteration", ylabel="gradient variance (trace)",
         title=f"{dataset}: variance along the trajectory (step 5e-4)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def format_variance_trace(var_trace):
  steps, values = var_trace["steps"], var_trace["values"]
  lines = ["Variance along each estimator's own trajectory (Fig. 2; step size 5e-4, seed 0, "
           "1,000 draws per point), with the bounds at the same parameters. Each cell: "
           "variance / V_n / V_eps.", "",
           "| iteration | " + " | ".join(values) + " |",
           "| ---: |" + " ---: |" * len(values)]
  for e, step in enumerate(steps):
    cells = [f"{v[e, 0]:.3g} / {v[e, 1]:.3g} / {v[e, 2]:.3g}" for v in values.values()]
    lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
  counts = []
  for name, v in values.items():
    counts.append(f"{name}: below V_n at {int(np.sum(v[:, 0] < v[:, 1]))}/{len(steps)}, "
                  f"below V_eps at {int(np.sum(v[:, 0] < v[:, 2]))}/{len(steps)}")
  lines += ["", "Points below the bounds: " + "; ".join(counts) + "."]
  return "\n".join(lines)


def _endpoint_variances(objective, endpoint, batch_size):
  out = {}
  for name, (params, state, est) in endpoint.items():
    var, se = total_variance(estimator_samples(est, state[0], params, objective,
                                               jax.random.key(3), 4000, batch_size))
    table1 = dsgrad.variance_decomposition(objective, params, jax.random.key(4), batch_size)
    out[name] = dict(var=var, se=se, **table1)
  return out


def summarize(dataset, results, num_steps, num_evals, step_sizes):
  steps = (np.arange(num_evals) + 1) * (num_steps // num_evals)
  best_trace = {n: _grid.mean_over_seeds(r["trace"]).max(0) for n, r in results.items()}
  naive_final = best_trace["naive"][-1]
  rows = []
  for name, r in results.items():
    finals = _grid.mean_over_seeds(r["final"][:, :, None])[:, 0]
    best = int(np.argmax(finals))
    se = np.nanstd(r["final"][best]) / np.sqrt(r["final"].shape[1])
    reached = np.nonzero(best_trace[name] >= naive_final)[0]
    first = int(steps[reached[0]]) if reached.size else None
    rows.append(dict(name=name, best_lr=step_sizes[best], final=finals[best], se=se,
                     reach=first, seconds=r["seconds"], finals=finals))
  return steps, best_trace, rows


def _figure(dataset, steps, best_trace, rows, step_sizes, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
  for row in rows:
    finite = np.isfinite(row["finals"])
    a.plot(np.asarray(step_sizes)[finite], row["finals"][finite], "o-", label=row["name"])
    b.plot(steps, best_trace[row["name"]], label=row["name"])
  lo = max(min(np.nanmin(np.where(np.isfinite(t), t, np.nan)) for t in best_trace.values()),
           best_trace["naive"][-1] - 3 * abs(best_trace["naive"][-1] - best_trace.get("joint", best_trace["naive"])[-1]) - 5)
  a.set(xscale="log", xlabel="step size", ylabel="final ELBO", title=f"{dataset}: final ELBO")
  b.set(xscale="log", xlabel="iteration", ylabel="ELBO (best step size per iteration)",
        title=f"{dataset}: traces", ylim=(lo, None))
  best = max(np.nanmax(np.where(np.isfinite(r["finals"]), r["finals"], np.nan)) for r in rows)
  a.set_ylim(lo, best + 0.05 * abs(best - lo))
  a.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def format_uci(dataset, model, rows, variances, config, figure):
  naive = next(r for r in rows if r["name"] == "naive")
  lines = [f"### {dataset} (N={model.num_data}, D={model.latent_dim} with intercept)", "",
           f"![{dataset}]({figure})", "",
           "| estimator | best step size (final) | final ELBO (mean over seeds) | "
           "iterations to reach naive's final ELBO | fraction of naive's | seconds for all runs |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
  for r in rows:
    reach = "never" if r["reach"] is None else f"{r['reach']:,}"
    frac = "" if r["reach"] is None else f"{r['reach'] / naive['reach']:.3f}" if naive["reach"] else ""
    lines.append(f"| {r['name']} | {r['best_lr']:g} | {r['final']:.3f} ± {r['se']:.3f} | "
                 f"{reach} | {frac} | {r['seconds']:.0f} |")
  verdicts = []
  for r in rows:
    if r["name"].startswith("joint"):
      ok = r["reach"] is not None and naive["reach"] and r["reach"] <= naive["reach"] / 5
      verdicts.append(f"{r['name']}: **{'reproduced' if ok else 'NOT reproduced'}**")
  lines += ["", "Claim (joint reaches naive's final ELBO in at most 1/5 of the iterations): "
            + "; ".join(verdicts) + ".", "",
            "Gradient variance at each estimator's endpoint (step size 5e-4, seed 0), with "
            "the bounds at the same parameters: `cv` cannot go below `V_n` (Eq. 10), `inc` "
            "cannot go below `V_eps` (Eq. 14). Variances are traces of covariances, "
            f"batch {config['batch_size']}.", "",
            "| estimator | variance | V_n (Eq. 10 bound) | V_eps (Eq. 14 bound) | V_n,eps (naive) |",
            "| --- | ---: | ---: | ---: | ---: |"]
  for name, v in variances.items():
    lines.append(f"| {name} | {v['var']:.4g} ± {v['se']:.2g} | {v['V_n']:.4g} | "
                 f"{v['V_eps']:.4g} ± {v['V_eps_se']:.2g} | {v['V_n_eps']:.4g} |")
  paper = PAPER_TABLE1[dataset]
  lines += ["", f"Paper's Table 1 for {dataset} (its own endpoint and scaling): V_n,eps = "
            f"{paper[0]:.3g}, V_n = {paper[1]:.3g}, V_eps = {paper[2]:.3g}."]
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv and argv[0] in paper_large.LARGE_TASKS:
    return paper_large.main(argv)
  parser = argparse.ArgumentParser(
      prog="python -m benchmarks paper",
      description=__doc__.split("\n\n")[0] + " Tasks mnist, ppca, tennis, movielens and "
      "large (all four): see `python -m benchmarks paper mnist --help`.")
  parser.add_argument("task", choices=["uci"], help="which experiment")
  parser.add_argument("--datasets", default="sonar,australian")
  parser.add_argument("--steps", type=command_line.count(1), default=10_000)
  parser.add_argument("--evals", type=command_line.count(1), default=40)
  parser.add_argument("--seeds", type=command_line.count(0), default=5)
  parser.add_argument("--estimators", default=",".join(ESTIMATORS))
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  estimators = tuple(args.estimators.split(","))
  unknown = set(estimators) - set(ESTIMATORS)
  if unknown or "naive" not in estimators:
    parser.error(f"--estimators: naive is required; unknown {sorted(unknown)}")
  sections = []
  config = dict(batch_size=5)
  for dataset in args.datasets.split(","):
    model, results, variances, var_trace = run_uci(dataset, _report.data_dir(), num_steps=args.steps,
                                        num_evals=args.evals, seeds=args.seeds,
                                        step_sizes=UCI_STEP_SIZES, estimators=estimators)
    steps, best_trace, rows = summarize(dataset, results, args.steps, args.evals, UCI_STEP_SIZES)
    figure = f"figures/paper_uci_{dataset}.png"
    var_figure = f"figures/paper_uci_{dataset}_variance.png"
    if not args.no_write:  # --no-write prints only: no table and no figure is written
      _figure(dataset, steps, best_trace, rows, UCI_STEP_SIZES, _report.docs_path(figure))
      _variance_figure(dataset, var_trace, _report.docs_path(var_figure))
    sections.append(format_uci(dataset, model, rows, variances, config, figure)
                    + f"\n\n![{dataset} variance]({var_figure})\n\n"
                    + format_variance_trace(var_trace))
  body = "\n\n".join([
      f"Command: `python -m benchmarks paper uci --steps {args.steps} --seeds {args.seeds}"
      + ("" if estimators == ESTIMATORS else f" --estimators {args.estimators}") + "` -- "
      f"SGD, batch 5, step sizes {', '.join(f'{s:g}' for s in UCI_STEP_SIZES)} (App. D), "
      f"{args.seeds} seeds, {args.steps:,} iterations, ELBO every {args.steps // args.evals} "
      f"iterations (500 MC samples; final: 5,000). Traces use the best step size per "
      f"iteration (mean over seeds; a run counts as diverged, -inf, from the first "
      f"evaluation where a parameter is non-finite or exceeds 1e3 in size).",
      f"Measured: {_report.environment()}"] + sections)
  _report.publish(f"paper-uci-{jax.default_backend()}", body, not args.no_write)
  return 0
