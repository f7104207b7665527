"""Small VAE networks as Flax NNX modules, and the Bernoulli image likelihood.

The MLP encoder outputs the mean and log standard deviation of a factorized Gaussian
``q(z | x)``; the MLP decoder outputs Bernoulli logits ``pi_theta(z)`` for binary
images (flattened). They are the "small MLP versions for fast tests and CPU examples".
:class:`ConvEncoder` and :class:`ConvDecoder` are the paper's convolutional networks:
strided 3x3 convolutions down, nearest-neighbour upsampling and 3x3 convolutions up; the
decoder outputs Bernoulli logits (binary images) or Gaussian means (colour images, with
:func:`gaussian_log_likelihood`). All take and return flattened images ``(..., D)``.

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

from dsgrad import checks


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


@checks.arguments(data_dim=checks.count(1), latent_dim=checks.count(1), hidden=checks.sizes(1))
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
    self.data_dim, self.latent_dim = int(data_dim), int(latent_dim)

  def __call__(self, x):
    mean, log_scale = jnp.split(self.body(x), 2, axis=-1)
    return mean, log_scale


@checks.arguments(latent_dim=checks.count(1), data_dim=checks.count(1), hidden=checks.sizes(1))
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
    self.latent_dim, self.data_dim = int(latent_dim), int(data_dim)

  def __call__(self, z):
    return self.body(z)


def _check_image_shape(image_shape, num_stages: int, owner: str):
  shape = tuple(int(v) for v in image_shape)
  if len(shape) != 3 or min(shape) < 1:
    raise ValueError(f"{owner}: image_shape must be (height, width, channels), got {shape}")
  factor = 2 ** num_stages
  if shape[0] % factor or shape[1] % factor:
    raise ValueError(f"{owner}: height and width {shape[:2]} must be multiples of "
                     f"2 ** len(channels) = {factor}")
  return shape


def _as_images(x, shape, owner):
  size = shape[0] * shape[1] * shape[2]
  if x.shape[-1] != size:
    raise ValueError(f"{owner} expects flattened images with last axis {size} "
                     f"(image shape {shape}), got shape {x.shape}")
  return x.reshape((-1,) + shape), x.shape[:-1]


@checks.arguments(latent_dim=checks.count(1), channels=checks.sizes(1))
class ConvEncoder(nnx.Module):
  """``x (..., H*W*C) -> (mean, log_scale)`` with a convolutional body (Sec. 4.3).

  Each stage is a 3x3 convolution and a strided 3x3 convolution (halving the height and
  width), ReLU after each; a linear head gives the Gaussian's mean and log scale. Two
  convolutions per entry of ``channels``: the paper's 8-layer encoder is
  ``channels=(32, 32, 64, 64)`` on 32x32 images.

  Args:
    image_shape: ``(H, W, C)``; ``H`` and ``W`` multiples of ``2 ** len(channels)``.
    latent_dim: ``d``.
    channels: feature maps per stage.
    rngs: ``nnx.Rngs``.
  """

  def __init__(self, image_shape, latent_dim: int, channels: Sequence[int] = (32, 64), *,
               rngs: nnx.Rngs):
    self.image_shape = _check_image_shape(image_shape, len(channels), "ConvEncoder")
    h, w, c = self.image_shape
    convs, widths = [], [c, *map(int, channels)]
    for a, b in zip(widths, widths[1:]):
      convs.append(nnx.Conv(a, b, (3, 3), rngs=rngs))
      convs.append(nnx.Conv(b, b, (3, 3), strides=(2, 2), rngs=rngs))
    self.convs = nnx.List(convs)
    factor = 2 ** len(channels)
    self.head = nnx.Linear((h // factor) * (w // factor) * widths[-1], 2 * int(latent_dim),
                           rngs=rngs)
    self.data_dim, self.latent_dim = h * w * c, int(latent_dim)

  def __call__(self, x):
    h, batch = _as_images(x, self.image_shape, "ConvEncoder")
    for conv in self.convs:
      h = jax.nn.relu(conv(h))
    out = self.head(h.reshape(h.shape[0], -1)).reshape(batch + (-1,))
    mean, log_scale = jnp.split(out, 2, axis=-1)
    return mean, log_scale


@checks.arguments(latent_dim=checks.count(1), channels=checks.sizes(1))
class ConvDecoder(nnx.Module):
  """``z (..., d) -> (..., H*W*C)``: Bernoulli logits, or Gaussian means in ``(0, 1)``.

  A linear layer to a ``(H / 2^S, W / 2^S, channels[0])`` map, then per stage a
  nearest-neighbour upsampling by 2 and a 3x3 convolution with ReLU, then a 3x3
  convolution to ``C`` channels (Sec. 4.3).

  Args:
    latent_dim: ``d``.
    image_shape: ``(H, W, C)``.
    channels: feature maps per stage (``S = len(channels)`` upsamplings).
    output: ``"bernoulli"`` (logits) or ``"gaussian"`` (means, through a sigmoid).
    rngs: ``nnx.Rngs``.
  """

  def __init__(self, latent_dim: int, image_shape, channels: Sequence[int] = (64, 32), *,
               output: str = "bernoulli", rngs: nnx.Rngs):
    if output not in ("bernoulli", "gaussian"):
      raise ValueError(f"output must be 'bernoulli' or 'gaussian', got {output!r}")
    self.image_shape = _check_image_shape(image_shape, len(channels), "ConvDecoder")
    h, w, c = self.image_shape
    factor = 2 ** len(channels)
    self.start = (h // factor, w // factor, int(channels[0]))
    self.head = nnx.Linear(int(latent_dim), self.start[0] * self.start[1] * self.start[2],
                           rngs=rngs)
    widths = [int(channels[0]), *map(int, channels)]
    self.convs = nnx.List([nnx.Conv(a, b, (3, 3), rngs=rngs)
                           for a, b in zip(widths, widths[1:])])
    self.out = nnx.Conv(widths[-1], c, (3, 3), rngs=rngs)
    self.output, self.latent_dim, self.data_dim = output, int(latent_dim), h * w * c

  def __call__(self, z):
    if z.shape[-1] != self.latent_dim:
      raise ValueError(f"ConvDecoder expects latents with last axis {self.latent_dim}, "
                       f"got shape {z.shape}")
    batch = z.shape[:-1]
    h = jax.nn.relu(self.head(z.reshape(-1, self.latent_dim))).reshape((-1,) + self.start)
    for conv in self.convs:
      h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)  # nearest-neighbour upsampling
      h = jax.nn.relu(conv(h))
    out = self.out(h).reshape(batch + (self.data_dim,))
    return jax.nn.sigmoid(out) if self.output == "gaussian" else out


@checks.arguments(scale=checks.positive())
def gaussian_log_likelihood(means, x, scale: float) -> jax.Array:
  """``sum_i log N(x_i; means_i, scale^2)`` over the last axis (colour images)."""
  return jnp.sum(-0.5 * ((x - means) / scale) ** 2 - jnp.log(scale)
                 - 0.5 * jnp.log(2 * jnp.pi), axis=-1)


def bernoulli_log_likelihood(logits, x) -> jax.Array:
  """``sum_i log Bern(x_i; sigmoid(logits_i))`` over the last axis; ``x`` in ``[0, 1]``
  (binary, or grey levels used as Bernoulli means)."""
  return -jnp.sum(jnp.logaddexp(0.0, logits) - x * logits, axis=-1)


@checks.arguments(data_dim=checks.optional(checks.count(1)))
def check_images(x, data_dim: int | None = None, name: str = "images",
                 unit_interval: bool = True) -> np.ndarray:
  """Validates images and returns them as float32 ``(N, D)``.

  Args:
    x: ``(N, ...)`` images.
    data_dim: the pixels per image the networks read (``None``: any).
    name: the argument's name in messages.
    unit_interval: require values in ``[0, 1]`` (Bernoulli pixels); ``False`` for a
      Gaussian decoder, whose pixels may take any finite value.

  Raises:
    ValueError: non-finite values, rows of the wrong size, or (``unit_interval``) values
      outside ``[0, 1]``.
  """
  # A dict or strings (the params, swapped in) are named, not "float() argument must be".
  arr = checks.numeric_array(x, name).astype(np.float32)
  if arr.ndim < 2:
    raise ValueError(f"{name} must have shape (N, ...), got {arr.shape}")
  if arr.shape[0] == 0 or arr.size == 0:
    raise ValueError(f"{name} is empty (shape {arr.shape}): pass at least one image with "
                     "at least one pixel")
  arr = arr.reshape(arr.shape[0], -1)
  if data_dim is not None and arr.shape[1] != data_dim:
    raise ValueError(f"{name} have {arr.shape[1]} pixels each, the networks expect {data_dim}")
  bad = ~np.isfinite(arr)
  if np.any(bad):
    first = np.argwhere(bad)[0]
    raise ValueError(f"{name} contain {int(bad.sum())} non-finite pixels (NaN or inf; the "
                     f"first in image {first[0]}, pixel {first[1]}): every pixel must be "
                     "a finite value")
  if unit_interval and (arr.min() < 0 or arr.max() > 1):
    raise ValueError(f"{name} must lie in [0, 1] for a Bernoulli decoder, got values in "
                     f"[{np.nanmin(arr):g}, {np.nanmax(arr):g}]; scale them (e.g. / 255)")
  return arr
