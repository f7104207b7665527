"""The joint control variate paper's experiments, side by side (``python -m dsgrad.bench paper``).

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
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad.bench import _report
from dsgrad.diagnostics import estimator_samples, total_variance
from dsgrad.train import batch_indices

UCI_STEP_SIZES = (7.5e-3, 5e-3, 2.5e-3, 1e-3, 5e-4, 1e-4, 5e-5, 2.5e-5, 1e-5)
ESTIMATORS = ("naive", "cv", "inc", "joint")
PAPER_TABLE1 = {"sonar": (4.04e4, 2.02e4, 1.16e4), "australian": (9.16e4, 8.61e4, 2.07e3)}


def _uci_problem(name, data_dir):
  loader = {"sonar": dsgrad.datasets.load_sonar,
            "australian": dsgrad.datasets.load_australian}[name]
  file = {"sonar": "sonar.all-data", "australian": "australian.dat"}[name]
  x, y = loader(os.path.join(data_dir, file))
  x = np.concatenate([x, np.ones((x.shape[0], 1), np.float32)], 1)  # intercept
  model = dsgrad.models.logistic_regression(x, y, name=name)
  return model, dsgrad.meanfield_gaussian(model)


def _estimator(name, objective, model, warmup):
  taylor = dsgrad.approx.gaussian_mean_taylor(model)
  off = dict(check_indices=False, check_finite=False)  # runs are vmapped: no host checks
  return {
      "naive": lambda: dsgrad.naive(check_finite=False),
      "cv": lambda: dsgrad.cv(objective, taylor, **off),
      "inc": lambda: dsgrad.inc(objective, **off),
      "joint": lambda: dsgrad.joint_saga(objective, taylor, warmup_steps=warmup, **off),
  }[name]()


def _trainer(estimator, objective, params0, batch_size, num_steps, num_evals):
  """``(step_size, key) -> (params at each of num_evals evenly spaced steps, final state)``."""
  per_eval = num_steps // num_evals

  def train(step_size, key):
    opt = optax.chain(estimator, optax.sgd(step_size))
    batch_key, noise_key = jax.random.split(key)

    def step(carry, t):
      params, state = carry
      idx = batch_indices(batch_key, t, 1, objective.num_data, batch_size)[0]
      noise = objective.sample_noise(jax.random.fold_in(noise_key, t), batch_size)
      grads = objective.grad(params, idx, noise, validate=False)
      updates, state = opt.update(grads, state, params, indices=idx, noise=noise)
      return (optax.apply_updates(params, updates), state), None

    def segment(carry, first):
      carry, _ = jax.lax.scan(step, carry, first + jnp.arange(per_eval))
      return carry, carry[0]

    carry = (params0, opt.init(params0))
    carry, trace = jax.lax.scan(segment, carry, per_eval * jnp.arange(num_evals))
    return trace, carry[1]

  return train


def _elbo_fn(objective, num_samples):
  idx = jnp.arange(objective.num_data, dtype=jnp.int32)

  def elbo(params, key):
    def one(k):
      return -jnp.mean(objective.loss(params, idx, objective.sample_noise(k, idx.shape[0]),
                                      validate=False))
    return jnp.mean(jax.lax.map(one, jax.random.split(key, num_samples), batch_size=100))

  return jax.jit(jax.vmap(elbo, in_axes=(0, None)))


def run_uci(dataset, data_dir, *, num_steps, num_evals, seeds, step_sizes, batch_size=5,
            out_dir="docs/figures"):
  model, objective = _uci_problem(dataset, data_dir)
  params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  warmup = model.num_data // batch_size
  lrs = jnp.asarray(step_sizes, jnp.float32)
  keys = jax.random.split(jax.random.key(0), seeds)
  elbo_trace = _elbo_fn(objective, 500)
  elbo_final = _elbo_fn(objective, 5000)
  results, endpoint = {}, {}
  for name in ESTIMATORS:
    est = _estimator(name, objective, model, warmup)
    train = _trainer(est, objective, params0, batch_size, num_steps, num_evals)
    t0 = time.perf_counter()
    runs = jax.jit(jax.vmap(jax.vmap(train, in_axes=(None, 0)), in_axes=(0, None)))
    traces, states = runs(lrs, keys)            # leaves (L, S, E, ...)
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
    sane = np.asarray(jax.tree.reduce(jnp.logical_and, jax.tree.map(
        lambda a: jnp.all(jnp.isfinite(a) & (jnp.abs(a) < 1e3),
                          axis=tuple(range(3, a.ndim))), traces)))
    sane = np.cumprod(sane, axis=2).astype(bool)
    values = np.where(sane, values, np.nan)
    final = np.where(sane[:, :, -1], final, np.nan)
    results[name] = dict(trace=values, final=final, seconds=seconds)
    # The Table 1 step size (5e-4), seed 0: params and estimator state at the endpoint.
    i = int(np.argmin(np.abs(np.asarray(step_sizes) - 5e-4)))
    endpoint[name] = (jax.tree.map(lambda a: a[i, 0, -1], traces),
                      jax.tree.map(lambda a: a[i, 0], states), est)
    print(f"  {dataset} {name:<6} {seconds:7.1f} s for {len(step_sizes)} x {seeds} runs", flush=True)
  variances = _endpoint_variances(objective, endpoint, batch_size)
  return model, results, variances


def _endpoint_variances(objective, endpoint, batch_size):
  out = {}
  for name, (params, state, est) in endpoint.items():
    var, se = total_variance(estimator_samples(est, state[0], params, objective,
                                               jax.random.key(3), 4000, batch_size))
    table1 = dsgrad.variance_decomposition(objective, params, jax.random.key(4), batch_size)
    out[name] = dict(var=var, se=se, **table1)
  return out


def _mean_over_seeds(values):
  """Mean over seeds treating diverged runs (nan) as -inf, so they are never 'best'."""
  v = np.where(np.isfinite(values), values, -np.inf)
  return v.mean(axis=1)


def summarize(dataset, results, num_steps, num_evals, step_sizes):
  steps = (np.arange(num_evals) + 1) * (num_steps // num_evals)
  best_trace = {n: _mean_over_seeds(r["trace"]).max(0) for n, r in results.items()}
  naive_final = best_trace["naive"][-1]
  rows = []
  for name, r in results.items():
    finals = _mean_over_seeds(r["final"][:, :, None])[:, 0]
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
           best_trace["naive"][-1] - 3 * abs(best_trace["naive"][-1] - best_trace["joint"][-1]) - 5)
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
  joint = next(r for r in rows if r["name"] == "joint")
  verdict = ("reproduced" if joint["reach"] is not None and naive["reach"]
             and joint["reach"] <= naive["reach"] / 5 else "NOT reproduced")
  lines += ["", f"Claim (joint reaches naive's final ELBO in at most 1/5 of the iterations): "
            f"**{verdict}**.", "",
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
  parser = argparse.ArgumentParser(prog="python -m dsgrad.bench paper",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("task", choices=["uci"], help="which experiment")
  parser.add_argument("--datasets", default="sonar,australian")
  parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data"))
  parser.add_argument("--steps", type=int, default=10_000)
  parser.add_argument("--evals", type=int, default=40)
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  sections = []
  config = dict(batch_size=5)
  for dataset in args.datasets.split(","):
    model, results, variances = run_uci(dataset, args.data_dir, num_steps=args.steps,
                                        num_evals=args.evals, seeds=args.seeds,
                                        step_sizes=UCI_STEP_SIZES)
    steps, best_trace, rows = summarize(dataset, results, args.steps, args.evals, UCI_STEP_SIZES)
    figure = f"figures/paper_uci_{dataset}.png"
    _figure(dataset, steps, best_trace, rows, UCI_STEP_SIZES,
            os.path.join(os.path.dirname(__file__), "..", "..", "docs", figure))
    sections.append(format_uci(dataset, model, rows, variances, config, figure))
  body = "\n\n".join([
      f"Command: `python -m dsgrad.bench paper uci --steps {args.steps} --seeds {args.seeds}` -- "
      f"SGD, batch 5, step sizes {', '.join(f'{s:g}' for s in UCI_STEP_SIZES)} (App. D), "
      f"{args.seeds} seeds, {args.steps:,} iterations, ELBO every {args.steps // args.evals} "
      f"iterations (500 MC samples; final: 5,000). Traces use the best step size per "
      f"iteration (mean over seeds; a run counts as diverged, -inf, from the first "
      f"evaluation where a parameter is non-finite or exceeds 1e3 in size).",
      f"Measured: {_report.environment()}"] + sections)
  print(body)
  if not args.no_write:
    print("wrote", _report.write_section(f"paper-uci-{jax.default_backend()}", body))
  return 0
