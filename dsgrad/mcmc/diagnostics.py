"""MCMC diagnostics: effective sample size, inefficiency factor, the CT measure, signs.

References:
  Dang et al. (2019), Eq. 3.2 (CT), 5.3 (sign-corrected estimates), 5.4, 6.1 (RCT).
  Geyer (1992). Practical Markov chain Monte Carlo. Statistical Science (initial
  monotone sequence estimator). Vehtari et al. (2021). Rank-normalization, folding,
  and localization: an improved R-hat. Bayesian Analysis.
"""

from __future__ import annotations

import numpy as np

from dsgrad import checks, psis


def effective_sample_size(samples) -> np.ndarray:
  """Effective sample size of each parameter of one chain, ``samples`` of shape (R, d).

  arviz-stats' ESS of the mean (``method="mean"``: the chain split in two halves,
  autocorrelations summed by Geyer's initial monotone sequence; Vehtari et al. 2021).
  Returns an array of shape ``(d,)``; a constant parameter is reported as 0 (nothing
  was learned from it; arviz-stats would report ``R``).

  Raises:
    ValueError: fewer than 4 samples, a non-2-D array, or NaN or inf values.
    ImportError: arviz-stats is not installed (``pip install 'dsgrad[diagnostics]'``).
  """
  x = np.asarray(samples, np.float64)
  if x.ndim == 1:
    x = x[:, None]
  if x.ndim != 2 or x.shape[0] < 4:
    raise ValueError(f"samples must have shape (R >= 4, d), got {np.shape(samples)}")
  if not np.all(np.isfinite(x)):
    bad = np.flatnonzero(~np.all(np.isfinite(x), axis=0))
    raise ValueError(f"samples hold NaN or inf in parameter(s) {bad.tolist()}: a chain that "
                     "diverged has no effective sample size")
  array_stats = psis.arviz_array_stats("dsgrad.mcmc.effective_sample_size")
  ess = np.asarray(array_stats.ess(x.T[:, None, :], chain_axis=-2, draw_axis=-1,
                                   method="mean"), np.float64)
  return np.where(np.ptp(x, axis=0) > 0, ess, 0.0)


def inefficiency_factor(samples) -> np.ndarray:
  """``IF = R / ESS`` per parameter: draws needed for one independent draw (Sec. 3.1)."""
  x = np.asarray(samples)
  return x.shape[0] / np.maximum(effective_sample_size(x), 1e-12)


@checks.arguments(evaluations_per_iteration=checks.positive())
def computational_time(samples, evaluations_per_iteration: float,
                       signs=None) -> np.ndarray:
  """The CT measure per parameter: ``IF x`` data density-and-gradient evaluations per
  iteration (Eq. 3.2), divided by ``(2 tau - 1)^2`` with ``tau`` the fraction of positive
  signs when ``signs`` are given (Eq. 5.4). Lower is better; the ratio of two methods'
  CT is the relative computational time RCT (Eq. 6.1)."""
  ct = inefficiency_factor(samples) * float(evaluations_per_iteration)
  if signs is not None:
    tau = positive_fraction(signs)
    ct = ct / max((2 * tau - 1) ** 2, 1e-12)
  return ct


def _checked_signs(signs) -> np.ndarray:
  """``signs`` as float64, refusing anything but +1 and -1: a NaN or a 0/1 label where a
  sign is meant would be counted (NaN > 0 is false) or weighted silently."""
  s = np.asarray(signs, np.float64)
  bad = ~np.isin(s, (-1.0, 1.0))
  if np.any(bad):
    found = np.unique(s[bad])[:5].tolist()
    raise ValueError(f"signs must be +1 or -1 (the signs of the likelihood estimates, "
                     f"result.signs), got {found}: NaN signs come from a chain that "
                     "diverged; 0/1 values are labels, not signs")
  return s


def positive_fraction(signs) -> float:
  """``tau``: fraction of iterations whose likelihood estimate was non-negative.

  Raises:
    ValueError: a sign other than +1 or -1 (NaN included).
  """
  return float(np.mean(_checked_signs(signs) > 0))


def signed_mean(values, signs) -> np.ndarray:
  """Sign-corrected posterior expectation ``sum_j psi_j s_j / sum_j s_j`` (Eq. 5.3).

  Args:
    values: ``(R, ...)`` values ``psi(theta_j)`` along the chain (e.g. the samples).
    signs: ``(R,)`` signs ``s_j`` of the likelihood estimates.

  Raises:
    ValueError: on mismatched lengths, a sign other than +1 or -1 (NaN included), or when
      the signs sum to zero or less (the estimate is then meaningless: tune for fewer
      negative estimates).
  """
  v = np.asarray(values, np.float64)
  s = _checked_signs(signs)
  if s.ndim != 1 or v.shape[0] != s.shape[0]:
    raise ValueError(f"values {v.shape} and signs {s.shape} must share the first axis")
  total = s.sum()
  if total <= 0:
    raise ValueError(f"the signs sum to {total:g}: more negative than positive estimates")
  return np.tensordot(s, v, axes=(0, 0)) / total
