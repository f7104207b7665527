"""``python -m benchmarks dais``: annealed VI on Bayesian logistic regression, with
NumPyro's ``AutoDAIS`` / ``AutoSurrogateLikelihoodDAIS`` side by side.

Methods (each trained with the naive estimator and with joint SVRG, where defined):
mean-field and full-rank Gaussian BBVI (:mod:`dsgrad.families`), DAIS with full-data
dynamics (K = 2 and 8), NS-DAIS (K = 8, mini-batch dynamics of ``B`` data; naive only:
its dynamics batch is discrete noise, for which ``linearize`` has no control variate)
and SL-DAIS (K = 8, RAND surrogate of 256 points; ``--surrogates rand,cs-init,cs-fix,nn``
adds the other surrogates of the paper's ablation, Table 1; ``--base-mass`` and
``--numpyro-momenta`` add DAIS and SL-DAIS with ``AnnealedVI(mass="base")`` and with
``AnnealedVI(momentum_scale="mass")``, NumPyro's chain). NumPyro runs the same model, prior,
initialization, optimizer, schedule, batch size, K, ``eta_max`` and surrogate points.

Every method runs for ``--seeds`` seeds (the optimization's noise and the RAND points;
the data are fixed). Reported per method: the final full-data ELBO (Monte Carlo, mean
over seeds with its standard error, and the worst seed), the test log predictive density
per test datum, and the training wall-clock per step
(compiled ``lax.scan`` segments for both libraries; compilation and evaluation excluded),
plus ELBO-vs-step checkpoints for the joint-versus-naive question.

Why joint SVRG and not joint SAGA here: every DAIS objective shares one chain draw
across the batch, so a SAGA table of per-datum parameters would need one chain per datum
of the batch (``B`` chains per step); SVRG's single snapshot needs one.

Data: a seeded synthetic set (``dsgrad.models.synthetic_logistic_data(key(0), 60,000,
20)``: 19 standard normal features plus an intercept, weight ``N(0, I)``, Bernoulli
labels; the first 50,000 rows train, the last 10,000 test), its correlated variant
``synthetic-corr`` (the same with ``feature_correlation=0.9``: AR(1) features, correlation
``0.9^|i-j|``, so the posterior is strongly correlated), ``synthetic-sharp`` (2,000 train
and 500 test rows, 20 standard normal features plus an intercept, true weight
``N(0, 9 I)`` against the ``N(0, I)`` prior: nearly deterministic labels and about 100
data per parameter, so the posterior is skewed -- a non-Gaussian posterior where
annealing has something to correct) and the Australian credit data embedded in
``shared/data`` (80/20 seeded split, standardized, with intercept).

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML. Sec. 7.3 (logistic regression), App. A.6.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import dsgrad
from dsgrad import command_line
from dsgrad.annealing import AnnealedVI, NeuralSurrogate, coreset_surrogate, rand_surrogate
from benchmarks import _report
from dsgrad.families import FullRankGaussian, MeanFieldGaussian
from dsgrad.models.logistic_regression import logistic_regression, synthetic_logistic_data
from dsgrad.training.batching import batch_indices

CORRELATED_FEATURES = 0.9  # AR(1) coefficient of the features of "synthetic-corr"
INIT_SCALE = 0.1  # NumPyro's default init_scale; dsgrad's base starts at the same scale


SHARP_WEIGHT_SCALE = 3.0  # "synthetic-sharp": true weight N(0, 9 I) against the N(0, I) prior


def _data(name: str, seed: int, quick: bool):
  if name == "synthetic-sharp":
    # Few data per parameter and nearly deterministic labels: the posterior is skewed and
    # heavy on the side where the likelihood flattens (a non-Gaussian posterior).
    n_train, n_test, dim = 2_000, 500, 20
    k_x, k_w, k_y = jax.random.split(jax.random.key(seed), 3)
    x = jnp.concatenate([jax.random.normal(k_x, (n_train + n_test, dim)),
                         jnp.ones((n_train + n_test, 1))], axis=1)
    w = SHARP_WEIGHT_SCALE * jax.random.normal(k_w, (dim + 1,))
    y = jax.random.bernoulli(k_y, jax.nn.sigmoid(x @ w)).astype(jnp.int32)
    x, y = np.asarray(x, np.float32), np.asarray(y, np.int32)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
  if name in ("synthetic", "synthetic-corr"):
    n_train, n_test = (5_000, 1_000) if quick else (50_000, 10_000)
    rho = CORRELATED_FEATURES if name == "synthetic-corr" else 0.0
    x, y, _ = synthetic_logistic_data(jax.random.key(seed), n_train + n_test, 20,
                                      feature_correlation=rho)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
  from dsgrad.datasets.uci import add_intercept, load_australian
  path = os.environ.get("DSGRAD_AUSTRALIAN") or os.path.join(_report.data_dir(),
                                                             "australian.dat")
  x, y = load_australian(path)
  x = add_intercept(x)
  perm = np.random.default_rng(seed).permutation(x.shape[0])
  cut = int(0.8 * x.shape[0])
  return (x[perm[:cut]], y[perm[:cut]]), (x[perm[cut:]], y[perm[cut:]])


def _schedule(lr: float, steps: int):
  """Adam's learning rate: ``lr``, divided by 10 at 60% and again at 85% of the steps."""
  return optax.piecewise_constant_schedule(lr, {int(0.6 * steps): 0.1, int(0.85 * steps): 0.1})


def _test_log_predictive(x_test, y_test, draws) -> float:
  """Mean over test data of ``log mean_s p(y_n | x_n, z_s)``."""
  signs = 2.0 * jnp.asarray(y_test, jnp.float32) - 1.0
  logits = jnp.asarray(x_test, jnp.float32) @ jnp.asarray(draws, jnp.float32).T  # (n, S)
  log_p = jax.nn.log_sigmoid(signs[:, None] * logits)
  return float(jnp.mean(jax.scipy.special.logsumexp(log_p, axis=1) - math.log(draws.shape[0])))


# ------------------------------------------------------------------------------ dsgrad
class _Method:
  """One dsgrad method: its objective, initial params, ELBO and posterior draws."""

  def __init__(self, name, objective, params, elbo, draws, joint=True):
    self.name, self.objective, self.params = name, objective, params
    self.elbo, self.draws, self.joint = elbo, draws, joint


def _bbvi(name, family_cls, model):
  family = family_cls(model.latent_dim, loc=0.0, log_scale=math.log(INIT_SCALE))
  objective = family.objective(model)

  def elbo(params, key, num):
    return dsgrad.elbo(objective, params, key, num, chunk_size=min(model.num_data, 16_384))

  def draws(params, key, num):
    return jax.vmap(lambda e: family_cls.transform(params, e))(
        jax.random.normal(key, (num, model.latent_dim)))

  return _Method(name, objective, family.params(), elbo, draws)


def _annealed(name, vi: AnnealedVI, step_size: float, joint=True):
  params = vi.init_params(loc=0.0, log_scale=math.log(INIT_SCALE), step_size=step_size)
  return _Method(name, vi.objective(), params, vi.elbo,
                 lambda p, key, num: jax.jit(lambda q: vi.sample_posterior(q, key, num))(p),
                 joint)


def _train(method: _Method, optimizer, steps: int, batch_size: int, checkpoints, key,
           eval_samples: int):
  """Trains in stages; returns final params, seconds per step and ELBO checkpoints."""
  params, state, done, wall, curve = method.params, None, 0, 0.0, []
  for i, stop in enumerate(checkpoints):
    result = dsgrad.fit(method.objective, optimizer, params, key, num_steps=stop,
                        batch_size=batch_size, eval_every=stop - done, elbo_samples=0,
                        progress=False, opt_state=state, start_step=done)
    params, state, done = result.params, result.opt_state, stop
    wall += float(result.history.wall_time[-1])
    curve.append(method.elbo(params, jax.random.fold_in(key, 10_000 + i), eval_samples)[0])
  return params, wall / steps, curve


# ----------------------------------------------------------------------------- numpyro
def _numpyro_runs(train, test, surrogate_points, args, steps, batch_size, checkpoints, key,
                  key_batches):
  """NumPyro's AutoSurrogateLikelihoodDAIS (and AutoDAIS unless ``--no-autodais``)."""
  import numpyro
  import numpyro.distributions as dist
  from numpyro.infer import SVI, Predictive, Trace_ELBO
  from numpyro.infer.autoguide import AutoDAIS, AutoSurrogateLikelihoodDAIS
  from numpyro.infer.initialization import init_to_value
  from numpyro.optim import optax_to_numpyro

  x, y = (jnp.asarray(a, jnp.float32) for a in train)
  n, d = x.shape
  n_surr = surrogate_points.shape[0]
  x_surr, y_surr = x[surrogate_points], y[surrogate_points]

  def model(subsample_size=None, idx=None):
    # idx: the batch's indices substituted into the plate (NumPyro's fast configuration);
    # without it the plate draws its own subsample each step (the idiomatic one).
    w = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
    with numpyro.handlers.substitute(data={} if idx is None else {"N": idx}):
      with numpyro.plate("N", n, subsample_size=subsample_size):
        xb = numpyro.subsample(x, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=xb @ w), obs=yb)

  def surrogate_model():
    w = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
    omegas = numpyro.param("omegas", jnp.full((n_surr,), n / n_surr),
                           constraint=dist.constraints.positive)
    with numpyro.plate("S", n_surr), numpyro.handlers.scale(scale=omegas):
      numpyro.sample("y", dist.Bernoulli(logits=x_surr @ w), obs=y_surr)

  common = dict(K=args.k, eta_init=args.eta_init, eta_max=args.eta_max, gamma_init=0.9,
                init_loc_fn=init_to_value(values={"w": jnp.zeros(d)}), init_scale=INIT_SCALE)
  guides = {}
  label = f"NumPyro AutoSurrogateLikelihoodDAIS (K={args.k}, RAND {n_surr})"
  if _selected("NumPyro AutoSurrogateLikelihoodDAIS", args.only):
    guides[label] = (AutoSurrogateLikelihoodDAIS(model, surrogate_model, **common),
                     batch_size, False)
  if args.numpyro_fed and _selected("NumPyro AutoSurrogateLikelihoodDAIS", args.only):
    guides[label + ", indices passed in"] = (
        AutoSurrogateLikelihoodDAIS(model, surrogate_model, **common), batch_size, True)
  if args.autodais and _selected("NumPyro AutoDAIS", args.only):
    guides[f"NumPyro AutoDAIS (K={args.k}, full data)"] = (AutoDAIS(model, **common), None,
                                                           False)
  # The same batches as dsgrad's runs: dsgrad.fit's reshuffled epochs from the same key.
  fit_key, _ = jax.random.split(key_batches)
  batches = batch_indices(jax.random.split(fit_key)[0], 0, steps, n, batch_size)
  out = {}
  for name, (guide, sub, fed) in guides.items():
    optim = optax_to_numpyro(optax.adam(_schedule(args.lr, steps)))
    svi = SVI(model, guide, optim, Trace_ELBO())
    state = svi.init(key, subsample_size=sub, idx=batches[0] if fed else None)

    def segment(s, idx, sub=sub, fed=fed, svi=svi):
      if fed:
        return jax.lax.scan(lambda c, i: (svi.update(c, subsample_size=sub, idx=i)[0], None),
                            s, idx)[0]
      return jax.lax.scan(lambda c, _: (svi.update(c, subsample_size=sub)[0], None), s,
                          idx)[0]

    compiled, wall, done, curve = {}, 0.0, 0, []
    loss_fn = jax.jit(lambda k, p: Trace_ELBO().loss(k, p, model, guide, subsample_size=None))

    def elbo(params, k, num):
      values = -np.asarray(jax.lax.map(lambda kk: loss_fn(kk, params), jax.random.split(k, num),
                                       batch_size=min(num, 256)), np.float64)
      return float(values.mean()), float(values.std(ddof=1) / np.sqrt(num))

    for i, stop in enumerate(checkpoints):
      length = stop - done
      if length not in compiled:
        compiled[length] = jax.jit(segment).lower(state, batches[done:stop]).compile()
      t0 = time.perf_counter()
      state = jax.block_until_ready(compiled[length](state, batches[done:stop]))
      wall += time.perf_counter() - t0
      done = stop
      curve.append(elbo(svi.get_params(state), jax.random.fold_in(key, 10_000 + i),
                        args.curve_samples)[0])
    params = svi.get_params(state)
    value = elbo(params, jax.random.fold_in(key, 99), args.eval_samples)
    draws = Predictive(guide, params=params, num_samples=args.predictive_samples)(
        jax.random.fold_in(key, 98), subsample_size=None)["w"]
    out[name] = {"elbo": value, "test_lpd": _test_log_predictive(*test, draws),
                 "seconds_per_step": wall / steps, "curve": curve,
                 "step_size": _numpyro_mean_step_size(params, args.eta_max)}
    print(f"  {name:<58} ELBO {value[0]:12.2f} ± {value[1]:.2f}  test lpd "
          f"{out[name]['test_lpd']:.4f}  {1e3 * wall / steps:8.3f} ms/step", flush=True)
  return out


def _numpyro_mean_step_size(params, eta_max) -> float:
  """Mean over the chain of AutoDAIS's ``clip(eta0 + eta_coeff beta_k, 0, eta_max)``."""
  betas = jnp.cumsum(params["auto_beta_increments"])
  betas = betas / betas[-1]
  eta = jnp.clip(params["auto_eta0"] + params["auto_eta_coeff"] * betas, 0.0, eta_max)
  return float(jnp.mean(eta))


# -------------------------------------------------------------------------------- main
def run_dataset(dataset: str, args) -> tuple[str, dict]:
  """Every method on ``dataset`` for each seed; returns the markdown table and results."""
  (x, y), test = _data(dataset, 0, args.quick)  # the data and split are fixed
  model = logistic_regression(x, y)
  n, d = model.num_data, model.latent_dim
  batch_size = min(args.batch_size, n)
  print(f"{dataset}: N={n}, d={d}, test {test[0].shape[0]}, B={batch_size}, {args.steps} "
        f"steps, seeds {args.seeds}", flush=True)
  results = {}
  for seed in _report.progress(range(args.seeds), f"{dataset}: seeds"):
    for name, r in _run_seed(model, (x, y), test, batch_size, seed, args).items():
      results.setdefault(name, []).append(r)
  return _table(dataset, n, d, test[0].shape[0], batch_size, results, args), results


def _run_seed(model, train, test, batch_size, seed, args) -> dict:
  """One seed (optimization noise and surrogate points): every method, both estimators."""
  n, k, steps = model.num_data, args.k, args.steps
  checkpoints = _checkpoints(args)
  key = jax.random.key(seed)
  surrogate = rand_surrogate(model, min(args.surrogate_points, n), jax.random.fold_in(key, 1))
  annealed = dict(eta_max=args.eta_max)
  eta = args.eta_init  # every annealed method starts from the same step size
  surrogates = list(_surrogates(model, surrogate, key, args))
  methods = [_annealed("DAIS (K=0, the mean-field base)", AnnealedVI(model, 0, **annealed),
                       eta),
             _bbvi("mean-field BBVI", MeanFieldGaussian, model),
             _bbvi("full-rank BBVI", FullRankGaussian, model),
             _annealed("DAIS (K=2, full data)", AnnealedVI(model, 2, **annealed), eta),
             _annealed(f"DAIS (K={k}, full data)", AnnealedVI(model, k, **annealed), eta),
             _annealed(f"NS-DAIS (K={k}, dynamics batch {batch_size})",
                       AnnealedVI(model, k, dynamics_batch_size=batch_size, **annealed), eta,
                       joint=False),
             *(_annealed(f"SL-DAIS (K={k}, {label})",
                         AnnealedVI(model, k, surrogate=module, **annealed), eta)
               for label, module in surrogates)]
  variants = ([(", base mass", dict(mass="base"))] if args.base_mass else []) + (
      [(", NumPyro momenta", dict(momentum_scale="mass"))] if args.numpyro_momenta else [])
  for suffix, chain in variants:  # other chains beside the default ones, if asked
    methods += [_annealed(f"DAIS (K={k}, full data{suffix})",
                          AnnealedVI(model, k, **chain, **annealed), eta),
                *(_annealed(f"SL-DAIS (K={k}, {label}{suffix})",
                            AnnealedVI(model, k, surrogate=module, **chain, **annealed), eta)
                  for label, module in surrogates)]
  results = {}
  for m in methods:
    estimators = {"naive": None, "joint SVRG": "joint"} if m.joint else {"naive": None}
    if m.joint and args.adaptive:
      estimators["joint SVRG, adaptive weight"] = "joint_adaptive"
    for est_name, kind in estimators.items():
      if not _selected(f"{m.name}, {est_name}", args.only):
        continue
      opt = optax.adam(_schedule(args.lr, steps))
      if kind is not None:
        every = max(1, n // batch_size // args.svrg_refreshes_per_epoch)
        weight = "adaptive" if kind == "joint_adaptive" else 1.0
        opt = optax.chain(dsgrad.joint_svrg(m.objective, every=every, chunk_size=n,
                                            control_weight=weight), opt)
      t0 = time.perf_counter()
      params, sps, curve = _train(m, opt, steps, batch_size, checkpoints,
                                  jax.random.fold_in(key, 2), args.curve_samples)
      value = m.elbo(params, jax.random.fold_in(key, 99), args.eval_samples)
      draws = m.draws(params, jax.random.fold_in(key, 98), args.predictive_samples)
      lpd = _test_log_predictive(*test, draws)
      eta = (float(jnp.mean(dsgrad.annealing.chain_settings(params["chain"],
                                                            args.eta_max).step_size))
             if "chain" in params else float("nan"))
      results[(m.name, est_name)] = {"elbo": value, "test_lpd": lpd, "seconds_per_step": sps,
                                     "curve": curve, "step_size": eta}
      print(f"  seed {seed} {m.name + ', ' + est_name:<52} ELBO {value[0]:12.2f} ± "
            f"{value[1]:.2f}  test lpd {lpd:.4f}  {1e3 * sps:8.3f} ms/step  "
            f"({time.perf_counter() - t0:.0f} s)", flush=True)
  if args.numpyro and (_selected("NumPyro AutoSurrogateLikelihoodDAIS", args.only)
                       or (args.autodais and _selected("NumPyro AutoDAIS", args.only))):
    for name, r in _numpyro_runs(train, test, surrogate.points[...], args, steps, batch_size,
                                 checkpoints, jax.random.fold_in(key, 3),
                                 jax.random.fold_in(key, 2)).items():
      results[(name, "NumPyro")] = r
  return results


SURROGATES = ("rand", "cs-init", "cs-fix", "nn")


def _surrogates(model, rand, key, args):
  """``(label, module)`` of each surrogate in ``--surrogates`` (the paper's Table 1 kinds;
  RAND is the one also handed to NumPyro). CS-INIT / CS-FIX draw ``--surrogate-points``
  data by sensitivity sampling at 8 prior draws; NN is two ELU layers of 100 units."""
  m = rand.num_points
  for kind in args.surrogates.split(","):
    kind = kind.strip()
    if kind == "rand":
      yield f"RAND {m}", rand
    elif kind in ("cs-init", "cs-fix"):
      yield (f"{kind.upper()} {m}",
             coreset_surrogate(model, m, jax.random.fold_in(key, 4),
                               learn_weights=kind == "cs-init"))
    elif kind == "nn":
      yield "NN 100x2", NeuralSurrogate(model.latent_dim, rngs=nnx.Rngs(int(
          jax.random.randint(jax.random.fold_in(key, 5), (), 0, 2**30))))
    else:
      raise ValueError(f"unknown surrogate {kind!r}; choose from {', '.join(SURROGATES)}")


def _checkpoints(args) -> list[int]:
  """The steps after which the ELBO curve is recorded: ``--curve-points`` equal shares."""
  return [int(round(args.steps * (i + 1) / args.curve_points)) for i in range(args.curve_points)]


def _selected(label: str, only: str | None) -> bool:
  """Whether a run labelled ``"method, estimator"`` is among ``--only``'s substrings."""
  return only is None or any(part.strip() and part.strip() in label for part in only.split(";"))


def _mean_se(values):
  v = np.asarray(values, np.float64)
  return v.mean(), (v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else float("nan"))


def _table(dataset, n, d, n_test, batch_size, results, args) -> str:
  k = args.k
  dais_ref = results.get((f"DAIS (K={k}, full data)", "naive"))
  ref_time = np.median([r["seconds_per_step"] for r in dais_ref]) if dais_ref else None
  lines = [f"### {dataset} (N={n:,} train, {n_test:,} test, d={d}; B={batch_size}, "
           f"{args.steps} steps, {args.seeds} seeds)", "",
           "| method | estimator | final ELBO, mean over seeds (± se) | worst seed | "
           "test log pred. density / datum | ms / step (median) | cost / step vs DAIS "
           f"K={k} | learned step size (mean over the chain) |", "|---|---|---|---|---|---|---|---|"]
  for (name, est), runs in results.items():
    elbo, elbo_se = _mean_se([r["elbo"][0] for r in runs])
    worst = min(r["elbo"][0] for r in runs)
    lpd = np.mean([r["test_lpd"] for r in runs])
    sps = np.median([r["seconds_per_step"] for r in runs])
    ratio = f"{sps / ref_time:.3f}x" if ref_time else ""
    eta = np.mean([r["step_size"] for r in runs])
    eta = "" if np.isnan(eta) else f"{eta:.4f}"
    se = "" if np.isnan(elbo_se) else f" (± {elbo_se:.2f})"
    lines.append(f"| {name} | {est} | {elbo:,.2f}{se} | {worst:,.2f} | {lpd:.4f} | "
                 f"{1e3 * sps:.3f} | {ratio} | {eta} |")
  checkpoints = _checkpoints(args)
  lines += ["", f"Mean ELBO over seeds ({args.curve_samples} samples each) after each share "
            "of the steps:", "",
            "| method | estimator | " + " | ".join(f"step {c}" for c in checkpoints) + " |",
            "|---|---|" + "---|" * len(checkpoints)]
  for (name, est), runs in results.items():
    curve = np.mean([r["curve"] for r in runs], axis=0)
    lines.append(f"| {name} | {est} | " + " | ".join(f"{v:,.1f}" for v in curve) + " |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks dais", description=__doc__.split("\n\n")[0])
  parser.add_argument("--datasets", default="synthetic,australian",
                      help="comma-separated: synthetic, synthetic-corr, synthetic-sharp, "
                           "australian")
  parser.add_argument("--steps", type=command_line.count(1), default=3000)
  parser.add_argument("--batch-size", type=command_line.count(1), default=256)
  parser.add_argument("--k", type=command_line.count(1),
                      default=8, help="annealing steps of DAIS/NS-/SL-DAIS")
  parser.add_argument("--surrogate-points", type=command_line.count(1), default=256)
  parser.add_argument("--surrogates", default="rand",
                      help="comma-separated SL-DAIS surrogates (the ablation of the paper's "
                           f"Table 1): {', '.join(SURROGATES)}")
  parser.add_argument("--base-mass", action="store_true",
                      help="also run DAIS (K) and SL-DAIS with AnnealedVI(mass='base'): the "
                           "mass relative to the base's precision")
  parser.add_argument("--numpyro-momenta", action="store_true",
                      help="also run DAIS (K) and SL-DAIS with AnnealedVI(momentum_scale="
                           "'mass'): NumPyro AutoDAIS's chain")
  parser.add_argument("--svrg-refreshes-per-epoch", type=command_line.count(1), default=1,
                      help="joint SVRG's full-data snapshots per epoch (every = N / (B r))")
  parser.add_argument("--lr", type=command_line.positive(), default=1e-2)
  parser.add_argument("--eta-max", type=command_line.positive(), default=0.25)
  parser.add_argument("--eta-init", type=command_line.positive(), default=0.01)
  parser.add_argument("--eval-samples", type=command_line.count(1),
                      default=2000, help="for the final ELBO")
  parser.add_argument("--curve-samples", type=command_line.count(1), default=200)
  parser.add_argument("--curve-points", type=command_line.count(1), default=6)
  parser.add_argument("--predictive-samples", type=command_line.count(1), default=1000)
  parser.add_argument("--seeds", type=command_line.count(0), default=3,
                      help="optimization seeds per method (also the RAND surrogate points)")
  parser.add_argument("--quick", action="store_true", help="5,000 synthetic rows (smoke run)")
  parser.add_argument("--no-numpyro", dest="numpyro", action="store_false")
  parser.add_argument("--no-autodais", dest="autodais", action="store_false",
                      help="skip NumPyro's full-data AutoDAIS (the slowest run)")
  parser.add_argument("--only", default=None,
                      help="';'-separated substrings of 'method, estimator' labels to run "
                           "(e.g. 'SL-DAIS;DAIS (K=2, full data), naive;NumPyro AutoSurr')")
  parser.add_argument("--section", default="dais",
                      help="docs/benchmarks.md section to write (default: dais)")
  parser.add_argument("--numpyro-fed", action="store_true",
                      help="also run NumPyro's SL-DAIS with the batch indices substituted "
                           "into its plate (its fast configuration) beside the idiomatic one")
  parser.add_argument("--adaptive", action="store_true",
                      help="also run joint SVRG with control_weight='adaptive' (the "
                           "variance-minimizing weight of the control, from earlier steps)")
  parser.add_argument("--no-write", dest="write", action="store_false")
  args = parser.parse_args(argv)
  t_start = time.perf_counter()
  sections = []
  for dataset in args.datasets.split(","):
    table, _ = run_dataset(dataset.strip(), args)
    print(table, flush=True)
    sections.append(table)
  argv = sys.argv[1:] if argv is None else argv
  command = "python -m benchmarks dais " + shlex.join(argv)
  try:
    import numpyro
    numpyro_version = f"numpyro {numpyro.__version__}"
  except ImportError:
    numpyro_version = "numpyro not installed"
  body = (f"`{command}` ({time.perf_counter() - t_start:.0f} s). {_report.environment()}, "
          f"{numpyro_version}\n\n"
          + "\n\n".join(sections) + "\n")
  if args.write and not args.quick:
    _report.write_section(args.section, body)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
