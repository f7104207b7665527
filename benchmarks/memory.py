"""State memory of every estimator on the paper's tasks at their full size.

Each estimator's state is built with ``jax.eval_shape`` (shapes only, nothing allocated)
on synthetic data of the paper's sizes: MNIST softmax regression (N = 60,000,
D = 785 x 10), PPCA on MNIST-sized images (N = 60,000, D = 784 x 16), tennis
Bradley-Terry (N = 169,405 matches, 5,525 players) and MovieLens (N = 100,000 ratings,
943 users, D = 85,050). The table reports ``dsgrad.table_bytes`` and
``dsgrad.state_bytes`` (the estimator's state, Adam's moments excluded) next to the
paper's dense Theta(N x D) figure.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import dsgrad
from benchmarks import _report
from dsgrad import models

_bytes = _report.format_bytes


def _tasks():
  """``{name: (model, has a logit table)}`` at the paper's sizes, synthetic data."""
  key = jax.random.key(0)
  out = {}
  x = np.asarray(jax.random.normal(key, (60_000, 785)), np.float32)
  y = np.asarray(jax.random.randint(key, (60_000,), 0, 10), np.int32)
  out["mnist"] = (models.softmax_regression(x, y, 10, name="mnist"), True)
  out["ppca"] = (models.ppca(x[:, :784], latent_dim=16), False)
  winners, losers, _ = models.synthetic_bradley_terry_data(key, 5_525, 169_405)
  out["tennis"] = (models.bradley_terry(winners, losers, 5_525, name="tennis"), False)
  users, genres, ratings = models.synthetic_movielens_data(key, 943, 1_682, 100_000)
  out["movielens"] = (models.movielens(users, genres, ratings, 943), False)
  return out


def run():
  """``[(task, N, D, estimator, table bytes, state bytes)]``."""
  rows = []
  for name, (model, glm) in _tasks().items():
    objective = dsgrad.meanfield_gaussian(model)
    params = jax.eval_shape(lambda: dsgrad.meanfield_init(model))
    taylor = dsgrad.approx.gaussian_mean_taylor(model)
    every = model.num_data // 100
    estimators = {
        "naive": dsgrad.naive(),
        "cv": dsgrad.cv(objective, taylor),
        "joint_svrg": dsgrad.joint_svrg(objective, taylor, every=every),
        "joint_saga (dense table)": dsgrad.joint_saga(objective, taylor),
        "joint_saga (dense, bfloat16)": dsgrad.joint_saga(objective, taylor,
                                                           table_dtype=jax.numpy.bfloat16),
        "inc": dsgrad.inc(objective),
        "smiso": dsgrad.smiso(objective, 1e-3),
    }
    if glm:
      estimators["joint_saga (logit table)"] = dsgrad.joint_saga(
          objective, dsgrad.approx.glm_mean_taylor(model))
    if model.sparse is not None:
      estimators["joint_saga (sparse table)"] = dsgrad.joint_saga(
          objective, dsgrad.approx.sparse_linearize(model))
    for est_name, estimator in estimators.items():
      state = jax.eval_shape(estimator.init, params)
      rows.append((name, model.num_data, model.latent_dim, est_name,
                   dsgrad.table_bytes(state), dsgrad.state_bytes(state)))
      print(f"  {name:<10} {est_name:<30} table {rows[-1][4] / 2**30:8.2f} GiB, "
            f"state {rows[-1][5] / 2**30:8.2f} GiB", flush=True)
  return rows


def format_table(rows):
  lines = [
      "Command: `python -m benchmarks memory` -- each estimator's state from "
      "`jax.eval_shape(estimator.init, params)` (nothing allocated) for mean-field Gaussian "
      "BBVI at the paper's sizes on synthetic data of those shapes. `P = 2 D` variational "
      "parameters. The paper's dense figure is `N x D` float32 (its 34 GB for MovieLens).",
      "",
      f"Measured: {_report.environment()}",
      "",
      "| task | N | D | estimator | table | whole estimator state | paper's dense N x D |",
      "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
  ]
  for task, n, d, est, table, state in rows:
    lines.append(f"| {task} | {n:,} | {d:,} | {est} | {_bytes(table)} | {_bytes(state)} | "
                 f"{_bytes(4 * n * d)} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks memory",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  rows = run()
  table = format_table(rows)
  _report.publish("memory", table, not args.no_write)
  return 0
