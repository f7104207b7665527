"""How HMC-ECS draws its subsample and estimates the likelihood from it.

A :class:`SubsampleScheme` bundles the auxiliary variable ``u`` of the pseudo-marginal
target (3.1): how to draw it, how to propose a correlated update of it, and the log of
the (absolute) likelihood estimate with its sign. Two schemes:

* :func:`perturbed` -- ``m`` indices in ``G`` blocks, the bias-corrected estimator
  ``exp(l_hat - sigma2_hat / 2)`` (Eq. 4.5); always positive, slightly biased, so the
  chain targets a perturbed posterior (Sec. 4).
* :func:`block_poisson` -- the block-Poisson estimator (Eq. 5.1), unbiased but possibly
  negative: the chain targets ``|L_hat|`` and expectations are sign-corrected (Eq. 5.3).

References:
  Dang et al. (2019), Sec. 3.3, 4, 5. Quiroz, Kohn, Villani, Tran (2019). Speeding up
  MCMC by efficient data subsampling. JASA. Quiroz, Tran, Villani, Kohn, Dang (2021).
  The block-Poisson estimator for optimally tuned exact subsampling MCMC. JCGS.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from dsgrad import checks
from dsgrad.training import batching, compile_cache
from dsgrad.mcmc import proxy as proxy_lib
from dsgrad.models.base import Model


class SubsampleScheme(NamedTuple):
  """The auxiliary subsample ``u`` and the likelihood estimator built on it.

  Attributes:
    init: ``key -> u``.
    propose: ``(key, u) -> u'``, a correlated update (some blocks redrawn).
    log_likelihood: ``(proxy, theta, u) -> (log |L_hat|, sign, variance)``, differentiable
      in ``theta``; ``variance`` is a :class:`dsgrad.mcmc.proxy.EstimatorVariance` (the
      estimator's own, from the same evaluation).
    evaluations: ``u -> int``: data log-likelihood evaluations one estimate costs.
    name: label.
    fixed: ``True`` when there is nothing to update (full data): the kernel skips the
      subsample step.
  """

  init: Callable[[jax.Array], Any]
  propose: Callable[[jax.Array, Any], Any]
  log_likelihood: Callable[..., tuple[jax.Array, jax.Array]]
  evaluations: Callable[[Any], jax.Array]
  name: str
  fixed: bool = False


@checks.arguments(chunk_size=checks.count(1))
def full_data(model: Model, chunk_size: int = 8192) -> SubsampleScheme:
  """No subsampling: the exact log likelihood over all ``n`` data (plain HMC).

  The baseline HMC-ECS is compared with, run by the same kernel and tuning. The sum
  runs in chunks of ``chunk_size`` data inside ``jit``.
  """
  n = model.num_data

  def log_likelihood(proxy, theta, u):
    del proxy, u
    total = jnp.zeros((), theta.dtype)
    for start in range(0, n, chunk_size):  # static chunks: bounded memory
      idx = jnp.arange(start, min(start + chunk_size, n), dtype=jnp.int32)
      total = total + jnp.sum(model.log_likelihood_at(theta, idx))
    exact = jnp.zeros((), theta.dtype)
    return total, jnp.ones((), theta.dtype), proxy_lib.EstimatorVariance(exact, exact)

  return SubsampleScheme(lambda key: jnp.zeros((), jnp.int32), lambda key, u: u,
                         log_likelihood, lambda u: jnp.asarray(n), "full data", fixed=True)


@checks.arguments(subsample_size=checks.count(1), num_blocks=checks.count(1))
def perturbed(model: Model, subsample_size: int, num_blocks: int = 100) -> SubsampleScheme:
  """``m`` indices drawn uniformly with replacement, updated one block of ``m / G`` at a
  time (correlation ``rho ~ 1 - 1/G`` between successive log-likelihood estimates), with
  the bias-corrected estimator of Eq. 4.5.

  Args:
    model: the model (its ``num_data`` is ``n``).
    subsample_size: ``m``, a multiple of ``num_blocks``, at most ``n``.
    num_blocks: ``G`` (the paper: 100, so ``rho = 0.99``).

  Returns:
    A :class:`SubsampleScheme` whose ``u`` is an ``(m,)`` int32 array.

  Raises:
    ValueError: ``m`` larger than ``n`` or not positive, ``G`` not positive, or ``m`` not
      a multiple of ``G``.
  """
  n = model.num_data
  m, g = int(subsample_size), int(num_blocks)
  if g < 1:
    raise ValueError(f"num_blocks must be a positive int, got {num_blocks}")
  if m < 1 or m > n:
    raise ValueError(f"subsample_size must lie in [1, n={n}], got {subsample_size}")
  if m % g:
    raise ValueError(f"subsample_size={m} must be a multiple of num_blocks={g}")
  per_block = m // g

  def init(key):
    return batching.uniform_indices(key, n, (m,))

  def propose(key, u):
    k_block, k_new = jax.random.split(key)
    block = jax.random.randint(k_block, (), 0, g)
    fresh = batching.uniform_indices(k_new, n, (per_block,))
    return jax.lax.dynamic_update_slice(u, fresh, (block * per_block,))

  def log_likelihood(proxy, theta, u):
    estimate, variance = proxy_lib.estimate_with_variance(model, proxy, theta, u)
    return estimate, jnp.ones((), theta.dtype), variance

  return SubsampleScheme(init, propose, log_likelihood, lambda u: jnp.asarray(m),
                         f"perturbed(m={m}, G={g})")


class PoissonSubsample(NamedTuple):
  """``u`` of the block-Poisson estimator.

  Attributes:
    counts: ``(lambda,)`` int32 number of factors ``X_l ~ Poisson(1)`` of each block.
    indices: ``(lambda, max_factors, m)`` int32 data indices of every possible factor;
      factor ``h`` of block ``l`` is used when ``h < counts[l]``.
  """

  counts: jax.Array
  indices: jax.Array


@checks.arguments(subsample_size=checks.count(1), num_blocks=checks.count(1),
                  lower_bound=checks.real(), blocks_per_update=checks.count(1),
                  max_factors=checks.count(1))
def block_poisson(model: Model, subsample_size: int, num_blocks: int, lower_bound: float,
                  *, blocks_per_update: int = 1, max_factors: int = 8) -> SubsampleScheme:
  """The block-Poisson estimator of the likelihood (Eq. 5.1).

      L_hat = exp(sum_k q_k) prod_{l=1}^{lambda} xi_l,
      xi_l = exp((a + lambda) / lambda) prod_{h=1}^{X_l} (d_hat^{(h,l)} - a) / lambda,

  with ``X_l ~ Poisson(1)`` and each ``d_hat^{(h,l)} = (n/m) sum_i d_{u_i}`` a difference
  estimator on its own ``m`` indices. ``E L_hat = L`` exactly; ``L_hat < 0`` when an odd
  number of factors have ``d_hat < a``. The log of ``|L_hat|`` and the sign are returned.
  ``blocks_per_update = kappa`` blocks are redrawn per update (``rho ~ 1 - kappa/lambda``).

  Each block stores ``max_factors`` factors and uses the first ``X_l``; a draw of
  ``X_l > max_factors`` is truncated (probability 1e-6 per block at the default 8), a
  negligible departure from exactness. Evaluation computes all ``lambda * max_factors``
  factors and masks the unused ones, so its cost is ``lambda * max_factors * m`` data
  evaluations (the algorithm itself needs ``m sum_l X_l``, ``lambda m`` on average).

  Args:
    model: the model.
    subsample_size: ``m`` per factor.
    num_blocks: ``lambda``.
    lower_bound: ``a``; choose it below the typical ``d_hat`` (see
      :func:`suggest_block_poisson`), so that few factors are negative.
    blocks_per_update: ``kappa``.
    max_factors: storage per block.

  Returns:
    A :class:`SubsampleScheme` whose ``u`` is a :class:`PoissonSubsample`.

  Raises:
    ValueError: on ``m`` outside ``[1, n]``, non-positive ``lambda``, ``kappa`` outside
      ``[1, lambda]``, or ``max_factors < 1``.
  """
  n = model.num_data
  m, lam, kappa = int(subsample_size), int(num_blocks), int(blocks_per_update)
  if m < 1 or m > n:
    raise ValueError(f"subsample_size must lie in [1, n={n}], got {subsample_size}")
  if lam < 1:
    raise ValueError(f"num_blocks must be a positive int, got {num_blocks}")
  if not 1 <= kappa <= lam:
    raise ValueError(f"blocks_per_update must lie in [1, num_blocks={lam}], got {kappa}")
  if max_factors < 1:
    raise ValueError(f"max_factors must be at least 1, got {max_factors}")
  a = float(lower_bound)

  def draw(key, num):
    k_count, k_idx = jax.random.split(key)
    counts = jnp.minimum(jax.random.poisson(k_count, 1.0, (num,)), max_factors)
    indices = batching.uniform_indices(k_idx, n, (num, max_factors, m))
    return counts.astype(jnp.int32), indices

  def init(key):
    return PoissonSubsample(*draw(key, lam))

  def propose(key, u):
    k_which, k_new = jax.random.split(key)
    blocks = jax.random.choice(k_which, lam, (kappa,), replace=False)
    counts, indices = draw(k_new, kappa)
    return PoissonSubsample(u.counts.at[blocks].set(counts), u.indices.at[blocks].set(indices))

  def log_likelihood(proxy, theta, u):
    flat = u.indices.reshape(lam * max_factors, m)
    values = jax.vmap(lambda idx: model.log_likelihood_at(theta, idx))(flat)
    d = values - jax.vmap(lambda idx: proxy_lib.proxy_values(model, proxy, theta, idx))(flat)
    d_hat = (n * jnp.mean(d, axis=1)).reshape(lam, max_factors)
    used = jnp.arange(max_factors)[None, :] < u.counts[:, None]
    factor = (d_hat - a) / lam
    log_abs = jnp.sum(jnp.where(used, jnp.log(jnp.abs(factor)), 0.0))
    negatives = jnp.sum(jnp.where(used, factor < 0, False))
    sign = jnp.where(negatives % 2 == 0, 1.0, -1.0).astype(theta.dtype)
    # Var log |L_hat| ~ E[#factors] Var(d_hat) / (d - a)^2 = lambda s2 / (d - a)^2: each
    # used factor contributes log((d - a) / lambda) + (d_hat - d) / (d - a) to first order.
    s2 = (n / m) ** 2 * jnp.sum((d - jnp.mean(d, axis=1, keepdims=True)) ** 2, axis=1)
    plain = (n / m) ** 2 * jnp.sum((values - jnp.mean(values, axis=1, keepdims=True)) ** 2,
                                   axis=1)
    variance = proxy_lib.EstimatorVariance(
        jax.lax.stop_gradient(lam * jnp.mean(s2) / jnp.mean((d_hat - a) ** 2)),
        jax.lax.stop_gradient(jnp.mean(plain)))
    return proxy_lib.proxy_sum(proxy, theta) + (a + lam) + log_abs, sign, variance

  return SubsampleScheme(init, propose, log_likelihood,
                         lambda u: jnp.asarray(lam * max_factors * m),
                         f"block_poisson(m={m}, lambda={lam}, a={a:g})")


@checks.arguments(key=checks.prng_key(), subsample_size=checks.count(1),
                  num_draws=checks.count(2), negative_sd=checks.positive())
def suggest_block_poisson(model: Model, proxy: proxy_lib.TaylorProxy, thetas, key,
                          subsample_size: int, *, num_draws: int = 20,
                          negative_sd: float = 3.0) -> tuple[int, float]:
  """A simple tuning of ``(lambda, a)`` for :func:`block_poisson`.

  At representative parameters ``thetas`` (e.g. draws from the Laplace approximation)
  it draws ``d_hat`` over random subsamples of size ``m``, takes the largest standard
  deviation ``s`` over subsamples at one ``theta`` and the smallest value ``d_min`` over
  everything, and sets ``lambda = max(1, ceil(negative_sd * s))`` and
  ``a = d_min - lambda``: each factor ``(d_hat - a) / lambda`` is then at least about
  one at every representative ``theta``, negative only when a subsample's ``d_hat``
  falls ``negative_sd`` standard deviations below the smallest value seen, and
  ``Var log |L_hat| ~ s^2 / lambda``.

  The block-Poisson target ``|L_hat|`` grows only polynomially where ``d_hat`` falls
  far below ``a``, so the control variates must keep ``d(theta)`` bounded over the
  posterior: use the second-order proxy (a first-order one on a Gaussian model, for
  one, lets the chain drift to where most estimates are negative).

  Returns:
    ``(num_blocks, lower_bound)``.
  """
  proxy = proxy_lib.check_proxy(model, proxy)
  thetas = proxy_lib.check_thetas(model, proxy, thetas)
  spread, lowest = _estimates_spread(model, proxy, thetas, key,
                                     num_draws=num_draws, subsample_size=subsample_size)
  lam = max(1, math.ceil(negative_sd * float(spread)))
  return lam, float(lowest) - lam


# One program, the model an argument: run eagerly, the vmapped estimates were some forty
# small programs compiled one by one.
@compile_cache.jit_by_text(static_argnames=("num_draws", "subsample_size"))
def _estimates_spread(model: Model, proxy, thetas, key, *, num_draws: int, subsample_size: int):
  """``(largest sd of d_hat over subsamples at one theta, smallest d_hat)``."""
  n = model.num_data

  def d_hats(theta, k):
    idx = batching.uniform_indices(k, n, (num_draws, subsample_size))
    return jax.vmap(lambda i: n * jnp.mean(proxy_lib.differences(model, proxy, theta, i)))(idx)

  values = jax.vmap(d_hats)(thetas, jax.random.split(key, thetas.shape[0]))
  return jnp.max(jnp.std(values, axis=1)), jnp.min(values)
