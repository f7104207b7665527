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
where ``q`` puts too little mass), as BlackJAX's ``psis_weights`` does; arviz-stats'
``psislw``, which does the smoothing here, takes their negation (log likelihoods).
Install it with ``pip install 'dsgrad[diagnostics]'``.

References:
  Vehtari, Simpson, Gelman, Yao, Gabry (2024). Pareto smoothed importance sampling.
  JMLR 25(72), Algorithm 1 and Sec. 3 (k-hat thresholds).
  Yao, Vehtari, Simpson, Gelman (2018). Yes, but did it work?: evaluating variational
  inference. ICML.
  Zhang, Stephens (2009). A new and efficient estimation method for the generalized
  Pareto distribution. Technometrics 51(3) (the fit of ``k``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks, elbo_estimates

__all__ = ["pareto_k", "psis_log_weights", "importance_log_ratios", "diagnose",
           "k_hat_scatter", "K_HAT_GOOD", "K_HAT_BAD"]

K_HAT_GOOD = 0.5
K_HAT_BAD = 0.7


def arviz_array_stats(purpose: str):
  """arviz-stats' NumPy functions (``arviz_stats.base.array_stats``), which dsgrad's
  PSIS and effective sample sizes use; an ImportError naming ``purpose`` and the extra
  to install where arviz-stats is missing."""
  try:
    from arviz_stats.base import array_stats
  except ImportError as error:
    raise ImportError(f"{purpose} uses arviz-stats' implementation: pip install "
                      "'dsgrad[diagnostics]' (or pip install arviz-stats)") from error
  return array_stats


def arviz_missing(purpose: str) -> str | None:
  """Why ``purpose`` cannot use arviz-stats (not installed: :func:`arviz_array_stats`'s
  message), or None. Where it is installed and not yet imported, its import begins in a
  thread (:func:`import_beside`), so that it runs beside what the caller compiles next;
  its first use waits for it (Python's lock on a module being imported)."""
  if "arviz_stats.base" in sys.modules:
    return None
  if importlib.util.find_spec("arviz_stats") is None:
    try:
      arviz_array_stats(purpose)
    except ImportError as error:
      return str(error)
  import_beside()
  return None


def import_beside() -> threading.Thread:
  """A started thread that imports arviz-stats (0.7 s on two CPU cores, once a process),
  for a caller to join after work that leaves Python's lock free (XLA compiling a
  program): :func:`dsgrad.fit`'s last evaluation needs it for k-hat, and a run paced to a
  budget pays for it before it shares out the time left. A failed import is left to
  :func:`arviz_array_stats` to report."""
  def quietly():
    with contextlib.suppress(ImportError):
      arviz_array_stats("k-hat")
  thread = threading.Thread(target=quietly, name="dsgrad-import-arviz-stats", daemon=True)
  thread.start()
  return thread


def psis_log_weights(log_ratios: jax.Array):
  """Pareto-smoothed, normalised log importance weights and k-hat; runs under ``jit``.

  The smoothing is arviz-stats' ``psislw`` (Vehtari et al. 2024, Algorithm 1), run in
  float64 (under ``jit`` as a host callback); this function adds the sign convention
  of the module docstring, the checks, and the answers for the two tails arviz-stats
  cannot fit (equal ratios; a tail over 708 nats wide).

  Args:
    log_ratios: ``(S,)`` log importance ratios ``log p(x, z_s) - log q(z_s)`` of
      independent draws ``z_s ~ q`` (any additive constant; see the module docstring
      for the sign). ``S >= 25``, so that the tail holds at least 5 draws.

  Returns:
    ``(log_weights, k_hat)``: ``(S,)`` log weights summing (in ``exp``) to 1, whose
    ``M = min(3 sqrt(S), S / 5)`` largest are replaced by the fitted distribution's
    quantiles; and the shape estimate ``k_hat``: 0 where the tail's ratios are all
    equal (there is no tail), ``+inf`` where the tail spans more than float64's 708
    nats (a few draws carry all the weight).

  Raises:
    ValueError: fewer than 25 draws, or (outside ``jit``) a NaN or ``+inf`` ratio.
    ImportError: arviz-stats is not installed (``pip install 'dsgrad[diagnostics]'``).

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
  array_stats = arviz_array_stats("PSIS")
  dtype = log_ratios.dtype if jnp.issubdtype(log_ratios.dtype, jnp.floating) else jnp.float32
  if not checks.is_concrete(log_ratios):
    shapes = (jax.ShapeDtypeStruct((s,), dtype), jax.ShapeDtypeStruct((), dtype))
    return jax.pure_callback(
        lambda r: tuple(np.asarray(x, dtype) for x in _smoothed(array_stats, r)), shapes,
        log_ratios, vmap_method="sequential")
  # -inf is a draw of weight zero; NaN and +inf have no weight to smooth.
  values = np.asarray(log_ratios, np.float64)
  if np.isnan(values).any() or np.isposinf(values).any() or np.isneginf(values).all():
    raise ValueError(f"log_ratios must be finite or -inf (a draw of weight zero), with one "
                     f"finite: they hold {int(np.isnan(values).sum())} NaN, "
                     f"{int(np.isposinf(values).sum())} +inf and "
                     f"{int(np.isneginf(values).sum())} -inf of {s}")
  log_weights, k = _smoothed(array_stats, values)
  if isinstance(log_ratios, jax.Array):
    return jnp.asarray(log_weights, dtype), jnp.asarray(k, dtype)
  return log_weights, k


def _smoothed(array_stats, log_ratios):
  """arviz-stats' PSIS of float64 ``log_ratios``, with the two tails it cannot fit
  answered here: a tail of equal ratios (which it refuses) has nothing to smooth, k-hat
  0; a tail whose threshold underflows ``exp`` in float64 (over 708 nats below the
  largest ratio; it returns NaN weights and a small k there) is all in a few draws,
  k-hat ``+inf``. Both keep the plain normalised ratios as weights."""
  values = np.asarray(log_ratios, np.float64)
  values = values - np.max(values)
  plain = values - np.logaddexp.reduce(values)
  tail = np.sort(values)[-_tail_length(values.size) - 1:]
  if tail[-1] - tail[1] < np.finfo(np.float64).tiny:
    return plain, 0.0
  if tail[0] < np.log(np.finfo(np.float64).tiny):
    return plain, float("inf")
  # arviz-stats takes log likelihoods, whose negation is the importance ratio.
  log_weights, k = array_stats.psislw(-values)
  return np.asarray(log_weights), float(k)


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
  return log_ratios_unchecked(objective, params, key, num_samples, chunk_size)


def log_ratios_unchecked(objective, params, key, num_samples: int, chunk_size: int = 4096,
                         program_samples: int | None = None):
  """:func:`importance_log_ratios` without its checks of the objective and ``params``, for
  a caller that made them (:func:`dsgrad.fit`'s last evaluation), on the program of
  :func:`dsgrad.elbo_estimates.elbo_draws_and_log_q` that its ELBO evaluations share:
  with ``program_samples``, that of so many draws, running the first ``num_samples`` (as
  :func:`dsgrad.elbo_estimates.elbo_unchecked`): a last evaluation cut short by a time
  limit compiles no program of its own (1-1.3 s at 400,000 rows)."""
  size = elbo_estimates.program_size(objective, num_samples, program_samples)
  draws, offsets = elbo_estimates.elbo_draws_and_log_q(objective, size, chunk_size)(
      params, key, count=num_samples)  # the first num_samples of size's draws
  draws = elbo_estimates.finite_elbo_draws(np.asarray(draws)[:num_samples],
                                           "dsgrad.importance_log_ratios")
  return draws - np.asarray(offsets, np.float64)[:num_samples], draws


def _tail_length(num_draws: int) -> int:
  """``M = min(3 sqrt(S), S / 5)``, the draws whose tail PSIS fits, as arviz-stats takes
  them (Vehtari et al. 2024, Sec. 3)."""
  return min(int(3.0 * np.sqrt(num_draws)), num_draws // 5)


@checks.arguments(k_hat=checks.real(), num_draws=checks.count(25))
def k_hat_scatter(k_hat: float, num_draws: int) -> float:
  """About how far k-hat estimates from ``num_draws`` draws scatter around the shape they
  estimate: ``(1 + k) / sqrt(M)``, the maximum-likelihood generalized Pareto shape's
  asymptotic standard error from ``M`` tail draws (Hosking, Wallis 1987; here
  ``k = max(k_hat, 0)``), times ``M / (M + 10)``, the shrinkage of the weak prior that
  arviz-stats' fit puts on ``k``. On 300 sets of 100 draws (``M = 20``) of tails with
  ``k`` = 0, 0.3 and 0.7, k-hat's spread was 0.18, 0.21 and 0.25 against 0.17, 0.21 and
  0.24 from this (at their mean k-hat); on sets of 1,000, 0.09, 0.12 and 0.15 against
  0.09, 0.12 and 0.16.

  References:
    Hosking, Wallis (1987). Parameter and quantile estimation for the generalized Pareto
    distribution. Technometrics 29(3), Sec. 3 (the shape's asymptotic variance).
  """
  m = _tail_length(num_draws)
  return float((1.0 + max(k_hat, 0.0)) / np.sqrt(m) * m / (m + 10))


def diagnose(k_hat: float, num_draws: int | None = None, full_rank: bool = False) -> str:
  """One sentence on what ``k_hat`` says about the approximation (for logs and results);
  ``full_rank``: the approximation is a full-rank Gaussian already, so a poor k-hat does
  not send its user to that family.

  With ``num_draws``, the draws it was estimated from, it also gives k-hat's scatter
  (:func:`k_hat_scatter`), and a k-hat of 0.5 or more that lies within two of them of
  the good range is called too uncertain to tell: from 100 draws of a mean-field fit
  whose log ratios spread by 0.15 nats, k-hat ranged from -0.11 to 0.78."""
  if np.isnan(k_hat):
    return "k-hat is NaN: the importance ratios are not finite (a NaN or inf log density)"
  if np.isinf(k_hat):
    return ("k-hat = inf: a few draws carry all the importance weight; the approximation "
            "is far from the posterior, do not trust it (PSIS)")
  scatter = k_hat_scatter(k_hat, num_draws) if num_draws else None
  shown = f"k-hat = {k_hat:.2f}" + (f" +- {scatter:.2f} ({num_draws:,} draws)"
                                     if scatter is not None else "")
  if k_hat < K_HAT_GOOD:
    return f"{shown} < {K_HAT_GOOD}: the approximation is close to the posterior (PSIS)"
  if scatter is not None and k_hat - 2 * scatter < K_HAT_GOOD:
    return (f"{shown}: too few draws to tell a close approximation (k-hat < {K_HAT_GOOD}) "
            f"from one that misses part of the posterior (>= {K_HAT_BAD}); with 1,000 "
            f"draws k-hat scatters by about {k_hat_scatter(k_hat, 1000):.2f} (fit's "
            "elbo_samples, or dsgrad.importance_log_ratios) (PSIS)")
  if k_hat < K_HAT_BAD:
    return (f"{shown} in [{K_HAT_GOOD}, {K_HAT_BAD}): usable, but its tails and variances "
            "may be off (PSIS)")
  return (f"{shown} >= {K_HAT_BAD}: the approximation misses part of the posterior; do not "
          "trust its variances or tails (PSIS). More steps or a richer family ("
          + ("annealed: dsgrad.annealing" if full_rank else "full-rank, annealed")
          + ") may help")
