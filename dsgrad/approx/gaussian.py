"""Approximations for Gaussian variational families: the paper's first-order
approximation of the mean (App. F) and a second-order one that also serves the scales.

References:
  Wang, Geffner, Domke (2024), App. F. Miller et al. (2017). Reducing reparameterization
  gradient variance. NeurIPS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dsgrad import data as data_lib
from dsgrad import derivatives
from dsgrad.approx.base import Approximation
from dsgrad.families.gaussian import FullRankGaussian, MeanFieldGaussian
from dsgrad.models.base import Model
from dsgrad.objective import Objective


def gaussian_mean_taylor(model: Model) -> Approximation:
  """The paper's approximation for mean-field Gaussian BBVI (App. F), on ``loc`` only.

  A second-order Taylor expansion of ``k_n(z) = N log p(x_n | z) + log p(z)`` around
  ``z0 = stop_gradient(loc)`` gives, for ``f = -k_n(T_w(eps)) - H(w)`` (Eq. 63-64),

      grad_loc f~(w; n, eps)   = -grad k_n(loc) - Hess k_n(loc) (exp(log_scale) * eps)
      E grad_loc f~(w; n, .)   = -grad k_n(loc)

  (the entropy does not depend on ``loc``). The ``log_scale`` gradient gets no control
  variate because its expectation needs the Hessian diagonal (Eq. 67). Implemented with
  an explicit gradient and Hessian-vector product of ``k_n``; it equals
  ``linearize(mask={"loc": True, "log_scale": False})`` on the objective of
  :func:`dsgrad.meanfield_gaussian` (tested).

  Args:
    model: the model whose mean-field objective is being optimized.

  Returns:
    An :class:`Approximation` for params ``{"loc", "log_scale"}``.

  References:
    Wang, Geffner, Domke (2024), App. F, Eq. 61-64.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> approx = dsgrad.approx.gaussian_mean_taylor(model)
    >>> expected = approx.expected_grad(objective, params, jnp.arange(10))  # e~ of a batch
    >>> jax.tree.map(jnp.shape, expected)
    {'loc': (3,), 'log_scale': (3,)}
    >>> estimator = dsgrad.joint_saga(objective, approx)  # or dsgrad.cv, dsgrad.joint_svrg
  """

  def grad_k_and_hvp(loc, scale, rows, eps):
    def k(z):
      return jnp.mean(model.num_data * model.log_likelihood(z, rows)) + model.log_prior(z)
    return derivatives.jvp(jax.grad(k), (loc,), (scale * eps,))

  def grad_and_expected(objective: Objective, params, indices, noise):
    _check_latent_dim(model, params, "gaussian_mean_taylor")
    loc, scale = params["loc"], jnp.exp(params["log_scale"])
    rows = objective.rows(indices)
    if objective.shared_noise:
      g, hv = grad_k_and_hvp(loc, scale, rows, noise)
    else:
      g, hv = jax.vmap(lambda row, e: grad_k_and_hvp(loc, scale, data_lib.batch_of_one(row),
                                                     e))(rows, noise)
      g, hv = jnp.mean(g, 0), jnp.mean(hv, 0)
    zeros = jnp.zeros_like(params["log_scale"])
    return ({"loc": -(g + hv), "log_scale": zeros}, {"loc": -g, "log_scale": zeros})

  def expected_grad(objective: Objective, params, indices):
    _check_latent_dim(model, params, "gaussian_mean_taylor")
    rows = objective.rows(indices)

    def k(z):
      return jnp.mean(model.num_data * model.log_likelihood(z, rows)) + model.log_prior(z)
    return {"loc": -jax.grad(k)(params["loc"]),
            "log_scale": jnp.zeros_like(params["log_scale"])}

  return Approximation(grad_and_expected, expected_grad, "gaussian_mean_taylor")


# Second-order approximations: a control variate for the scale parameters too.


def _hessian_diag(fn, z):
  """Diagonal of the Hessian of the scalar ``fn`` at ``z`` (shape ``(d,)``).

  Exact, by ``d`` Hessian-vector products (forward over reverse), 256 at a time.
  """
  d = z.shape[0]
  grad = jax.grad(fn)

  def one(e):
    return jnp.vdot(e, derivatives.jvp(grad, (z,), (e,))[1])

  return jax.lax.map(one, jnp.eye(d, dtype=z.dtype), batch_size=min(d, 256))


def _logit_hessian_diag(linear, logits, rows):
  """``diag Hess_a log p(x_b | a)`` at each row of ``logits`` (``(B, K)``), by ``K``
  Hessian-vector products of the batch's summed log likelihood (rows are independent)."""
  k = logits.shape[1]
  grad = jax.grad(lambda a: jnp.sum(linear.log_likelihood_of_logits(a, rows)))
  directions = jnp.broadcast_to(jnp.eye(k, dtype=logits.dtype)[:, None, :],
                                (k,) + logits.shape)
  columns = jax.vmap(lambda e: derivatives.jvp(grad, (logits,), (e,))[1])(directions)  # (K, B, K)
  return jnp.diagonal(columns, axis1=0, axis2=2)


def _prior_hessian_diag(model: Model, z):
  if model.log_prior_hessian_diag is not None:
    return model.log_prior_hessian_diag(z)
  return _hessian_diag(model.log_prior, z)


def _likelihood_hessian_diag(model: Model, z, rows):
  """``mean_b N diag Hess log p(x_b | z)``: closed form for a linear predictor
  (``N x_b^2`` times the logits' Hessian diagonal), else ``d`` Hessian-vector products."""
  n, linear = model.num_data, model.linear
  if linear is not None:
    x = linear.features(rows)
    logits = x @ z.reshape(x.shape[1], linear.num_outputs)
    curvature = _logit_hessian_diag(linear, logits, rows)
    return (n / x.shape[0]) * (curvature.T @ x ** 2).T.reshape(-1).astype(z.dtype)
  return _hessian_diag(lambda zz: n * jnp.mean(model.log_likelihood(zz, rows)), z)


_FAMILIES = {frozenset({"loc", "log_scale"}): MeanFieldGaussian,
             frozenset({"loc", "unit_lower", "log_diag"}): FullRankGaussian}


def _check_latent_dim(model: Model, params, who: str) -> None:
  """Refuses params of another latent dimension than the model the approximation was
  built for (it computes on the objective's rows with this model's functions)."""
  if jnp.shape(params["loc"]) != (model.latent_dim,):
    raise ValueError(f"{who}({model.name}): params['loc'] has shape "
                     f"{jnp.shape(params['loc'])}, expected ({model.latent_dim},)")


def _gaussian_family(params, who: str):
  """The Gaussian family whose params these are (by their keys), or a ``ValueError``."""
  family = _FAMILIES.get(frozenset(params) if isinstance(params, dict) else None)
  if family is None:
    raise ValueError(f"{who} works on Gaussian params {{'loc', 'log_scale'}} (mean-field) "
                     f"or {{'loc', 'unit_lower', 'log_diag'}} (full-rank), got "
                     f"{jax.tree.structure(params)}")
  return family


def gaussian_taylor(model: Model) -> Approximation:
  """The paper's second-order Taylor approximation on *all* Gaussian parameters.

  ``k_n(z) = N log p(x_n | z) + log p(z)`` is replaced by its quadratic expansion around
  ``z0 = loc`` (held fixed under differentiation), ``f~(w; n, eps) = -k~_n(T_w(eps)) - H(w)``
  with ``T_w(eps) = loc + S eps`` (``S = diag(exp(log_scale))`` or the Cholesky factor
  ``L``). Its gradient at the drawn noise and its expectation are (Eq. 65-67)

      grad f~ = vjp of T_w at eps applied to -(grad k_n(loc) + Hess k_n(loc) S eps) - grad H
      E grad_loc f~ = -grad k_n(loc)
      E grad_{log_scale} f~ = -diag(Hess k_n(loc)) * exp(2 log_scale) - 1   (mean-field)
      E grad_L f~ = -Hess k_n(loc) L                                          (full-rank)

  so, unlike :func:`gaussian_mean_taylor` (App. F, ``loc`` only) and :func:`linearize`
  (first order, which misses the ``eps^2`` part of the scale gradient), the scale
  gradients get a control variate whose expectation is exact: the estimators stay
  unbiased and, for a quadratic ``k_n``, the Monte Carlo noise vanishes entirely.

  Cost per call (one datum or a batch): one gradient and one Hessian-vector product of
  ``k_n`` for the drawn noise, plus the curvature for the expectation:

  * mean-field, model with a linear predictor (``model.linear``: logistic and softmax
    regression): ``K`` Hessian-vector products in logit space -- closed form, ``O(B D K)``;
  * mean-field, any other model: ``d`` Hessian-vector products of the likelihood
    (``O(d)`` times a gradient; fine for ``d`` up to a few hundred);
  * full-rank: the dense ``d x d`` Hessian (``d`` Hessian-vector products), as the
    family itself already holds ``d^2`` parameters.

  The prior's Hessian diagonal comes from ``model.log_prior_hessian_diag`` when the model
  declares it (the regression models do), else from ``d`` Hessian-vector products.

  Args:
    model: the model whose BBVI objective (:func:`dsgrad.meanfield_gaussian` or
      ``FullRankGaussian.objective``, shared or per-datum noise) is being optimized.

  Returns:
    An :class:`Approximation` for mean-field ``{"loc", "log_scale"}`` or full-rank
    ``{"loc", "unit_lower", "log_diag"}`` params (chosen by the params' keys).

  References:
    Wang, Geffner, Domke (2024), App. F, Eq. 61-67.
    Miller et al. (2017). Reducing reparameterization gradient variance. NeurIPS.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> approx = dsgrad.approx.gaussian_taylor(model)
    >>> expected = approx.expected_grad(objective, params, jnp.arange(10))  # e~ of a batch
    >>> jax.tree.map(jnp.shape, expected)
    {'loc': (3,), 'log_scale': (3,)}
    >>> estimator = dsgrad.joint_saga(objective, approx)  # or dsgrad.cv, dsgrad.joint_svrg
  """
  n = model.num_data

  def k_mean(z, rows):
    return n * jnp.mean(model.log_likelihood(z, rows)) + model.log_prior(z)

  def expected_from(family, params, grad_k, curvature):
    def expected_value(p):  # E f~ up to terms constant in p, at z0 = loc
      if "log_scale" in p:  # mean-field: curvature is the Hessian's diagonal
        trace = jnp.sum(curvature * jnp.exp(2.0 * p["log_scale"]))
      else:
        chol = family.cholesky(p)
        trace = jnp.sum(curvature * (chol @ chol.T))
      return -jnp.vdot(grad_k, p["loc"]) - 0.5 * trace - family.entropy_at(p)
    return jax.grad(expected_value)(params)

  def curvature_at(params, z, rows):
    if "log_scale" in params:  # mean-field: the Hessian's diagonal suffices
      return _likelihood_hessian_diag(model, z, rows) + _prior_hessian_diag(model, z)
    return derivatives.hessian(lambda zz: k_mean(zz, rows))(z)

  def grad_and_expected(objective: Objective, params, indices, noise):
    family = _gaussian_family(params, "gaussian_taylor")
    _check_latent_dim(model, params, "gaussian_taylor")
    loc, rows = params["loc"], objective.rows(indices)

    def drawn(batch, eps):
      delta = family.transform(params, eps) - loc
      g, hv = derivatives.jvp(jax.grad(lambda z: k_mean(z, batch)), (loc,), (delta,))
      _, pullback = jax.vjp(lambda p: family.transform(p, eps), params)
      return pullback(-(g + hv))[0], g

    if objective.shared_noise:
      g_tilde, grad_k = drawn(rows, noise)
    else:
      g_tilde, grad_k = jax.tree.map(lambda a: jnp.mean(a, 0), jax.vmap(
          lambda row, e: drawn(data_lib.batch_of_one(row), e))(rows, noise))
    g_tilde = optax.tree.sub(g_tilde, jax.grad(family.entropy_at)(params))
    expected = expected_from(family, params, grad_k, curvature_at(params, loc, rows))
    return g_tilde, expected

  def expected_grad(objective: Objective, params, indices):
    family = _gaussian_family(params, "gaussian_taylor")
    _check_latent_dim(model, params, "gaussian_taylor")
    loc, rows = params["loc"], objective.rows(indices)
    grad_k = jax.grad(lambda z: k_mean(z, rows))(loc)
    return expected_from(family, params, grad_k, curvature_at(params, loc, rows))

  return Approximation(grad_and_expected, expected_grad, "gaussian_taylor")
