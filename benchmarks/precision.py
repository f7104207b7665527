"""The variance cost of storing joint SAGA's table in low precision.

``dsgrad.joint_saga(..., table_dtype=...)`` stores the table rows in bfloat16 or float16
and computes in float32; ``G`` is kept consistent with the rounded rows, so the estimator
stays unbiased, but rounding makes the control variate less accurate. This benchmark
trains the same problem from the same start with each table dtype (same batches and
noise), then at each run's endpoint draws the estimator's output for fresh batches at
fixed state and reports its total variance next to naive's, with the table memory and
the final ELBO.

Problem: mean-field Gaussian BBVI for binary logistic regression on synthetic data
(N, D configurable), Adam, batch B, the paper's App. F approximation (dense table) and
the GLM logit table.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from dsgrad.models import logistic_regression, synthetic_logistic_data

DTYPES = {"float32": None, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def run(num_data=10_000, num_features=100, batch_size=100, steps=1000, draws=2000, lr=1e-2):
  """``[(approximation, dtype, table bytes, variance, se, naive variance, final ELBO)]``."""
  x, y, _ = synthetic_logistic_data(jax.random.key(0), num_data, num_features)
  model = logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  params0 = dsgrad.meanfield_init(model, 0.0, -2.0)
  approximations = {"App. F, dense table": dsgrad.approx.gaussian_mean_taylor(model),
                    "App. F, logit table": dsgrad.approx.glm_mean_taylor(model)}
  rows = []
  for approx_name, approx in approximations.items():
    for dtype_name, dtype in DTYPES.items():
      estimator = dsgrad.joint_saga(objective, approx, table_dtype=dtype, control_weight=1.0)
      fit = dsgrad.fit(objective, optax.chain(estimator, optax.adam(lr)), params0,
                       jax.random.key(1), num_steps=steps, batch_size=batch_size,
                       elbo_samples=0, progress=False)
      state = fit.opt_state[0]
      key = jax.random.key(2)
      variance, se = dsgrad.total_variance(dsgrad.estimator_samples(
          estimator, state, fit.params, objective, key, draws, batch_size))
      naive, _ = dsgrad.total_variance(dsgrad.estimator_samples(
          dsgrad.naive(), dsgrad.naive().init(fit.params), fit.params, objective, key, draws,
          batch_size))
      elbo, elbo_se = dsgrad.elbo(objective, fit.params, jax.random.key(3), 2000)
      rows.append((approx_name, dtype_name, dsgrad.table_bytes(fit.opt_state), variance, se,
                   naive, float(elbo), float(elbo_se)))
      print(f"  {approx_name:<20} {dtype_name:<9} variance {variance:.4g} ± {se:.2g} "
            f"(naive {naive:.4g}), table {rows[-1][2] / 2**20:.2f} MiB, ELBO {float(elbo):.2f}",
            flush=True)
  return rows


def format_table(rows, config):
  lines = [
      f"Command: `python -m benchmarks precision` -- binary logistic regression, synthetic, "
      f"N = {config['num_data']:,}, D = {config['num_features']} (intercept included), "
      f"mean-field Gaussian BBVI, batch {config['batch_size']}, Adam {config['lr']}, "
      f"{config['steps']:,} steps from the same start with the same batches and noise; "
      f"variance: trace of the covariance of {config['draws']:,} draws of the estimator at "
      "the run's endpoint (fresh batches, fixed state), naive's at the same point beside it.",
      "",
      f"Measured: {_report.environment()}",
      "",
      "| approximation | table dtype | table | joint variance (± se) | ratio to float32 | naive variance | final ELBO (± se) |",
      "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  base = {r[0]: r[3] for r in rows if r[1] == "float32"}
  for approx, dtype, table, var, se, naive, elbo, elbo_se in rows:
    lines.append(f"| {approx} | {dtype} | {table / 2**20:,.2f} MiB | {var:.4g} ± {se:.2g} | "
                 f"{var / base[approx]:.2f}x | {naive:.4g} | {elbo:.2f} ± {elbo_se:.2f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks precision",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num-data", type=command_line.count(1), default=10_000, help="N")
  parser.add_argument("--num-features", type=command_line.count(1),
                      default=100, help="D, intercept included")
  parser.add_argument("--batch-size", type=command_line.count(1), default=100, help="B")
  parser.add_argument("--steps", type=command_line.count(1),
                      default=1000, help="training steps per run")
  parser.add_argument("--draws", type=command_line.count(1), default=2000,
                      help="estimator draws per variance estimate")
  parser.add_argument("--lr", type=command_line.positive(), default=1e-2, help="Adam step size")
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  config = dict(num_data=args.num_data, num_features=args.num_features,
                batch_size=args.batch_size, steps=args.steps, draws=args.draws, lr=args.lr)
  rows = run(**config)
  table = format_table(rows, config)
  _report.publish(f"precision-{jax.default_backend()}", table, not args.no_write)
  return 0
