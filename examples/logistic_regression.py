"""Quickstart: compare dsgrad's gradient estimators on Bayesian logistic regression.

Mean-field Gaussian BBVI on a small real data set, plain SGD (as in the paper's
Sonar/Australian experiments), the same batches and noise for every estimator. The step
size is chosen by a stated rule that favours no estimator: for each estimator, the value of
``--lrs`` with the best final ELBO on a tuning seed that is *not* reported. Then every
estimator runs on ``--seeds`` reported seeds. Prints the final full-data ELBO (mean and
standard error over seeds), the gradient variance at the endpoint and the time per step,
says which estimator won and by how much, and saves ELBO curves against wall-clock
seconds with bands over seeds. Then every estimator at equal wall-clock (the steps naive's
time affords it) beside a hand-written optax loop. A quick example: each run takes tens of
milliseconds, where every estimator ends within about a nat of the others; the main job,
``examples/hierarchical_logistic.py``, is the 10^6-row case.

    python examples/logistic_regression.py                      # breast cancer (scikit-learn)
    python examples/logistic_regression.py --dataset sonar --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from _common import (add_all_cores_flag, check_batch_fits, check_checkpoint_config,
                     first_paragraph, place_xla_threads)
from dsgrad.diagnostics import elbo, estimator_samples, total_variance
from dsgrad.datasets import load_australian, load_sonar, standardize
from dsgrad.models import logistic_regression


def load(dataset: str, data_dir: str):
  """Standardized features with an intercept column, and 0/1 labels."""
  if dataset == "breast_cancer":
    from sklearn.datasets import load_breast_cancer
    x, y = load_breast_cancer(return_X_y=True)
    x = standardize(x)
  else:
    loader, name = {"sonar": (load_sonar, "sonar.all-data"),
                    "australian": (load_australian, "australian.dat")}[dataset]
    try:
      x, y = loader(os.path.join(data_dir, name))
    except FileNotFoundError as err:
      raise SystemExit(f"{err}\n(pass --data-dir pointing at the folder holding {name})")
  return dsgrad.datasets.add_intercept(x), np.asarray(y, int)


def make_approx(model, approx_name: str):
  """The approximation ``f~`` named by ``--approx``."""
  return {"probit": lambda: dsgrad.approx.logistic_probit(model),
          "taylor2": lambda: dsgrad.approx.glm_taylor(model),
          "taylor": lambda: dsgrad.approx.gaussian_mean_taylor(model),
          "linearize": dsgrad.approx.linearize}[approx_name]()


def make_estimators(objective, model, approx_name: str, steps_per_epoch: int):
  """The five estimators; cv and the joint ones share the approximation ``f~``."""
  approx = make_approx(model, approx_name)
  return {
      "naive": lambda: dsgrad.naive(),
      "cv": lambda: dsgrad.cv(objective, approx),
      "inc": lambda: dsgrad.inc(objective),
      "joint_svrg": lambda: dsgrad.joint_svrg(objective, approx, every=steps_per_epoch),
      "joint_saga": lambda: dsgrad.joint_saga(objective, approx, warmup_steps=steps_per_epoch),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=first_paragraph(__doc__),
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--dataset", default="breast_cancer",
                      choices=["breast_cancer", "sonar", "australian"],
                      help="data set (breast_cancer ships with scikit-learn)")
  parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data"),
                      help="folder with sonar.all-data / australian.dat")
  parser.add_argument("--steps", type=command_line.count(1), default=3000, help="SGD steps per run")
  parser.add_argument("--batch-size", type=command_line.count(1), default=5, help="data per step")
  parser.add_argument("--lrs", default="1e-3,5e-4,2.5e-4,1e-4",
                      help="SGD step sizes to choose from, per estimator, on the tuning seed")
  parser.add_argument("--approx", default="probit",
                      choices=["probit", "taylor2", "taylor", "linearize"],
                      help="f~: the sigmoid's probit mixture for loc with second-order scales "
                           "(logistic_probit), the second-order Taylor expansion on every "
                           "parameter with a table of logits (glm_taylor), the paper's "
                           "mean-only one (App. F), or the generic first-order expansion in "
                           "the noise")
  parser.add_argument("--seeds", type=command_line.count(0), default=3, help="reported seeds")
  parser.add_argument("--seed", type=command_line.count(0), default=0,
                      help="first reported seed (seeds seed .. seed + seeds - 1); runs are "
                           "deterministic given it")
  parser.add_argument("--tune-seed", type=command_line.count(0), default=1000,
                      help="seed of the step-size choice, not among the reported ones")
  parser.add_argument("--checkpoint-dir", type=command_line.folder(), default=None,
                      help="save every run here; a rerun resumes where it stopped")
  parser.add_argument("--no-progress", action="store_true", help="no progress bars")
  add_all_cores_flag(parser)
  parser.add_argument("--out", type=command_line.folder(),
                      default=os.path.join("results", "logistic_regression"),
                      help="folder for results.json and the figures")
  args = parser.parse_args(argv)
  seeds = list(range(args.seed, args.seed + args.seeds))
  if args.tune_seed in seeds:
    parser.error("--tune-seed must not be one of the reported seeds")
  lrs = [float(v) for v in args.lrs.split(",")]
  place_xla_threads(args)  # before JAX starts its CPU client: its timings are compared

  x, y = load(args.dataset, args.data_dir)
  model = logistic_regression(x, y, name=args.dataset)
  objective = dsgrad.meanfield_gaussian(model)
  n = model.num_data
  check_batch_fits(parser, args.batch_size, n, f"rows of {args.dataset}")
  init = {"loc": jnp.zeros(model.latent_dim), "log_scale": jnp.full(model.latent_dim, -1.0)}
  steps_per_epoch = n // args.batch_size
  estimators = make_estimators(objective, model, args.approx, steps_per_epoch)
  eval_every = max(1, args.steps // 30)
  if args.steps % eval_every:
    parser.error(f"--steps must be a multiple of {eval_every} (steps // 30)")
  print(f"{args.dataset}: N={n}, D={model.latent_dim}, batch {args.batch_size}, SGD, "
        f"{args.steps} steps, approximation {args.approx}, seeds {seeds}")
  check_checkpoint_config(args.checkpoint_dir, {
      k: v for k, v in vars(args).items()
      if k not in ("steps", "out", "checkpoint_dir", "no_progress")})

  # One optimizer object per (estimator, step size): fit keeps its compiled steps per
  # optimizer, so the seeds after the first reuse them instead of compiling again.
  optimizers = {}

  def run(name, lr, seed, samples, num_steps=None):
    num_steps = num_steps or args.steps
    stem = f"{name}-lr{lr:g}-seed{seed}" + (f"-{num_steps}" if num_steps != args.steps else "")
    path = (os.path.join(args.checkpoint_dir, f"{stem}.msgpack")
            if args.checkpoint_dir else None)
    if (name, lr) not in optimizers:
      est = estimators[name]()
      optimizers[name, lr] = est, optax.chain(est, optax.sgd(lr))
    est, optimizer = optimizers[name, lr]
    fit = dsgrad.fit(objective, optimizer, init, jax.random.key(seed),
                     num_steps=num_steps, batch_size=args.batch_size,
                     eval_every=eval_every, elbo_samples=samples,
                     progress=not args.no_progress, checkpoint_path=path, resume=True)
    return est, fit

  # 1. The rule: each estimator's step size is its best final ELBO on the tuning seed.
  chosen = {}
  for name in estimators:
    scores = []
    for lr in lrs:
      _, fit = run(name, lr, args.tune_seed, 0)
      value = float(elbo(objective, fit.params, jax.random.key(7), 1000)[0])
      scores.append(value if np.isfinite(value) else -np.inf)
    chosen[name] = lrs[int(np.argmax(scores))]
  print("step sizes chosen on the tuning seed: "
        + ", ".join(f"{k} {v:g}" for k, v in chosen.items()))

  # 2. The reported runs.
  results, traces = {}, {}
  for name in estimators:
    finals, curves, clocks, variances, ms = [], [], [], [], []
    for seed in seeds:
      est, fit = run(name, chosen[name], seed, 200)
      params, state = fit.params, fit.opt_state
      finals.append(float(elbo(objective, params, jax.random.key(99), 2000)[0]))
      curves.append([float(elbo(objective, init, jax.random.key(0), 200)[0])]
                    + [float(v) for v in fit.history.elbo])
      # Seconds spent stepping (compilation and ELBO evaluations excluded) at each point.
      clocks.append([0.0] + [float(v) for v in fit.history.wall_time])
      var, _ = total_variance(estimator_samples(est, state[0], params, objective,
                                                jax.random.key(3), 2000, args.batch_size))
      variances.append(var)
      ms.append(1e3 * float(fit.history.wall_time[-1]) / args.steps)
    finals = np.asarray(finals)
    results[name] = {"lr": chosen[name], "final_elbo": finals.tolist(),
                     "final_elbo_mean": float(finals.mean()),
                     "final_elbo_se": float(finals.std(ddof=1) / np.sqrt(len(finals)))
                     if len(finals) > 1 else float("nan"),
                     "grad_variance": float(np.median(variances)),
                     "ms_per_step": float(np.median(ms)),
                     "table_bytes": dsgrad.table_bytes(state)}
    traces[name] = {"step": [0] + [int(t) for t in fit.history.step], "elbo": curves,
                    "seconds": clocks}

  print(f"\n{'estimator':<11} {'step size':>9} {'final ELBO (se over seeds)':>27} "
        f"{'grad variance':>14} {'ms/step':>8} {'table':>9}")
  for name, r in results.items():
    print(f"{name:<11} {r['lr']:>9g} {r['final_elbo_mean']:>18.2f} ({r['final_elbo_se']:.2f}) "
          f"{r['grad_variance']:>14.3g} {r['ms_per_step']:>8.3f} {r['table_bytes']:>8d}B")
  print("\n" + summary(results))
  equal_time = equal_wall_clock(objective, (x, y), run, chosen, results, seeds, args)

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"args": vars(args), "results": results, "traces": traces,
               "equal_wall_clock": equal_time}, f, indent=1)
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print(f"\nwrote {args.out}/results.json (install matplotlib for the plot)")
    return results
  fig, ax = plt.subplots(figsize=(6.5, 4))
  lo, hi = np.inf, -np.inf
  for i, (name, trace) in enumerate(traces.items()):
    # Against wall-clock: what a user waits for. The median over seeds of the seconds
    # each point took, so a slower step shows as a curve stretched to the right.
    t, v = np.median(np.asarray(trace["seconds"]), axis=0), np.asarray(trace["elbo"])
    ax.plot(t, v.mean(0), color=f"C{i}", label=f"{name} (lr {results[name]['lr']:g})")
    ax.fill_between(t, v.min(0), v.max(0), color=f"C{i}", alpha=0.2, linewidth=0)
    lo, hi = min(lo, np.nanmin(v[:, len(t) // 3:])), max(hi, np.nanmax(v))
  ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.05 * (hi - lo))
  ax.set_xlabel(f"seconds of steps ({args.steps} steps; compilation excluded)")
  ax.set_ylabel("full-data ELBO")
  ax.set_title(f"{args.dataset}: SGD, batch {args.batch_size}; mean and range over "
               f"{len(seeds)} seeds")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "elbo.png"), dpi=120)
  print(f"\nwrote {args.out}/results.json and {args.out}/elbo.png")
  return results


def hand_written_sgd(x, y, lr: float, steps: int, batch_size: int, key, program=None):
  """The loop a user writes without dsgrad: mean-field BBVI for logistic regression with
  a N(0, I) prior in plain JAX and optax, one noise draw and a uniform batch (with
  replacement) per step. Returns ``(params, seconds per step, program)``: the fastest of
  three runs, compilation excluded; pass ``program`` back to run another key without
  compiling again."""
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  n, d = x.shape
  sgd = optax.sgd(lr)

  def negative_elbo(params, idx, eps):
    z = params["loc"] + jnp.exp(params["log_scale"]) * eps
    logits = x[idx] @ z
    log_lik = n / idx.shape[0] * jnp.sum(y[idx] * logits - jax.nn.softplus(logits))
    return -(log_lik - 0.5 * jnp.sum(z ** 2) + jnp.sum(params["log_scale"]))

  def step(carry, k):
    params, state = carry
    k_idx, k_eps = jax.random.split(k)
    grads = jax.grad(negative_elbo)(params, jax.random.randint(k_idx, (batch_size,), 0, n),
                                    jax.random.normal(k_eps, (d,)))
    updates, state = sgd.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), None

  params = {"loc": jnp.zeros(d), "log_scale": jnp.full(d, -1.0)}
  keys = jax.random.split(key, steps)
  if program is None:
    program = jax.jit(lambda p, ks: jax.lax.scan(step, (p, sgd.init(p)), ks)[0][0])
    program = program.lower(params, keys).compile()
  best = np.inf
  for _ in range(3):
    start = time.perf_counter()
    out = jax.block_until_ready(program(params, keys))
    best = min(best, time.perf_counter() - start)
  return out, best / steps, program


def equal_wall_clock(objective, data, run, chosen, results, seeds, args) -> dict:
  """Every estimator given naive's time for ``--steps`` steps, on each reported seed.

  A step that removes noise costs more than naive's, so at equal time it takes fewer
  steps: ``--steps`` times naive's time per step over its own (the table's ms/step,
  which hold each segment's fixed cost too, so the ratios slightly favour the costlier
  steps), at its own tuned step size. Beside them, a hand-written optax loop for
  ``--steps`` steps at naive's step size. Prints the table and how the best at equal
  wall-clock compares with naive and with the hand-written loop; returns the numbers."""
  eval_key, rows, hand, hand_seconds = jax.random.key(99), {}, [], []
  naive_cost = results["naive"]["ms_per_step"]
  for name, r in results.items():
    steps = max(1, int(round(args.steps * naive_cost / r["ms_per_step"])))
    finals = [float(elbo(objective, run(name, chosen[name], seed, 0, steps)[1].params,
                         eval_key, 2000)[0]) for seed in seeds]
    rows[name] = {"steps": steps, "ms_per_step": r["ms_per_step"], "final_elbo": finals}
  program = None
  for seed in seeds:
    params, seconds, program = hand_written_sgd(*data, chosen["naive"], args.steps,
                                                args.batch_size, jax.random.key(seed), program)
    hand.append(float(elbo(objective, params, eval_key, 2000)[0]))
    hand_seconds.append(seconds)
  rows["hand loop"] = {"steps": args.steps, "ms_per_step": 1e3 * float(np.median(hand_seconds)),
                       "final_elbo": hand}
  print(f"\nAt equal wall-clock (naive's time for {args.steps} steps; seeds {seeds}):")
  print(f"{'estimator':<11} {'steps':>7} {'ms/step':>8} {'final ELBO (se over seeds)':>27}")
  for name, r in rows.items():
    print(f"{name:<11} {r['steps']:>7d} {r['ms_per_step']:>8.4f} "
          f"{np.mean(r['final_elbo']):>18.2f} ({_se(r['final_elbo']):.2f})")
  pick = max(results, key=lambda k: np.mean(rows[k]["final_elbo"]))
  lines = [f"The best at equal wall-clock, {pick}, against naive and the hand-written loop:"]
  for other in dict.fromkeys(("naive", "hand loop")):
    diff = np.asarray(rows[pick]["final_elbo"]) - np.asarray(rows[other]["final_elbo"])
    verdict = ("the same runs" if not diff.any() else
               "ahead" if diff.mean() > 2 * _se(diff) else
               "behind" if diff.mean() < -2 * _se(diff) else "a tie within 2 se")
    lines.append(f"  {pick} - {other}: {diff.mean():+.2f} nats (se {_se(diff):.2f}): {verdict}")
  print("\n".join(lines))
  return {"rows": rows, "best": pick, "verdict": lines}


def _se(values) -> float:
  values = np.asarray(values, float)
  return float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else float("nan")


def summary(results) -> str:
  """Which estimator won (highest mean final ELBO) and by how much, with the standard
  error of each difference over seeds (the runs of one seed share their batches)."""
  ranked = sorted(results, key=lambda k: -results[k]["final_elbo_mean"])
  best = ranked[0]

  def gap(a, b):
    d = np.asarray(results[a]["final_elbo"]) - np.asarray(results[b]["final_elbo"])
    return d.mean(), _se(d)

  lines = [f"Winner: {best} (final ELBO {results[best]['final_elbo_mean']:.2f})."]
  for other in ranked[1:]:
    d, se = gap(best, other)
    verdict = "a tie within 2 se" if np.isfinite(se) and d < 2 * se else "ahead"
    lines.append(f"  {best} - {other}: {d:+.2f} nats (se {se:.2f}): {verdict}")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
