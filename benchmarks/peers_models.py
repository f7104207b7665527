"""Models users bring, for ``python -m benchmarks peers``: a Bayesian neural network and a
hierarchical count model, each written once in NumPyro and once by hand in JAX.

Every contender optimizes the *same* objective: dsgrad through its NumPyro bridge
(:func:`dsgrad.contrib.numpyro.objective`), NumPyro SVI with ``AutoNormal`` on the same
model, and the hand-written optax step on a log density written directly in JAX, whose
equality with the bridge's (value at a random ``z``) is checked when the task is built.
Latent variables are in NumPyro's unconstrained space with its log-Jacobians, flattened in
the bridge's order (sites sorted by name).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class ModelSpec(NamedTuple):
  """A task defined by a model rather than by a GLM design matrix.

  Attributes:
    objective: dsgrad's objective, from the NumPyro bridge (mean-field Gaussian).
    numpyro_model: ``model(idx=None)``; with ``idx`` the data plate's subsample is those
      indices, without it the plate draws its own.
    init_values: constrained values at which ``AutoNormal`` starts (unconstrained zeros,
      where dsgrad's ``loc`` starts).
    log_likelihood: hand-written ``(z, indices) -> (B,)``.
    log_prior: hand-written ``z -> scalar`` (with the log-Jacobians).
    approximation: what the control variates use, in words (for the table's labels).
  """

  objective: object
  numpyro_model: Callable
  init_values: dict
  log_likelihood: Callable
  log_prior: Callable
  approximation: str = "1st order"


def _with_plate_indices(idx):
  import numpyro
  return numpyro.handlers.substitute(data={} if idx is None else {"N": idx})


def _finish(numpyro_model, log_likelihood, log_prior, num_data) -> ModelSpec:
  """The bridge's objective, NumPyro's initial values, and a check that the hand-written
  log density is the bridge's."""
  from dsgrad.contrib import numpyro as bridge
  objective = bridge.objective(numpyro_model)
  found = objective.numpyro_model
  d = found.model.latent_dim
  z = 0.3 * jax.random.normal(jax.random.key(7), (d,))
  idx = jnp.arange(min(num_data, 256))
  ours = found.model.log_prior(z) + jnp.sum(found.model.log_likelihood_at(z, idx))
  hand = log_prior(z) + jnp.sum(log_likelihood(z, idx))
  if not np.isclose(float(ours), float(hand), rtol=1e-4, atol=1e-2):
    raise AssertionError(f"hand-written log density {float(hand)} differs from the "
                         f"NumPyro bridge's {float(ours)}")
  init_values = found.constrain(jnp.zeros((d,)))
  return ModelSpec(objective, numpyro_model, init_values, log_likelihood, log_prior)


def _normal_logpdf(x, scale=1.0):
  return -0.5 * (x / scale) ** 2 - jnp.log(scale) - 0.5 * math.log(2 * math.pi)


# --------------------------------------------------------------- Bayesian neural network
BNN_INPUTS, BNN_HIDDEN = 8, 110


def bnn_data(num_data: int, seed: int = 0):
  """Regression data from a smooth nonlinear function of 8 standardized inputs, noise
  standard deviation 0.3."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num_data, BNN_INPUTS)).astype(np.float32)
  a = rng.normal(size=(BNN_INPUTS, 3)).astype(np.float32) / math.sqrt(BNN_INPUTS)
  f = np.sin(2 * x @ a[:, 0]) + 0.5 * (x @ a[:, 1]) ** 2 - np.tanh(x @ a[:, 2])
  y = (f + 0.3 * rng.normal(size=num_data)).astype(np.float32)
  return x, y


def bnn(num_data: int, batch_size: int) -> ModelSpec:
  """A one-hidden-layer tanh network (8 -> 110 -> 1) with ``N(0, 1)`` priors on every
  weight and on the log noise scale: 8 x 110 + 110 + 110 + 1 + 1 = 1,102 latent variables."""
  import numpyro
  import numpyro.distributions as dist

  x_np, y_np = bnn_data(num_data)
  x, y = jnp.asarray(x_np), jnp.asarray(y_np)
  d_in, h = BNN_INPUTS, BNN_HIDDEN

  def predict(w1, b1, w2, b2, xb):
    # 1/sqrt(H) keeps the output's prior scale O(1) as the width grows.
    return jnp.tanh(xb @ w1 + b1) @ w2 / math.sqrt(h) + b2

  def model(idx=None):
    w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((d_in, h)), 1.0).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(jnp.zeros(h), 1.0).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(jnp.zeros(h), 1.0).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0))
    log_noise = numpyro.sample("log_noise", dist.Normal(0.0, 1.0))
    with _with_plate_indices(idx):
      with numpyro.plate("N", num_data, subsample_size=batch_size) as ind:
        numpyro.sample("y", dist.Normal(predict(w1, b1, w2, b2, x[ind]), jnp.exp(log_noise)),
                       obs=y[ind])

  # The bridge's flat order: sites sorted by name (b1, b2, log_noise, w1, w2).
  sizes = {"b1": h, "b2": 1, "log_noise": 1, "w1": d_in * h, "w2": h}
  offsets = np.cumsum([0] + list(sizes.values()))

  def split(z):
    parts = {k: z[offsets[i]:offsets[i + 1]] for i, k in enumerate(sizes)}
    return parts["w1"].reshape(d_in, h), parts["b1"], parts["w2"], parts["b2"][0], \
        parts["log_noise"][0]

  def log_likelihood(z, idx):
    w1, b1, w2, b2, log_noise = split(z)
    return _normal_logpdf(y[idx] - predict(w1, b1, w2, b2, x[idx]), jnp.exp(log_noise))

  def log_prior(z):
    return jnp.sum(_normal_logpdf(z))

  return _finish(model, log_likelihood, log_prior, num_data)


# ------------------------------------------------------------ hierarchical count model
COUNT_GROUPS, COUNT_COVARIATES = 100, 5


def count_data(num_data: int, num_groups: int = COUNT_GROUPS, seed: int = 0):
  """Over-dispersed counts: ``y ~ NegBinomial(mean exp(mu + x beta + tau theta_g),
  concentration 3)``, groups of unequal sizes, true ``mu = 1``, ``tau = 0.5``."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num_data, COUNT_COVARIATES)).astype(np.float32)
  sizes = rng.dirichlet(np.full(num_groups, 2.0))
  groups = rng.choice(num_groups, size=num_data, p=sizes).astype(np.int32)
  beta = rng.normal(scale=0.3, size=COUNT_COVARIATES)
  theta = rng.normal(size=num_groups)
  mean = np.exp(1.0 + x @ beta + 0.5 * theta[groups])
  concentration = 3.0
  y = rng.negative_binomial(concentration, concentration / (concentration + mean))
  return x, groups, y.astype(np.int32)


def count_model(num_data: int, batch_size: int) -> ModelSpec:
  """Hierarchical negative-binomial regression, non-centered: ``beta ~ N(0, 1)``,
  ``mu ~ N(0, 1)``, ``tau ~ HalfNormal(1)``, ``theta_g ~ N(0, 1)`` for 100 groups,
  concentration ``phi ~ HalfNormal(10)``; ``y_n ~ NegBinomial2(exp(mu + x_n beta +
  tau theta_{g_n}), phi)``: 5 + 1 + 1 + 1 + 100 = 108 latent variables."""
  import numpyro
  import numpyro.distributions as dist

  x_np, g_np, y_np = count_data(num_data)
  x, g, y = jnp.asarray(x_np), jnp.asarray(g_np), jnp.asarray(y_np)
  k = COUNT_COVARIATES

  def model(idx=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(k), 1.0).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(COUNT_GROUPS), 1.0).to_event(1))
    phi = numpyro.sample("phi", dist.HalfNormal(10.0))
    with _with_plate_indices(idx):
      with numpyro.plate("N", num_data, subsample_size=batch_size) as ind:
        rate = jnp.exp(mu + x[ind] @ beta + tau * theta[g[ind]])
        numpyro.sample("y", dist.NegativeBinomial2(rate, phi), obs=y[ind])

  # Flat order (sorted): beta (5), mu, phi, tau, theta (100); phi and tau are exp(u).
  def split(z):
    return z[:k], z[k], jnp.exp(z[k + 1]), jnp.exp(z[k + 2]), z[k + 3:]

  def log_likelihood(z, idx):
    beta, mu, phi, tau, theta = split(z)
    log_rate = mu + x[idx] @ beta + tau * theta[g[idx]]
    counts = y[idx].astype(jnp.float32)
    log_phi_plus_rate = jnp.logaddexp(jnp.log(phi), log_rate)
    return (jax.scipy.special.gammaln(counts + phi) - jax.scipy.special.gammaln(phi)
            - jax.scipy.special.gammaln(counts + 1.0)
            + phi * (jnp.log(phi) - log_phi_plus_rate) + counts * (log_rate - log_phi_plus_rate))

  def log_prior(z):
    beta, mu, phi, tau, theta = split(z)
    half_normal = lambda v, s: _normal_logpdf(v, s) + math.log(2.0)
    # log-Jacobians of phi = exp(u) and tau = exp(u): + u.
    return (jnp.sum(_normal_logpdf(beta)) + _normal_logpdf(mu) + jnp.sum(_normal_logpdf(theta))
            + half_normal(tau, 1.0) + z[k + 2] + half_normal(phi, 10.0) + z[k + 1])

  return _finish(model, log_likelihood, log_prior, num_data)
