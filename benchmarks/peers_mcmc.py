"""Subsampling MCMC beside NumPyro and BlackJAX, under the same mass-matrix treatment
(``python -m benchmarks peers mcmc``).

The question: on a large logistic regression, how many effective draws per second of
wall-clock does each sampler deliver, and does it stay on the posterior? Every sampler
runs on the same data (``synthetic_logistic_data(key(0), N, D)``, prior ``N(0, I)``),
starts at the same ``theta*`` (the full-data posterior mode by L-BFGS,
:func:`dsgrad.mcmc.find_reference_point` with ``subset_size = N``, computed once before
any clock; a subset's mode sits several posterior sd away at N = 100,000, where the
signed estimator with a fixed centre goes wrong),
uses the same control-variate centre, subsample size ``m``, number of blocks ``G``,
trajectory length ``epsilon L = 1.2`` and dual-averaging target 0.8, in one process, in
two settings that treat the mass matrix identically for every sampler:

* ``adapt``: every sampler adapts a *diagonal* mass matrix during its warm-up (NumPyro's
  default windowed adaptation; dsgrad's ``mass_matrix="adapt"``, the same regularized
  window variance), starting from the identity;
* ``laplace``: every sampler is handed the *same* dense mass matrix ``M``, the Laplace
  posterior precision at ``theta*`` (:func:`dsgrad.mcmc.laplace_precision`), computed
  once before any clock starts (NumPyro: ``inverse_mass_matrix=M^{-1}``,
  ``dense_mass=True``, ``adapt_mass_matrix=False``). dsgrad's control-variate centre stays
  at ``theta*`` here too (``reference_updates_every=0``), as NumPyro's does.

Samplers with a Metropolis correction: dsgrad HMC-ECS perturbed (``m``, ``G``) and signed
(block-Poisson, ``m / 10`` per factor), NumPyro ``HMCECS`` (HMC inner kernel, the Taylor
proxy at ``theta*``, the same ``m`` and ``G``); on all data: dsgrad's HMC kernel,
NumPyro ``HMC`` (same trajectory length) and NumPyro ``NUTS`` (what a NumPyro user runs
by default). Without one (stochastic-gradient baselines, fixed step, control variates
centred at ``theta*``, 1/4 of the kept iterations as burn-in before the clock): dsgrad
``sgld`` and BlackJAX ``sgld`` (the same update: BlackJAX's step ``h`` is dsgrad's
``epsilon / 2``; dsgrad's control variate is the second-order Taylor one, BlackJAX's the
gradient-difference one of Baker et al. 2019), dsgrad ``sghmc`` with an identity mass and
BlackJAX ``sghmc`` (the same Euler scheme and friction; BlackJAX uses one mini-batch for
the ``L`` steps of an iteration, dsgrad a fresh one per step). Mini-batches are drawn
inside the jitted loop for every library (BlackJAX's fastest configuration; its
tutorials pass batches from Python).

Protocol: ``--chains`` chains for each of ``--seeds`` seeds, run one after the other (two
CPU cores; nobody is vectorized). Sampling wall-clock excludes compilation for everyone:
NumPyro samples with its own ``MCMC.run`` (its compile cost, measured on a one-draw run,
is moved to the warm-up column), BlackJAX's ``step`` runs in one jitted ``lax.scan``
compiled before the clock starts, as dsgrad's :func:`dsgrad.mcmc.run_chain` does.
Warm-up seconds (compilation included) have their own column. ESS and R-hat are
NumPyro's multi-chain ``effective_sample_size`` and ``split_gelman_rubin`` over the
chains of one seed, the same yardstick for every sampler. Headline: **ESS per second of
sampling** (minimum over parameters), median over seeds with the range. Posterior
accuracy against a long NumPyro NUTS run on all data (4 chains): the largest mean error
in reference sd and the range of sd ratios.
"""

from __future__ import annotations

import argparse
import time
import zlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import command_line
from dsgrad import mcmc
from benchmarks import _report
from dsgrad.models import logistic_regression, synthetic_logistic_data

TRAJECTORY = 1.2
TARGET_ACCEPT = 0.8
SETTINGS = ("adapt", "laplace")


class Problem(NamedTuple):
  x: jax.Array
  y: jax.Array
  model: object
  theta_star: jax.Array
  precision: np.ndarray      # the Laplace precision at theta*, float64
  m: int
  num_blocks: int


class Chains(NamedTuple):
  samples: np.ndarray        # (chains, draws, d)
  signs: np.ndarray | None   # (chains, draws) for the signed estimator
  sampling_seconds: float    # all chains
  warmup_seconds: float      # all chains, compilation included
  evaluations: float         # data evaluations per iteration, mean
  note: str


def make_problem(num_data: int, dim: int, m: int, num_blocks: int) -> Problem:
  x, y, _ = synthetic_logistic_data(jax.random.key(0), num_data, dim)
  x, y = jnp.asarray(x), jnp.asarray(y)
  model = logistic_regression(x, y)
  # The full-data posterior mode: a subset's mode (find_reference_point's default) sits
  # several posterior sd away at this N, which a fixed proxy centre cannot afford.
  theta_star = mcmc.find_reference_point(model, jax.random.key(1), subset_size=num_data)
  precision = np.asarray(mcmc.laplace_precision(model, mcmc.taylor_proxy(model, theta_star)),
                         np.float64)
  return Problem(x, y, model, theta_star, precision, m, num_blocks)


# --- dsgrad ------------------------------------------------------------------------------

def dsgrad_chains(problem: Problem, kind: str, setting: str, key, chains: int, warmup: int,
                  samples: int) -> Chains:
  """``kind``: ``perturbed``, ``signed`` or ``full`` (:func:`dsgrad.mcmc.sample`)."""
  m = problem.m if kind != "signed" else max(1, problem.m // 10)
  mass = "adapt" if setting == "adapt" else problem.precision
  draws, signs, sampling, warm, evals = [], [], 0.0, 0.0, []
  for k in jax.random.split(key, chains):
    r = mcmc.sample(k, problem.model, num_samples=samples, num_warmup=warmup,
                    subsample_size=m, num_blocks=problem.num_blocks if kind != "signed" else 1,
                    estimator=kind, reference_point=problem.theta_star,
                    reference_updates_every=0, mass_matrix=mass,
                    trajectory_length=TRAJECTORY, target_accept=TARGET_ACCEPT, progress=False)
    draws.append(r.samples)
    signs.append(r.signs)
    sampling += r.sampling_seconds
    warm += r.warmup_seconds
    evals.append(np.mean(r.info.num_evaluations))
  note = (f"eps = {float(r.parameters.step_size):.3f} (last chain), L = "
          f"{int(r.parameters.num_integration_steps)}")
  if kind == "signed":
    tau = mcmc.positive_fraction(np.concatenate(signs))
    note = f"{r.scheme.name}, positive fraction tau = {tau:.3f}, {note}"
  return Chains(np.stack(draws), np.stack(signs) if kind == "signed" else None, sampling,
                warm, float(np.mean(evals)), note)


# --- NumPyro -----------------------------------------------------------------------------

def numpyro_model(n: int, subsample_size: int | None):
  import numpyro
  import numpyro.distributions as dist

  def model(x, y):
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(x.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", n, subsample_size=subsample_size) as idx:
      numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ theta), obs=y[idx])
  return model


def numpyro_kernel(problem: Problem, kind: str, setting: str):
  """``kind``: ``hmcecs``, ``hmc`` (all data) or ``nuts`` (all data)."""
  from numpyro.infer import HMC, HMCECS, NUTS, init_to_value

  n = problem.model.num_data
  mass = {} if setting == "adapt" else dict(
      inverse_mass_matrix=jnp.asarray(np.linalg.inv(problem.precision), jnp.float32),
      dense_mass=True, adapt_mass_matrix=False)
  start = init_to_value(values={"theta": problem.theta_star})
  if kind == "nuts":
    return NUTS(numpyro_model(n, None), target_accept_prob=TARGET_ACCEPT, init_strategy=start,
                **mass)
  inner = HMC(numpyro_model(n, problem.m if kind == "hmcecs" else None),
              trajectory_length=TRAJECTORY, target_accept_prob=TARGET_ACCEPT,
              init_strategy=start, **mass)
  if kind == "hmc":
    return inner
  return HMCECS(inner, num_blocks=problem.num_blocks,
                proxy=HMCECS.taylor_proxy({"theta": problem.theta_star}))


def numpyro_chains(problem: Problem, kind: str, setting: str, key, chains: int, warmup: int,
                   samples: int) -> Chains:
  """NumPyro's own loop: ``MCMC.warmup`` then ``MCMC.run`` from the warmed-up state.

  ``MCMC.run`` traces and compiles its loop on every call; that cost is measured on a
  one-draw ``run`` from the same state and moved from the sampling column to the warm-up
  column. (Timing ``kernel.sample`` in a hand-written ``lax.scan`` instead, with the data
  closed over, made NumPyro's adapted HMC kernel several times slower than its own loop
  here: that harness would not be fair to NumPyro.)
  """
  from numpyro.infer import MCMC

  runner = MCMC(numpyro_kernel(problem, kind, setting), num_warmup=warmup,
                num_samples=samples, progress_bar=False)
  data = (problem.x, problem.y)
  n = problem.model.num_data
  field = "hmc_state.num_steps" if kind == "hmcecs" else "num_steps"
  draws, steps, sampling, warm = [], [], 0.0, 0.0
  for k in jax.random.split(key, chains):
    k_warm, k_run = jax.random.split(k)
    start = time.perf_counter()
    runner.warmup(k_warm, *data, extra_fields=(field,))
    jax.block_until_ready(runner.post_warmup_state)
    warm += time.perf_counter() - start
    timings = {}
    for size in (1, samples):
      runner.num_samples = size
      start = time.perf_counter()
      runner.run(k_run, *data, extra_fields=(field,))
      jax.block_until_ready(runner.get_samples())
      timings[size] = time.perf_counter() - start
    sampling += max(timings[samples] - timings[1], 1e-9)
    warm += timings[1]
    draws.append(np.asarray(runner.get_samples()["theta"], np.float64))
    steps.append(np.asarray(runner.get_extra_fields()[field], np.float64))
  steps = np.concatenate(steps)
  # HMC / NUTS evaluate the full-data gradient once per leapfrog step; HMCECS evaluates
  # the subsample once per step plus the initial potential.
  evals = (problem.m * (1 + steps.mean()) if kind == "hmcecs" else n * steps.mean())
  state = runner.post_warmup_state
  hmc = state.hmc_state if kind == "hmcecs" else state
  note = (f"eps = {float(hmc.adapt_state.step_size):.3f} (last chain), mean leapfrog "
          f"steps {steps.mean():.1f}")
  return Chains(np.stack(draws), None, sampling, warm, float(evals), note)


# --- stochastic-gradient baselines ---------------------------------------------------------

def sg_settings(problem: Problem) -> dict:
  """One fixed step per method, from the Laplace covariance: SGLD's ``epsilon`` = 0.1 x
  the smallest posterior variance (it is not preconditioned); SG-HMC (identity mass):
  ``h`` = 0.1 x the smallest posterior sd, ``L = 10``, friction with ``h C = 0.1``; SG-HMC
  with the Laplace mass: as in ``python -m benchmarks hmcecs``, 0.3 x the step HMC-ECS
  tunes with that mass (a short warm-up), the same trajectory length, friction 1."""
  cov = np.linalg.inv(problem.precision)
  smallest_var = float(np.min(np.linalg.eigvalsh(cov)))
  h = 0.1 * np.sqrt(smallest_var)
  r = mcmc.sample(jax.random.key(99), problem.model, num_samples=1, num_warmup=300,
                  subsample_size=problem.m, num_blocks=problem.num_blocks,
                  reference_point=problem.theta_star, reference_updates_every=0,
                  mass_matrix=problem.precision, progress=False)
  laplace_h = 0.3 * float(r.parameters.step_size)
  return dict(sgld_eps=0.1 * smallest_var, sghmc_h=h, sghmc_steps=10, friction=0.1 / h,
              laplace_h=laplace_h, laplace_steps=int(np.ceil(TRAJECTORY / laplace_h)))


def _timed_scan(step, state, key, burn_in: int, samples: int):
  """Burn-in (untimed), then ``samples`` iterations timed; both compiled beforehand."""
  def run(state, keys):
    def body(s, k):
      s = step(k, s)
      return s, s
    return jax.lax.scan(body, state, keys)

  runner = jax.jit(run)
  k_burn, k_keep = jax.random.split(key)
  burn_keys = jax.random.split(k_burn, burn_in)
  keep_keys = jax.random.split(k_keep, samples)
  start = time.perf_counter()
  state, _ = jax.block_until_ready(runner.lower(state, burn_keys).compile()(state, burn_keys))
  compiled = runner.lower(state, keep_keys).compile()
  warm = time.perf_counter() - start
  start = time.perf_counter()
  _, trace = jax.block_until_ready(compiled(state, keep_keys))
  return trace, time.perf_counter() - start, warm


def sg_step(problem: Problem, s: dict, library: str, kind: str, mass: str = "identity"):
  """``(step(key, theta) -> theta, data evaluations per iteration)`` for ``library``
  (``dsgrad`` or ``blackjax``) and ``kind`` (``sgld`` or ``sghmc``); ``s``:
  :func:`sg_settings`."""
  model, m, n = problem.model, problem.m, problem.model.num_data
  d = model.latent_dim
  if library == "dsgrad":
    proxy = mcmc.taylor_proxy(model, problem.theta_star)
    if kind == "sgld":
      algo = mcmc.sgld(model, proxy, step_size=s["sgld_eps"], subsample_size=m)
      evals = m
    else:
      mass_matrix = np.eye(d) if mass == "identity" else problem.precision
      h = s["sghmc_h"] if mass == "identity" else s["laplace_h"]
      steps = s["sghmc_steps"] if mass == "identity" else s["laplace_steps"]
      algo = mcmc.sghmc(model, proxy, mcmc.hmc_parameters(h, steps, mass_matrix),
                        subsample_size=m, friction=s["friction"] if mass == "identity" else 1.0)
      evals = m * steps

    def step(k, theta):
      return algo.step(k, mcmc.SGState(theta))[0].position
  else:
    import blackjax
    from blackjax.sgmcmc import gradients

    def log_prior(theta):
      return model.log_prior(theta)

    def log_likelihood(theta, datum):
      xi, yi = datum
      logit = xi @ theta
      return yi * logit - jnp.logaddexp(0.0, logit)

    grad = gradients.control_variates(
        gradients.grad_estimator(log_prior, log_likelihood, n), problem.theta_star,
        (problem.x, problem.y))
    if kind == "sgld":
      algo, size = blackjax.sgld(grad), s["sgld_eps"] / 2
      evals = 2 * m
    else:
      algo = blackjax.sghmc(grad, num_integration_steps=s["sghmc_steps"], alpha=s["friction"])
      size, evals = s["sghmc_h"], 2 * m * s["sghmc_steps"]

    def step(k, theta):
      k_batch, k_step = jax.random.split(k)
      idx = jax.random.randint(k_batch, (m,), 0, n)
      return algo.step(k_step, theta, (problem.x[idx], problem.y[idx]), size)
  return step, evals


def sg_chains(problem: Problem, s: dict, library: str, kind: str, key, chains: int,
              samples: int, mass: str = "identity") -> Chains:
  """:func:`sg_step`'s sampler from ``theta*``: ``samples // 4`` burn-in iterations, then
  ``samples`` timed, for each of ``chains`` chains."""
  step, evals = sg_step(problem, s, library, kind, mass)
  draws, sampling, warm = [], 0.0, 0.0
  for k in jax.random.split(key, chains):
    trace, seconds, w = _timed_scan(step, problem.theta_star, k, max(1, samples // 4), samples)
    draws.append(np.asarray(trace, np.float64))
    sampling += seconds
    warm += w
  return Chains(np.stack(draws), None, sampling, warm, float(evals), "")


# --- reference, summaries, tables --------------------------------------------------------

def reference(problem: Problem, chains: int, samples: int) -> np.ndarray:
  """A long NumPyro NUTS run on all data (default adaptation), ``(chains * samples, d)``."""
  from numpyro.infer import MCMC
  runner = MCMC(numpyro_kernel(problem, "nuts", "adapt"), num_warmup=1000,
                num_samples=samples, num_chains=chains, chain_method="sequential",
                progress_bar=False)
  runner.run(jax.random.key(2), problem.x, problem.y)
  return np.asarray(runner.get_samples()["theta"], np.float64)


def summarize(c: Chains, ref_mean, ref_sd) -> dict:
  from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
  ess = np.asarray(effective_sample_size(c.samples))
  rhat = np.asarray(split_gelman_rubin(c.samples))
  flat = c.samples.reshape(-1, c.samples.shape[-1])
  if c.signs is not None:
    mean = mcmc.signed_mean(flat, c.signs.reshape(-1))
  else:
    mean = flat.mean(0)
  ratio = flat.std(0) / ref_sd
  return dict(ess=float(ess.min()), ess_per_s=float(ess.min() / c.sampling_seconds),
              rhat=float(rhat.max()), mean_err=float(np.max(np.abs(mean - ref_mean) / ref_sd)),
              sd_lo=float(ratio.min()), sd_hi=float(ratio.max()), seconds=c.sampling_seconds,
              warm=c.warmup_seconds, evals=c.evaluations, note=c.note)


METHODS = {  # name -> (library, kind): dsgrad_chains / numpyro_chains
    "dsgrad HMC-ECS perturbed": ("dsgrad", "perturbed"),
    "dsgrad HMC-ECS signed": ("dsgrad", "signed"),
    "NumPyro HMCECS": ("numpyro", "hmcecs"),
    "dsgrad HMC (all data)": ("dsgrad", "full"),
    "NumPyro HMC (all data)": ("numpyro", "hmc"),
    "NumPyro NUTS (all data)": ("numpyro", "nuts"),
}
SG_METHODS = {  # name -> (library, kind, mass)
    "dsgrad SGLD": ("dsgrad", "sgld", "identity"),
    "BlackJAX SGLD": ("blackjax", "sgld", "identity"),
    "dsgrad SG-HMC": ("dsgrad", "sghmc", "identity"),
    "BlackJAX SG-HMC": ("blackjax", "sghmc", "identity"),
    "dsgrad SG-HMC, Laplace mass": ("dsgrad", "sghmc", "laplace"),
}


def _median_range(values, fmt="{:,.1f}"):
  values = np.asarray(values, np.float64)
  text = fmt.format(np.median(values))
  if len(values) > 1:
    text += f" [{fmt.format(values.min())}-{fmt.format(values.max())}]"
  return text


def format_table(results: dict, title: str) -> list[str]:
  """``results``: name -> list of per-seed summaries."""
  lines = [f"**{title}**", "",
           "| sampler | ESS / s, median [range] | min ESS | max R-hat | max mean error (ref sd) "
           "| sd ratio | sampling s | warm-up s (incl. compile) | evaluations / iteration "
           "| settings |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
  for name, runs in results.items():
    lines.append(
        f"| {name} | {_median_range([r['ess_per_s'] for r in runs])} | "
        f"{_median_range([r['ess'] for r in runs], '{:,.0f}')} | "
        f"{max(r['rhat'] for r in runs):.3f} | {max(r['mean_err'] for r in runs):.3f} | "
        f"{min(r['sd_lo'] for r in runs):.2f}-{max(r['sd_hi'] for r in runs):.2f} | "
        f"{_median_range([r['seconds'] for r in runs], '{:.2f}')} | "
        f"{_median_range([r['warm'] for r in runs], '{:.1f}')} | "
        f"{np.median([r['evals'] for r in runs]):,.0f} | {runs[-1]['note']} |")
  return lines


# dsgrad's sampler against the peer it is compared with, in the ratio lines and the reading.
MCMC_PAIRS = (("dsgrad HMC-ECS perturbed", "NumPyro HMCECS"),
              ("dsgrad HMC-ECS perturbed", "NumPyro NUTS (all data)"),
              ("dsgrad HMC (all data)", "NumPyro HMC (all data)"))
SG_PAIRS = (("dsgrad SGLD", "BlackJAX SGLD"), ("dsgrad SG-HMC", "BlackJAX SG-HMC"))


def _ratios(a: list, b: list) -> list:
  """ESS/s ratios within each seed of two samplers' per-seed summaries."""
  return [x["ess_per_s"] / y["ess_per_s"] for x, y in zip(a, b)]


def ratio_line(results: dict, pairs, label: str) -> str:
  """ESS/s ratios within each seed, dsgrad against its peers, written from the table."""
  parts = [f"{mine} / {theirs} = "
           f"{_median_range(_ratios(results[mine], results[theirs]), '{:.2f}')}x"
           for mine, theirs in pairs if mine in results and theirs in results]
  return f"ESS/s ratios, {label} (per seed, median [range]): " + "; ".join(parts) + "."


def _verdict(ratios, margin=0.1) -> str:
  """``wins`` when every seed's ratio exceeds ``1 + margin``, ``loses`` when every one is
  below ``1 - margin``, ``ties`` otherwise."""
  ratios = np.asarray(ratios)
  if np.all(ratios > 1 + margin):
    return "wins"
  if np.all(ratios < 1 - margin):
    return "loses"
  return "ties"


def off_posterior(r: dict) -> bool:
  """A mean error beyond what Monte Carlo error explains: more than ``4 / sqrt(min ESS)``
  reference sd plus 0.05 (the reference's own error and float32 slack)."""
  return r["mean_err"] > 4.0 / np.sqrt(max(r["ess"], 1.0)) + 0.05


MIN_ESS = 100  # below this, an ESS/s ratio is mostly the ESS estimator's noise


def _comparison(mine: str, theirs: str, a: list, b: list) -> str:
  """One reading line: ``mine`` against ``theirs`` from their per-seed summaries."""
  r = _ratios(a, b)
  if min(x["ess"] for x in [*a, *b]) < MIN_ESS:
    verdict = f"cannot be compared with {theirs} (an ESS below {MIN_ESS})"
  else:
    verdict = f"{_verdict(r)} against {theirs}"
  return (f"{mine} {verdict}: {_median_range([x['ess_per_s'] for x in a])} vs "
          f"{_median_range([y['ess_per_s'] for y in b])} ESS/s (ratio "
          f"{_median_range(r, '{:.2f}')}x).")


def reading(tables: dict, sg: dict) -> str:
  """The reading, written from the tables of the same run: wins (every seed's ESS/s
  ratio above 1.1), ties and losses, and any sampler off the posterior."""
  lines = ["Reading (written by the benchmark from the tables above; a win or loss needs "
           "every seed's ESS/s ratio beyond 10%):", ""]
  for setting, results in tables.items():
    for mine, theirs in MCMC_PAIRS:
      if mine in results and theirs in results:
        lines.append(f"* `{setting}`: " + _comparison(mine, theirs, results[mine],
                                                      results[theirs]))
  for mine, theirs in SG_PAIRS:
    if mine in sg and theirs in sg:
      lines.append("* " + _comparison(mine, theirs, sg[mine], sg[theirs]))
  off = [f"{name} (`{setting}`, {max(r['mean_err'] for r in runs):.3f} sd)"
         for setting, results in [*tables.items(), ("no Metropolis", sg)]
         for name, runs in results.items() if any(off_posterior(r) for r in runs)]
  lines.append("* Off the posterior (mean error beyond 4 / sqrt(min ESS) + 0.05 reference sd "
               "on some seed): " + (", ".join(off) if off else "none") + ".")
  return "\n".join(lines)


def run(args) -> str:
  started = time.perf_counter()
  problem = make_problem(args.num_data, args.dim, args.subsample_size, args.num_blocks)
  t0 = time.perf_counter()
  ref = reference(problem, 4, args.reference_samples)
  print(f"reference NUTS: {time.perf_counter() - t0:.0f} s", flush=True)
  ref_mean, ref_sd = ref.mean(0), ref.std(0)
  only = [s.strip() for s in args.only.split(";")] if args.only else None

  def wanted(name):
    return only is None or any(s in name for s in only)

  tables = {setting: {name: [] for name in METHODS if wanted(name)} for setting in SETTINGS}
  sg = {name: [] for name in SG_METHODS if wanted(name)}
  s = sg_settings(problem) if sg else None
  for seed in range(args.seeds):
    key = jax.random.key(100 + seed)
    for setting in SETTINGS:
      for name in tables[setting]:
        library, kind = METHODS[name]
        chains = dsgrad_chains if library == "dsgrad" else numpyro_chains
        c = chains(problem, kind, setting, jax.random.fold_in(key, zlib.crc32(name.encode())),
                   args.chains, args.num_warmup, args.num_samples)
        tables[setting][name].append(summarize(c, ref_mean, ref_sd))
        print(f"seed {seed} {setting} {name}: {tables[setting][name][-1]}", flush=True)
    for name in sg:
      library, kind, mass = SG_METHODS[name]
      c = sg_chains(problem, s, library, kind, jax.random.fold_in(key, zlib.crc32(name.encode())),
                    args.chains, args.num_samples, mass)
      sg[name].append(summarize(c, ref_mean, ref_sd))
      print(f"seed {seed} {name}: {sg[name][-1]}", flush=True)
    jax.clear_caches()

  lines = [f"Logistic regression, N = {args.num_data:,}, D = {args.dim} (intercept included), "
           f"synthetic, prior N(0, I); m = {args.subsample_size}, G = {args.num_blocks}; "
           f"{args.chains} chains x {args.seeds} seeds, {args.num_warmup} warm-up and "
           f"{args.num_samples} kept iterations per chain; reference: NumPyro NUTS on all "
           f"data, 4 chains x {args.reference_samples} draws. Total "
           f"{time.perf_counter() - started:.0f} s.", ""]
  titles = {"adapt": "Setting `adapt`: every sampler adapts a diagonal mass matrix in its "
                     "warm-up",
            "laplace": "Setting `laplace`: every sampler gets the same dense Laplace mass "
                       "matrix"}
  for setting in SETTINGS:
    if tables[setting]:
      lines += format_table(tables[setting], titles[setting]) + ["", ratio_line(
          tables[setting], MCMC_PAIRS, f"`{setting}` setting"), ""]
  if sg:
    lines += format_table(sg, "Stochastic-gradient samplers (no Metropolis correction; "
                              f"SGLD epsilon = {s['sgld_eps']:.3g}; SG-HMC h = "
                              f"{s['sghmc_h']:.3g}, L = {s['sghmc_steps']}, friction "
                              f"{s['friction']:.3g}, identity mass; with the Laplace mass "
                              f"h = {s['laplace_h']:.3g}, L = {s['laplace_steps']}, "
                              "friction 1)")
    lines += ["", ratio_line(sg, SG_PAIRS, "stochastic-gradient samplers")]
  lines += ["", reading({k: v for k, v in tables.items() if v}, sg)]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks peers mcmc",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="N = 20,000, D = 6, 2 chains x 1 seed, 300 + 300 iterations")
  parser.add_argument("--num-data", type=command_line.count(1), default=100_000)
  parser.add_argument("--dim", type=command_line.count(1),
                      default=11, help="D, the intercept included")
  parser.add_argument("--subsample-size", type=command_line.count(1), default=1000)
  parser.add_argument("--num-blocks", type=command_line.count(1), default=100)
  parser.add_argument("--chains", type=command_line.count(1), default=4)
  parser.add_argument("--seeds", type=command_line.count(0), default=3)
  parser.add_argument("--num-warmup", type=command_line.count(0), default=1000)
  parser.add_argument("--num-samples", type=command_line.count(1), default=1000)
  parser.add_argument("--reference-samples", type=command_line.count(1), default=5000)
  parser.add_argument("--only", default=None, help="';'-separated substrings of samplers")
  parser.add_argument("--no-write", action="store_true", help="print only")
  args = parser.parse_args(argv)
  if args.quick:
    args.num_data, args.dim, args.chains, args.seeds = 20_000, 6, 2, 1
    args.num_warmup, args.num_samples, args.reference_samples = 300, 300, 1000
  command = "python -m benchmarks peers mcmc" + (f" {' '.join(argv)}" if argv else "")
  body = run(args)
  body = f"Command: `{command}`. Measured: {_report.environment()}\n\n" + body
  section = f"peers{'-quick' if args.quick else ''}-mcmc-{jax.default_backend()}"
  _report.publish(section, body, not args.no_write)
  return 0
