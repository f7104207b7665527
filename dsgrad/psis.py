"""How far to trust a variational approximation: Pareto-smoothed importance sampling.

Draw ``z_s ~ q`` and form the log importance ratios ``r_s = log p(x, z_s) - log q(z_s)``.
If ``q`` covered the posterior well the ratios would be nearly constant; the heavier
the right tail of ``exp(r_s)``, the worse ``q`` misses mass of the posterior. PSIS fits a
generalized Pareto distribution to the largest ratios; its shape ``k`` (k-hat) reads:

* ``k < 0.5``: the importance weights have finite variance; ``q`` is close to the
  posterior and expectations under ``q`` can be trusted (or corrected by PSIS);
* ``0.5 <= k < 0.7``: usable with PSIS correction, with care;
* ``k >= 0.7``: the approximation misses a part of the posterior; do not trust its
  variances or tails (Yao et al. 2018).

Sign convention: the functions here take the *log ratios* ``log p - log q`` (large =
where ``q`` puts too little mass), as BlackJAX's ``psis_weights`` does; ArviZ's
``psislw`` takes their negation.

References:
  Vehtari, Simpson, Gelman, Yao, Gabry (2024). Pareto smoothed importance sampling.
  JMLR 25(72), Algorithm 1 and Sec. 3 (k-hat thresholds).
  Yao, Vehtari, Simpson, Gelman (2018). Yes, but did it work?: evaluating variational
  inference. ICML.
  Zhang, Stephens (2009). A new and efficient estimation method for the generalized
  Pareto distribution. Technometrics 51(3) (the fit of ``k``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks, diagnostics
from dsgrad.training import compile_cache

__all__ = ["pareto_k", "psis_log_weights", "importance_log_ratios", "diagnose",
           "K_HAT_GOOD", "K_HAT_BAD"]

K_HAT_GOOD = 0.5
K_HAT_BAD = 0.7


def _tail_length(num_draws: int) -> int:
  # Vehtari et al. (2024), Sec. 3: M = min(3 sqrt(S), S / 5) for independent draws.
  return min(max(int(3.0 * math.sqrt(num_draws)), 5), num_draws // 5)


def _gpd_fit(exceedances: jax.Array):
  """``(k, sigma)`` of a generalized Pareto distribution fitted to ``exceedances``
  (ascending, non-negative) by Zhang and Stephens' (2009) profile-likelihood average
  over a grid of ``b = -k / sigma``, with the weakly informative prior of Vehtari et al.
  (2024, App. C) that shrinks ``k`` toward 0.5 (10 pseudo-observations)."""
  n = exceedances.shape[0]
  grid = 30 + int(math.sqrt(n))
  tiny = jnp.finfo(exceedances.dtype).tiny
  flat = exceedances[-1] < tiny  # every ratio in the tail equal: no tail at all
  x = jnp.where(flat, jnp.ones_like(exceedances), exceedances)
  # The grid's scale is the tail's lower quartile; ties at the threshold (ratios equal
  # to float precision) would make it 0 and the grid infinite.
  quartile = x[int(n / 4 + 0.5) - 1]
  quartile = jnp.where(quartile < tiny, x[-1] * jnp.finfo(x.dtype).eps, quartile)
  b = 1.0 - jnp.sqrt(grid / (jnp.arange(1, grid + 1, dtype=x.dtype) - 0.5))
  b = b / (3.0 * quartile) + 1.0 / x[-1]
  k_of_b = jnp.mean(jnp.log1p(-b[:, None] * x[None, :]), axis=1)
  profile = n * (jnp.log(-b / k_of_b) - k_of_b - 1.0)
  weights = jax.nn.softmax(profile)
  b_mean = jnp.sum(b * weights)
  k = jnp.mean(jnp.log1p(-b_mean * x))
  sigma = -k / b_mean
  k = (n * k + 10 * 0.5) / (n + 10)
  return jnp.where(flat, 0.0, k), jnp.where(flat, 0.0, sigma)


# Beyond this many nats between the largest ratio and the tail's threshold the smaller
# ratios underflow in float32: the weights are dominated by a few draws, k-hat is +inf.
_MAX_SPREAD = 80.0


def psis_log_weights(log_ratios: jax.Array):
  """Pareto-smoothed, normalised log importance weights and k-hat; runs under ``jit``.

  Args:
    log_ratios: ``(S,)`` log importance ratios ``log p(x, z_s) - log q(z_s)`` of
      independent draws ``z_s ~ q`` (any additive constant; see the module docstring
      for the sign). ``S >= 25``, so that the tail holds at least 5 draws.

  Returns:
    ``(log_weights, k_hat)``: ``(S,)`` log weights summing (in ``exp``) to 1, whose
    ``M = min(3 sqrt(S), S / 5)`` largest are replaced by the fitted distribution's
    quantiles when ``k_hat >= 1/3``; and the shape estimate ``k_hat``: ``+inf`` when
    the tail spans more than 80 nats (a few draws carry all the weight).

  Raises:
    ValueError: fewer than 25 draws, or (outside ``jit``) a NaN or ``+inf`` ratio.

  Example:
    >>> import jax, dsgrad
    >>> ratios = jax.random.normal(jax.random.key(0), (1000,))  # a light tail
    >>> bool(dsgrad.pareto_k(ratios) < 0.5)
    True

  References:
    Vehtari et al. (2024), Algorithm 1.
  """
  if not isinstance(log_ratios, (np.ndarray, jax.Array)):
    log_ratios = np.asarray(log_ratios, np.float64)
  if log_ratios.ndim != 1:
    raise ValueError(f"log_ratios must be one draw per entry, shape (S,), got "
                     f"{log_ratios.shape}")
  s = log_ratios.shape[0]
  if s < 25:
    raise ValueError(f"PSIS needs at least 25 draws (a tail of 5 to fit), got {s}")
  if checks.is_concrete(log_ratios):
    # -inf is a draw of weight zero; NaN and +inf have no weight to smooth.
    values = np.asarray(log_ratios, np.float64)
    if np.isnan(values).any() or np.isposinf(values).any() or np.isneginf(values).all():
      raise ValueError(f"log_ratios must be finite or -inf (a draw of weight zero), with one "
                       f"finite: they hold {int(np.isnan(values).sum())} NaN, "
                       f"{int(np.isposinf(values).sum())} +inf and "
                       f"{int(np.isneginf(values).sum())} -inf of {s}")
  m = _tail_length(s)
  if isinstance(log_ratios, np.ndarray):
    # Shift in the caller's precision (float64 ratios near the evidence differ in
    # digits float32 does not keep).
    log_ratios = log_ratios - np.max(log_ratios)
  log_ratios = jnp.asarray(log_ratios)
  if not jnp.issubdtype(log_ratios.dtype, jnp.floating):
    log_ratios = log_ratios.astype(jnp.float32)
  return _smoothed(log_ratios, m)


# Compiled once per shape: run op by op, its sixty-odd small operations took 2 s to
# compile in every new process (the end of each fit).
@functools.partial(jax.jit, static_argnums=1)
def _smoothed(log_ratios, m: int):
  """:func:`psis_log_weights` of float ratios, the tail's length ``m`` given."""
  s = log_ratios.shape[0]
  shifted = log_ratios - jnp.max(log_ratios)
  order = jnp.argsort(shifted)
  ascending = shifted[order]
  threshold_log = ascending[s - m - 1]
  tail_log = ascending[s - m:]
  too_wide = threshold_log < -_MAX_SPREAD
  threshold = jnp.exp(threshold_log)
  # exp(a) - exp(t) = exp(t) expm1(a - t) keeps the small differences exp(a) - exp(t) drops.
  k, sigma = _gpd_fit(threshold * jnp.expm1(tail_log - threshold_log))
  k = jnp.where(too_wide, jnp.inf, k)
  quantiles = (jnp.arange(m, dtype=ascending.dtype) + 0.5) / m
  small_k = jnp.abs(k) < 1e-10
  safe_k = jnp.where(small_k | ~jnp.isfinite(k), 1.0, k)
  inverse_cdf = jnp.where(small_k, -sigma * jnp.log1p(-quantiles),
                          sigma * jnp.expm1(-safe_k * jnp.log1p(-quantiles)) / safe_k)
  smoothed = jnp.minimum(threshold + inverse_cdf, jnp.exp(tail_log[-1]))
  smooth = (k >= 1.0 / 3.0) & jnp.isfinite(k)
  ascending = jnp.where(smooth, ascending.at[s - m:].set(jnp.log(smoothed)), ascending)
  log_weights = jnp.zeros_like(ascending).at[order].set(ascending)
  return log_weights - jax.nn.logsumexp(log_weights), k


def pareto_k(log_ratios: jax.Array) -> jax.Array:
  """k-hat of ``log_ratios`` (``log p - log q`` per draw; see :func:`psis_log_weights`).

  Below 0.5 the approximation can be trusted; from 0.7 it misses part of the posterior.
  Runs under ``jit``.
  """
  return psis_log_weights(log_ratios)[1]


@checks.arguments(objective=checks.objective(), params=checks.parameters(), key=checks.prng_key(),
                  num_samples=checks.count(25), chunk_size=checks.count(1))
def importance_log_ratios(objective, params, key, num_samples: int = 1000,
                          chunk_size: int = 4096):
  """``(log_ratios, elbo_draws)`` for ``num_samples`` draws ``z_s ~ q``.

  ``log_ratios[s] = log p(x, z_s) - log q(z_s)`` over the whole data set, from the
  full-data ELBO draws of :func:`dsgrad.elbo` (the same key gives the same draws) and the
  objective's ``log_q_offset``. Available for objectives that set ``log_q_offset`` with
  one noise draw per batch: the Gaussian families' (:func:`dsgrad.meanfield_gaussian`,
  :mod:`dsgrad.families`, the NumPyro bridge) with ``shared_noise=True``.

  Args:
    objective: the objective.
    params: variational parameters.
    key: PRNG key (as for :func:`dsgrad.elbo`).
    num_samples: draws, at least 25.
    chunk_size: data per chunk of each full pass.

  Returns:
    Two ``(num_samples,)`` float64 NumPy arrays.

  Raises:
    ValueError: the objective does not expose ``log q`` (no ``log_q_offset``) or draws
      one noise per datum.
  """
  if objective.log_q_offset is None or not objective.shared_noise:
    why = ("draws one noise per datum, so its ELBO draws are not one z each"
           if objective.log_q_offset is not None else "does not expose log q "
           "(its log_q_offset is None)")
    raise ValueError(f"importance ratios of objective {objective.name!r}: it {why}. PSIS "
                     "is available for the Gaussian families with shared_noise=True")
  checks.check_objective_evaluates(objective, params, "importance_log_ratios")
  draws = diagnostics.elbo_draws(objective, num_samples, chunk_size)(params, key)
  offsets = _offsets(objective, num_samples)(params, key)
  draws = diagnostics.finite_elbo_draws(draws, "dsgrad.importance_log_ratios")
  return draws - np.asarray(offsets, np.float64), draws


def _offsets(objective, num_samples: int):
  def build():
    @jax.jit
    def offsets(params, key):
      # The keys elbo_draws gives each draw's noise (diagnostics._elbo_program).
      keys = jax.random.split(key, num_samples)
      return jax.vmap(lambda k: objective.log_q_offset(params, objective.sample_noise(k, 1))
                      )(keys)
    return offsets
  return compile_cache.get_or_build(("psis_offsets", jax.tree.structure(objective), num_samples),
                                    build)[0]


def diagnose(k_hat: float) -> str:
  """One sentence on what ``k_hat`` says about the approximation (for logs and results)."""
  if np.isnan(k_hat):
    return "k-hat is NaN: the importance ratios are not finite (a NaN or inf log density)"
  if np.isinf(k_hat):
    return (f"k-hat = inf: a few draws carry all the importance weight (the ratios' tail "
            f"spans over {_MAX_SPREAD:.0f} nats); the approximation is far from the "
            "posterior, do not trust it (PSIS)")
  if k_hat < K_HAT_GOOD:
    return (f"k-hat = {k_hat:.2f} < {K_HAT_GOOD}: the approximation is close to the "
            "posterior (PSIS)")
  if k_hat < K_HAT_BAD:
    return (f"k-hat = {k_hat:.2f} in [{K_HAT_GOOD}, {K_HAT_BAD}): usable, but its tails and "
            "variances may be off (PSIS)")
  return (f"k-hat = {k_hat:.2f} >= {K_HAT_BAD}: the approximation misses part of the "
          "posterior; do not trust its variances or tails (PSIS). A richer family "
          "(full-rank, annealed) or more steps may help")
