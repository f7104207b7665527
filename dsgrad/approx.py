"""Approximations ``f~(w; n, eps)`` whose noise expectation is known in closed form.

The control-variate estimators (``cv``, ``joint_saga``, ``joint_svrg``) need, for a batch
of data, the mean over the batch of

* ``grad_w f~(w; n, eps_n)``          -- the approximation's gradient at the drawn noise;
* ``E_xi grad_w f~(w; n, xi)``        -- its expectation over the noise, in closed form.

An :class:`Approximation` bundles two functions computing these:

    grad_and_expected(objective, params, indices, noise) -> (mean grad f~, mean E grad f~)
    expected_grad(objective, params, indices)            -> mean E grad f~

Both return trees shaped like ``params`` (means over the batch). Estimators that need
values at per-datum parameters (the SAGA table) call them on batches of size one under
``jax.vmap``. To bring your own approximation, construct ``Approximation`` with two such
functions; :func:`linearize` is the generic choice.

Compact tables: an approximation may also carry :class:`DatumStatistics`, saying that
its per-datum part depends on the parameters only through a small per-datum statistic
(for a GLM, the ``K`` logits ``x_n^T Z``). ``joint_saga`` then stores that statistic
instead of a copy of the parameters per datum (:func:`glm_mean_taylor` for GLMs,
:func:`sparse_linearize` for models whose likelihood terms read a few coordinates).

References:
  Wang, Geffner, Domke (2024), Sec. 4, App. E (dropout), App. F (mean-field Gaussian).
  Miller et al. (2017). Reducing reparameterization gradient variance. NeurIPS.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad.bbvi import meanfield_entropy
from dsgrad.families.gaussian import FullRankGaussian, MeanFieldGaussian
from dsgrad.models.base import Model
from dsgrad.models.dropout_glm import DropoutGLM
from dsgrad.objective import Objective


class DatumStatistics(NamedTuple):
  """An approximation split into a per-datum part held in a compact table and a
  data-independent part evaluated at the current parameters.

  ``grad f~(w; n, eps) = d_n(s_n, w, eps) + c(w, eps)`` where ``s_n = statistics(w^n, n)``
  is what the SAGA table stores for datum ``n`` (taken at the parameters ``w^n`` of its
  last visit) and ``c`` is the data-independent part (prior, entropy). Requirements for
  an unbiased ``joint_saga``: ``E_eps d_n(s, w, eps)`` depends on ``s`` and ``n`` only
  (not on ``w``) and ``E_eps c(w, eps)`` is known.

  Attributes:
    statistics: ``(params, indices) -> tree`` with leaves ``(B, ...)``.
    datum_terms: ``(objective, params, stats, indices, noise, weights) -> (d, e)``,
      ``d = sum_b weights_b d_b(stats_b, params, eps_b)`` and
      ``e = sum_b weights_b E d_b(stats_b)``, both shaped like ``params``.
    datum_expected: ``(objective, params, stats, indices, weights) -> e`` as above;
      ``params`` serves only as a template for the output's structure.
    global_terms: ``(objective, params, noise) -> (c, E c)``: the data-independent part,
      averaged over the batch's noise draws.
    expected_of_mean: optional ``(params, mean) -> expectation``, linear in ``mean``.
      When set, ``datum_expected`` returns a statistic that does not depend on ``w``
      (what ``joint_saga`` keeps as its running mean) and the expectation of the
      per-datum part at the current parameters is ``expected_of_mean(params, mean)``.
      :func:`glm_taylor` uses it for the scale: ``E d_n = sigma^2 * curvature_n``, with
      the stored curvature and the current ``sigma``. ``None``: the identity.
  """

  statistics: Callable[..., Any]
  datum_terms: Callable[..., tuple[Any, Any]]
  datum_expected: Callable[..., Any]
  global_terms: Callable[..., tuple[Any, Any]]
  expected_of_mean: Callable[[Any, Any], Any] | None = None

  def expectation(self, params, mean):
    """The per-datum part's expectation at ``params`` from a ``datum_expected`` mean."""
    return mean if self.expected_of_mean is None else self.expected_of_mean(params, mean)


class Approximation(NamedTuple):
  """An approximation ``f~`` of a doubly-stochastic objective (see module docstring).

  Attributes:
    grad_and_expected: ``(objective, params, indices, noise) -> (g_tilde, e_tilde)``,
      the batch means of ``grad f~(w; n, eps_n)`` and ``E_xi grad f~(w; n, xi)``.
    expected_grad: ``(objective, params, indices) -> e_tilde``.
    name: label for tables and messages.
    through_objective: ``True`` if both functions see the data only through
      ``objective.loss_fn``, so that weighting the per-datum losses weights the batch
      means. Estimators then get weighted sums over a batch from one call on a
      reweighted objective instead of one call per datum. Leave ``False`` if unsure.
    statistics: optional :class:`DatumStatistics`; when present, ``joint_saga`` keeps
      a compact table of per-datum statistics instead of per-datum parameters.
  """

  grad_and_expected: Callable[..., tuple[Any, Any]]
  expected_grad: Callable[..., Any]
  name: str = "custom"
  through_objective: bool = False
  statistics: DatumStatistics | None = None


def _resolve_mask(mask, params):
  if mask is None:
    return None
  if callable(mask):
    mask = mask(params)
  return jax.tree.map(lambda m, p: jnp.asarray(m, bool), mask, params)


def _apply_mask(mask, tree):
  if mask is None:
    return tree
  return jax.tree.map(lambda m, x: jnp.where(m, x, jnp.zeros_like(x)), mask, tree)


def _require_continuous_noise(objective: Objective, noise) -> None:
  """Refuses noise with integer leaves: it has no derivative to expand in, and its
  expectation is not the value at zero (NS-DAIS's dynamics mini-batch, for example)."""
  discrete = [jax.tree_util.keystr(path) for path, leaf in
              jax.tree_util.tree_leaves_with_path(noise)
              if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating)]
  if discrete:
    raise TypeError(f"linearize() expands the gradient in continuous noise, but the noise of "
                    f"{objective.name} has discrete leaves {discrete}; its expectation is not "
                    f"the value at zero, so no control variate from linearize() is unbiased "
                    f"for it. Use the naive estimator (or an approximation written for it).")


def linearize(mask: Any = None) -> Approximation:
  """First-order expansion of the gradient in the noise around its mean (zero).

  ``grad f~(w; n, eps) = grad f(w; n, 0) + d/d(eps) grad f(w; n, eps)|_{eps=0} [eps]``,
  so ``E grad f~ = grad f(w; n, 0)`` for zero-mean noise. Both come from one
  forward-over-reverse pass (``jax.jvp`` of ``jax.grad`` in the noise direction); the
  expectation alone costs one gradient at ``eps = 0``. For mean-field Gaussian BBVI with
  ``mask`` selecting ``loc`` this is exactly the paper's mean-only second-order Taylor
  approximation (App. F, Eq. 63-64); see :func:`gaussian_mean_taylor`.

  Args:
    mask: optional tree of booleans with the structure of the params (or a callable
      ``params -> mask``, as in ``optax.masked``). Leaves marked ``False`` get no control
      variate (their ``f~`` gradient and its expectation are zero).

  Returns:
    An :class:`Approximation`. Requires the objective's noise to have mean zero.

  References:
    Wang, Geffner, Domke (2024), Sec. 4 and App. F; DESIGN.md, Sec. 3.
  """

  def grad_and_expected(objective: Objective, params, indices, noise):
    _require_continuous_noise(objective, noise)

    def grad_at(eps):
      return objective.grad(params, indices, eps, validate=False)

    zero = jax.tree.map(jnp.zeros_like, noise)
    expected, deviation = jax.jvp(grad_at, (zero,), (noise,))
    m = _resolve_mask(mask, params)
    return (_apply_mask(m, optax.tree.add(expected, deviation)), _apply_mask(m, expected))

  def expected_grad(objective: Objective, params, indices):
    zero = objective.zero_noise(indices.shape[0])
    _require_continuous_noise(objective, zero)
    g = objective.grad(params, indices, zero, validate=False)
    return _apply_mask(_resolve_mask(mask, params), g)

  return Approximation(grad_and_expected, expected_grad,
                       "linearize" if mask is None else "linearize(masked)",
                       through_objective=True)


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
  """

  def grad_k_and_hvp(loc, scale, indices, eps):
    def k(z):
      return jnp.mean(model.num_data * model.log_likelihood(z, indices)) + model.log_prior(z)
    return jax.jvp(jax.grad(k), (loc,), (scale * eps,))

  def grad_and_expected(objective: Objective, params, indices, noise):
    loc, scale = params["loc"], jnp.exp(params["log_scale"])
    if objective.shared_noise:
      g, hv = grad_k_and_hvp(loc, scale, indices, noise)
    else:
      g, hv = jax.vmap(lambda i, e: grad_k_and_hvp(loc, scale, i[None], e))(indices, noise)
      g, hv = jnp.mean(g, 0), jnp.mean(hv, 0)
    zeros = jnp.zeros_like(params["log_scale"])
    return ({"loc": -(g + hv), "log_scale": zeros}, {"loc": -g, "log_scale": zeros})

  def expected_grad(objective: Objective, params, indices):
    def k(z):
      return jnp.mean(model.num_data * model.log_likelihood(z, indices)) + model.log_prior(z)
    return {"loc": -jax.grad(k)(params["loc"]),
            "log_scale": jnp.zeros_like(params["log_scale"])}

  return Approximation(grad_and_expected, expected_grad, "gaussian_mean_taylor")


def _with_statistics(statistics, datum_terms, datum_expected, global_terms, name: str,
                     dtype, expected_of_mean=None) -> Approximation:
  """An :class:`Approximation` whose batch means come from its :class:`DatumStatistics`
  (statistics at the current parameters, uniform weights, plus the global part)."""

  def uniform(indices):
    return jnp.full(indices.shape, 1.0 / indices.shape[0], dtype)

  def grad_and_expected(objective, params, indices, noise):
    d, e = datum_terms(objective, params, statistics(params, indices), indices, noise,
                       uniform(indices))
    c, ec = global_terms(objective, params, noise)
    return optax.tree.add(d, c), optax.tree.add(e, ec)

  fns = DatumStatistics(statistics, datum_terms, datum_expected, global_terms,
                        expected_of_mean)

  def expected_grad(objective, params, indices):
    e = fns.expectation(params, datum_expected(objective, params, statistics(params, indices),
                                               indices, uniform(indices)))
    zero = objective.zero_noise(indices.shape[0])
    return optax.tree.add(e, global_terms(objective, params, zero)[1])

  return Approximation(grad_and_expected, expected_grad, name, statistics=fns)


class _GlmParts(NamedTuple):
  """What :func:`glm_mean_taylor` and :func:`glm_taylor` share: a GLM's features, the
  table statistic (the logits at ``loc``) and the logit-space gradient terms."""

  linear: Any
  x: jax.Array
  dim: int
  k: int
  check: Callable[[Any], None]
  statistics: Callable[..., Any]
  logit_grad: Callable[..., Any]
  logit_terms: Callable[..., Any]
  weighted_outer: Callable[..., Any]


def _glm_parts(model: Model, who: str, alternative: str) -> _GlmParts:
  """The shared pieces of the GLM approximations, or a ``ValueError`` naming ``who`` and
  what to use instead when the model has no linear predictor."""
  if model.linear is None:
    raise ValueError(f"{who} needs a model with a linear predictor (model.linear); "
                     f"{model.name!r} has none. Use {alternative} instead.")
  linear = model.linear
  x = linear.features
  dim, k = x.shape[1], linear.num_outputs

  def check(params):
    shape = jnp.shape(params["loc"])
    if shape != (dim * k,):
      raise ValueError(f"{who}({model.name}): params['loc'] has shape {shape}, "
                       f"expected ({dim * k},) = D * K with D={dim}, K={k}")

  def statistics(params, indices):
    check(params)
    return x[indices] @ params["loc"].reshape(dim, k)

  def logit_grad(stats, indices):
    return jax.grad(lambda a: jnp.sum(linear.log_likelihood_of_logits(a, indices)))(stats)

  def logit_terms(objective, params, stats, indices, noise):
    """``(ell'(a_b), ell''(a_b) x_b^T V_b, V, x_b^T V_b)`` with
    ``V = exp(log_scale) * noise``."""
    scaled = jnp.exp(params["log_scale"]) * noise
    if objective.shared_noise:
      direction = x[indices] @ scaled.reshape(dim, k)
    else:
      direction = jnp.einsum("bd,bdk->bk", x[indices], scaled.reshape(-1, dim, k))
    g, hv = jax.jvp(lambda a: logit_grad(a, indices), (stats,), (direction,))
    return g, hv, scaled, direction

  def weighted_outer(indices, terms, weights):
    """``sum_b weights_b x_b terms_b^T`` as a ``(D, K)`` matrix."""
    return x[indices].T @ (terms * weights[:, None].astype(terms.dtype))

  return _GlmParts(linear, x, dim, k, check, statistics, logit_grad, logit_terms,
                   weighted_outer)


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
  """
  glm = _glm_parts(model, "glm_mean_taylor", "gaussian_mean_taylor(model) or linearize()")
  n = model.num_data

  def to_params(params, per_datum_logit_terms, indices, weights):
    loc = -n * glm.weighted_outer(indices, per_datum_logit_terms, weights).reshape(-1)
    return {"loc": loc.astype(params["loc"].dtype),
            "log_scale": jnp.zeros_like(params["log_scale"])}

  def datum_terms(objective, params, stats, indices, noise, weights):
    glm.check(params)
    g, hv, _, _ = glm.logit_terms(objective, params, stats, indices, noise)
    return (to_params(params, g + hv, indices, weights),
            to_params(params, g, indices, weights))

  def datum_expected(objective, params, stats, indices, weights):
    del objective
    return to_params(params, glm.logit_grad(stats, indices), indices, weights)

  def global_terms(objective, params, noise):
    scaled = jnp.exp(params["log_scale"]) * noise
    if not objective.shared_noise:
      scaled = jnp.mean(scaled, 0)  # the Hessian-vector product is linear in the noise
    g, hv = jax.jvp(jax.grad(model.log_prior), (params["loc"],), (scaled,))
    zeros = jnp.zeros_like(params["log_scale"])
    return {"loc": -(g + hv), "log_scale": zeros}, {"loc": -g, "log_scale": zeros}

  return _with_statistics(glm.statistics, datum_terms, datum_expected, global_terms,
                          "glm_mean_taylor", glm.x.dtype)


# --------------------------------------------------------------------------------------
# Second-order approximations: a control variate for the scale parameters too.


def _hessian_diag(fn, z):
  """Diagonal of the Hessian of the scalar ``fn`` at ``z`` (shape ``(d,)``).

  Exact, by ``d`` Hessian-vector products (forward over reverse), 256 at a time.
  """
  d = z.shape[0]
  grad = jax.grad(fn)

  def one(e):
    return jnp.vdot(e, jax.jvp(grad, (z,), (e,))[1])

  return jax.lax.map(one, jnp.eye(d, dtype=z.dtype), batch_size=min(d, 256))


def _logit_hessian_diag(linear, logits, indices):
  """``diag Hess_a log p(x_b | a)`` at each row of ``logits`` (``(B, K)``), by ``K``
  Hessian-vector products of the batch's summed log likelihood (rows are independent)."""
  k = logits.shape[1]
  grad = jax.grad(lambda a: jnp.sum(linear.log_likelihood_of_logits(a, indices)))
  directions = jnp.broadcast_to(jnp.eye(k, dtype=logits.dtype)[:, None, :],
                                (k,) + logits.shape)
  columns = jax.vmap(lambda e: jax.jvp(grad, (logits,), (e,))[1])(directions)  # (K, B, K)
  return jnp.diagonal(columns, axis1=0, axis2=2)


def _prior_hessian_diag(model: Model, z):
  if model.log_prior_hessian_diag is not None:
    return model.log_prior_hessian_diag(z)
  return _hessian_diag(model.log_prior, z)


def _likelihood_hessian_diag(model: Model, z, indices):
  """``mean_b N diag Hess log p(x_b | z)``: closed form for a linear predictor
  (``N x_b^2`` times the logits' Hessian diagonal), else ``d`` Hessian-vector products."""
  n, linear = model.num_data, model.linear
  if linear is not None:
    x = linear.features[indices]
    logits = x @ z.reshape(x.shape[1], linear.num_outputs)
    curvature = _logit_hessian_diag(linear, logits, indices)
    return (n / indices.shape[0]) * ((x ** 2).T @ curvature).reshape(-1).astype(z.dtype)
  return _hessian_diag(lambda zz: n * jnp.mean(model.log_likelihood(zz, indices)), z)


_FAMILIES = {frozenset({"loc", "log_scale"}): MeanFieldGaussian,
             frozenset({"loc", "off_diag", "log_diag"}): FullRankGaussian}


def _gaussian_family(params, who: str):
  """The Gaussian family whose params these are (by their keys), or a ``ValueError``."""
  family = _FAMILIES.get(frozenset(params) if isinstance(params, dict) else None)
  if family is None:
    raise ValueError(f"{who} works on Gaussian params {{'loc', 'log_scale'}} (mean-field) "
                     f"or {{'loc', 'off_diag', 'log_diag'}} (full-rank), got "
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
    ``{"loc", "off_diag", "log_diag"}`` params (chosen by the params' keys).

  References:
    Wang, Geffner, Domke (2024), App. F, Eq. 61-67.
    Miller et al. (2017). Reducing reparameterization gradient variance. NeurIPS.
  """
  n = model.num_data

  def k_mean(z, indices):
    return n * jnp.mean(model.log_likelihood(z, indices)) + model.log_prior(z)

  def expected_from(family, params, grad_k, curvature):
    def expected_value(p):  # E f~ up to terms constant in p, at z0 = loc
      if "log_scale" in p:  # mean-field: curvature is the Hessian's diagonal
        trace = jnp.sum(curvature * jnp.exp(2.0 * p["log_scale"]))
      else:
        chol = family.cholesky(p)
        trace = jnp.sum(curvature * (chol @ chol.T))
      return -jnp.vdot(grad_k, p["loc"]) - 0.5 * trace - family.entropy_at(p)
    return jax.grad(expected_value)(params)

  def curvature_at(params, z, indices):
    if "log_scale" in params:  # mean-field: the Hessian's diagonal suffices
      return _likelihood_hessian_diag(model, z, indices) + _prior_hessian_diag(model, z)
    return jax.hessian(lambda zz: k_mean(zz, indices))(z)

  def grad_and_expected(objective: Objective, params, indices, noise):
    family = _gaussian_family(params, "gaussian_taylor")
    loc = params["loc"]

    def drawn(idx, eps):
      delta = family.transform(params, eps) - loc
      g, hv = jax.jvp(jax.grad(lambda z: k_mean(z, idx)), (loc,), (delta,))
      _, pullback = jax.vjp(lambda p: family.transform(p, eps), params)
      return pullback(-(g + hv))[0], g

    if objective.shared_noise:
      g_tilde, grad_k = drawn(indices, noise)
    else:
      g_tilde, grad_k = jax.tree.map(lambda a: jnp.mean(a, 0), jax.vmap(
          lambda i, e: drawn(i[None], e))(indices, noise))
    g_tilde = optax.tree.sub(g_tilde, jax.grad(family.entropy_at)(params))
    expected = expected_from(family, params, grad_k, curvature_at(params, loc, indices))
    return g_tilde, expected

  def expected_grad(objective: Objective, params, indices):
    del objective
    family = _gaussian_family(params, "gaussian_taylor")
    loc = params["loc"]
    grad_k = jax.grad(lambda z: k_mean(z, indices))(loc)
    return expected_from(family, params, grad_k, curvature_at(params, loc, indices))

  return Approximation(grad_and_expected, expected_grad, "gaussian_taylor")


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
  """
  return _glm_second_order(model, "glm_taylor")


class _LocTerms(NamedTuple):
  """Replaces the second-order Taylor term of ``loc`` in :func:`_glm_second_order`.

  Attributes:
    statistics: ``(params, indices) -> tree`` stored per datum beside the logits.
    drawn: ``(params, logits, extra, direction, indices) -> (B, K)``: the logit-space
      term whose ``-N x_n`` multiple is the control variate's ``loc`` part.
    expected: ``(logits, extra, indices) -> (B, K)``: its expectation over the noise,
      a function of the stored statistics only.
  """

  statistics: Callable[..., Any]
  drawn: Callable[..., Any]
  expected: Callable[..., Any]


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

  def statistics(params, indices):
    check(params)
    logits = glm.statistics(params, indices)
    if loc_terms is None:
      return logits
    return {"logit": logits, "extra": loc_terms.statistics(params, indices)}

  def logits_of(stats):
    return stats if loc_terms is None else stats["logit"]

  def curvature(stats, indices, weights):
    """``sum_b weights_b x_b^2 diag ell''(a_b)^T``, flattened; independent of ``w``."""
    h = _logit_hessian_diag(glm.linear, logits_of(stats), indices)
    return ((x[indices] ** 2).T @ (h * weights[:, None].astype(h.dtype))).reshape(-1)

  def variance(params):
    return jnp.exp(2.0 * params["log_scale"])

  def datum_terms(objective, params, stats, indices, noise, weights):
    check(params)
    g, hv, scaled, direction = glm.logit_terms(objective, params, logits_of(stats), indices,
                                               noise)
    t = g + hv
    taylor_loc = -n * glm.weighted_outer(indices, t, weights).reshape(-1)
    if objective.shared_noise:
      scale = taylor_loc * scaled
    else:
      scale = -n * jnp.einsum("bd,bk,bdk->dk", x[indices],
                              t * weights[:, None].astype(t.dtype),
                              scaled.reshape(-1, dim, k)).reshape(-1)
    if loc_terms is None:
      loc, loc_mean = taylor_loc, glm.weighted_outer(indices, g, weights)
    else:
      drawn = loc_terms.drawn(params, stats["logit"], stats["extra"], direction, indices)
      loc = -n * glm.weighted_outer(indices, drawn, weights).reshape(-1)
      loc_mean = glm.weighted_outer(
          indices, loc_terms.expected(stats["logit"], stats["extra"], indices), weights)
    expected = {"loc": -n * loc_mean.reshape(-1),
                "log_scale": -n * curvature(stats, indices, weights) * variance(params)}
    d = {"loc": loc, "log_scale": scale}
    return (optax.tree.cast_like(d, params), optax.tree.cast_like(expected, params))

  def datum_expected(objective, params, stats, indices, weights):
    del objective
    per_datum = (glm.logit_grad(stats, indices) if loc_terms is None else
                 loc_terms.expected(stats["logit"], stats["extra"], indices))
    mean = {"loc": -n * glm.weighted_outer(indices, per_datum, weights).reshape(-1),
            "log_scale": -n * curvature(stats, indices, weights)}
    return optax.tree.cast_like(mean, params)

  def expected_of_mean(params, mean):
    return {"loc": mean["loc"], "log_scale": mean["log_scale"] * variance(params)}

  def prior_terms(params, eps):
    scaled = jnp.exp(params["log_scale"]) * eps
    g, hv = jax.jvp(jax.grad(model.log_prior), (params["loc"],), (scaled,))
    return {"loc": -(g + hv), "log_scale": -(g + hv) * scaled - 1.0}, g

  def global_terms(objective, params, noise):
    if objective.shared_noise:
      drawn, g = prior_terms(params, noise)
    else:
      drawn, g = jax.tree.map(lambda a: jnp.mean(a, 0),
                              jax.vmap(lambda e: prior_terms(params, e))(noise))
    hess = _prior_hessian_diag(model, params["loc"])
    expected = {"loc": -g, "log_scale": -hess * variance(params) - 1.0}
    return optax.tree.cast_like(drawn, params), optax.tree.cast_like(expected, params)

  return _with_statistics(statistics, datum_terms, datum_expected, global_terms,
                          who, x.dtype, expected_of_mean)


# Normal scale mixture for the logistic sigmoid: sigmoid(a) ~= sum_k w_k Phi(c_k a),
# maximum absolute error 6.83e-07 over the real line (fitted by
# docs/scripts/probit_mixture_fit.py; Monahan and Stefanski, 1992). Symmetric by
# construction (the weights sum to one), so 1 - mixture(a) = mixture(-a).
_PROBIT_WEIGHTS = (0.02272679947235489, 0.04636018583277259, 0.4273662837027873,
                   0.29982761515524337, 0.20371911583684196)
_PROBIT_SLOPES = (0.2908939547987842, 1.1177027767637808, 0.5733797503044391,
                  0.7996983577121225, 0.4094193686200046)


def sigmoid_probit_mixture(a):
  """``sum_k w_k Phi(c_k a)``: the logistic sigmoid to within 6.83e-07 (absolute)."""
  a = jnp.asarray(a)
  w = jnp.asarray(_PROBIT_WEIGHTS, a.dtype)
  c = jnp.asarray(_PROBIT_SLOPES, a.dtype)
  return jnp.sum(w * jax.scipy.stats.norm.cdf(a[..., None] * c), axis=-1)


def sigmoid_probit_mixture_gaussian_mean(mean, sd):
  """``E sigmoid_probit_mixture(mean + sd * xi)`` for ``xi ~ N(0, 1)``, in closed form:
  ``sum_k w_k Phi(c_k mean / sqrt(1 + c_k^2 sd^2))``."""
  mean, sd = jnp.asarray(mean), jnp.asarray(sd)
  w = jnp.asarray(_PROBIT_WEIGHTS, mean.dtype)
  c = jnp.asarray(_PROBIT_SLOPES, mean.dtype)
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
  """
  linear = model.linear
  if linear is None or linear.logistic_signs is None or linear.num_outputs != 1:
    raise ValueError(f"logistic_probit needs a binary logistic regression (a model whose "
                     f"model.linear.logistic_signs is set); {model.name!r} is not one. Use "
                     "glm_taylor(model) for other GLMs")
  x = linear.features
  signs = linear.logistic_signs

  def spread(params, indices):
    """``|x_b * s|``: the sd of datum b's logit under ``q``, ``(B,)``."""
    return jnp.sqrt((x[indices] ** 2) @ jnp.exp(2.0 * params["log_scale"]))

  def drawn(params, logits, stored_spread, direction, indices):
    now = spread(params, indices)
    xi = jnp.where(now > 0, direction[:, 0] / jnp.where(now > 0, now, 1.0), 0.0)
    a = logits[:, 0] + stored_spread * xi
    sign = signs[indices]
    return (sign * sigmoid_probit_mixture(-sign * a))[:, None]

  def expected(logits, stored_spread, indices):
    sign = signs[indices]
    mean = sigmoid_probit_mixture_gaussian_mean(sign * logits[:, 0], stored_spread)
    return (sign * (1.0 - mean))[:, None]

  return _glm_second_order(model, "logistic_probit", _LocTerms(spread, drawn, expected),
                           alternative="glm_taylor(model)")


def sparse_linearize(model: Model) -> Approximation:
  """:func:`linearize` for mean-field Gaussian BBVI with a table of each datum's coordinates.

  For a model that declares which latent coordinates each likelihood term reads
  (``model.sparse``, a :class:`dsgrad.models.SparseLikelihood`), the per-datum loss of
  :func:`dsgrad.meanfield_gaussian` splits into a likelihood term that depends on the
  variational parameters only through ``w_n = (loc[c_n], log_scale[c_n])`` and a
  data-independent term (prior and entropy):

      f(w; n, eps) = l_n(w_n, eps[c_n]) + c(w, eps),
      l_n = -N log p(x_n | loc[c_n] + exp(log_scale[c_n]) * eps[c_n]),
      c   = -log p(loc + exp(log_scale) * eps) - H(w).

  Both terms are linearized in the noise around zero, exactly as :func:`linearize`
  does for the whole loss (linearization is linear in the loss, so at the current
  parameters the two approximations coincide -- tested). ``joint_saga`` then stores
  per datum only ``w_n``: ``2 k`` numbers instead of ``2 d`` (MovieLens 100K: 180
  instead of 170,100), evaluates ``l_n``'s terms at the stored ``w_n`` and ``c``'s at the
  current parameters. With a flat prior this is the dense ``joint_saga(objective,
  linearize())`` estimator update for update (tested); with a prior, the prior's
  control variate is taken at the current parameters rather than the stored ones
  (both are unbiased; the prior is cheap to evaluate at ``w``).

  Cost per step: one gradient and one JVP of ``l_n`` per batch datum on ``k``
  coordinates, a gather and a scatter-add of ``B k`` values, and one gradient and JVP
  of the prior over ``d`` -- no ``d``-sized work per datum.

  Args:
    model: a model with ``model.sparse`` set (``dsgrad.models.movielens``,
      ``dsgrad.models.bradley_terry``, or any model via
      :func:`dsgrad.models.with_coordinates`), used with
      :func:`dsgrad.meanfield_gaussian` (shared or per-datum noise).

  Returns:
    An :class:`Approximation` with :class:`DatumStatistics` for params
    ``{"loc", "log_scale"}``.

  Raises:
    ValueError: if the model declares no sparse likelihood, or (when called) the params
      are not mean-field Gaussian params of the model's dimension.

  References:
    Wang, Geffner, Domke (2024), Sec. 4 (the approximation), Sec. 7.1 (MovieLens, where
    the dense table did not fit in memory).
  """
  sparse = model.sparse
  if sparse is None:
    raise ValueError(f"sparse_linearize needs a model that declares which coordinates "
                     f"each likelihood term reads (model.sparse); {model.name!r} has none. "
                     f"Declare it with dsgrad.models.with_coordinates(model, k, fn), or "
                     f"use linearize().")
  n, d, k = model.num_data, model.latent_dim, sparse.num_coordinates

  def check(params):
    if not isinstance(params, dict) or set(params) != {"loc", "log_scale"}:
      raise ValueError(f"sparse_linearize({model.name}) works on mean-field Gaussian "
                       f"params {{'loc', 'log_scale'}}, got {jax.tree.structure(params)}")
    for key, value in params.items():
      if jnp.shape(value) != (d,):
        raise ValueError(f"sparse_linearize({model.name}): params[{key!r}] has shape "
                         f"{jnp.shape(value)}, expected ({d},)")

  def coordinates(indices):
    coords = sparse.coordinates(indices)
    if coords.shape != indices.shape + (k,):
      raise ValueError(f"{model.name}: sparse.coordinates returned shape {coords.shape}, "
                       f"expected {indices.shape + (k,)}")
    return coords

  def statistics(params, indices):
    check(params)
    coords = coordinates(indices)
    return {"loc": params["loc"][coords], "log_scale": params["log_scale"][coords]}

  def local_noise(objective, noise, coords):
    if objective.shared_noise:
      return noise[coords]
    return jnp.take_along_axis(noise, coords, axis=1)

  def local_loss(row, index, eps):
    z = row["loc"] + jnp.exp(row["log_scale"]) * eps
    return -n * sparse.log_likelihood_local(z[None], index[None])[0]

  def local_terms(row, index, eps):
    def grad_at(e):
      return jax.grad(local_loss)(row, index, e)
    expected, deviation = jax.jvp(grad_at, (jnp.zeros_like(eps),), (eps,))
    return optax.tree.add(expected, deviation), expected

  def scatter(params, rows, coords, weights):
    flat = coords.reshape(-1)
    return {key: jnp.zeros_like(params[key]).at[flat].add(
        (rows[key] * weights[:, None].astype(rows[key].dtype)).reshape(-1)
        .astype(params[key].dtype)) for key in ("loc", "log_scale")}

  def datum_terms(objective, params, stats, indices, noise, weights):
    check(params)
    coords = coordinates(indices)
    eps = local_noise(objective, noise, coords)
    rows = jax.tree.map(lambda v: v.astype(params["loc"].dtype), stats)
    d_rows, e_rows = jax.vmap(local_terms)(rows, indices, eps)
    return scatter(params, d_rows, coords, weights), scatter(params, e_rows, coords, weights)

  def datum_expected(objective, params, stats, indices, weights):
    del objective
    coords = coordinates(indices)
    rows = jax.tree.map(lambda v: v.astype(params["loc"].dtype), stats)
    e_rows = jax.vmap(jax.grad(local_loss))(rows, indices, jnp.zeros_like(rows["loc"]))
    return scatter(params, e_rows, coords, weights)

  def global_loss(params, eps):
    z = params["loc"] + jnp.exp(params["log_scale"]) * eps
    return -model.log_prior(z) - meanfield_entropy(params["log_scale"])

  def global_terms(objective, params, noise):
    check(params)
    if not objective.shared_noise:
      noise = jnp.mean(noise, 0)  # the linearization is linear in the noise
    expected, deviation = jax.jvp(lambda e: jax.grad(global_loss)(params, e),
                                  (jnp.zeros_like(noise),), (noise,))
    return optax.tree.add(expected, deviation), expected

  return _with_statistics(statistics, datum_terms, datum_expected, global_terms,
                          "sparse_linearize", jnp.float32)


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

  References:
    Wang, Geffner, Domke (2024), App. E, Eq. 55-58.
  """

  def per_datum(params, index, delta):
    x, y = glm.features[index], glm.labels[index]
    gt = jax.grad(lambda p: _dropout_terms(glm, p, x, y, delta)[0])(params)
    ge = jax.grad(lambda p: _dropout_terms(glm, p, x, y, delta)[1])(params)
    return gt, ge

  def grad_and_expected(objective: Objective, params, indices, noise):
    del objective
    gt, ge = jax.vmap(per_datum, in_axes=(None, 0, 0))(params, indices, noise)
    return jax.tree.map(lambda a: jnp.mean(a, 0), (gt, ge))

  def expected_grad(objective: Objective, params, indices):
    del objective

    def one(index):
      x, y = glm.features[index], glm.labels[index]
      return jax.grad(lambda p: _dropout_terms(glm, p, x, y, jnp.zeros_like(x))[1])(params)

    return jax.tree.map(lambda a: jnp.mean(a, 0), jax.vmap(one)(indices))

  return Approximation(grad_and_expected, expected_grad, "dropout_taylor")


def dropout_taylor_values(glm: DropoutGLM, params, index, delta):
  """``(f~(w; n, delta), E f~(w; n, .))`` for one datum (App. E, Eq. 57-58).

  Exposed for diagnostics and tests of the closed form.
  """
  return _dropout_terms(glm, params, glm.features[index], glm.labels[index], delta)
