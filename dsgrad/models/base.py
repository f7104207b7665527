"""The model protocol: a log prior and a per-datum log likelihood over a flat latent."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax


class LinearPredictor(NamedTuple):
  """Declares that a likelihood sees the latent only through ``K`` linear predictors.

  ``log p(x_n | z) = log_likelihood_of_logits(x_n^T Z, n)`` with ``Z = z.reshape(D, K)``
  (row-major). Approximations can then store per datum the ``K`` logits instead of the
  whole parameter vector (see :func:`dsgrad.approx.glm_mean_taylor`).

  Attributes:
    features: ``(N, D)`` feature matrix ``x_n``.
    num_outputs: ``K``, the number of linear predictors per datum.
    log_likelihood_of_logits: ``(logits (B, K), indices (B,)) -> (B,)`` log likelihoods.
  """

  features: jax.Array
  num_outputs: int
  log_likelihood_of_logits: Callable[[jax.Array, jax.Array], jax.Array]


class Model(NamedTuple):
  """A Bayesian model ``p(z) prod_n p(x_n | z)`` with a flat latent ``z`` in R^d.

  Attributes:
    log_prior: ``log_prior(z) -> scalar`` for ``z`` of shape ``(latent_dim,)``.
    log_likelihood: ``log_likelihood(z, indices) -> (B,)``: ``log p(x_n | z)`` for each
      datum of the batch, all at the same ``z``. The data are closed over.
    num_data: ``N``.
    latent_dim: ``d``.
    name: label for messages and tables.
    linear: optional :class:`LinearPredictor` structure of the likelihood (GLMs).
  """

  log_prior: Callable[[jax.Array], jax.Array]
  log_likelihood: Callable[[jax.Array, jax.Array], jax.Array]
  num_data: int
  latent_dim: int
  name: str = "model"
  linear: LinearPredictor | None = None

  def log_joint_datum(self, z, index):
    """``k_n(z) = N log p(x_n | z) + log p(z)`` for one datum (App. F notation)."""
    return self.num_data * self.log_likelihood(z, index[None])[0] + self.log_prior(z)
