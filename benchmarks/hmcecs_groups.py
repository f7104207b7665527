"""HMC-ECS at a few thousand latents: a Gaussian random-intercept regression, written as a
user writes it (``dsgrad.model_from_logdensity``, its group column's reads found), whose
posterior is Gaussian in closed form.

Two tables. The kernel alone (``dsgrad.mcmc.hmcecs``, jitted, a fixed step size, ``L`` and
subsample): milliseconds per iteration with the mass matrix given as a dense ``(d, d)``
identity and as its ``(d,)`` diagonal, for second- and first-order proxies (the same
chain either way; the diagonal costs ``O(d)`` a leapfrog step, the dense one ``O(d^2)``).
Then ``dsgrad.mcmc.sample`` from start to finish with each mass setting, and full-data HMC
with the same tuning (``estimator="full"``): its setup and warm-up seconds, sampling
milliseconds per iteration, the least effective sample size and its rate, and the draws
against the exact posterior (each coordinate's mean error in Monte Carlo standard errors,
its standard deviation over the exact one).

    python -m benchmarks hmcecs-groups                 # N = 200,000, 3,000 groups
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import _report
from dsgrad import command_line


def _problem(num_data: int, groups: int, features: int, seed: int = 8):
  """The model and its exact posterior mean and standard deviations."""
  import jax.numpy as jnp
  import dsgrad
  rng = np.random.default_rng(seed)
  g = rng.integers(0, groups, num_data)
  x = rng.normal(size=(num_data, features))
  y = x @ rng.normal(size=features) + 0.5 * rng.normal(size=groups)[g] + rng.normal(size=num_data)
  data = {"x": x.astype(np.float32), "y": y.astype(np.float32), "g": g.astype(np.int32)}

  def log_prior(z):  # group effects ~ N(0, 0.5^2), coefficients ~ N(0, 1)
    return -0.5 * jnp.sum(z["a"] ** 2) / 0.25 - 0.5 * jnp.sum(z["beta"] ** 2)

  def log_lik(z, rows):  # unit noise
    return -0.5 * (rows["y"] - rows["x"] @ z["beta"] - z["a"][rows["g"]]) ** 2

  latent = {"a": jnp.zeros(groups), "beta": jnp.zeros(features)}
  model = dsgrad.model_from_logdensity(log_prior, log_lik, data, latent)
  # The posterior precision, in the latent's ravel order (a, then beta).
  precision = np.zeros((groups + features,) * 2)
  precision[:groups, :groups] = np.diag(np.bincount(g, minlength=groups) + 4.0)
  precision[groups:, groups:] = x.T @ x + np.eye(features)
  cross = np.zeros((groups, features))
  np.add.at(cross, g, x)
  precision[:groups, groups:], precision[groups:, :groups] = cross, cross.T
  covariance = np.linalg.inv(precision)
  mean = covariance @ np.concatenate([np.bincount(g, weights=y, minlength=groups), x.T @ y])
  return model, mean, np.sqrt(np.diag(covariance))


def _kernel_times(model, subsample_size: int, steps: int, calls: int) -> list:
  import jax
  import jax.numpy as jnp
  import dsgrad
  mcmc, d = dsgrad.mcmc, model.latent_dim
  star = mcmc.find_reference_point(model, jax.random.key(1))
  scheme = mcmc.perturbed(model, subsample_size, 10)
  rows = []
  for order in (2, 1):
    proxy = mcmc.taylor_proxy(model, star, order=order)
    for label, mass in (("dense (d, d) identity", jnp.eye(d)), ("diagonal (d,)", jnp.ones(d))):
      params = mcmc.hmc_parameters(0.01, steps, mass)
      # The proxy and the parameters are arguments, as in dsgrad.mcmc.sample's chain.
      step = jax.jit(mcmc.build_kernel(model, scheme))
      state = mcmc.init(model, scheme, proxy, star, jax.random.key(2))
      for key in jax.random.split(jax.random.key(3), 2):  # the first call's state retraces
        state, _ = step(key, state, proxy, params)
      jax.block_until_ready(state)
      started = time.perf_counter()
      for key in jax.random.split(jax.random.key(4), calls):
        state, _ = step(key, state, proxy, params)
      jax.block_until_ready(state)
      rows.append({"order": order, "mass": label,
                   "ms_per_iteration": (time.perf_counter() - started) / calls * 1e3})
  return rows


def _sampled(model, mean, sd, num_samples: int, num_warmup: int) -> list:
  import jax
  import dsgrad
  rows = []
  for label, settings in (("HMC-ECS, Laplace mass (dense)", dict(mass_matrix="laplace")),
                          ("HMC-ECS, adapted diagonal mass", dict(mass_matrix="adapt")),
                          ("HMC on all data, Laplace mass", dict(mass_matrix="laplace",
                                                                 estimator="full"))):
    started = time.perf_counter()
    result = dsgrad.mcmc.sample(jax.random.key(0), model, num_samples=num_samples,
                                num_warmup=num_warmup, progress=False, **settings)
    total = time.perf_counter() - started
    draws, ess = np.asarray(result.samples, np.float64), np.asarray(result.ess)
    z = (draws.mean(0) - mean) / (draws.std(0) / np.sqrt(np.maximum(ess, 1.0)))
    ratio = draws.std(0) / sd
    rows.append({"sampler": label, "total_s": total, "warmup_s": result.warmup_seconds,
                 "sampling_s": result.sampling_seconds, "min_ess": float(ess.min()),
                 "steps": int(result.parameters.num_integration_steps),
                 "subsample_size": result.subsample_size,
                 "mean_error_rms_se": float(np.sqrt(np.mean(z ** 2))),
                 "sd_ratio": [float(ratio.min()), float(ratio.max())]})
  return rows


def run(num_data: int, groups: int, features: int, num_samples: int, num_warmup: int,
        subsample_size: int, steps: int, calls: int) -> dict:
  model, mean, sd = _problem(num_data, groups, features)
  return {"kernel": _kernel_times(model, subsample_size, steps, calls),
          "sample": _sampled(model, mean, sd, num_samples, num_warmup)}


def render(record) -> str:
  results, config = record["results"]["results"], record["results"]["config"]
  d = config["groups"] + config["features"]
  lines = [f"Command: `{record['command']}`. Gaussian random intercepts: N = "
           f"{config['num_data']:,}, {config['groups']:,} groups, {config['features']} "
           f"features (d = {d:,}); exact posterior in closed form. Measured: "
           f"{record['environment']}.", "",
           f"The kernel alone (jitted; step 0.01, L = {config['steps']}, m = "
           f"{config['subsample_size']}, {config['calls']} iterations after a warm-up):", "",
           "| proxy | mass matrix given as | ms per iteration |", "| --- | --- | ---: |"]
  for row in results["kernel"]:
    lines.append(f"| order {row['order']} | {row['mass']} | {row['ms_per_iteration']:.2f} |")
  lines += ["", f"`dsgrad.mcmc.sample`, {config['num_warmup']} warm-up and "
            f"{config['num_samples']} kept iterations, `subsample_size=\"auto\"`:", "",
            "| sampler | setup + warm-up s | sampling ms / iteration | L | m | min ESS "
            "| min ESS / s | mean error, rms (MC se) | sd / exact sd |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
  for row in results["sample"]:
    per = row["sampling_s"] / config["num_samples"] * 1e3
    lines.append(f"| {row['sampler']} | {row['warmup_s']:.1f} | {per:.1f} | {row['steps']} "
                 f"| {row['subsample_size'] or 'all'} | {row['min_ess']:.0f} | "
                 f"{row['min_ess'] / row['sampling_s']:.2f} | {row['mean_error_rms_se']:.2f} "
                 f"| {row['sd_ratio'][0]:.2f}-{row['sd_ratio'][1]:.2f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks hmcecs-groups",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num-data", type=command_line.count(1), default=200_000)
  parser.add_argument("--groups", type=command_line.count(1), default=3_000)
  parser.add_argument("--features", type=command_line.count(1), default=3)
  parser.add_argument("--num-samples", type=command_line.count(1), default=600)
  parser.add_argument("--num-warmup", type=command_line.count(1), default=600)
  parser.add_argument("--subsample-size", type=command_line.count(1), default=100)
  parser.add_argument("--steps", type=command_line.count(1), default=5)
  parser.add_argument("--calls", type=command_line.count(1), default=30)
  _report.add_output_flags(parser, "hmcecs-groups")
  args = parser.parse_args(argv)
  config = {k: getattr(args, k) for k in ("num_data", "groups", "features", "num_samples",
                                           "num_warmup", "subsample_size", "steps", "calls")}
  results = run(**config)
  _report.publish(_report.section_of(args, "hmcecs-groups"), None, not args.no_write,
                  render=render,
                  data={"results": results, "config": config})


if __name__ == "__main__":
  main()
