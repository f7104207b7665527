"""More Monte Carlo samples per datum, drawn independently or as randomized quasi-Monte Carlo.

:func:`multi_sample` turns an objective into one whose loss for a datum is the mean of
``K`` loss draws. It is the equal-cost baseline a control variate must beat (spend the
control variate's extra time on more samples instead), and with ``sampler="rqmc"`` a
noise-reduction method of its own: the ``K`` standard normal draws are a randomized Sobol
point set mapped through the normal inverse CDF, so they cover the space more evenly than
independent draws while each one is still exactly ``N(0, I)``. Every estimator stays
unbiased with it, the joint control variates included: a control variate needs only that
each draw has the noise's distribution, and the estimator's control is computed at the
same draws.

Randomization: a random *digital shift* (a uniform random bit pattern XOR-ed into every
point's coordinates) of the unscrambled Sobol points from :class:`scipy.stats.qmc.Sobol`.
A digitally shifted point is uniform on the grid of ``2^-23`` cells of each coordinate
(the resolution ``jax.random.normal`` has in float32), and a digital shift keeps the
points' net structure, which a random additive shift does not.

References:
  Buchholz, Wenzel, Mandt (2018). Quasi-Monte Carlo variational inference. ICML (Sec. 3,
  randomized QMC for reparameterization gradients).
  Owen (2023). Practical quasi-Monte Carlo integration, Ch. 17 (digital shifts).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.training import compile_cache
from dsgrad.objective import Objective

__all__ = ["multi_sample", "sobol_normal", "SAMPLERS"]

SAMPLERS = ("mc", "rqmc")
_BITS = 23  # float32 resolution of a uniform in (0, 1), as jax.random.normal has


def _sobol_class():
  # Imported on first use: scipy.stats takes about a second to import, a third of
  # ``import dsgrad``, and only randomized QMC reads it.
  from scipy.stats import qmc  # pylint: disable=import-outside-toplevel
  return qmc.Sobol


@compile_cache.cached
def _sobol_bits(num_points: int, dim: int) -> np.ndarray:
  """The first ``num_points`` unscrambled Sobol points in ``[0, 1)^dim`` as ``_BITS``-bit
  integers (exact: scipy's points are multiples of ``2^-32``)."""
  sobol = _sobol_class()
  if dim > sobol.MAXDIM:
    raise ValueError(f"randomized QMC noise: the noise has {dim} coordinates per draw, more "
                     f"than the {sobol.MAXDIM} Sobol dimensions scipy provides; use "
                     "sampler='mc'")
  # A power-of-two prefix (what scipy's balance properties ask for), cut to size.
  m = max(0, int(np.ceil(np.log2(num_points))))
  points = sobol(dim, scramble=False).random_base2(m)[:num_points]
  return (points * 2.0 ** _BITS).astype(np.uint32)


@checks.arguments(key=checks.prng_key(), num_points=checks.count(1), dim=checks.count(1))
def sobol_normal(key: jax.Array, num_points: int, dim: int, dtype=jnp.float32) -> jax.Array:
  """``(num_points, dim)`` randomized Sobol points mapped to standard normal draws.

  Each row is exactly distributed as ``N(0, I_dim)`` (at float32 resolution); the rows
  together are a digitally shifted Sobol point set, so averages over them have lower
  variance than over independent draws for smooth integrands. Powers of two are the
  natural point counts.

  Args:
    key: PRNG key (the random shift).
    num_points: number of points.
    dim: dimension of each point.
    dtype: floating dtype of the result.

  Returns:
    An array of shape ``(num_points, dim)``.

  Example::

    >>> import jax, dsgrad
    >>> dsgrad.noise.sobol_normal(jax.random.key(0), 8, 3).shape
    (8, 3)
  """
  bits = jnp.asarray(_sobol_bits(int(num_points), int(dim)))
  shift = jax.random.bits(key, (dim,), jnp.uint32) >> (32 - _BITS)
  cells = jnp.bitwise_xor(bits, shift[None, :])
  # The cell's midpoint: (2k + 1) / 2^24 is exact in float32 and never 0 or 1.
  uniform = (2.0 * cells.astype(jnp.float32) + 1.0) * 2.0 ** -(_BITS + 1)
  return jax.scipy.special.ndtri(uniform).astype(dtype)


def _gaussian_spec(objective: Objective):
  spec = getattr(objective.noise_fn, "gaussian", None)
  if spec is None:
    raise ValueError(f"sampler='rqmc' maps Sobol points to standard normal noise, but "
                     f"{objective.name}'s noise sampler is not dsgrad.gaussian_noise (its "
                     "distribution is unknown here); use sampler='mc'")
  return spec


@checks.arguments(objective=checks.objective(), num_samples=checks.count(1))
def multi_sample(objective: Objective, num_samples: int, *, sampler: str = "mc"
                 ) -> Objective:
  """``objective`` with ``K = num_samples`` noise draws per datum, their losses averaged.

  The loss of datum ``n`` becomes ``(1/K) sum_k f(w; n, eps_k)``: the same objective
  ``F(w)`` (same mean), whose gradient's Monte Carlo variance is ``1/K`` of the original's
  with independent draws and lower still with ``sampler="rqmc"`` on smooth models. It is
  an objective like any other: every estimator, approximation written for any objective
  (:func:`dsgrad.approx.linearize`) and :func:`dsgrad.fit` take it.

  Args:
    objective: the objective (its noise has a batch axis or is shared, as before).
    num_samples: ``K``.
    sampler: ``"mc"`` (independent draws of the objective's own noise sampler) or
      ``"rqmc"`` (randomized Sobol points mapped to normal draws; requires noise made by
      :func:`dsgrad.gaussian_noise`, as the Gaussian families' is). With shared noise the
      ``K`` draws are the point set; with per-datum noise the batch's ``B K`` draws are.

  Returns:
    An :class:`dsgrad.Objective`. Its noise has a ``K`` axis after the batch axis (per-datum
    noise) or first (shared noise). Fused kernels do not apply to it (their arithmetic is
    for one draw).

  Raises:
    ValueError: an unknown sampler, or ``"rqmc"`` for noise that is not Gaussian or has
      more coordinates per draw than scipy's Sobol sequence (21,201).

  References:
    Buchholz, Wenzel, Mandt (2018), Sec. 3; Wang, Geffner, Domke (2024), Eq. 2-3.

  Example::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> base = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> objective = dsgrad.multi_sample(base, 8, sampler="rqmc")
    >>> objective.sample_noise(jax.random.key(1), 10).shape  # shared noise: (K, d)
    (8, 3)
  """
  if sampler not in SAMPLERS:
    raise ValueError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")
  k, shared, base_loss = int(num_samples), objective.shared_noise, objective.loss_fn
  if sampler == "rqmc":
    shape, dtype, scale = _gaussian_spec(objective)[:3]
    dim = int(np.prod(shape))
    max_dim = _sobol_class().MAXDIM
    if dim > max_dim:  # refused here, not when the first draw is traced
      raise ValueError(f"multi_sample(sampler='rqmc'): the noise has {dim:,} coordinates "
                       f"per draw, more than the {max_dim:,} Sobol dimensions "
                       f"scipy provides; use sampler='mc'")

    def noise_fn(key, batch_size):
      count = k if shared else batch_size * k
      points = scale * sobol_normal(key, count, dim, dtype)
      return points.reshape(((k,) if shared else (batch_size, k)) + tuple(shape))
  else:
    base_noise = objective.noise_fn

    def noise_fn(key, batch_size):
      draws = jax.vmap(lambda kk: base_noise(kk, batch_size))(jax.random.split(key, k))
      # Per-datum noise: (K, B, ...) -> (B, K, ...), so the batch axis stays first.
      return draws if shared else jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), draws)

  def loss_fn(params, rows, noise):
    axis = 0 if shared else 1
    losses = jax.vmap(lambda e: base_loss(params, rows, e), in_axes=axis)(noise)
    return jnp.mean(losses, axis=0)

  label = f"{objective.name}[{k} {'RQMC' if sampler == 'rqmc' else 'MC'} samples]"
  return dataclasses.replace(
      objective, loss_fn=loss_fn, noise_fn=noise_fn, name=label, source=None,
      table_approximation=None,
      # An average of K draws is not one draw's log importance ratio (PSIS needs that).
      log_q_offset=None)
