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
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad.diagnostics import elbo, epoch_batches, estimator_samples, total_variance
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
  x = np.concatenate([x, np.ones((x.shape[0], 1), np.float32)], axis=1)
  return x.astype(np.float32), np.asarray(y, int)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--dataset", default="breast_cancer",
                      choices=["breast_cancer", "sonar", "australian"])
  parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data"),
                      help="folder with sonar.all-data / australian.dat")
  parser.add_argument("--steps", type=int, default=3000, help="SGD steps per estimator")
  parser.add_argument("--batch-size", type=int, default=5)
  parser.add_argument("--lr", type=float, default=5e-4, help="SGD step size")
  parser.add_argument("--approx", default="taylor", choices=["taylor", "linearize"],
                      help="f~: the paper's mean-only Taylor expansion (App. F) or the "
                           "generic first-order expansion in the noise")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join("results", "logistic_regression"))
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
  batches = epoch_batches(jax.random.fold_in(key, 1), n, args.batch_size, args.steps)
  noise_keys = jax.random.split(jax.random.fold_in(key, 2), args.steps)
  record_every = max(1, args.steps // 30)
  print(f"{args.dataset}: N={n}, D={model.latent_dim}, batch {args.batch_size}, "
        f"SGD lr={args.lr}, {args.steps} steps")

  results, traces = {}, {}
  for name, est in estimators.items():
    opt = optax.chain(est, optax.sgd(args.lr))

    def step(carry, inputs):
      params, state = carry
      indices, k = inputs
      noise = objective.sample_noise(k, args.batch_size)
      grads = objective.grad(params, indices, noise)
      updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
      return (optax.apply_updates(params, updates), state), params

    run = jax.jit(lambda c, xs: jax.lax.scan(step, c, xs), donate_argnums=0)
    fresh = lambda: jax.tree.map(jnp.copy, (init, opt.init(init)))  # donated below
    run(fresh(), (batches[:2], noise_keys[:2]))  # compile
    carry = fresh()
    start = time.perf_counter()
    (params, state), path = run(carry, (batches, noise_keys))
    jax.block_until_ready(params)
    per_step = (time.perf_counter() - start) / args.steps
    trace = [(int(t), elbo(objective, jax.tree.map(lambda p: p[t], path),
                           jax.random.key(t), 200)[0])
             for t in range(0, args.steps, record_every)]
    final, final_se = elbo(objective, params, jax.random.key(99), 2000)
    var, _ = total_variance(estimator_samples(est, state[0], params, objective,
                                              jax.random.key(3), 2000, args.batch_size))
    results[name] = {"final_elbo": final, "final_elbo_se": final_se,
                     "grad_variance": var, "ms_per_step": 1e3 * per_step,
                     "table_bytes": dsgrad.table_bytes(state)}
    traces[name] = trace

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
