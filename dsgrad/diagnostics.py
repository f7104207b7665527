"""Diagnostics: memory of estimator state, and Monte Carlo variance of an estimator.

References:
  Wang, Geffner, Domke (2024), Sec. 3 (variance decomposition), Fig. 2, Table 1.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad.training import compile_cache
from dsgrad import checks
from dsgrad import elbo_trust
from dsgrad.training.batching import sample_batch
from dsgrad.objective import Objective, per_datum
from dsgrad.tables import full_pass_mean, tree_bytes


def table_bytes(state: Any) -> int:
  """Bytes held in per-datum tables (state fields named ``table``), anywhere in ``state``.

  Works on a single estimator state or on the state of an ``optax.chain``.
  """
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if any(isinstance(k, jax.tree_util.GetAttrKey) and k.name == "table" for k in path):
      total += tree_bytes(leaf)
  return total


def state_bytes(state: Any) -> int:
  """Total bytes of all arrays in a state (tables, running means, optimizer moments)."""
  return tree_bytes(state)


@checks.arguments(params=checks.parameters(), objective=checks.objective(),
                  key=checks.prng_key(), num_draws=checks.count(2), batch_size=checks.count(1))
def estimator_samples(transform: optax.GradientTransformationExtraArgs, state, params,
                      objective: Objective, key, num_draws: int, batch_size: int, *,
                      replace: bool = True):
  """Draws the estimator's output at fixed ``(state, params)`` for fresh batches.

  Each draw samples a batch of ``batch_size`` indices (uniform; with or without
  replacement) and its noise, computes the naive gradient and passes it through
  ``transform.update``; the state update is discarded, so every draw sees the same
  table/snapshot.

  Args:
    transform: an estimator (not a chain: its output would be the optimizer's step).
    state: its state.
    params: the parameters at which to evaluate.
    objective: the objective.
    key: PRNG key.
    num_draws: number of draws ``M``.
    batch_size: ``B``.
    replace: sample indices with replacement (i.i.d.) or not.

  Returns:
    A ``(M, P)`` array: each row the flattened output (``P`` = number of parameters).
  """
  if isinstance(state, tuple) and not hasattr(state, "_fields") and state:
    raise ValueError(
        "estimator_samples draws the estimator's own output, so it needs the estimator "
        "and its state, not an optax.chain (whose output is the optimizer's step): for "
        "opt = optax.chain(est, optax.adam(...)) pass est and state[0]")
  # Imported here: the estimators import this module.
  from dsgrad.estimators.checked import check_state
  check_state(transform, state, params, "dsgrad.estimator_samples")  # another's state named
  draws = _estimator_draws(transform, jax.tree.structure(objective), batch_size, replace)
  return draws(objective, state, params, jax.random.split(key, num_draws))


@compile_cache.cached
def _estimator_draws(transform, structure, batch_size: int, replace: bool):
  """The draws' program for objectives of ``structure``: the objective (its data) is an
  argument, handed to the estimator's ``update``; as a constant, XLA would fold every row
  into the program (4 GB at 10^6 rows of 1,000 features)."""
  del structure  # the cache's key: one program per kind of objective

  @jax.jit
  def draws(objective, state, params, keys):
    def one(k):
      indices, noise = sample_batch(k, objective, batch_size, replace)
      grads = objective.grad(params, indices, noise, validate=False)
      out, _ = transform.update(grads, state, params, indices=indices, noise=noise,
                                objective=objective)
      return jax.flatten_util.ravel_pytree(out)[0]
    return jax.lax.map(one, keys)

  return draws


def total_variance(samples) -> tuple[float, float]:
  """Trace of the covariance of the rows of ``samples`` and its standard error.

  ``V = mean_m ||x_m - x_bar||^2 * M/(M-1)``; the standard error is that of the mean of
  the squared deviations, ``std(||x_m - x_bar||^2) / sqrt(M)``.

  Args:
    samples: ``(M, P)`` draws (a row each, as :func:`estimator_samples` gives them), ``(M,)``
      scalar draws, or a dict (or NamedTuple) of arrays sharing the leading draw axis
      ``M``, like params with a draw axis (each draw's leaves flattened into one row).

  Returns:
    ``(variance, standard_error)`` as floats.

  Raises:
    ValueError: fewer than 2 draws, or a draw that holds NaN or inf.
  """
  if isinstance(samples, dict) or hasattr(samples, "_fields"):  # params-like draws
    leaves = jax.tree.leaves(samples)
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else 0 for leaf in leaves}
    if len(sizes) != 1 or 0 in sizes:
      raise ValueError(f"total_variance: the leaves of samples need one shared leading "
                       f"draw axis (axis 0); their lengths are {sorted(sizes)} (0: a scalar)")
    draws = sizes.pop()
    samples = np.concatenate([np.reshape(leaf, (draws, -1)) for leaf in leaves], 1)
  x = np.asarray(samples, np.float64)
  x = x[:, None] if x.ndim == 1 else x.reshape(x.shape[0], -1) if x.ndim > 2 else x
  m = x.shape[0] if x.ndim else 0
  if m < 2:
    raise ValueError(f"total_variance needs at least 2 draws (rows of samples) for a "
                     f"variance, got {m}")
  bad = ~np.isfinite(x).all(axis=1)
  if bad.any():  # one NaN draw would make the variance NaN, as if it were measured
    raise ValueError(f"total_variance: {int(bad.sum())} of {m} draws hold NaN or inf (the "
                     f"first is row {int(np.argmax(bad))}); a variance of them is not defined")
  sq = np.sum((x - x.mean(0)) ** 2, axis=1) * m / (m - 1)
  return float(sq.mean()), float(sq.std(ddof=1) / np.sqrt(m))


@checks.arguments(objective=checks.objective(), params=checks.parameters(), key=checks.prng_key(),
                  num_samples=checks.count(2), chunk_size=checks.count(1),
                  num_data_sampled=checks.optional(checks.count(1)))
def elbo(objective: Objective, params, key, num_samples: int = 1000,
         chunk_size: int = 4096, num_data_sampled: int | None = None):
  """Full-data ELBO ``-E_eps mean_n f(w; n, eps)`` by Monte Carlo, in bounded memory.

  For a BBVI objective (Eq. 3) this is the evidence lower bound; for other objectives
  it is minus the expected full-data loss. Each Monte Carlo sample draws fresh noise
  and sweeps all data in chunks of ``chunk_size`` (a shared-noise objective uses one
  draw for all data). Compiled once per (objective structure, num_samples,
  chunk_size): objectives made by :meth:`~dsgrad.Objective.with_data` share it.

  With ``num_data_sampled`` below ``N``, each sample instead reads that many data (rounded
  up to whole chunks) drawn uniformly with replacement: still unbiased, its standard
  error holding the subsampling's spread too, at that fraction of a full pass's cost
  (:func:`sampled_elbo_draws`). On large data this buys more precision per second than
  fewer full passes only when the data's terms vary less than the noise's; on a
  hierarchical model with 10^6 data the two were even.

  Returns:
    ``(estimate, standard_error)`` as floats.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> value, standard_error = dsgrad.elbo(objective, params, jax.random.key(1), num_samples=50)
    >>> bool(standard_error > 0), bool(value < 0)
    (True, True)
  """
  checks.check_objective_evaluates(objective, params, "elbo")
  value, se = elbo_unchecked(objective, params, key, num_samples, chunk_size, num_data_sampled)
  elbo_trust.warn_above_bound(value, se, objective.log_evidence_bound, "from dsgrad.elbo")
  return value, se


@checks.arguments(key=checks.prng_key(), num_samples=checks.count(2),
                  chunk_size=checks.count(1), num_data_sampled=checks.optional(checks.count(1)))
def elbo_unchecked(objective: Objective, params, key, num_samples: int = 1000,
                   chunk_size: int = 4096, num_data_sampled: int | None = None):
  """:func:`elbo` without its checks of ``params`` (finite values, the objective's
  shapes): for a caller that has checked them (:func:`dsgrad.fit` evaluates the ELBO of
  params it checks itself, many times a run)."""
  if num_data_sampled is not None and num_data_sampled < objective.num_data:
    values = sampled_elbo_draws(objective, num_samples, chunk_size)(params, key,
                                                                    num_data_sampled)
  else:
    values = elbo_draws(objective, num_samples, chunk_size)(params, key)
  return mean_and_standard_error(finite_elbo_draws(values, "dsgrad.elbo"))


class NonFiniteELBO(ValueError):
  """An ELBO estimate whose Monte Carlo draws are not all finite
  (:func:`finite_elbo_draws`): ``who`` estimated it, ``detail`` says what was found."""

  def __init__(self, who: str, detail: str):
    super().__init__(f"{who}: {detail}")
    self.who, self.detail = who, detail


def finite_elbo_draws(draws, who: str) -> np.ndarray:
  """``draws`` (Monte Carlo draws of an ELBO) as float64, refusing them where any is not
  finite: their mean would be reported as -inf or NaN with a NaN standard error.

  Raises:
    NonFiniteELBO: a ``ValueError`` naming ``who``, how many draws are -inf, +inf or
      NaN, and the usual causes.
  """
  values = np.asarray(draws, np.float64)
  if np.all(np.isfinite(values)):
    return values
  counts = {"-inf": int(np.sum(values == -np.inf)), "+inf": int(np.sum(values == np.inf)),
            "NaN": int(np.sum(np.isnan(values)))}
  found = ", ".join(f"{count} {name}" for name, count in counts.items() if count)
  raise NonFiniteELBO(
      who, f"the ELBO is not finite at these params ({found} of {values.size} Monte Carlo "
      "draws): the log density is -inf or NaN where q puts mass, e.g. a datum the "
      "likelihood deems impossible (log 0), a latent outside the prior's support, or an "
      "overflow (exp of a large value). Per-datum terms (objective.loss_fn on a few "
      "indices at a time) find the datum.")


def mean_and_standard_error(draws) -> tuple[float, float]:
  """``(mean, standard error of the mean)`` of independent draws, in float64."""
  values = np.asarray(draws, np.float64)
  return float(values.mean()), float(values.std(ddof=1) / np.sqrt(values.size))


def paired_gain(draws: list, reference: list) -> tuple[float, float]:
  """``(gain, its standard error)`` of one run's ELBO over a ``reference`` run, from both
  runs' draws at several checkpoints, each with common random numbers: the mean over
  checkpoints of the paired differences, as :func:`dsgrad.recommend` compares runs at
  equal time.

  The checkpoints' means scatter by the draws' noise and by a run's jitter from step to
  step; their spread estimates both (a one-way random-effects model), but from a few
  checkpoints only, so the draws' share, estimated from every draw, is its floor. (Their
  sum counted the draws' noise twice: 1.35-1.4x the true error where it dominates.)"""
  differences = [np.asarray(a, np.float64) - np.asarray(b, np.float64)
                 for a, b in zip(draws, reference)]
  means = np.array([d.mean() for d in differences])
  draw_variance = np.mean([d.var(ddof=1) / d.size for d in differences]) / means.size
  checkpoint_variance = means.var(ddof=1) / means.size if means.size > 1 else 0.0
  return float(means.mean()), float(np.sqrt(max(draw_variance, checkpoint_variance)))


@checks.arguments(num_samples=checks.count(1), chunk_size=checks.count(1))
def elbo_draws(objective: Objective, num_samples: int = 1000, chunk_size: int = 4096):
  """The compiled function behind :func:`elbo`: ``(params, key) -> (num_samples,)`` draws
  of the full-data ELBO, whose mean :func:`elbo` reports. Use it to evaluate many
  parameter sets in one program (``jax.vmap`` over params) with the same noise.

  Shared by objectives of one structure: the objective (its data) is an argument of the
  compiled program, so :meth:`~dsgrad.Objective.with_data` copies reuse it.
  Chunks run in :func:`dsgrad.tables.full_pass_mean` (a program of constant size in
  ``N``).

  Args:
    objective: the objective.
    num_samples: Monte Carlo draws per call.
    chunk_size: data per chunk of the full pass.

  Returns:
    A function ``(params, key) -> (num_samples,)`` array, computing with ``objective``'s
    data.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)}
    >>> draws = dsgrad.diagnostics.elbo_draws(objective, 8)(params, jax.random.key(1))
    >>> draws.shape
    (8,)
  """
  program = compile_cache.get_or_build(
      ("elbo_draws", jax.tree.structure(objective), num_samples, chunk_size),
      lambda: jax.jit(functools.partial(_elbo_run, num_samples=num_samples,
                                        chunk_size=chunk_size)))[0]
  return functools.partial(program, objective)


@checks.arguments(num_samples=checks.count(1), chunk_size=checks.count(1))
def sampled_elbo_draws(objective: Objective, num_samples: int = 64, chunk_size: int = 4096):
  """``(params, key, rows) -> (num_samples,)`` ELBO draws, each on ``rows`` data: with
  ``rows >= N`` a full pass (as :func:`elbo_draws`), else ``rows`` (rounded up to whole
  chunks) drawn uniformly with replacement, scaled to the full data (unbiased). ``rows``
  is an argument of one compiled program, so a caller can time a chunk and then choose
  how many to read without compiling again (:func:`dsgrad.recommend` does).

  The same ``key`` draws the same rows and noise at any ``params``: differences between
  parameter sets keep common random numbers for the subsampling too.

  Args:
    objective: the objective.
    num_samples: Monte Carlo draws per call.
    chunk_size: data per chunk (at most ``N``).

  Returns:
    A function ``(params, key, rows) -> (num_samples,)`` array.

  Example::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 1000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> draws = dsgrad.diagnostics.sampled_elbo_draws(objective, 8, 100)(
    ...     params, jax.random.key(1), 200)  # two chunks of 100 data per draw
    >>> draws.shape
    (8,)
  """
  chunk = max(1, min(int(chunk_size), objective.num_data))
  program = compile_cache.get_or_build(
      ("sampled_elbo_draws", jax.tree.structure(objective), num_samples, chunk),
      lambda: jax.jit(functools.partial(_sampled_elbo_run, num_samples=num_samples,
                                        chunk_size=chunk)))[0]
  return functools.partial(program, objective)


def _sampled_elbo_run(objective: Objective, params, key, rows, *, num_samples: int,
                      chunk_size: int):
  n = objective.num_data
  full = rows >= n
  num_chunks = jnp.where(full, -(-n // chunk_size), jnp.maximum(1, -(-rows // chunk_size)))
  positions = jnp.arange(chunk_size)
  dtype = jnp.result_type(float)

  def one(k):
    k_rows, k_noise = jax.random.split(k)

    def body(j, total):
      # A full pass reads the data in order (its last chunk padded and masked); a
      # sampled one draws each chunk's rows.
      idx, weights = jax.lax.cond(
          full,
          lambda: (jnp.minimum(j * chunk_size + positions, n - 1),
                   (j * chunk_size + positions < n).astype(dtype)),
          lambda: (jax.random.randint(jax.random.fold_in(k_rows, j), (chunk_size,), 0, n),
                   jnp.ones(chunk_size, dtype)))
      k_chunk = k_noise if objective.shared_noise else jax.random.fold_in(k_noise, j)
      noise = objective.sample_noise(k_chunk, chunk_size)
      loss = objective.loss(params, idx, noise, validate=False).astype(dtype)
      return total + jnp.sum(weights * loss)

    total = jax.lax.fori_loop(0, num_chunks, body, jnp.zeros((), dtype))
    return -total / jnp.where(full, n, num_chunks * chunk_size).astype(dtype)

  return jax.lax.map(one, jax.random.split(key, num_samples))


def _elbo_run(objective: Objective, params, key, *, num_samples: int, chunk_size: int):
  def one(params, k):
    def chunk_mean(idx):
      k_chunk = k if objective.shared_noise else jax.random.fold_in(k, idx[0])
      noise = objective.sample_noise(k_chunk, idx.shape[0])
      return jnp.mean(objective.loss(params, idx, noise, validate=False))
    return -full_pass_mean(chunk_mean, objective.num_data, chunk_size)

  return jax.lax.map(lambda k: one(params, k), jax.random.split(key, num_samples))


@checks.arguments(objective=checks.objective(), params=checks.parameters(), key=checks.prng_key(),
                  batch_size=checks.count(1), num_draws=checks.count(2),
                  full_draws=checks.count(2),
                  noise_draws_per_datum=checks.count(2), chunk_size=checks.count(1),
                  num_data_sampled=checks.optional(checks.count(2)))
def variance_decomposition(objective: Objective, params, key, batch_size: int, *,
                           num_draws: int = 2000, full_draws: int = 200,
                           noise_draws_per_datum: int = 8, chunk_size: int = 256,
                           num_data_sampled: int | None = None) -> dict:
  """The variance decomposition of Table 1 at ``params``, for batches of ``batch_size``.

  Variances are traces of covariance matrices, for a batch of ``B`` i.i.d. data:

  * ``V_n_eps``: of the naive estimator ``mean_B grad f(w; n, eps)`` (data and noise
    drawn): ``num_draws`` Monte Carlo draws.
  * ``V_n``: of ``mean_B grad f(w; n)``, the noise-averaged per-datum gradient, over the
    batch draw: ``tr Cov_n[grad f(w; n)] / B``. Each ``grad f(w; n)`` is estimated with
    ``K = noise_draws_per_datum`` draws for every datum; the Monte Carlo inflation
    ``E_n tr V_eps[grad f(w; n, eps)] / K`` is estimated from the within-datum sample
    variances and subtracted, so the estimate is unbiased. With ``num_data_sampled = m
    < N`` only ``m`` data drawn uniformly without replacement enter it: their sample
    covariance (divisor ``m - 1``) is unbiased for the population's (divisor
    ``N - 1``), at ``m / N`` of the cost.
  * ``V_eps``: of the full-data gradient ``grad f(w; eps) = mean_n grad f(w; n, eps)``
    over the noise: ``full_draws`` full passes.

  Cost: ``num_draws`` batch gradients, ``full_draws`` full-data gradients, and ``m K``
  per-datum gradients (``m = N`` by default), each a dense vector of the params' size:
  the term that dominates for a model with many latent variables.

  Returns:
    ``{"V_n_eps", "V_n", "V_eps"}`` and the standard errors ``"V_n_eps_se"`` and
    ``"V_eps_se"`` (``V_n``'s estimate has none: its data-sampling error is not
    estimated).

  References:
    Wang, Geffner, Domke (2024), Sec. 3, Table 1, Fig. 1.

  Example: at the start of training, for batches of 10 of 100 data; the naive
  estimator's variance holds both sources, so it exceeds each part::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> v = dsgrad.variance_decomposition(
    ...     dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model, 0.0, -1.0),
    ...     jax.random.key(1), 10, num_draws=500, full_draws=100)
    >>> sorted(name for name in v if not name.endswith("_se"))
    ['V_eps', 'V_n', 'V_n_eps']
    >>> bool(v["V_n_eps"] - 3 * v["V_n_eps_se"] > max(v["V_n"], v["V_eps"]))
    True
  """
  checks.check_objective_evaluates(objective, params, "variance_decomposition")
  n = objective.num_data
  k_naive, k_datum, k_full = jax.random.split(key, 3)
  naive_draws, datum_stats, full_draws_fn = (
      functools.partial(program, objective) for program in _decomposition_fns(
          jax.tree.structure(objective), batch_size, noise_draws_per_datum))
  v_n_eps, v_n_eps_se = total_variance(
      naive_draws(params, jax.random.split(k_naive, num_draws)))

  kk = noise_draws_per_datum
  m = n if num_data_sampled is None else min(n, num_data_sampled)
  if m == n:
    data = jnp.arange(n, dtype=jnp.int32)
  else:
    data = jnp.sort(jax.random.choice(jax.random.fold_in(k_datum, 2**30), n, (m,),
                                      replace=False)).astype(jnp.int32)
  chunk = min(chunk_size, m)
  total, total_sq, within_sum = 0.0, 0.0, 0.0
  for c, start in enumerate(range(0, m, chunk)):
    s, sq, w = datum_stats(params, data[start:start + chunk], jax.random.fold_in(k_datum, c))
    total, total_sq, within_sum = total + s, total_sq + sq, within_sum + w
  mean_all = total / m
  # tr Cov_n of the K-draw means, then remove the E_n tr V_eps / K inflation.
  cov_trace = (total_sq / m - jnp.sum(mean_all ** 2)) * m / (m - 1)
  v_n = float((cov_trace - within_sum / m / kk) / batch_size)

  v_eps, v_eps_se = total_variance(full_draws_fn(params, jax.random.split(k_full, full_draws)))
  return {"V_n_eps": v_n_eps, "V_n_eps_se": v_n_eps_se, "V_n": v_n,
          "V_eps": v_eps, "V_eps_se": v_eps_se}


@compile_cache.cached
def _decomposition_fns(structure, batch_size: int, noise_draws: int):
  """The jitted pieces of :func:`variance_decomposition`, compiled once per kind of
  objective (``structure``, the cache's key): the objective, its data, is each one's
  first argument, not a constant folded into the program."""
  del structure
  flat = lambda tree: jax.flatten_util.ravel_pytree(tree)[0]  # noqa: E731

  @jax.jit
  def naive_draws(objective, params, keys):
    def one(k):
      indices, noise = sample_batch(k, objective, batch_size, replace=True)
      return flat(objective.grad(params, indices, noise, validate=False))
    return jax.lax.map(one, keys)

  @jax.jit
  def datum_stats(objective, params, indices, k):
    # (K, C, P) per-datum gradients at K noise draws.
    def at(kd):
      noise = objective.sample_noise(kd, indices.shape[0])
      g = per_datum(lambda p, i, e: objective.grad(p, i, e, validate=False), objective,
                    params_axis=None)(params, indices, noise)
      return jax.vmap(flat)(g)
    grads = jax.lax.map(at, jax.random.split(k, noise_draws))
    mean = grads.mean(0)
    within = jnp.sum(grads.var(0, ddof=1), axis=1)   # tr of per-datum noise variance
    return mean.sum(0), jnp.sum(mean ** 2), jnp.sum(within)

  @jax.jit
  def full_draws(objective, params, keys):
    n = objective.num_data
    all_idx = jnp.arange(n, dtype=jnp.int32)
    def one(k):
      noise = objective.sample_noise(k, n)
      return flat(objective.grad(params, all_idx, noise, validate=False))
    return jax.lax.map(one, keys)

  return naive_draws, datum_stats, full_draws
