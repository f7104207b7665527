"""Diagnostics: memory of estimator state, and Monte Carlo variance of an estimator
(the ELBO's estimates are :mod:`dsgrad.elbo_estimates`', re-exported here).

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
from dsgrad.elbo_estimates import (  # noqa: F401  (dsgrad.diagnostics.elbo, ...)
    ELBO_DRAWS_AT_ONCE, NonFiniteELBO, control_variate_mean, elbo, elbo_draws, elbo_unchecked,
    finite_elbo_draws, mean_and_standard_error, paired_gain, sampled_elbo_draws)
from dsgrad.training.batching import sample_batch
from dsgrad.objective import Objective, per_datum
from dsgrad.tables import tree_bytes


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

  @compile_cache.jit_by_text
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

  @compile_cache.jit_by_text
  def naive_draws(objective, params, keys):
    def one(k):
      indices, noise = sample_batch(k, objective, batch_size, replace=True)
      return flat(objective.grad(params, indices, noise, validate=False))
    return jax.lax.map(one, keys)

  @compile_cache.jit_by_text
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

  @compile_cache.jit_by_text
  def full_draws(objective, params, keys):
    n = objective.num_data
    all_idx = jnp.arange(n, dtype=jnp.int32)
    def one(k):
      noise = objective.sample_noise(k, n)
      return flat(objective.grad(params, all_idx, noise, validate=False))
    return jax.lax.map(one, keys)

  return naive_draws, datum_stats, full_draws
