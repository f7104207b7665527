"""Means of independent Monte Carlo draws with their standard errors: plain, corrected by
a control variate of known mean, and paired between two runs at common random numbers."""

from __future__ import annotations

import numpy as np


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


CONTROL_VARIATE_MIN_DRAWS = 10
"""Fewest draws whose ELBO :func:`control_variate_mean` corrects with ``log q``: with its
coefficient estimated from so few, the correction would add more noise than it removes."""


def control_variate_mean(draws, log_q_offsets) -> tuple[float, float]:
  """``(ELBO, its standard error)`` from ELBO ``draws`` ``log p(x, z_s) + H(q)`` and, at
  the same ``z_s``, ``log_q_offsets`` ``log q(z_s) + H(q)``, whose mean is exactly 0:
  the regression estimator ``mean(draws) - c mean(offsets)``, with ``c`` their fitted
  slope. ``c = 1`` gives ``log p - log q``, whose spread vanishes as q nears the
  posterior; ``c = 0`` the draws themselves, which vary less far from it: the fitted
  ``c`` does at least as well as either, up to ``O(1/S)``. At a mean-field fit of a
  hierarchical logistic model (202 latents, 20,000 rows, 1,000 draws) the standard error
  fell from 0.34 to 0.14 nats; at a start far from the posterior, from 161.2 to 160.6.
  Fewer than :data:`CONTROL_VARIATE_MIN_DRAWS` draws: their plain mean.

  References:
    Owen (2013), Monte Carlo theory, methods and examples, Ch. 8 (control variates: the
    regression estimator and its variance). MacKinnon, White (1985), J. Econometrics 29,
    the HC2 variance estimator.
  """
  values, offsets = np.asarray(draws, np.float64), np.asarray(log_q_offsets, np.float64)
  centred = offsets - offsets.mean()
  spread = float(centred @ centred)
  if values.size < CONTROL_VARIATE_MIN_DRAWS or not spread > 0:
    return mean_and_standard_error(values)
  slope = float((values - values.mean()) @ centred) / spread
  estimate = float((values - slope * offsets).mean())
  # Its standard error is the fitted intercept's, with the slope's own error in it, by the
  # sandwich estimator (HC2), which allows for residuals whose spread changes with log q,
  # as it does: at 10 draws of a mean-field Gaussian on a linear regression, the
  # residuals' plain spread (ddof=2) came out 11.5% below the estimates' spread over
  # repeated runs, this 3-4.5% below it; at 20 draws 6% and under 1%.
  weights = 1.0 / values.size - offsets.mean() * centred / spread  # estimate = weights @ values
  leverage = 1.0 / values.size + centred ** 2 / spread
  residuals = values - values.mean() - slope * centred
  # (A draw with leverage near 1 has a residual near 0: its share stays finite.)
  variance = float(np.sum(weights ** 2 * residuals ** 2
                          / np.maximum(1.0 - leverage, 1.0 / values.size)))
  return estimate, float(np.sqrt(variance))
