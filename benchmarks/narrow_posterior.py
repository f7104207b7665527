"""Where naive's Monte Carlo noise holds a run back on a posterior it could fit exactly.

Bayesian linear regression with unit noise and a ``N(0, I)`` prior, written as a user
would with :func:`dsgrad.objective_from_logdensity`: its posterior is Gaussian, so the KL
divergence from each run's ``q`` to it is exact (no ELBO estimate, no draws). With many
rows the posterior's scales are about ``1 / sqrt(N)``, far below the prior's, and the
reparameterization gradient of the log likelihood with respect to a scale carries Monte
Carlo noise of the order of the likelihood's curvature (``N`` times a datum's) times the
scale: near the optimum it swamps the signal, Adam's steps on the scales shrink to the
noise's, and the scales settle slowly. Sticking the landing (``path_derivative=True``)
removes the entropy's part of that noise, not the likelihood's; a control variate on the
likelihood removes it.

Every contender gets the same seconds of steps (its step timed on a probe run, the schedule
sized to the steps that fit), the same data, initial params (the family's default), batch
and Adam with a cosine decay; its peak step size is the best on an unreported seed among
``--peaks``. Contenders: naive; naive with sticking the landing; the equal-cost naive
variants (twice the batch, two Monte Carlo samples per datum); cv; joint SVRG (refreshed
once an epoch); joint SAGA. Both families: mean-field and full-rank. The table gives the
KL (mean over seeds, standard error), its part from the mean and from the covariance, and
each contender's KL over naive's.

    python -m benchmarks narrow-posterior
    python -m benchmarks narrow-posterior --num-data 100000 --seconds 2 --seeds 0
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from dsgrad.elbo_estimates import mean_and_standard_error
from benchmarks import _report

CONTENDERS = ("naive", "naive, sticking the landing", "naive, 2x batch",
              "naive, 2 samples per datum", "cv", "joint_svrg", "joint_saga")
FAMILIES = ("meanfield", "fullrank")
TUNE_SEED = 100


def problem(num_data: int, dim: int, seed: int = 0) -> dict:
  """Rows ``x`` (two columns correlated at 0.9: a posterior that is not diagonal) and
  ``y = x w + noise``; the exact posterior's mean and precision (float64)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_data, dim))
  x[:, 1] = 0.9 * x[:, 0] + np.sqrt(1 - 0.81) * x[:, 1]
  y = x @ rng.standard_normal(dim) + rng.standard_normal(num_data)
  x, y = x.astype(np.float32), y.astype(np.float32)  # the data the objective reads
  wide_x, wide_y = x.astype(np.float64), y.astype(np.float64)
  precision = wide_x.T @ wide_x + np.eye(dim)
  return {"x": x, "y": y, "precision": precision,
          "mean": np.linalg.solve(precision, wide_x.T @ wide_y)}


def objective(data: dict, family: str, path_derivative: bool = False):
  """The user's objective: ``log p(z) + sum_n log N(y_n | x_n z, 1)`` (constants dropped)."""
  return dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, rows: -0.5 * (rows["y"] - rows["x"] @ z) ** 2,
      {"x": data["x"], "y": data["y"]}, data["x"].shape[1], family=family,
      path_derivative=path_derivative)


def covariance(params: dict) -> np.ndarray:
  """``q``'s covariance, float64, from either family's params."""
  if "log_scale" in params:
    return np.diag(np.exp(2 * np.asarray(params["log_scale"], np.float64)))
  factor = np.asarray(dsgrad.families.FullRankGaussian.cholesky(params), np.float64)
  return factor @ factor.T


def kl_to_posterior(params: dict, data: dict) -> tuple[float, float]:
  """``(from the mean, from the covariance)``: the two parts of ``KL(q || posterior)``,
  both Gaussian (their sum is the KL)."""
  precision, cov = data["precision"], covariance(params)
  gap = np.asarray(params["loc"], np.float64) - data["mean"]
  logdet = np.linalg.slogdet(precision)[1] + np.linalg.slogdet(cov)[1]
  return (0.5 * gap @ precision @ gap,
          0.5 * (np.trace(precision @ cov) - len(gap) - logdet))


def _kl(run: dict) -> float:
  """A run's KL: the sum of its two parts."""
  return run["kl_mean"] + run["kl_cov"]


def family_floor(data: dict, family: str) -> float:
  """The least KL the family can reach, in closed form: 0 for the full-rank Gaussian; for
  the mean-field one (its best q has the posterior's mean and the precision's diagonal as
  precisions) ``(sum_i log Lambda_ii - log det Lambda) / 2``."""
  if family == "fullrank":
    return 0.0
  precision = data["precision"]
  return float(0.5 * (np.sum(np.log(np.diag(precision))) - np.linalg.slogdet(precision)[1]))


def _setup(name: str, data: dict, family: str, batch_size: int):
  """``(objective, estimator, batch size)`` of a contender."""
  base = objective(data, family, path_derivative=name == "naive, sticking the landing")
  if name == "naive, 2 samples per datum":
    return dsgrad.multi_sample(base, 2), dsgrad.naive(), batch_size
  if name == "naive, 2x batch":
    return base, dsgrad.naive(), 2 * batch_size
  estimator = {"cv": dsgrad.cv, "joint_svrg": dsgrad.joint_svrg,
               "joint_saga": dsgrad.joint_saga}.get(name)
  return base, (estimator(base) if estimator else dsgrad.naive()), batch_size


def run_one(name: str, data: dict, family: str, peak: float, seed: int, seconds: float,
            batch_size: int) -> dict:
  """One contender's run for ``seconds`` of steps: its step timed on a probe with the run's
  segments (an epoch, fit's default: shorter ones cost more a step) after the first update
  (which fills a table or takes a snapshot), on about a tenth of ``seconds``; then a cosine
  schedule over the steps that fit, run again on the steps its own step time affords where
  it took over 10% more or less than ``seconds`` (the probe's constant step size is
  another program, whose step was 0.7-1.4 times the run's)."""
  obj, estimator, batch = _setup(name, data, family, batch_size)
  # Standard deviation 1: the start its published figures were measured from.
  params = dsgrad.families.by_name(family, data["x"].shape[1], log_scale=0.0).params()
  key, segment = jax.random.key(seed), max(1, obj.num_data // batch)
  settings = dict(batch_size=batch, elbo_samples=0, progress=False, segment_steps=segment)
  constant = optax.chain(estimator, optax.adam(peak))
  first = dsgrad.fit(obj, constant, params, key, num_steps=segment, **settings)
  segments = max(1, min(10, round(0.1 * seconds / first.timing.steps)))
  timed = dsgrad.fit(obj, constant, first.params, key, num_steps=(1 + segments) * segment,
                     opt_state=first.opt_state, start_step=segment, **settings)
  steps = max(segment, int(seconds / (timed.timing.steps / (segments * segment))))
  for _ in range(2):  # sized again from its own step where the probe's was 10% off
    result = dsgrad.fit(obj, optax.chain(estimator, optax.adam(
        optax.cosine_decay_schedule(peak, steps, alpha=0.01))), params, key, num_steps=steps,
                        **settings)
    if abs(result.timing.steps / seconds - 1) <= 0.1:
      break
    steps = max(segment, int(seconds / (result.timing.steps / steps)))
  mean_part, cov_part = kl_to_posterior(result.params, data)
  return {"steps": steps, "seconds": result.timing.steps, "kl_mean": mean_part,
          "kl_cov": cov_part, "finite": bool(np.isfinite(mean_part + cov_part))}


def run(num_data: int, dim: int, seconds: float, seeds, peaks, batch_size: int,
        families=FAMILIES, contenders=CONTENDERS) -> dict:
  data = problem(num_data, dim)
  out = {}
  for family in families:
    for name in contenders:
      tuned = {peak: run_one(name, data, family, peak, TUNE_SEED, seconds, batch_size)
               for peak in peaks}
      kl = lambda r: _kl(r) if r["finite"] else np.inf
      peak = min(peaks, key=lambda p: kl(tuned[p]))
      runs = [run_one(name, data, family, peak, seed, seconds, batch_size) for seed in seeds]
      out[f"{family}|{name}"] = {"peak": peak, "tuning": {str(p): kl(tuned[p]) for p in peaks},
                                 "runs": runs}
      total = [_kl(r) for r in runs]
      print(f"  {family:<9} {name:<28} peak {peak:g}: KL {statistics.mean(total):.3f} "
            f"({', '.join(f'{t:.3f}' for t in total)})", flush=True)
  return {"config": {"num_data": num_data, "dim": dim, "seconds": seconds, "seeds": list(seeds),
                     "peaks": list(peaks), "batch_size": batch_size},
          "floors": {family: family_floor(data, family) for family in families},
          "results": out}


def _mean_se(values) -> tuple[float, float]:
  """Mean and standard error over seeds; no error from one seed."""
  if len(values) > 1:
    return mean_and_standard_error(values)
  return float(np.mean(values)), float("nan")


def render(record) -> str:
  data, config = record["results"]["results"], record["results"]["config"]
  lines = [
      f"Bayesian linear regression, N = {config['num_data']:,} rows, D = {config['dim']} "
      f"(two features correlated at 0.9), `objective_from_logdensity`; "
      f"{config['seconds']:g} s of steps per run, batch {config['batch_size']}, Adam with a "
      f"cosine decay to 1% of a peak tuned per contender on seed {TUNE_SEED} among "
      f"{config['peaks']}; seeds {config['seeds']}. KL(q || exact posterior) in closed form: "
      f"mean over seeds (standard error); the least a family can reach (closed form): "
      + ", ".join(f"{family} {floor:.3f}" for family, floor in record["results"]["floors"].items())
      + f". Command: `{record['command']}`; measured: {record['environment']}.", "",
      "| family | contender | peak | steps | seconds of steps | KL | from the mean | "
      "from the covariance | KL above the family's least, over naive's | KL on the tuning "
      "seed at each peak |", "|---|---|---|---|---|---|---|---|---|---|"]
  for key, row in data.items():
    family, name = key.split("|")
    runs = row["runs"]
    total = _mean_se([_kl(r) for r in runs])
    naive = _mean_se([_kl(r) for r in data[f"{family}|naive"]["runs"]])
    floor = record["results"]["floors"][family]
    lines.append(
        f"| {family} | {name} | {row['peak']:g} | "
        f"{statistics.mean(r['steps'] for r in runs):,.0f} | "
        f"{statistics.mean(r['seconds'] for r in runs):.2f} | {total[0]:.3f} ({total[1]:.3f}) | "
        f"{statistics.mean(r['kl_mean'] for r in runs):.3f} | "
        f"{statistics.mean(r['kl_cov'] for r in runs):.3f} | "
        f"{(total[0] - floor) / (naive[0] - floor):.3f} | "
        + ", ".join(f"{float(p):g}: {kl:.3g}" for p, kl in row["tuning"].items()) + " |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks narrow-posterior",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num-data", type=command_line.count(2), default=1_000_000)
  parser.add_argument("--dim", type=command_line.count(2), default=10)
  parser.add_argument("--seconds", type=float, default=5.0)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--peaks", type=float, nargs="+",
                      default=[0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03])
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
  parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
  _report.add_output_flags(parser, "narrow-posterior")
  args = parser.parse_args(argv)
  if not (args.seconds > 0 and np.isfinite(args.seconds)):
    parser.error(f"--seconds must be positive and finite, got {args.seconds}")
  results = run(args.num_data, args.dim, args.seconds, args.seeds, args.peaks, args.batch_size,
                args.families, args.contenders)
  section = _report.section_of(args, "narrow-posterior")
  _report.publish(section, None, not args.no_write, results, render)


if __name__ == "__main__":
  main()
