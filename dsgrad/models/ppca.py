"""Probabilistic PCA with a Gaussian prior on the loading matrix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.models.base import Model, model_data

_LOG_2PI = float(np.log(2 * np.pi))


# The K x K Cholesky factor and triangular solve below are written with jnp instead of
# ``jnp.linalg.cholesky`` / ``jax.scipy.linalg.solve_triangular``: on CPU (jax 0.10.2) a
# long joint_saga training scan that calls the LAPACK-backed versions stops in XLA's
# runtime (0% CPU, never returns); ``docs/scripts/ppca_hang.py`` reproduces it. K is
# small (the paper uses 16), so a loop over columns costs little.


def _cholesky(a):
  """Lower Cholesky factor of a symmetric positive-definite ``(K, K)`` matrix, one column
  per iteration of a ``fori_loop`` (Cholesky-Banachiewicz)."""
  k = a.shape[-1]
  rows = jnp.arange(k)

  def column(j, chol):
    # Columns >= j of ``chol`` are still zero, so full-length dot products sum over < j.
    diag = jnp.sqrt(a[j, j] - jnp.sum(chol[j] ** 2))
    below = (a[:, j] - chol @ chol[j]) / diag
    return chol.at[:, j].set(jnp.where(rows > j, below, jnp.where(rows == j, diag, 0.0)))

  return jax.lax.fori_loop(0, k, column, jnp.zeros_like(a))


def _solve_lower(chol, b):
  """``chol^{-1} b`` for a lower-triangular ``(K, K)`` ``chol`` and ``(K, B)`` ``b``."""

  def row(i, y):
    # Rows >= i of ``y`` are still zero, so ``chol[i] @ y`` sums over < i.
    return y.at[i].set((b[i] - chol[i] @ y) / chol[i, i])

  return jax.lax.fori_loop(0, chol.shape[0], row, jnp.zeros_like(b))


@checks.arguments(latent_dim=checks.count(1), noise_std=checks.positive())
def ppca(data, latent_dim: int = 16, noise_std: float = 1.0, name: str = "ppca") -> Model:
  """Probabilistic PCA: ``W ~ N(0, I)``, ``x_n ~ N(0, W W^T + noise_std^2 I)``.

  The latent ``z`` is the loading matrix ``W`` of shape ``(D, K)`` flattened row-major.
  The latent coordinates ``u_n`` of PCA are integrated out, so each datum's likelihood is
  a ``D``-dimensional Gaussian. It is evaluated with the Woodbury identity and the matrix
  determinant lemma through the ``K x K`` matrix ``M = s^2 I + W^T W``: ``O(D K^2 + K^3)``
  per batch plus ``O(D K)`` per datum, never a ``D x D`` matrix.

  Args:
    data: ``(N, D)`` observations (centre them first: the model has mean zero).
    latent_dim: ``K`` (the paper uses 16).
    noise_std: observation noise standard deviation ``s`` (the paper uses 1).
    name: label.

  Returns:
    A :class:`dsgrad.models.Model` with ``latent_dim = D * K``.

  Raises:
    ValueError: on a non-2-D or non-finite data matrix, ``K`` outside ``[1, D]`` or a
      non-positive ``noise_std``.

  References:
    Wang, Geffner, Domke (2024), Sec. 7.1 (PPCA, K = 16, lambda = 1).
    Tipping, Bishop (1999). Probabilistic principal component analysis. JRSS B.

  Example::

    >>> import numpy as np, dsgrad
    >>> data = np.random.default_rng(0).normal(size=(50, 6)).astype(np.float32)
    >>> model = dsgrad.models.ppca(data, latent_dim=2, noise_std=0.5)
    >>> model.latent_dim  # the D x K loading matrix W, flattened
    12
  """
  x = checks.float32_values(data, "data")
  if x.ndim != 2:
    raise ValueError(f"data must be a 2-D (N, D) array, got shape {x.shape}")
  n, d = x.shape
  k = int(latent_dim)
  if not 1 <= k <= d:
    raise ValueError(f"latent_dim must be in [1, D={d}], got {latent_dim}")
  data = model_data(x=jnp.asarray(x, jnp.float32))
  var = float(noise_std) ** 2

  def log_prior(z):
    return -0.5 * jnp.sum(z ** 2) - 0.5 * d * k * _LOG_2PI

  def log_likelihood(z, rows):
    w = z.reshape(d, k)
    chol = _cholesky(var * jnp.eye(k, dtype=z.dtype) + w.T @ w)
    # log det(W W^T + s^2 I_D) = (D - K) log s^2 + log det(s^2 I_K + W^T W).
    log_det = (d - k) * jnp.log(var) + 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))
    xb = rows["x"]
    projected = _solve_lower(chol, w.T @ xb.T)  # (K, B)
    quad = (jnp.sum(xb ** 2, axis=1) - jnp.sum(projected ** 2, axis=0)) / var
    return -0.5 * (d * _LOG_2PI + log_det + quad)

  return Model(log_prior, log_likelihood, n, d * k, name, data=data)


@checks.arguments(key=checks.prng_key(), num_data=checks.count(1), dim=checks.count(1),
                  latent_dim=checks.count(1), noise_std=checks.positive())
def synthetic_ppca_data(key, num_data: int, dim: int, latent_dim: int,
                        noise_std: float = 1.0):
  """Seeded draws from the PPCA model: ``(data (N, D), true W (D, K))`` as numpy arrays."""
  k1, k2, k3 = jax.random.split(key, 3)
  w = jax.random.normal(k1, (dim, latent_dim))
  u = jax.random.normal(k2, (num_data, latent_dim))
  x = u @ w.T + noise_std * jax.random.normal(k3, (num_data, dim))
  return np.asarray(x), np.asarray(w)
