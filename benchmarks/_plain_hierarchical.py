"""The scale suite's hierarchical model and its mini-batch gradient in plain JAX (no
dsgrad), for timing XLA itself: what ``python -m benchmarks two-threads`` times in fresh
processes and ``docs/scripts/split_loop_profile.py`` traces. :func:`build` creates arrays,
so JAX starts there: set the process's affinity (or call ``dsgrad.pin_xla_threads``)
before it."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree


class PlainModel(NamedTuple):
  """``loss(params, idx, eps)``: one-sample negative ELBO estimate of a mean-field Gaussian
  (``params``: ``loc``, ``log_scale`` over the ``dim`` flat latents) on the rows ``idx``;
  ``params`` and ``idx`` a starting point and one batch."""

  loss: Callable
  params: dict
  idx: jax.Array
  dim: int


def build(num_data: int, groups: int, batch: int) -> PlainModel:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((num_data, 8), dtype=np.float32))
  g = jnp.asarray(rng.integers(0, groups, num_data).astype(np.int32))
  y = jnp.asarray((rng.random(num_data) < 0.5).astype(np.float32))
  latent = {"beta": jnp.zeros(8), "mu": jnp.zeros(3), "log_tau": jnp.zeros(3),
            "raw": jnp.zeros((groups, 3))}
  flat, unravel = ravel_pytree(latent)

  def loss(params, idx, eps):
    zf = params["loc"] + jnp.exp(params["log_scale"]) * eps
    z = unravel(zf)
    ab = z["mu"] + jnp.exp(z["log_tau"]) * z["raw"][g[idx]]
    xr = x[idx]
    logit = xr @ z["beta"] + ab[:, 0] + ab[:, 1] * xr[:, 0] + ab[:, 2] * xr[:, 1]
    return (-num_data * jnp.mean(y[idx] * logit - jax.nn.softplus(logit))
            + 0.5 * jnp.sum(zf ** 2) - jnp.sum(params["log_scale"]))

  params = {"loc": jnp.zeros(flat.size), "log_scale": jnp.full(flat.size, -2.0)}
  return PlainModel(loss, params, jnp.arange(batch), flat.size)


def gradient(model: PlainModel) -> Callable:
  """The compiled ``(params, idx, key) -> gradient`` with the step's noise drawn inside."""
  return jax.jit(lambda params, idx, key: jax.grad(model.loss)(
      params, idx, jax.random.normal(key, (model.dim,))))
