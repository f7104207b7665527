"""Generalized linear models with Gaussian dropout on the features (App. E).

``f(w; n, eps) = L(y_n, W (eps * x_n) + b)`` with multiplicative noise
``eps ~ N(1, s^2 I)``. dsgrad works with the centred noise ``delta = eps - 1`` so that
:func:`dsgrad.approx.linearize` applies; the objective is unchanged.

References:
  Wang, Geffner, Domke (2024), App. E, Eq. 54-58.
  Srivastava et al. (2014). Dropout. JMLR (Gaussian dropout).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks
from dsgrad.models.base import model_data
from dsgrad.objective import Objective, gaussian_noise


def softmax_cross_entropy(logits, label):
  """Cross-entropy of integer ``label`` under ``softmax(logits)`` (one datum)."""
  return optax.losses.softmax_cross_entropy_with_integer_labels(logits, label)


class DropoutGLM(NamedTuple):
  """A GLM ``logits = W ((1 + delta) * x) + b`` with Gaussian dropout ``delta ~ N(0, s^2)``.

  Attributes:
    features: ``(N, D)`` inputs ``x_n``.
    labels: ``(N,)`` targets ``y_n`` (integers for classification).
    num_outputs: ``K``, the number of logits.
    dropout_std: ``s``, the standard deviation of the multiplicative noise.
    loss: ``loss(logits (K,), label) -> scalar`` (default softmax cross-entropy).
  """

  features: jax.Array
  labels: jax.Array
  num_outputs: int
  dropout_std: float
  loss: Callable = softmax_cross_entropy

  @property
  def num_data(self) -> int:
    return int(self.features.shape[0])

  def init_params(self, key=None, scale: float = 0.0) -> dict:
    """Parameters ``{"weight": (K, D), "bias": (K,)}``: zeros, or ``scale * N(0,1)``."""
    k, d = self.num_outputs, self.features.shape[1]
    if key is None:
      return {"weight": jnp.zeros((k, d)), "bias": jnp.zeros((k,))}
    return {"weight": scale * jax.random.normal(key, (k, d)), "bias": jnp.zeros((k,))}

  def logits(self, params, features, delta):
    """Logits of a batch of feature rows ``(B, D)``, ``(B, K)``; ``delta`` is ``(B, D)``
    centred noise."""
    return (features * (1.0 + delta)) @ params["weight"].T + params["bias"]

  def objective(self) -> Objective:
    """The doubly-stochastic objective ``f(w; n, delta) = L(y_n, W((1+delta) x_n) + b)``
    over the data ``{"features", "labels"}``.

    The noise is per datum, centred: ``delta ~ N(0, s^2 I_D)``.
    """
    logits, loss = self.logits, self.loss

    def loss_fn(params, rows, delta):
      return jax.vmap(loss)(logits(params, rows["features"], delta), rows["labels"])

    return Objective(loss_fn, gaussian_noise((self.features.shape[1],), scale=self.dropout_std),
                     self.num_data, shared_noise=False, name="dropout_glm",
                     data={"features": self.features, "labels": self.labels})


@checks.arguments(num_outputs=checks.count(1), dropout_std=checks.positive())
def dropout_glm(features, labels, num_outputs: int, dropout_std: float = 0.5,
                loss: Callable = softmax_cross_entropy) -> DropoutGLM:
  """Builds a :class:`DropoutGLM`, checking shapes and values.

  Args:
    features: ``(N, D)`` finite floats.
    labels: ``(N,)`` labels; for the default loss integers in ``[0, num_outputs)``.
    num_outputs: ``K``.
    dropout_std: ``s > 0`` (the paper uses 0.5).
    loss: per-datum loss of the logits.

  Returns:
    The model.

  Example::

    >>> import numpy as np, dsgrad
    >>> x = np.random.default_rng(0).normal(size=(40, 5)).astype(np.float32)
    >>> glm = dsgrad.models.dropout_glm(x, np.arange(40) % 2, num_outputs=2)
    >>> glm.num_data
    40
  """
  x = checks.float32_values(features, "features")
  y = checks.numeric_array(labels, "labels")
  if x.ndim != 2:
    raise ValueError(f"features must be a 2-D (N, D) array, got shape {x.shape}")
  if y.shape[:1] != (x.shape[0],):
    raise ValueError(f"labels must have leading dimension {x.shape[0]}, got shape {y.shape}")
  if loss is softmax_cross_entropy and num_outputs < 2:
    # A softmax over one class is 1 whatever the logits: nothing would be learned.
    raise ValueError(f"num_outputs={num_outputs}: the default loss, a softmax "
                     "cross-entropy, needs at least 2 classes (pass loss= for a regression)")
  if loss is softmax_cross_entropy and (
      not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_outputs):
    raise ValueError(f"labels must be integers in [0, {num_outputs}) for cross-entropy")
  data = model_data(features=jnp.asarray(x), labels=jnp.asarray(y))
  return DropoutGLM(data["features"], data["labels"], int(num_outputs), float(dropout_std),
                    loss)
