"""Fits the normal scale mixture that stands in for the logistic sigmoid in
:func:`dsgrad.approx.logistic_probit`:  sigmoid(a) ~= sum_k w_k Phi(c_k a).

Any such mixture is exactly symmetric (w summing to one), and its expectation under a
Gaussian argument is closed form: E Phi(c (mu + tau xi)) = Phi(c mu / sqrt(1 + c^2 tau^2)).
The weights and slopes are fitted by least squares and then refined to minimize the
maximum absolute error on a >= 0 (20 random starts per K). Run:

    python docs/scripts/probit_mixture_fit.py

Output of the run whose K = 5 coefficients dsgrad uses (2026-11-23, scipy 1.x):
max error 9.46e-03 (K=1), 5.1e-04 (2), 4.45e-05 (3), 4.97e-06 (4), 6.83e-07 (5).

References:
  Monahan, Stefanski (1992). Normal scale mixture approximations to F*(z) and
  computation of the logistic-normal integral. Handbook of the Logistic Distribution.
"""

import numpy as np
from scipy import optimize, special, stats

GRID = np.linspace(0, 40, 8001)


def mixture(params, k, a):
  weights = special.softmax(np.concatenate([[0.0], params[:k - 1]]))
  slopes = np.exp(params[k - 1:])
  return (weights[None, :] * stats.norm.cdf(a[:, None] * slopes[None, :])).sum(1), weights, slopes


def fit(k: int, starts: int = 20):
  best = None
  for trial in range(starts):
    rng = np.random.default_rng(trial)
    p0 = np.concatenate([rng.normal(size=k - 1), np.log(0.6267) + rng.normal(scale=0.5, size=k)])
    residual = lambda p: mixture(p, k, GRID)[0] - special.expit(GRID)
    start = optimize.least_squares(residual, p0).x
    worst = lambda p: np.max(np.abs(residual(p)))
    refined = optimize.minimize(worst, start, method="Nelder-Mead",
                                options=dict(maxiter=20000, xatol=1e-12, fatol=1e-14)).x
    if best is None or worst(refined) < best[0]:
      best = (worst(refined), refined)
  error, params = best
  _, weights, slopes = mixture(params, k, GRID)
  return error, weights, slopes


if __name__ == "__main__":
  for k in range(1, 6):
    error, weights, slopes = fit(k)
    print(f"K={k} max error {error:.3g}\n  weights {weights.tolist()}\n  slopes  {slopes.tolist()}")
