"""The Taylor approximation of Gaussian-dropout GLMs (App. E).

References:
  Wang, Geffner, Domke (2024), App. E.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dsgrad.approx.base import Approximation
from dsgrad.models.dropout_glm import DropoutGLM
from dsgrad.objective import Objective


def _dropout_terms(glm: DropoutGLM, params, x, y, delta):
  """Second-order Taylor of the loss in the logits for one datum (Eq. 57-58)."""
  w, b = params["weight"], params["bias"]
  logits0 = w @ x + b
  loss0 = glm.loss(logits0, y)
  g = jax.grad(glm.loss)(logits0, y)
  h = jax.hessian(glm.loss)(logits0, y)
  scaled = w * x[None, :]                  # column d of W times x_d, (K, D)
  # f~ = L + g . dphi + dphi^T H dphi / 2 with dphi = W (delta * x).
  dphi = scaled @ delta
  f_tilde = loss0 + g @ dphi + 0.5 * dphi @ h @ dphi
  # E f~ = L + s^2 / 2 tr(Hess_delta f) and Hess_delta f = diag(x) W^T H W diag(x).
  expected = loss0 + 0.5 * glm.dropout_std ** 2 * jnp.sum((h @ scaled) * scaled)
  return f_tilde, expected


def dropout_taylor(glm: DropoutGLM) -> Approximation:
  """Second-order expansion of a dropout GLM in the noise around ``eps = 1`` (App. E).

  With ``delta = eps - 1 ~ N(0, s^2 I)`` and logits ``phi = W((1 + delta) x) + b``,
  ``f~(w; n, delta) = f(w; n, 0) + delta^T grad_delta f + delta^T Hess_delta f delta / 2``
  (Eq. 57) and ``E f~ = f(w; n, 0) + s^2 / 2 tr Hess_delta f(w; n, 0)`` (Eq. 58). For a
  GLM, ``Hess_delta f = diag(x) W^T H_L W diag(x)`` with ``H_L`` the ``K x K`` Hessian of
  the loss in the logits, so the trace is ``sum_d x_d^2 w_d^T H_L w_d``: closed form at
  ``O(K^2 D)`` per datum, no ``D x D`` matrix. Gradients in ``w`` are taken through these
  closed forms by autodiff.

  Args:
    glm: the dropout GLM (supplies features, labels, loss and ``s``).

  Returns:
    An :class:`Approximation` for params ``{"weight", "bias"}``.

  Example: on the full data set, where only the dropout noise varies, the control
  variate it gives removes most of the gradient's variance::

    >>> import jax, numpy as np, optax, dsgrad
    >>> x = np.random.default_rng(0).normal(size=(200, 5)).astype(np.float32)
    >>> glm = dsgrad.models.dropout_glm(x, (x[:, 0] > 0).astype(int), num_outputs=2)
    >>> objective, params = glm.objective(), glm.init_params(jax.random.key(0), 0.5)
    >>> def variance(estimator):
    ...   draws = dsgrad.estimator_samples(estimator, estimator.init(params), params,
    ...                                    objective, jax.random.key(1), 100, batch_size=200,
    ...                                    replace=False)
    ...   return dsgrad.total_variance(draws)[0]
    >>> cv = dsgrad.cv(objective, dsgrad.approx.dropout_taylor(glm), control_weight=1.0)
    >>> bool(variance(cv) < 0.5 * variance(dsgrad.naive()))
    True

  References:
    Wang, Geffner, Domke (2024), App. E, Eq. 55-58.
  """

  def per_datum(params, x, y, delta):
    gt = jax.grad(lambda p: _dropout_terms(glm, p, x, y, delta)[0])(params)
    ge = jax.grad(lambda p: _dropout_terms(glm, p, x, y, delta)[1])(params)
    return gt, ge

  def grad_and_expected(objective: Objective, params, indices, noise):
    rows = objective.rows(indices)
    gt, ge = jax.vmap(per_datum, in_axes=(None, 0, 0, 0))(params, rows["features"],
                                                          rows["labels"], noise)
    return jax.tree.map(lambda a: jnp.mean(a, 0), (gt, ge))

  def expected_grad(objective: Objective, params, indices):
    def one(x, y):
      return jax.grad(lambda p: _dropout_terms(glm, p, x, y, jnp.zeros_like(x))[1])(params)

    rows = objective.rows(indices)
    return jax.tree.map(lambda a: jnp.mean(a, 0), jax.vmap(one)(rows["features"],
                                                                rows["labels"]))

  return Approximation(grad_and_expected, expected_grad, "dropout_taylor")


def dropout_taylor_values(glm: DropoutGLM, params, index, delta):
  """``(f~(w; n, delta), E f~(w; n, .))`` for one datum (App. E, Eq. 57-58).

  Exposed for diagnostics and tests of the closed form.
  """
  return _dropout_terms(glm, params, glm.features[index], glm.labels[index], delta)
