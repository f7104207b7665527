"""The model protocol: a log prior and a per-datum log likelihood over a flat latent."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax


class Model(NamedTuple):
  """A Bayesian model ``p(z) prod_n p(x_n | z)`` with a flat latent ``z`` in R^d.

  Attributes:
    log_prior: ``log_prior(z) -> scalar`` for ``z`` of shape ``(latent_dim,)``.
    log_likelihood: ``log_likelihood(z, indices) -> (B,)``: ``log p(x_n | z)`` for each
      datum of the batch, all at the same ``z``. The data are closed over.
    num_data: ``N``.
    latent_dim: ``d``.
    name: label for messages and tables.
  """

  log_prior: Callable[[jax.Array], jax.Array]
  log_likelihood: Callable[[jax.Array, jax.Array], jax.Array]
  num_data: int
  latent_dim: int
  name: str = "model"

  def log_joint_datum(self, z, index):
    """``k_n(z) = N log p(x_n | z) + log p(z)`` for one datum (App. F notation)."""
    return self.num_data * self.log_likelihood(z, index[None])[0] + self.log_prior(z)
