"""Small VAE networks as Flax NNX modules, and the Bernoulli image likelihood.

The MLP encoder outputs the mean and log standard deviation of a factorized Gaussian
``q(z | x)``; the MLP decoder outputs Bernoulli logits ``pi_theta(z)`` for binary
images (flattened). They are the "small MLP versions for fast tests and CPU examples";
the paper's convolutional networks are not written yet.

References:
  Thin et al. (2021), Sec. 4.3 (architecture: a factorized Gaussian encoder, a Bernoulli
  decoder for binarized MNIST, latent size 64).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class _MLP(nnx.Module):
  """ReLU hidden layers and a linear head; checks the input's last axis."""

  def __init__(self, in_dim: int, out_dim: int, hidden: Sequence[int], owner: str,
               rngs: nnx.Rngs):
    widths = [in_dim, *map(int, hidden)]
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths, widths[1:])])
    self.head = nnx.Linear(widths[-1], out_dim, rngs=rngs)
    self.in_dim, self.owner = in_dim, owner

  def __call__(self, h):
    if h.shape[-1] != self.in_dim:
      raise ValueError(f"{self.owner} expects inputs with last axis {self.in_dim}, got "
                       f"shape {h.shape}")
    for layer in self.layers:
      h = jax.nn.relu(layer(h))
    return self.head(h)


class MLPEncoder(nnx.Module):
  """``x (..., data_dim) -> (mean, log_scale)``, each ``(..., latent_dim)``.

  Args:
    data_dim: size of a flattened input.
    latent_dim: ``d``.
    hidden: widths of the hidden layers (ReLU).
    rngs: ``nnx.Rngs`` for the initialization.
  """

  def __init__(self, data_dim: int, latent_dim: int, hidden: Sequence[int] = (256,), *,
               rngs: nnx.Rngs):
    self.body = _MLP(int(data_dim), 2 * int(latent_dim), hidden, "MLPEncoder", rngs)

  def __call__(self, x):
    mean, log_scale = jnp.split(self.body(x), 2, axis=-1)
    return mean, log_scale


class MLPDecoder(nnx.Module):
  """``z (..., latent_dim) -> logits (..., data_dim)`` of independent Bernoullis.

  Args:
    latent_dim: ``d``.
    data_dim: size of a flattened image.
    hidden: widths of the hidden layers (ReLU).
    rngs: ``nnx.Rngs`` for the initialization.
  """

  def __init__(self, latent_dim: int, data_dim: int, hidden: Sequence[int] = (256,), *,
               rngs: nnx.Rngs):
    self.body = _MLP(int(latent_dim), int(data_dim), hidden, "MLPDecoder", rngs)

  def __call__(self, z):
    return self.body(z)


def bernoulli_log_likelihood(logits, x) -> jax.Array:
  """``sum_i log Bern(x_i; sigmoid(logits_i))`` over the last axis; ``x`` in ``[0, 1]``
  (binary, or grey levels used as Bernoulli means)."""
  return -jnp.sum(jnp.logaddexp(0.0, logits) - x * logits, axis=-1)


def check_images(x, data_dim: int | None = None, name: str = "images") -> np.ndarray:
  """Validates images for a Bernoulli decoder and returns them as float32 ``(N, D)``.

  Raises:
    ValueError: values outside ``[0, 1]`` or non-finite, or rows of the wrong size.
  """
  arr = np.asarray(x, np.float32)
  if arr.ndim < 2:
    raise ValueError(f"{name} must have shape (N, ...), got {arr.shape}")
  arr = arr.reshape(arr.shape[0], -1)
  if data_dim is not None and arr.shape[1] != data_dim:
    raise ValueError(f"{name} have {arr.shape[1]} pixels each, the networks expect {data_dim}")
  if not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 1:
    raise ValueError(f"{name} must lie in [0, 1] for a Bernoulli decoder, got values in "
                     f"[{np.nanmin(arr):g}, {np.nanmax(arr):g}]; scale them (e.g. / 255)")
  return arr
