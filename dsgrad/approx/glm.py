"""Approximations for generalized linear models: first- and second-order Taylor
expansions in the logits, and the probit-mixture approximation of the logistic sigmoid,
each with a compact per-datum table (the logits).

References:
  Wang, Geffner, Domke (2024), Sec. 4, App. F.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad import derivatives
from dsgrad.approx.base import Approximation, with_statistics
from dsgrad.approx.glm_fused import LogitSpec as _LogitSpec, fused_terms as _fused_terms
from dsgrad.approx.gaussian import _gaussian_family, _logit_hessian_diag, _prior_hessian_diag
from dsgrad.models.base import Model


class _GlmParts(NamedTuple):
  """What :func:`glm_mean_taylor` and :func:`glm_taylor` share: a GLM's features, the
  table statistic (the logits at ``loc``) and the logit-space gradient terms."""

  linear: Any
  x: Callable[[Any], jax.Array]
  dtype: Any
  dim: int
  k: int
  check: Callable[[Any], None]
  statistics: Callable[..., Any]
  logit_grad: Callable[..., Any]
  logit_terms: Callable[..., Any]
  weighted_outer: Callable[..., Any]
  weighted_square_outer: Callable[..., Any]


def _glm_parts(model: Model, who: str, alternative: str) -> _GlmParts:
  """The shared pieces of the GLM approximations, or a ``ValueError`` naming ``who`` and
  what to use instead when the model has no linear predictor."""
  if model.linear is None:
    raise ValueError(f"{who} needs a model with a linear predictor (model.linear); "
                     f"{model.name!r} has none. Use {alternative} instead.")
  linear = model.linear
  x, k = linear.features, linear.num_outputs
  dim = model.latent_dim // k

  def check(params):
    shape = jnp.shape(params["loc"])
    if shape != (dim * k,):
      raise ValueError(f"{who}({model.name}): params['loc'] has shape {shape}, "
                       f"expected ({dim * k},) = D * K with D={dim}, K={k}")

  def statistics(params, rows):
    check(params)
    return x(rows) @ params["loc"].reshape(dim, k)

  def logit_grad(stats, rows):
    return jax.grad(lambda a: jnp.sum(linear.log_likelihood_of_logits(a, rows)))(stats)

  def logit_terms(objective, params, stats, rows, noise):
    """``(ell'(a_b), ell''(a_b) x_b^T V_b, V, x_b^T V_b)`` with
    ``V = exp(log_scale) * noise``."""
    scaled = jnp.exp(params["log_scale"]) * noise
    if objective.shared_noise:
      direction = x(rows) @ scaled.reshape(dim, k)
    else:
      direction = jnp.einsum("bd,bdk->bk", x(rows), scaled.reshape(-1, dim, k))
    g, hv = jax.jvp(lambda a: logit_grad(a, rows), (stats,), (direction,))
    return g, hv, scaled, direction

  def weighted_outer(rows, terms, weights):
    """``sum_b weights_b x_b terms_b^T`` as a ``(D, K)`` matrix."""
    # Written (v^T x)^T: XLA:CPU compiles x^T v with x gathered into a slow loop fusion.
    return ((terms * weights[:, None].astype(terms.dtype)).T @ x(rows)).T

  def weighted_square_outer(rows, terms, weights):
    """``sum_b weights_b x_b^2 terms_b^T`` (elementwise square) as a ``(D, K)`` matrix."""
    return ((terms * weights[:, None].astype(terms.dtype)).T @ x(rows) ** 2).T

  features_dtype = jax.eval_shape(lambda: x(model.rows(jnp.zeros((1,), jnp.int32)))).dtype
  return _GlmParts(linear, x, features_dtype, dim, k, check, statistics, logit_grad, logit_terms,
                   weighted_outer, weighted_square_outer)


def glm_mean_taylor(model: Model) -> Approximation:
  """App. F's mean-only Taylor approximation for a GLM, with a table of logits.

  For a model whose likelihood depends on ``z`` only through ``a_n = x_n^T Z`` (a
  :class:`dsgrad.models.LinearPredictor`, ``Z = z.reshape(D, K)``), the per-datum part of
  :func:`gaussian_mean_taylor` is

      d_n = -N x_n (ell'(a_n) + ell''(a_n) x_n^T V),   V = (exp(log_scale) * eps).reshape(D, K)
      E d_n = -N x_n ell'(a_n)

  with ``ell(a) = log p(x_n | a)``, ``a_n`` evaluated at the table's stored ``loc`` and
  ``V`` at the *current* ``log_scale``. So ``joint_saga`` stores ``K`` numbers per datum
  (the logits) instead of ``2 D K``: for MNIST-sized softmax regression 10 instead of
  15,700 floats per row. The prior part ``-grad log p(loc) - Hess log p(loc) V`` is taken at
  the current parameters; ``log_scale`` gets no control variate, as in App. F.

  At a table row equal to the current parameters this is exactly
  :func:`gaussian_mean_taylor` (tested), so ``cv`` and ``joint_svrg`` give the same
  estimates with either. In ``joint_saga`` it differs from the paper's estimator in one
  respect: the zero-mean noise term uses the current scale instead of the stored one.
  The estimator stays unbiased (that term has mean zero for any scale, and the
  expectation stored in ``G`` depends on the stored logits only).

  Args:
    model: a model with ``model.linear`` set (``logistic_regression``,
      ``softmax_regression``), used with :func:`dsgrad.meanfield_gaussian`.

  Returns:
    An :class:`Approximation` with :class:`DatumStatistics` for params
    ``{"loc", "log_scale"}``.

  Raises:
    ValueError: if the model declares no linear-predictor structure.

  References:
    Wang, Geffner, Domke (2024), App. F, Eq. 61-64; Sec. 7.3 (Table 3).

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> approx = dsgrad.approx.glm_mean_taylor(model)
    >>> expected = approx.expected_grad(objective, params, jnp.arange(10))  # e~ of a batch
    >>> jax.tree.map(jnp.shape, expected)
    {'loc': (3,), 'log_scale': (3,)}
    >>> estimator = dsgrad.joint_saga(objective, approx)  # or dsgrad.cv, dsgrad.joint_svrg
  """
  glm = _glm_parts(model, "glm_mean_taylor", "gaussian_mean_taylor(model) or linearize()")
  n = model.num_data

  def to_params(params, per_datum_logit_terms, rows, weights):
    loc = -n * glm.weighted_outer(rows, per_datum_logit_terms, weights).reshape(-1)
    return {"loc": loc.astype(params["loc"].dtype),
            "log_scale": jnp.zeros_like(params["log_scale"])}

  def datum_terms(objective, params, stats, rows, noise, weights):
    glm.check(params)
    g, hv, _, _ = glm.logit_terms(objective, params, stats, rows, noise)
    return (to_params(params, g + hv, rows, weights),
            to_params(params, g, rows, weights))

  def datum_expected(objective, params, stats, rows, weights):
    del objective
    return to_params(params, glm.logit_grad(stats, rows), rows, weights)

  def expected_change(objective, params, new, old, rows, weights):
    del objective
    change = glm.logit_grad(new, rows) - glm.logit_grad(old, rows)
    return to_params(params, change, rows, weights)

  def global_terms(objective, params, noise):
    scaled = jnp.exp(params["log_scale"]) * noise
    if not objective.shared_noise:
      scaled = jnp.mean(scaled, 0)  # the Hessian-vector product is linear in the noise
    g, hv = derivatives.jvp(jax.grad(model.log_prior), (params["loc"],), (scaled,))
    zeros = jnp.zeros_like(params["log_scale"])
    return {"loc": -(g + hv), "log_scale": zeros}, {"loc": -g, "log_scale": zeros}

  def drawn(params, stats, direction, rows):
    del params
    g, hv = jax.jvp(lambda a: glm.logit_grad(a, rows), (stats,), (direction,))
    return g + hv, None

  spec = _LogitSpec(lambda params, logits, x_rows, rows: logits, drawn,
                    lambda stats, rows: glm.logit_grad(stats, rows),
                    lambda stats: stats, False, global_terms)
  return with_statistics(glm.statistics, datum_terms, datum_expected, global_terms,
                          "glm_mean_taylor", glm.dtype, expected_change=expected_change,
                          fused=_fused_terms(model, glm, spec))


def glm_taylor(model: Model) -> Approximation:
  """:func:`gaussian_taylor` for a GLM with a compact table of logits (mean-field).

  The second-order version of :func:`glm_mean_taylor`: with ``ell(a) = log p(x_n | a)``,
  ``a_n = x_n^T Z`` at the table's stored ``loc``, ``V = (exp(log_scale) * eps)`` as a
  ``(D, K)`` matrix and ``t_n = ell'(a_n) + ell''(a_n) x_n^T V`` (``K`` numbers),

      d_n,loc       = -N x_n t_n^T                    E = -N x_n ell'(a_n)^T
      d_n,log_scale = -N (x_n t_n^T) * V              E = -N (x_n^2 diag(ell''(a_n))^T) * exp(2 log_scale)

  (all as ``(D, K)`` matrices, flattened row-major). The scale's expectation is the
  stored per-datum curvature ``x_n^2 diag ell''(a_n)`` times the *current* variance:
  ``joint_saga`` keeps the mean curvature over the table (independent of ``w``, see
  :attr:`DatumStatistics.expected_of_mean`) and multiplies by ``exp(2 log_scale)`` each
  step, so the table still holds ``K`` numbers per datum. The estimator stays unbiased:
  given the stored logits, the expectation over the noise of ``d_n`` at the current
  scale is exactly that product. At a table row equal to the current parameters this is
  :func:`gaussian_taylor` restricted to the likelihood (tested).

  The prior and entropy are taken at the current parameters: the prior's ``loc`` and
  ``log_scale`` terms to second order too, with its Hessian diagonal from
  ``model.log_prior_hessian_diag`` (``-1/s^2`` for the regression models' Gaussian
  priors) or ``d`` Hessian-vector products when the model declares none.

  Cost per step beyond :func:`glm_mean_taylor`: the ``K x K`` logit Hessian's diagonal per
  datum (``K`` Hessian-vector products in logit space) and two ``(D, K)`` elementwise
  products; with one noise draw per datum, an ``O(B D K)`` contraction for the scale.

  Args:
    model: a model with ``model.linear`` set (``logistic_regression``,
      ``softmax_regression``), used with :func:`dsgrad.meanfield_gaussian`.

  Returns:
    An :class:`Approximation` with :class:`DatumStatistics` for params
    ``{"loc", "log_scale"}``.

  Raises:
    ValueError: if the model declares no linear-predictor structure.

  References:
    Wang, Geffner, Domke (2024), App. F, Eq. 61-67; Sec. 7.3 (Table 3).

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> approx = dsgrad.approx.glm_taylor(model)
    >>> expected = approx.expected_grad(objective, params, jnp.arange(10))  # e~ of a batch
    >>> jax.tree.map(jnp.shape, expected)
    {'loc': (3,), 'log_scale': (3,)}
    >>> estimator = dsgrad.joint_saga(objective, approx)  # or dsgrad.cv, dsgrad.joint_svrg
  """
  return _glm_second_order(model, "glm_taylor")


class _LocTerms(NamedTuple):
  """Replaces the second-order Taylor term of ``loc`` in :func:`_glm_second_order`.

  Attributes:
    statistics: ``(params, rows, x_rows=None) -> tree`` stored per datum beside the
      logits (``x_rows``: the batch's feature rows when already read).
    drawn: ``(params, logits, extra, direction, rows) -> (B, K)``: the logit-space
      term whose ``-N x_n`` multiple is the control variate's ``loc`` part.
    expected: ``(logits, extra, rows) -> (B, K)``: its expectation over the noise,
      a function of the stored statistics only.
  """

  statistics: Callable[..., Any]
  drawn: Callable[..., Any]
  expected: Callable[..., Any]


def _variance(params):
  return jnp.exp(2.0 * params["log_scale"])


def _second_order_spec(glm: _GlmParts, loc_terms: _LocTerms | None, logits_of,
                       expected_loc, global_terms) -> _LogitSpec:
  """:func:`_glm_second_order`'s approximation in logit space, for its fused kernel."""
  def new_stats(params, logits, x_rows, rows):
    if loc_terms is None:
      return logits
    return {"logit": logits, "extra": loc_terms.statistics(params, rows, x_rows)}

  def drawn(params, stats, direction, rows):
    logits = logits_of(stats)
    g, hv = jax.jvp(lambda a: glm.logit_grad(a, rows), (logits,), (direction,))
    taylor = g + hv
    if loc_terms is None:
      return taylor, taylor
    return loc_terms.drawn(params, logits, stats["extra"], direction, rows), taylor

  return _LogitSpec(new_stats, drawn, expected_loc, logits_of, True, global_terms)


def _glm_second_order(model: Model, who: str, loc_terms: _LocTerms | None = None,
                      alternative: str = "gaussian_taylor(model)") -> Approximation:
  """:func:`glm_taylor`, or with ``loc_terms``, the same scale and prior terms with
  another ``loc`` term (:func:`logistic_probit`)."""
  glm = _glm_parts(model, who, alternative)
  x, dim, k, n = glm.x, glm.dim, glm.k, model.num_data

  def check(params):
    _gaussian_family(params, f"{who}({model.name})")
    if "log_scale" not in params:
      raise ValueError(f"{who}({model.name}) works on mean-field params; for "
                       f"full-rank params use gaussian_taylor(model)")
    glm.check(params)

  def statistics(params, rows):
    check(params)
    return spec.new_stats(params, glm.statistics(params, rows), None, rows)

  def logits_of(stats):
    return stats if loc_terms is None else stats["logit"]

  def curvature(stats, rows, weights):
    """``sum_b weights_b x_b^2 diag ell''(a_b)^T``, flattened; independent of ``w``."""
    h = _logit_hessian_diag(glm.linear, logits_of(stats), rows)
    return glm.weighted_square_outer(rows, h, weights).reshape(-1)

  def datum_terms(objective, params, stats, rows, noise, weights):
    check(params)
    g, hv, scaled, direction = glm.logit_terms(objective, params, logits_of(stats), rows,
                                               noise)
    t = g + hv
    taylor_loc = -n * glm.weighted_outer(rows, t, weights).reshape(-1)
    if objective.shared_noise:
      scale = taylor_loc * scaled
    else:
      scale = -n * jnp.einsum("bd,bk,bdk->dk", x(rows),
                              t * weights[:, None].astype(t.dtype),
                              scaled.reshape(-1, dim, k)).reshape(-1)
    if loc_terms is None:
      loc, loc_mean = taylor_loc, glm.weighted_outer(rows, g, weights)
    else:
      drawn = loc_terms.drawn(params, stats["logit"], stats["extra"], direction, rows)
      loc = -n * glm.weighted_outer(rows, drawn, weights).reshape(-1)
      loc_mean = glm.weighted_outer(
          rows, loc_terms.expected(stats["logit"], stats["extra"], rows), weights)
    expected = {"loc": -n * loc_mean.reshape(-1),
                "log_scale": -n * curvature(stats, rows, weights) * _variance(params)}
    d = {"loc": loc, "log_scale": scale}
    return (optax.tree.cast_like(d, params), optax.tree.cast_like(expected, params))

  def expected_terms(stats, rows):
    """The ``(B, K)`` logit-space terms whose projections are ``E d``'s loc and scale."""
    per_datum = (glm.logit_grad(stats, rows) if loc_terms is None else
                 loc_terms.expected(stats["logit"], stats["extra"], rows))
    return per_datum, _logit_hessian_diag(glm.linear, logits_of(stats), rows)

  def project(params, per_datum, hessian, rows, weights):
    mean = {"loc": -n * glm.weighted_outer(rows, per_datum, weights).reshape(-1),
            "log_scale": -n * glm.weighted_square_outer(rows, hessian, weights).reshape(-1)}
    return optax.tree.cast_like(mean, params)

  def datum_expected(objective, params, stats, rows, weights):
    del objective
    return project(params, *expected_terms(stats, rows), rows, weights)

  def expected_change(objective, params, new, old, rows, weights):
    del objective
    (g_new, h_new), (g_old, h_old) = expected_terms(new, rows), expected_terms(old, rows)
    return project(params, g_new - g_old, h_new - h_old, rows, weights)

  def expected_of_mean(params, mean):
    return {"loc": mean["loc"], "log_scale": mean["log_scale"] * _variance(params)}

  global_terms = _prior_terms(model)
  spec = _second_order_spec(glm, loc_terms, logits_of,
                            lambda stats, rows: expected_terms(stats, rows)[0],
                            global_terms)
  return with_statistics(statistics, datum_terms, datum_expected, global_terms,
                          who, glm.dtype, expected_of_mean, expected_change,
                          fused=_fused_terms(model, glm, spec))


def _prior_terms(model: Model):
  """The prior's and entropy's terms of a mean-field second-order approximation:
  ``global_terms(objective, params, noise) -> (drawn, expected)``."""
  def drawn_at(params, eps):
    scaled = jnp.exp(params["log_scale"]) * eps
    g, hv = derivatives.jvp(jax.grad(model.log_prior), (params["loc"],), (scaled,))
    return {"loc": -(g + hv), "log_scale": -(g + hv) * scaled - 1.0}, g

  def global_terms(objective, params, noise):
    if objective.shared_noise:
      drawn, g = drawn_at(params, noise)
    else:
      drawn, g = jax.tree.map(lambda a: jnp.mean(a, 0),
                              jax.vmap(lambda e: drawn_at(params, e))(noise))
    hess = _prior_hessian_diag(model, params["loc"])
    expected = {"loc": -g, "log_scale": -hess * jnp.exp(2.0 * params["log_scale"]) - 1.0}
    return optax.tree.cast_like(drawn, params), optax.tree.cast_like(expected, params)

  return global_terms


# Normal scale mixture for the logistic sigmoid: sigmoid(a) ~= sum_k w_k Phi(c_k a),
# maximum absolute error 6.83e-07 over the real line (fitted by
# docs/scripts/probit_mixture_fit.py; Monahan and Stefanski, 1992). Symmetric by
# construction (the weights sum to one), so 1 - mixture(a) = mixture(-a).
PROBIT_WEIGHTS = (0.02272679947235489, 0.04636018583277259, 0.4273662837027873,
                  0.29982761515524337, 0.20371911583684196)
PROBIT_SLOPES = (0.2908939547987842, 1.1177027767637808, 0.5733797503044391,
                 0.7996983577121225, 0.4094193686200046)


def sigmoid_probit_mixture(a):
  """``sum_k w_k Phi(c_k a)``: the logistic sigmoid to within 6.83e-07 (absolute)."""
  a = jnp.asarray(a)
  w = jnp.asarray(PROBIT_WEIGHTS, a.dtype)
  c = jnp.asarray(PROBIT_SLOPES, a.dtype)
  return jnp.sum(w * jax.scipy.stats.norm.cdf(a[..., None] * c), axis=-1)


def sigmoid_probit_mixture_gaussian_mean(mean, sd):
  """``E sigmoid_probit_mixture(mean + sd * xi)`` for ``xi ~ N(0, 1)``, in closed form:
  ``sum_k w_k Phi(c_k mean / sqrt(1 + c_k^2 sd^2))``."""
  mean, sd = jnp.asarray(mean), jnp.asarray(sd)
  w = jnp.asarray(PROBIT_WEIGHTS, mean.dtype)
  c = jnp.asarray(PROBIT_SLOPES, mean.dtype)
  shrunk = c * mean[..., None] / jnp.sqrt(1.0 + (c * sd[..., None]) ** 2)
  return jnp.sum(w * jax.scipy.stats.norm.cdf(shrunk), axis=-1)


def logistic_probit(model: Model) -> Approximation:
  """A control variate for binary logistic regression whose ``loc`` part follows the
  likelihood's gradient globally, not only to second order.

  With a mean-field Gaussian ``q``, datum ``n``'s logit is ``a_n = x_n^T (m + s * eps)``,
  Gaussian with mean ``mu_n = x_n^T m`` and sd ``tau_n = |x_n * s|``. The likelihood's
  ``loc`` gradient is ``x_n ell'(a_n)`` with ``ell'(a) = sign_n sigmoid(-sign_n a)``. This
  approximation replaces the sigmoid by a normal scale mixture
  (:func:`sigmoid_probit_mixture`, error below 7e-7), whose expectation under a Gaussian
  argument is closed form. Per datum the table stores ``mu_n`` and ``tau_n`` at the
  parameters of the datum's last visit, and the drawn term is evaluated at

      a~_n = mu_n + tau_n xi_n,    xi_n = x_n^T (s_now * eps) / |x_n * s_now|  ~ N(0, 1)

  (the current noise, standardized with the current scale), so

      d_n,loc = -N x_n sign_n mix(-sign_n a~_n)
      E d_n,loc = -N x_n sign_n (1 - sum_k w_k Phi(c_k sign_n mu_n / sqrt(1 + c_k^2 tau_n^2)))

  depends on the stored ``(mu_n, tau_n)`` only: the estimator is unbiased for any
  ``(mu_n, tau_n)``, and when they are the current parameters' ``a~_n = a_n`` exactly, so
  the ``loc`` control variate matches the true gradient to the mixture's error whatever
  the posterior's width (a second-order Taylor expansion around ``mu_n`` does not:
  App. F and :func:`glm_taylor` leave the third and higher orders, which dominate on
  wide posteriors such as Sonar's). ``log_scale``, the prior and the entropy get
  :func:`glm_taylor`'s second-order terms.

  The table holds three numbers per datum (logit, logit sd, and the logit's curvature is
  recomputed from the logit), for ``cv``, ``joint_saga`` (compact table) and
  ``joint_svrg``. Cost per datum beyond :func:`glm_taylor`: ten normal CDFs and an
  ``O(D)`` norm.

  Args:
    model: binary logistic regression (:func:`dsgrad.models.logistic_regression`, whose
      ``model.linear.logistic_signs`` is set), used with :func:`dsgrad.meanfield_gaussian`.

  Returns:
    An :class:`Approximation` with :class:`DatumStatistics` for params
    ``{"loc", "log_scale"}``.

  Raises:
    ValueError: if the model is not a binary logistic GLM.

  References:
    Wang, Geffner, Domke (2024), Sec. 4 (any ``f~`` with a known noise expectation gives
    an unbiased joint control variate), App. F (the scale's second-order terms).
    Monahan, Stefanski (1992). Normal scale mixture approximations to F*(z) and
    computation of the logistic-normal integral.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> approx = dsgrad.approx.logistic_probit(model)
    >>> expected = approx.expected_grad(objective, params, jnp.arange(10))  # e~ of a batch
    >>> jax.tree.map(jnp.shape, expected)
    {'loc': (3,), 'log_scale': (3,)}
    >>> estimator = dsgrad.joint_saga(objective, approx)  # or dsgrad.cv, dsgrad.joint_svrg
  """
  linear = model.linear
  if linear is None or linear.logistic_signs is None or linear.num_outputs != 1:
    raise ValueError(f"logistic_probit needs a binary logistic regression (a model whose "
                     f"model.linear.logistic_signs is set); {model.name!r} is not one. Use "
                     "glm_taylor(model) for other GLMs")
  x, signs = linear.features, linear.logistic_signs

  def spread(params, rows, x_rows=None):
    """``|x_b * s|``: the sd of datum b's logit under ``q``, ``(B,)`` (``x_rows``: the
    batch's feature rows when already read)."""
    x_rows = x(rows) if x_rows is None else x_rows
    return jnp.sqrt((x_rows ** 2) @ jnp.exp(2.0 * params["log_scale"]))

  def drawn(params, logits, stored_spread, direction, rows):
    now = spread(params, rows)
    xi = jnp.where(now > 0, direction[:, 0] / jnp.where(now > 0, now, 1.0), 0.0)
    a = logits[:, 0] + stored_spread * xi
    sign = signs(rows)
    return (sign * sigmoid_probit_mixture(-sign * a))[:, None]

  def expected(logits, stored_spread, rows):
    sign = signs(rows)
    mean = sigmoid_probit_mixture_gaussian_mean(sign * logits[:, 0], stored_spread)
    return (sign * (1.0 - mean))[:, None]

  return _glm_second_order(model, "logistic_probit", _LocTerms(spread, drawn, expected),
                           alternative="glm_taylor(model)")
