"""Quickstart: compare dsgrad's gradient estimators on Bayesian logistic regression.

Mean-field Gaussian BBVI on a small real data set, plain SGD (as in the paper's
Sonar/Australian experiments), the same step size and batches for every estimator.
Prints the final full-data ELBO, the gradient variance at the endpoint and the time per
step; saves a plot of ELBO traces when matplotlib is installed.

    python examples/logistic_regression.py                      # breast cancer (scikit-learn)
    python examples/logistic_regression.py --dataset sonar --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from _common import check_checkpoint_config
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


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--dataset", default="breast_cancer",
                      choices=["breast_cancer", "sonar", "australian"],
                      help="data set (breast_cancer ships with scikit-learn)")
  parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data"),
                      help="folder with sonar.all-data / australian.dat")
  parser.add_argument("--steps", type=int, default=3000, help="SGD steps per estimator")
  parser.add_argument("--batch-size", type=int, default=5,
                      help="data per step")
  parser.add_argument("--lr", type=float, default=5e-4, help="SGD step size")
  parser.add_argument("--approx", default="taylor", choices=["taylor", "linearize"],
                      help="f~: the paper's mean-only Taylor expansion (App. F) or the "
                           "generic first-order expansion in the noise")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of every batch and noise draw (runs are deterministic given it)")
  parser.add_argument("--checkpoint-dir", default=None,
                      help="save every run here; a rerun resumes where it stopped")
  parser.add_argument("--no-progress", action="store_true", help="no progress bars")
  parser.add_argument("--out", default=os.path.join("results", "logistic_regression"),
                      help="folder for results.json and the figures")
  args = parser.parse_args(argv)

  x, y = load(args.dataset, args.data_dir)
  model = logistic_regression(x, y, name=args.dataset)
  objective = dsgrad.meanfield_gaussian(model)
  n = model.num_data
  key = jax.random.key(args.seed)
  init = {"loc": jax.random.normal(key, (model.latent_dim,)),
          "log_scale": jnp.zeros(model.latent_dim)}
  steps_per_epoch = n // args.batch_size
  approx = (dsgrad.approx.gaussian_mean_taylor(model) if args.approx == "taylor"
            else dsgrad.approx.linearize())
  estimators = {
      "naive": dsgrad.naive(),
      "cv": dsgrad.cv(objective, approx),
      "inc": dsgrad.inc(objective),
      "joint_svrg": dsgrad.joint_svrg(objective, approx, every=steps_per_epoch),
      "joint_saga": dsgrad.joint_saga(objective, approx, warmup_steps=steps_per_epoch),
  }
  eval_every = max(1, args.steps // 30)
  if args.steps % eval_every:
    parser.error(f"--steps must be a multiple of {eval_every} (steps // 30)")
  print(f"{args.dataset}: N={n}, D={model.latent_dim}, batch {args.batch_size}, "
        f"SGD lr={args.lr}, {args.steps} steps")
  check_checkpoint_config(args.checkpoint_dir, {
      k: v for k, v in vars(args).items()
      if k not in ("steps", "out", "checkpoint_dir", "no_progress")})

  results, traces = {}, {}
  for name, est in estimators.items():
    path = (os.path.join(args.checkpoint_dir, f"{name}.msgpack") if args.checkpoint_dir
            else None)
    fit = dsgrad.fit(objective, optax.chain(est, optax.sgd(args.lr)), init, key,
                     num_steps=args.steps, batch_size=args.batch_size, eval_every=eval_every,
                     elbo_samples=200, progress=not args.no_progress, checkpoint_path=path,
                     resume=True)
    params, state = fit.params, fit.opt_state
    final, final_se = elbo(objective, params, jax.random.key(99), 2000)
    var, _ = total_variance(estimator_samples(est, state[0], params, objective,
                                              jax.random.key(3), 2000, args.batch_size))
    results[name] = {"final_elbo": final, "final_elbo_se": final_se,
                     "grad_variance": var,
                     "ms_per_step": 1e3 * float(fit.history.wall_time[-1]) / args.steps,
                     "table_bytes": dsgrad.table_bytes(state)}
    traces[name] = [(0, float(elbo(objective, init, jax.random.key(0), 200)[0]))] + [
        (int(t), float(v)) for t, v in zip(fit.history.step, fit.history.elbo)]

  print(f"\n{'estimator':<11} {'final ELBO':>16} {'grad variance':>14} {'ms/step':>8} {'table':>9}")
  for name, r in results.items():
    print(f"{name:<11} {r['final_elbo']:>9.2f} ± {r['final_elbo_se']:<4.2f} "
          f"{r['grad_variance']:>14.3g} {r['ms_per_step']:>8.3f} {r['table_bytes']:>8d}B")

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"args": vars(args), "results": results, "traces": traces}, f, indent=1)
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print(f"\nwrote {args.out}/results.json (install matplotlib for the plot)")
    return results
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, trace in traces.items():
    t, v = zip(*trace)
    ax.plot(t, v, label=name)
  ax.set_xlabel("iteration")
  ax.set_ylabel("full-data ELBO")
  lo = min(min(v for _, v in tr[len(tr) // 3:]) for tr in traces.values())
  hi = max(max(v for _, v in tr) for tr in traces.values())
  ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.05 * (hi - lo))
  ax.set_title(f"{args.dataset}: SGD lr={args.lr}, batch {args.batch_size}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "elbo.png"), dpi=120)
  print(f"\nwrote {args.out}/results.json and {args.out}/elbo.png")
  return results


if __name__ == "__main__":
  main()
