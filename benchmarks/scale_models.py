"""The scale suite's models, written as a user with 10^6-10^7 rows writes them: a log prior
and a per-row log likelihood over a pytree latent, handed to
:func:`dsgrad.objective_from_logdensity` (none of dsgrad's catalogue models). Data are
generated from a fixed seed with NumPy, so nothing is downloaded.

* ``hierarchical``: logistic regression with ``G`` groups, each with an intercept and two
  slopes drawn around global means (non-centred: ``ab = mu + exp(log_tau) * raw``), and
  ``D`` fixed effects. 10^6 rows, 20,000 groups: 60,014 latents.
* ``two_index``: Poisson counts with a per-user and a per-item effect and a few
  covariates (a rating or count model with two index columns). 10^6 rows, 30,000 users,
  5,000 items: 35,007 latents.
* ``mlp``: a Bayesian 20-32-2 MLP classifier (tanh), 10^6 rows: 738 latents.
* ``wide_glm``: logistic regression on a dense design of ``D = 1,000`` standardized
  features (4 GB of float32 at 10^6 rows), a sparse true weight vector: 1,001 latents.
* ``item_response``: a two-parameter item-response model (a person's ability, an item's
  difficulty and log discrimination, multiplied): 10^6 answers, 50,000 persons, 400
  items: 50,800 latents.
* ``factorization``: Gaussian matrix factorization of ratings (rank-4 user and item
  factors, a global mean), 10^6 ratings, 20,000 users, 3,000 items: 92,001 latents.

The last two were added after the advice was built, to check it on models it was not
developed on: their likelihoods multiply two rows' latents, where a control variate's
linear approximation is least accurate.

The models with per-row latents declare which latent rows each data row reads
(``reads``), so joint SAGA keeps a table of those coordinates only
(:func:`dsgrad.approx.sparse_linearize`; the dense tables would be 447 and 261 GiB).

Each builder returns a :class:`SuiteModel`: the objective, the same two functions and data
for a hand-written loop, and the flat latent's unravelling.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import dsgrad


class SuiteModel(NamedTuple):
  """One scale-suite model.

  Attributes:
    name: its name in :data:`BUILDERS`.
    objective: mean-field BBVI objective (one noise draw shared by the batch).
    log_prior: ``log_prior(z) -> scalar`` on the pytree latent.
    log_lik: ``log_lik(z, rows) -> (B,)`` on the pytree latent and a batch of rows.
    data: the rows as a dict of device arrays (axis 0: rows), the objective's own.
    unravel: flat ``(d,)`` vector -> pytree latent.
    dim: the flat latent's dimension ``d``.
    num_data: ``N``.
    summary: one line for the tables.
    latent: an example latent (zeros), as handed to ``objective_from_logdensity``.
    reads: the latent rows each data row reads (``objective_from_logdensity``'s
      ``reads``), or ``None``.
  """

  name: str
  objective: Any
  log_prior: Callable
  log_lik: Callable
  data: dict
  unravel: Callable
  dim: int
  num_data: int
  summary: str
  latent: Any = None
  reads: dict | None = None


def _normal_logpdf(x, scale=1.0):
  return -0.5 * jnp.sum((x / scale) ** 2) - jnp.size(x) * jnp.log(scale)


def _build(name, log_prior, log_lik, data, latent, summary, reads=None) -> SuiteModel:
  # On the device once: the objective and the hand-written loop share these arrays (a
  # second copy of the wide design would be 4 GB more).
  data = {key: jnp.asarray(value) for key, value in data.items()}
  objective = dsgrad.objective_from_logdensity(log_prior, log_lik, data, latent, name=name,
                                               reads=reads)
  flat, unravel = jax.flatten_util.ravel_pytree(latent)
  n = int(next(iter(data.values())).shape[0])
  return SuiteModel(name, objective, log_prior, log_lik, data, unravel, int(flat.size), n,
                    summary, latent, reads)


def on_disk(model: SuiteModel, directory: str) -> SuiteModel:
  """``model`` with its objective reading the rows from ``.npy`` files in ``directory``
  (written once, kept between runs), memory-mapped (:func:`dsgrad.data.open_memmap`),
  as a user whose data do not fit in memory runs it; the hand loop's ``data`` stay in
  memory."""
  os.makedirs(directory, exist_ok=True)
  files = {}
  for key, value in model.data.items():
    path = os.path.join(directory, f"{model.name}-{model.num_data}-{key}.npy")
    if not os.path.exists(path):
      np.save(path + ".part.npy", np.asarray(value))
      os.replace(path + ".part.npy", path)
    files[key] = dsgrad.data.open_memmap(path, dtype=np.asarray(value[:1]).dtype,
                                         shape=value.shape)
  objective = dsgrad.objective_from_logdensity(model.log_prior, model.log_lik, files,
                                               model.latent, name=model.name + " (disk)",
                                               reads=model.reads)
  return model._replace(objective=objective, summary=model.summary + "; rows read from disk")


def hierarchical(num_data: int = 1_000_000, groups: int = 20_000, dim: int = 8,
                 seed: int = 0) -> SuiteModel:
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_data, dim), dtype=np.float32)
  g = rng.integers(0, groups, num_data).astype(np.int32)
  mu, tau = np.array([-0.5, 1.0, -0.5]), np.array([1.0, 0.5, 0.5])
  ab = mu + tau * rng.standard_normal((groups, 3))
  beta = rng.standard_normal(dim) / np.sqrt(dim)
  logits = x @ beta + ab[g, 0] + ab[g, 1] * x[:, 0] + ab[g, 2] * x[:, 1]
  y = (rng.random(num_data) < 1 / (1 + np.exp(-logits))).astype(np.float32)

  def log_prior(z):
    return (_normal_logpdf(z["beta"]) + _normal_logpdf(z["mu"], 2.0)
            + _normal_logpdf(z["log_tau"]) + _normal_logpdf(z["raw"]))

  def log_lik(z, rows):
    ab_rows = z["mu"] + jnp.exp(z["log_tau"]) * z["raw"][rows["g"]]  # (B, 3)
    xr = rows["x"]
    logit = (xr @ z["beta"] + ab_rows[:, 0] + ab_rows[:, 1] * xr[:, 0]
             + ab_rows[:, 2] * xr[:, 1])
    # Bernoulli log likelihood with 0/1 labels: y * logit - log(1 + e^logit).
    return rows["y"] * logit - jax.nn.softplus(logit)

  latent = {"beta": jnp.zeros(dim), "mu": jnp.zeros(3), "log_tau": jnp.zeros(3),
            "raw": jnp.zeros((groups, 3))}
  return _build("hierarchical", log_prior, log_lik, {"x": x, "g": g, "y": y}, latent,
                f"hierarchical logistic regression, N = {num_data:,}, {groups:,} groups "
                f"(intercept + 2 slopes), {dim} fixed effects", reads={"raw": "g"})


def two_index(num_data: int = 1_000_000, users: int = 30_000, items: int = 5_000,
              dim: int = 4, seed: int = 0) -> SuiteModel:
  rng = np.random.default_rng(seed + 1)
  u = rng.integers(0, users, num_data).astype(np.int32)
  i = rng.integers(0, items, num_data).astype(np.int32)
  x = rng.standard_normal((num_data, dim), dtype=np.float32)
  a = 0.5 * rng.standard_normal(users)
  c = 0.5 * rng.standard_normal(items)
  beta = 0.3 * rng.standard_normal(dim)
  rate = np.exp(0.5 + a[u] + c[i] + x @ beta)
  y = rng.poisson(rate).astype(np.float32)

  def log_prior(z):
    return (_normal_logpdf(z["bias"], 2.0) + _normal_logpdf(z["beta"])
            + _normal_logpdf(z["log_scales"]) + _normal_logpdf(z["user_raw"])
            + _normal_logpdf(z["item_raw"]))

  def log_lik(z, rows):
    s = jnp.exp(z["log_scales"])
    eta = (z["bias"] + rows["x"] @ z["beta"] + s[0] * z["user_raw"][rows["u"]]
           + s[1] * z["item_raw"][rows["i"]])
    # Poisson log likelihood up to the data's constant -log(y!).
    return rows["y"] * eta - jnp.exp(eta)

  latent = {"bias": jnp.zeros(()), "beta": jnp.zeros(dim), "log_scales": jnp.zeros(2),
            "user_raw": jnp.zeros(users), "item_raw": jnp.zeros(items)}
  return _build("two_index", log_prior, log_lik, {"u": u, "i": i, "x": x, "y": y}, latent,
                f"Poisson counts with per-user and per-item effects, N = {num_data:,}, "
                f"{users:,} users, {items:,} items, {dim} covariates",
                reads={"user_raw": "u", "item_raw": "i"})


def mlp(num_data: int = 1_000_000, inputs: int = 20, hidden: int = 32, classes: int = 2,
        seed: int = 0) -> SuiteModel:
  rng = np.random.default_rng(seed + 2)
  x = rng.standard_normal((num_data, inputs), dtype=np.float32)
  teacher = rng.standard_normal((inputs, classes))
  y = np.argmax(x @ teacher + 0.5 * np.sin(3 * x[:, :classes]), axis=1).astype(np.int32)

  def log_prior(z):
    return sum(_normal_logpdf(leaf) for leaf in jax.tree.leaves(z))

  def log_lik(z, rows):
    h = jnp.tanh(rows["x"] @ z["w1"] + z["b1"])
    logp = jax.nn.log_softmax(h @ z["w2"] + z["b2"])
    return jnp.take_along_axis(logp, rows["y"][:, None], 1)[:, 0]

  latent = {"w1": jnp.zeros((inputs, hidden)), "b1": jnp.zeros(hidden),
            "w2": jnp.zeros((hidden, classes)), "b2": jnp.zeros(classes)}
  return _build("mlp", log_prior, log_lik, {"x": x, "y": y}, latent,
                f"Bayesian {inputs}-{hidden}-{classes} MLP classifier, N = {num_data:,}")


def wide_glm(num_data: int = 1_000_000, dim: int = 1_000, seed: int = 0,
             chunk: int = 100_000) -> SuiteModel:
  rng = np.random.default_rng(seed + 3)
  # Written chunk by chunk: a float64 draw of the whole design would need 8 GB.
  x = np.empty((num_data, dim), np.float32)
  for start in range(0, num_data, chunk):
    x[start:start + chunk] = rng.standard_normal((min(chunk, num_data - start), dim),
                                                 dtype=np.float32)
  beta = np.zeros(dim)
  active = rng.choice(dim, min(50, dim), replace=False)
  beta[active] = rng.standard_normal(active.size) / np.sqrt(active.size) * 3
  logits = np.concatenate([x[s:s + chunk] @ beta for s in range(0, num_data, chunk)]) - 0.5
  y = (rng.random(num_data) < 1 / (1 + np.exp(-logits))).astype(np.float32)
  data = {"x": x, "y": y}
  del x  # the builder's copy goes once the device holds the design

  def log_prior(z):
    return _normal_logpdf(z["w"]) + _normal_logpdf(z["b"], 5.0)

  def log_lik(z, rows):
    logit = rows["x"] @ z["w"] + z["b"]
    return rows["y"] * logit - jax.nn.softplus(logit)

  latent = {"w": jnp.zeros(dim), "b": jnp.zeros(())}
  return _build("wide_glm", log_prior, log_lik, data, latent,
                f"logistic regression on a dense design, N = {num_data:,}, D = {dim:,}")


def item_response(num_data: int = 1_000_000, persons: int = 50_000, items: int = 400,
                  seed: int = 0) -> SuiteModel:
  rng = np.random.default_rng(seed + 4)
  p = rng.integers(0, persons, num_data).astype(np.int32)
  i = rng.integers(0, items, num_data).astype(np.int32)
  theta, b = rng.standard_normal(persons), rng.standard_normal(items)
  a = np.exp(0.3 * rng.standard_normal(items))
  eta = a[i] * (theta[p] - b[i])
  y = (rng.random(num_data) < 1 / (1 + np.exp(-eta))).astype(np.float32)

  def log_prior(z):
    return (_normal_logpdf(z["theta"]) + _normal_logpdf(z["b"], 2.0)
            + _normal_logpdf(z["log_a"], 0.5))

  def log_lik(z, rows):
    # Two-parameter logistic: discrimination times (ability - difficulty), a product of
    # two rows' latents.
    eta = jnp.exp(z["log_a"][rows["i"]]) * (z["theta"][rows["p"]] - z["b"][rows["i"]])
    return rows["y"] * eta - jax.nn.softplus(eta)

  latent = {"theta": jnp.zeros(persons), "b": jnp.zeros(items), "log_a": jnp.zeros(items)}
  return _build("item_response", log_prior, log_lik, {"p": p, "i": i, "y": y}, latent,
                f"two-parameter item response, N = {num_data:,}, {persons:,} persons, "
                f"{items:,} items", reads={"theta": "p", "b": "i", "log_a": "i"})


def factorization(num_data: int = 1_000_000, users: int = 20_000, items: int = 3_000,
                  rank: int = 4, seed: int = 0) -> SuiteModel:
  rng = np.random.default_rng(seed + 5)
  u = rng.integers(0, users, num_data).astype(np.int32)
  i = rng.integers(0, items, num_data).astype(np.int32)
  user_f = 0.5 * rng.standard_normal((users, rank))
  item_f = 0.5 * rng.standard_normal((items, rank))
  y = (3.0 + np.sum(user_f[u] * item_f[i], 1)
       + 0.5 * rng.standard_normal(num_data)).astype(np.float32)

  def log_prior(z):
    return _normal_logpdf(z["user"]) + _normal_logpdf(z["item"]) + _normal_logpdf(z["mu"], 5.0)

  def log_lik(z, rows):
    # Gaussian ratings around an inner product of factor rows (noise scale 0.5, known).
    pred = z["mu"] + jnp.sum(z["user"][rows["u"]] * z["item"][rows["i"]], axis=-1)
    return -2.0 * (rows["y"] - pred) ** 2

  latent = {"user": jnp.zeros((users, rank)), "item": jnp.zeros((items, rank)),
            "mu": jnp.zeros(())}
  return _build("factorization", log_prior, log_lik, {"u": u, "i": i, "y": y}, latent,
                f"Gaussian matrix factorization, N = {num_data:,}, {users:,} users, "
                f"{items:,} items, rank {rank}", reads={"user": "u", "item": "i"})


BUILDERS = {"hierarchical": hierarchical, "two_index": two_index, "mlp": mlp,
            "wide_glm": wide_glm, "item_response": item_response,
            "factorization": factorization}
"""The suite's models by name; each takes ``num_data`` and ``seed`` (the data's)."""


def hand_loss(model: SuiteModel) -> Callable:
  """The negative-ELBO mini-batch loss a user writes for mean-field BBVI by hand (entropy
  up to its constant): ``(params, rows, eps) -> scalar`` with ``params = {"loc",
  "log_scale"}`` over the flat latent, ``rows`` the batch's rows, ``eps`` one ``(d,)``
  standard normal draw for the batch."""
  n = model.num_data

  def loss(params, rows, eps):
    z = model.unravel(params["loc"] + jnp.exp(params["log_scale"]) * eps)
    return (-n * jnp.mean(model.log_lik(z, rows)) - model.log_prior(z)
            - jnp.sum(params["log_scale"]))

  return loss
