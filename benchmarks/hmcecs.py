"""Subsampling MCMC on a large logistic regression: HMC-ECS against SGLD, SG-HMC, full-data
HMC and NumPyro's HMCECS (``python -m benchmarks hmcecs``).

Data: seeded synthetic logistic regression, ``dsgrad.models.synthetic_logistic_data(
key(0), N, D)`` (standard normal features plus an intercept column, true weight
``N(0, I)``), prior ``N(0, I)``. Reference posterior: a long NumPyro NUTS chain on all
data (an independent implementation).

Methods, all with the paper's tuning (Sec. 6.3: ``M`` = posterior precision at
``theta*``, dual averaging to acceptance 0.8, ``epsilon L = 1.2``; SGLD/SG-HMC with the
same control variates and a fixed step):

* ``hmcecs perturbed`` and ``hmcecs signed`` -- :func:`dsgrad.mcmc.sample`;
* ``full-data HMC`` -- the same kernel and tuning on all data (``estimator="full"``);
* ``sgld``, ``sghmc`` -- :func:`dsgrad.mcmc.sgld` / :func:`dsgrad.mcmc.sghmc` from
  ``theta*``: SGLD with step 0.1 x the smallest posterior variance (it is not
  preconditioned), SG-HMC with HMC-ECS's mass matrix, 0.3 x its step and the same
  trajectory length;
* ``numpyro HMCECS`` -- ``numpyro.infer.HMCECS`` with an HMC inner kernel
  (``trajectory_length=1.2``), the Taylor proxy around the same ``theta*``, the same
  ``m`` and number of blocks, NumPyro's default diagonal mass adaptation (so *not*
  like-for-like with the rows above; ``python -m benchmarks peers mcmc`` compares
  under the same mass treatment).

Reported: the largest posterior-mean error in units of the reference posterior sd, the
sd ratio range, ESS (min over parameters), ESS per second of sampling (compilation
excluded), data evaluations per iteration, the CT measure (Eq. 3.2 / 5.4, max IF over
parameters) and the relative computational time against full-data HMC (Eq. 6.1).

The targets: HMC-ECS posterior means within 0.1 sd of the reference with at least
5x fewer evaluations per effective draw than full-data HMC at N >= 100,000.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import command_line
from dsgrad import mcmc
from benchmarks import _report
from dsgrad.models import logistic_regression, synthetic_logistic_data


def _summary(name, samples, seconds, evals_per_iter, ref_mean, ref_sd, signs=None, note=""):
  samples = np.asarray(samples, np.float64)
  ess = mcmc.effective_sample_size(samples)
  if signs is not None:
    mean = mcmc.signed_mean(samples, signs)
    tau = mcmc.positive_fraction(signs)
  else:
    mean, tau = samples.mean(0), None
  ct = mcmc.computational_time(samples, evals_per_iter, signs)
  return dict(name=name, mean_err=float(np.max(np.abs(mean - ref_mean) / ref_sd)),
              sd_lo=float(np.min(samples.std(0) / ref_sd)),
              sd_hi=float(np.max(samples.std(0) / ref_sd)), ess=float(ess.min()),
              ess_per_s=float(ess.min() / seconds), seconds=seconds,
              evals=float(evals_per_iter), ct=float(ct.max()), tau=tau, note=note)


def _numpyro_reference(x, y, key, num_warmup, num_samples):
  from numpyro.infer import MCMC, NUTS

  from benchmarks import peers_mcmc
  model = peers_mcmc.numpyro_model(x.shape[0], None)  # all data: the plate is the identity
  run = MCMC(NUTS(model), num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
  run.run(key, x, y)
  return np.asarray(run.get_samples()["theta"], np.float64)


def _numpyro_hmcecs(x, y, model, key, theta_star, subsample_size, num_blocks, num_warmup,
                    num_samples):
  """NumPyro's HMCECS with its default diagonal mass adaptation, timed with its own
  ``MCMC.run`` (:func:`benchmarks.peers_mcmc.numpyro_chains`). Not like-for-like with
  the dsgrad rows (Laplace mass): ``python -m benchmarks peers mcmc`` is the fair
  comparison."""
  from benchmarks import peers_mcmc
  problem = peers_mcmc.Problem(x, y, model, jnp.asarray(theta_star), None, subsample_size,
                               num_blocks)
  c = peers_mcmc.numpyro_chains(problem, "hmcecs", "adapt", key, 1, num_warmup, num_samples)
  return c.samples[0], c.sampling_seconds, c.evaluations


def run(num_data=100_000, dim=11, subsample_size=1000, num_blocks=100, num_samples=2000,
        num_warmup=1000, reference_samples=4000, seed=0, with_numpyro=True):
  x, y, _ = synthetic_logistic_data(jax.random.key(0), num_data, dim)
  model = logistic_regression(x, y)
  key = jax.random.key(seed)
  k_ref, k_pert, k_signed, k_full, k_sgld, k_sghmc, k_np = jax.random.split(key, 7)
  t0 = time.perf_counter()
  reference = _numpyro_reference(jnp.asarray(x), jnp.asarray(y), k_ref, 1000,
                                 reference_samples)
  print(f"reference NUTS chain: {time.perf_counter() - t0:.0f} s", flush=True)
  ref_mean, ref_sd = reference.mean(0), reference.std(0)
  rows, results = [], {}
  for name, estimator, k in (("hmcecs perturbed", "perturbed", k_pert),
                             ("hmcecs signed", "signed", k_signed),
                             ("full-data HMC", "full", k_full)):
    m = subsample_size if estimator != "signed" else max(1, subsample_size // 10)
    r = mcmc.sample(k, model, num_samples=num_samples, num_warmup=num_warmup,
                    subsample_size=m, num_blocks=num_blocks if estimator != "signed" else 1,
                    estimator=estimator, progress=False)
    results[estimator] = r
    evals = float(np.mean(r.info.num_evaluations))
    signs = r.signs if estimator == "signed" else None
    note = (f"m = {m}, G = {num_blocks}" if estimator == "perturbed" else
            r.scheme.name if estimator == "signed" else f"n = {num_data:,}")
    note += (f", eps = {float(r.parameters.step_size):.3f}, "
             f"L = {int(r.parameters.num_integration_steps)}, "
             f"accept {float(np.mean(r.info.acceptance_rate)):.2f}")
    rows.append(_summary(name, r.samples, r.sampling_seconds, evals, ref_mean, ref_sd,
                         signs, note))
    print(f"  {name}: {rows[-1]}", flush=True)

  pert = results["perturbed"]
  eps = float(pert.parameters.step_size)
  proxy = pert.proxy
  # SGLD is not preconditioned: its step must stay below 2 / (largest precision
  # eigenvalue); a tenth of the smallest posterior variance.
  sghmc_steps = int(np.ceil(1.2 / (0.3 * eps)))  # the same trajectory length
  smallest_var = 1.0 / float(np.max(np.linalg.eigvalsh(
      np.asarray(mcmc.laplace_precision(model, proxy), np.float64))))
  for name, algo, k, evals in (
      ("sgld", mcmc.sgld(model, proxy, step_size=0.1 * smallest_var,
                         subsample_size=subsample_size), k_sgld, subsample_size),
      ("sghmc", mcmc.sghmc(model, proxy, pert.parameters._replace(
          step_size=jnp.asarray(0.3 * eps, jnp.float32),
          num_integration_steps=jnp.asarray(sghmc_steps, jnp.int32)),
          subsample_size=subsample_size), k_sghmc, subsample_size * sghmc_steps)):
    state = algo.init(proxy.theta_star, None)
    samples, _, _, _, seconds = mcmc.run_chain(k, algo.step, state,
                                               num_warmup + num_samples, progress=False)
    rows.append(_summary(name, samples[num_warmup:], seconds * num_samples /
                         (num_warmup + num_samples), evals, ref_mean, ref_sd,
                         note="control variates, fixed step"))
    print(f"  {name}: {rows[-1]}", flush=True)

  if with_numpyro:
    samples, seconds, evals = _numpyro_hmcecs(jnp.asarray(x), jnp.asarray(y), model, k_np,
                                              proxy.theta_star, subsample_size, num_blocks,
                                              num_warmup, num_samples)
    rows.append(_summary("numpyro HMCECS", samples, seconds, evals, ref_mean, ref_sd,
                         note=f"HMC inner kernel, m = {subsample_size}, G = {num_blocks}"))
    print(f"  numpyro HMCECS: {rows[-1]}", flush=True)
  return rows, reference


def format_table(rows, config):
  full = next(r for r in rows if r["name"] == "full-data HMC")
  lines = [
      f"Command: `{config['command']}` -- logistic regression, N = {config['num_data']:,}, "
      f"D = {config['dim']} (intercept included), synthetic (`synthetic_logistic_data(key(0),"
      f" N, D)`), prior N(0, I); {config['num_warmup']} warm-up and "
      f"{config['num_samples']} kept iterations per method, one chain each; reference: "
      f"NumPyro NUTS on all data ({config['reference_samples']} draws). CT = max IF over "
      "parameters x data evaluations per iteration (Eq. 3.2; signed: / (2 tau - 1)^2, "
      "Eq. 5.4); RCT = CT(full-data HMC) / CT (Eq. 6.1). ESS/s over sampling time, "
      "compilation excluded.",
      "",
      f"Measured: {_report.environment()}",
      "",
      "| method | max mean error (ref sd) | sd ratio | min ESS | ESS / s | evaluations / "
      "iteration | CT | RCT vs full-data HMC | tau | settings |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
  ]
  for r in rows:
    tau = "" if r["tau"] is None else f"{r['tau']:.3f}"
    lines.append(f"| {r['name']} | {r['mean_err']:.3f} | {r['sd_lo']:.2f}-{r['sd_hi']:.2f} | "
                 f"{r['ess']:.0f} | {r['ess_per_s']:.1f} | {r['evals']:,.0f} | "
                 f"{r['ct']:,.0f} | {full['ct'] / r['ct']:.1f}x | {tau} | {r['note']} |")
  pert = next(r for r in rows if r["name"] == "hmcecs perturbed")
  np_row = next((r for r in rows if r["name"] == "numpyro HMCECS"), None)
  lines += ["", "Targets: perturbed HMC-ECS mean error <= 0.1 sd: "
            + ("met" if pert["mean_err"] <= 0.1 else "**missed**")
            + f" ({pert['mean_err']:.3f}); at least 5x fewer evaluations per effective draw "
            f"than full-data HMC: " + ("met" if full["ct"] / pert["ct"] >= 5 else "**missed**")
            + f" ({full['ct'] / pert['ct']:.1f}x)"]
  if np_row is not None:
    lines[-1] += (". The NumPyro row adapts a diagonal mass while the dsgrad rows use the "
                  "Laplace mass: not a comparison (`python -m benchmarks peers mcmc` is).")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks hmcecs",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num-data", type=command_line.count(1), default=100_000)
  parser.add_argument("--dim", type=command_line.count(1),
                      default=11, help="D, the intercept included")
  parser.add_argument("--subsample-size", type=command_line.count(1), default=1000)
  parser.add_argument("--num-blocks", type=command_line.count(1), default=100)
  parser.add_argument("--num-samples", type=command_line.count(1), default=2000)
  parser.add_argument("--num-warmup", type=command_line.count(0), default=1000)
  parser.add_argument("--reference-samples", type=command_line.count(1), default=4000)
  parser.add_argument("--no-numpyro", action="store_true",
                      help="skip NumPyro's HMCECS (the reference chain still needs numpyro)")
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  rows, _ = run(args.num_data, args.dim, args.subsample_size, args.num_blocks,
                args.num_samples, args.num_warmup, args.reference_samples,
                with_numpyro=not args.no_numpyro)
  command = "python -m benchmarks hmcecs" + "".join(f" {a}" for a in (argv or []))
  table = format_table(rows, dict(vars(args), command=command))
  _report.publish(f"hmcecs-{jax.default_backend()}", table, not args.no_write)
  return 0
