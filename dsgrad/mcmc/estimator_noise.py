"""How noisy a subsampled log-likelihood estimator is, and the subsample size that keeps
it where pseudo-marginal chains work.

A subsampling chain runs on an *estimate* of the log likelihood. Its variance
``sigma2(theta)`` decides everything: about 1 and the chain mixes and (perturbed scheme)
targets a posterior close to the true one; far above it the chain sticks where an estimate
came out high, and the perturbed target ``exp(l_hat - sigma2_hat / 2)`` favours the
parameters where the control variates fit best, not the posterior. Nothing in the draws
themselves shows it: the acceptance rate can stay high. So the estimator's variance is
reported with the draws (:class:`dsgrad.mcmc.proxy.EstimatorVariance` in every
iteration's info) and checked here.

For the difference estimator ``sigma2(theta) ~ n^2 s2(theta) / m`` with ``s2`` the
variance of ``d_k(theta) = l_k(theta) - q_k(theta)`` over the data, so ``m`` follows from
a target variance once ``s2`` is estimated where the chain will go.

References:
  Dang, Quiroz, Kohn, Tran, Villani (2019). Hamiltonian Monte Carlo with energy
  conserving subsampling. JMLR 20. Sec. 3 (``m`` from a variance of about 1), Eq. 4.3.
  Pitt, Silva, Giordani, Kohn (2012). On some properties of Markov chain Monte Carlo
  simulation methods based on the particle filter. J. Econometrics.
  Doucet, Pitt, Deligiannidis, Kohn (2015). Efficient implementation of Markov chain Monte
  Carlo when using an unbiased likelihood estimator. Biometrika (``sigma`` in 1-1.7).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad.training import batching
from dsgrad import checks
from dsgrad.mcmc import proxy as proxy_lib
from dsgrad.mcmc import reference
from dsgrad.models.base import Model
from dsgrad.training import compile_cache


@checks.arguments(model=checks.model(), key=checks.prng_key(), num_blocks=checks.count(1),
                  target_variance=checks.positive(), num_data_read=checks.count(2),
                  quantile=checks.probability())
def choose_subsample_size(model: Model, proxy: proxy_lib.TaylorProxy, thetas, key, *,
                          num_blocks: int = 1,
                          target_variance: float = proxy_lib.RECOMMENDED_VARIANCE,
                          num_data_read: int = 2048, quantile: float = 0.9) -> tuple[int, float]:
  """The subsample size ``m`` whose difference estimator has variance at most
  ``target_variance`` at a ``quantile`` of ``thetas`` (90% of them by default).

  At each ``theta`` it reads ``num_data_read`` data drawn uniformly (all ``n`` when fewer),
  estimates ``s2(theta)``, the variance of ``d_k(theta)`` over the data, and sets
  ``m = n^2 quantile_theta s2(theta) / target_variance``, rounded up to a multiple of
  ``num_blocks`` and capped at ``n``.

  Why a high quantile and not the mean: the control variates' error, and with it
  ``s2``, grows as a power of ``|theta - theta*|`` (the fourth with a first-order proxy),
  so the chain's excursions into the tails are where the estimate goes wrong. On a
  Gaussian posterior with a first-order proxy (2,000 data, 3 dimensions), the mean's
  ``m = 20`` left the perturbed chain 26% too wide and 6 standard errors off; the 90%
  quantile's ``m`` (40 to 90 over three keys) left the means within 2.3 standard errors
  (3,000 draws) and the spread 4-12% too wide.

  Cost: ``len(thetas) * min(n, num_data_read)`` data evaluations, each a likelihood value
  and its first two directional derivatives (the control variates): with 50 draws and the
  default, 102,400 evaluations, about what one chain iteration costs at ``m = 10^4``.

  Args:
    model: the model.
    proxy: the control variates the chain will use.
    thetas: ``(K, d)`` parameters where the chain is expected to go, e.g. draws from the
      Laplace approximation (:func:`dsgrad.mcmc.laplace_draws`).
    key: PRNG key for the data read.
    num_blocks: ``G``: ``m`` is made a multiple of it.
    target_variance: the variance to reach (default :data:`RECOMMENDED_VARIANCE`).
    num_data_read: data read per ``theta``.

  Returns:
    ``(m, sigma2 at m)``: the subsample size and the variance it is expected to give
    (above the target only when ``m`` reached ``n``).

  Raises:
    ValueError: ``thetas`` not a ``(K, d)`` floating array of finite values, or more
      blocks than data.
  """
  proxy = proxy_lib.check_proxy(model, proxy)
  n = model.num_data
  check_num_blocks(n, num_blocks)
  s2 = float(np.quantile(_spreads(model, proxy, thetas, key, num_data_read), quantile))
  wanted = max(1, math.ceil(n ** 2 * s2 / target_variance))
  m = min(num_blocks * math.ceil(wanted / num_blocks), n - n % num_blocks or n)
  return int(m), n ** 2 * s2 / m


def check_num_blocks(num_data: int, num_blocks: int) -> None:
  """Refuses more blocks than data: the chosen ``m`` is a multiple of ``num_blocks`` and
  at most ``n``, so no ``m`` would do (all ``n`` data were chosen, then refused by the
  perturbed scheme as a subsample size the user never gave)."""
  if num_blocks > num_data:
    raise ValueError(f"num_blocks={num_blocks} is more than the n={num_data} data: the "
                     "subsample size chosen is a multiple of num_blocks and at most n; pass "
                     f"num_blocks of at most {num_data}")


def _spreads(model: Model, proxy: proxy_lib.TaylorProxy, thetas, key,
             num_data_read: int) -> np.ndarray:
  """``s2(theta)``, the variance of ``d_k(theta)`` over the data, at each of ``thetas``,
  from ``num_data_read`` data drawn afresh for each (all ``n`` when fewer)."""
  read = min(model.num_data, num_data_read)
  thetas = proxy_lib.check_thetas(model, proxy, thetas)
  return np.asarray(_spreads_program(model, proxy, thetas, key, read), np.float64)


# The model and proxy are arguments (not constants): one compile serves every call with
# the same shapes.
@compile_cache.jit_by_text(static_argnames="read")
def _spreads_program(model: Model, proxy, thetas, key, read: int):
  n = model.num_data
  keys = jax.random.split(key, thetas.shape[0])  # here, not eagerly: one program fewer

  def spread(theta, k):
    idx = (jnp.arange(n, dtype=jnp.int32) if read == n
           else batching.uniform_indices(k, n, (read,)))
    return jnp.var(proxy_lib.differences(model, proxy, theta, idx))
  return jax.vmap(spread)(thetas, keys)


@checks.arguments(key=checks.prng_key(), subsample_size=checks.count(1),
                  num_data_read=checks.count(2))
def variance_at_draws(model: Model, proxy: proxy_lib.TaylorProxy, draws, key,
                      subsample_size: int, *, num_data_read: int = 2048) -> np.ndarray:
  """The difference estimator's variance ``n^2 s2(theta) / m`` at each of ``draws``,
  from data read afresh (``num_data_read`` per draw).

  Why not the chain's own ``sigma2_hat`` (``info.variance``): the chain accepts the
  subsamples whose estimate came out high, ``l_hat - sigma2_hat / 2``, so it keeps the
  ones that miss the large differences, and its ``sigma2_hat`` is conditioned on that.
  On a regression with ``m = 10`` and a first-order proxy, the chain's own estimate had
  median 0.27 (mean 0.58) at its draws, the variance there median 12.6 (mean 432).

  Cost: ``len(draws) * min(n, num_data_read)`` data evaluations with the control
  variates' two directional derivatives.
  """
  proxy = proxy_lib.check_proxy(model, proxy)
  return model.num_data ** 2 * _spreads(model, proxy, draws, key, num_data_read) / (
      subsample_size)


@checks.arguments(subsample_size=checks.optional(checks.count(1)), threshold=checks.positive(),
                  num_data=checks.optional(checks.count(1)))
def variance_warnings(variance, subsample_size: int | None,
                      threshold: float = proxy_lib.VARIANCE_WARNING,
                      num_data: int | None = None,
                      reference_given: bool = False) -> tuple[str, ...]:
  """A sentence when the estimator's variance, averaged over a chain's iterations, is
  above ``threshold``, naming the subsample size that would bring it to about 1.

  The mean and not the median: a chain in trouble spends most iterations stuck where its
  estimate came out high and the variance is moderate, and the rest in excursions where
  it is large (on a regression with ``m = 10``: median 2-4, mean 7, 90% quantile 19,
  depending on the run's rounding; at a good ``m``, all three below 1).

  Args:
    variance: the estimator's variance at the chain's draws (:func:`variance_at_draws`).
    subsample_size: the ``m`` the chain used (``None``: not a subsampling chain).
    threshold: default :data:`dsgrad.mcmc.proxy.VARIANCE_WARNING`.
    num_data: ``n``; where the subsample size that would bring the mean variance to
      about 1 is larger, the sentence names no size.
    reference_given: whether the user chose ``theta*`` (not found as the full-data
      mode): the sentence then names it as the first suspect.
  """
  values = np.asarray(variance, np.float64)
  if subsample_size is None or values.size == 0:
    return ()
  mean = float(np.mean(values))
  if not mean > threshold:
    return ()
  better = math.ceil(subsample_size * mean / proxy_lib.RECOMMENDED_VARIANCE)
  if num_data is None or better <= num_data:
    remedy = (f"raise subsample_size from {subsample_size} to about {better} (the variance "
              "falls as 1/m), or pass subsample_size='auto'")
  else:
    # The mean is set by the chain's excursions, which a larger m shrinks: "about
    # {better}" would name more data than there are.
    remedy = (f"raise subsample_size from {subsample_size}: pass subsample_size='auto' "
              "(it measures the variance at draws of the Laplace approximation), or use "
              "estimator='full'")
  if reference_given:
    remedy = ("the control variates fit only near the reference point theta*, and the one "
              "given may be far from the posterior: omit reference_point (sample then finds "
              "the full-data mode) or let the warm-up move it (num_warmup several times "
              "reference_updates_every); or " + remedy)
  return (f"the log-likelihood estimator's variance at the draws is {mean:.3g} on average "
          f"(median {float(np.median(values)):.3g}, 90% of iterations below "
          f"{float(np.quantile(values, 0.9)):.3g}), above the "
          f"{threshold:g} beyond which subsampling chains stick and the perturbed one "
          f"targets a distorted posterior (the papers keep it near 1: Dang et al. 2019, "
          f"Sec. 3; Doucet et al. 2015). Its draws can be confidently wrong: {remedy}",)


@checks.arguments(threshold=checks.positive())
def reference_drift_warnings(mode, reference_point, precision,
                             threshold: float = 3.0) -> tuple[str, ...]:
  """A sentence when the reference point the chain sampled with lies more than
  ``threshold`` posterior standard deviations from the full-data mode in any coordinate.

  The warm-up moves ``theta*`` to the mean of recent draws (Dang et al., 2019, Sec. 6.3).
  Where a coordinate drifted during warm-up, ``theta*`` follows it, the control variates
  become exact *there*, and the perturbed chain stays there with a small estimator
  variance: the variance check cannot see it, the distance from the mode can.

  Args:
    mode: ``(d,)`` the full-data mode (:func:`dsgrad.mcmc.refine_reference_point`).
    reference_point: ``(d,)`` the ``theta*`` of the sampling phase.
    precision: ``(d, d)`` the Laplace precision at the mode (its inverse's diagonal gives
      the standard deviations).
    threshold: in standard deviations.
  """
  sd = np.sqrt(reference.inverse_diagonal(np.asarray(precision, np.float64)))
  distance = np.abs(np.asarray(reference_point, np.float64) - np.asarray(mode, np.float64)) / sd
  worst = int(np.argmax(distance))
  if not distance[worst] > threshold:
    return ()
  return (f"during warm-up the reference point moved {distance[worst]:.1f} posterior "
          f"standard deviations from the full-data mode (coordinate {worst}; "
          f"{int(np.sum(distance > threshold))} beyond {threshold:g}): the chain wandered "
          "there, the control variates now fit there, and a perturbed chain can stay with "
          "a small estimator variance. Rerun with a larger subsample_size, a longer "
          "num_warmup, or reference_updates_every=0 (keep the mode)",)


@checks.arguments(key=checks.prng_key(), subsample_size=checks.optional(checks.count(1)))
def diagnose(model: Model, proxy: proxy_lib.TaylorProxy, samples, info, key,
             subsample_size: int | None, perturbed: bool, mode=None):
  """``(estimator_variance, warnings)`` of a finished chain (:func:`dsgrad.mcmc.sample`).

  For the perturbed scheme the variance is read afresh at up to 50 draws spread over
  the chain (:func:`variance_at_draws`); for the signed scheme the chain's own estimate
  (``info.variance``) is used. With ``mode`` (``(full-data mode, Laplace precision)``),
  the reference point's drift from it is checked too; without it, ``theta*`` counts as
  the user's choice, and the variance warning names it as a suspect.
  """
  proxy = proxy_lib.check_proxy(model, proxy)
  estimator_variance = None
  if perturbed:
    picks = np.unique(np.linspace(0, samples.shape[0] - 1, 50).astype(int))
    estimator_variance = variance_at_draws(model, proxy, jnp.asarray(samples[picks]), key,
                                           subsample_size)
  warnings = variance_warnings(info.variance.with_control_variate if estimator_variance is None
                               else estimator_variance, subsample_size,
                               num_data=model.num_data, reference_given=mode is None)
  if mode is not None and subsample_size is not None:
    warnings += reference_drift_warnings(mode[0], proxy.theta_star, mode[1])
  return estimator_variance, warnings

