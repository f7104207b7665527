"""Taylor control variates for subsampled log likelihoods and the difference estimator.

For a model with per-datum log likelihoods ``l_k(theta)`` the control variate of datum
``k`` is the Taylor expansion of ``l_k`` around a fixed ``theta*`` (Eq. 4.4),

    q_k(theta) = l_k(theta*) + grad l_k(theta*)^T delta + delta^T H_k(theta*) delta / 2,
    delta = theta - theta*,

whose full-data sum ``sum_k q_k(theta) = S0 + A^T delta + delta^T B delta / 2`` costs O(1)
per evaluation once ``S0 = sum_k l_k(theta*)``, ``A = sum_k grad l_k(theta*)`` and
``B = sum_k H_k(theta*)`` have been computed in one O(n) pass (:func:`taylor_proxy`).
For a subsample, ``q_k`` needs no per-datum Hessian: ``grad l_k^T delta`` and
``delta^T H_k delta`` are the first and second directional derivatives of ``l_k`` along
``delta``, two nested JVPs of the batched log likelihood.

References:
  Dang, Quiroz, Kohn, Tran, Villani (2019). Hamiltonian Monte Carlo with energy
  conserving subsampling. JMLR 20. Sec. 4.1-4.2, Eq. 4.1-4.7.
  Bardenet, Doucet, Holmes (2017). On Markov chain Monte Carlo methods for tall data.
  JMLR 18.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from dsgrad import checks
from dsgrad import derivatives
from dsgrad.checks import is_concrete
from dsgrad.models.base import Model
from dsgrad.tables import full_pass_fold, full_pass_mean
from dsgrad.training import compile_cache


class TaylorProxy(NamedTuple):
  """Full-data sums of the Taylor control variates around ``theta_star`` (Eq. 4.4).

  Attributes:
    theta_star: ``(d,)`` expansion point.
    sum_value: ``sum_k l_k(theta*)``.
    sum_grad: ``(d,)`` ``A = sum_k grad l_k(theta*)``.
    sum_hessian: ``(d, d)`` ``B = sum_k H_k(theta*)`` (computed at either order: the
      mass matrix uses it; a first-order proxy's ``q_k`` ignores it).
    second_order: ``1.0`` for the second-order expansion, ``0.0`` for first order (an
      array so that the proxy is a plain pytree; use :func:`taylor_proxy`'s ``order``).
    hessian_entries: ``(rows, cols, values)`` of ``B``'s nonzero entries where they are
      few (a model whose data read a few coordinates each: ``model.sparse``), by which
      the chain forms ``B delta`` in ``O(nonzeros)`` instead of ``O(d^2)``; ``None``:
      the dense product.
  """

  theta_star: jax.Array
  sum_value: jax.Array
  sum_grad: jax.Array
  sum_hessian: jax.Array
  second_order: jax.Array
  hessian_entries: tuple | None = None


def check_theta(model: Model, theta, name="theta_star"):
  """``theta`` as the model's flat ``(d,)`` float32 latent: a flat array, or a pytree laid
  out as ``model.unravel`` arranges the latent (flattened here)."""
  if not isinstance(theta, (jax.Array, np.ndarray, float, int)) and len(
      jax.tree.leaves(theta)) > 0 and not _is_flat_sequence(theta):
    theta = _ravel_like_latent(model, theta, name)
  theta = jnp.asarray(theta)
  if theta.shape != (model.latent_dim,):
    raise ValueError(f"{name} must have shape ({model.latent_dim},) for model "
                     f"{model.name!r}, got {theta.shape}")
  if not jnp.issubdtype(theta.dtype, jnp.floating):
    raise ValueError(f"{name} must be a floating array, got dtype {theta.dtype}")
  if is_concrete(theta) and not np.all(np.isfinite(np.asarray(theta))):
    raise ValueError(f"{name} must be finite, got {theta}")
  # The chains compute in float32, as the models' data are: a float64 point (numpy's
  # default, kept as such under jax_enable_x64) would mix the two in the chain's state.
  return theta if theta.dtype == jnp.float32 else theta.astype(jnp.float32)


def check_proxy(model: Model, proxy, name: str = "proxy") -> TaylorProxy:
  """Refuses a ``proxy`` that is not a :class:`TaylorProxy` of ``model``'s latent
  dimension (one built for another model): its sums would broadcast against the latent
  in a bare shape error, or not at all. Shapes only, so it runs under ``jit`` too."""
  if not isinstance(proxy, TaylorProxy):
    raise TypeError(f"{name} must be a dsgrad.mcmc.TaylorProxy (dsgrad.mcmc.taylor_proxy), "
                    f"got {type(proxy).__name__}")
  d = model.latent_dim
  shapes = {"theta_star": (d,), "sum_grad": (d,), "sum_hessian": (d, d)}
  wrong = [f"{field} {jnp.shape(getattr(proxy, field))}" for field, shape in shapes.items()
           if jnp.shape(getattr(proxy, field)) != shape]
  if wrong:
    raise ValueError(f"{name} was built for a latent of another size: {', '.join(wrong)}, "
                     f"where model {model.name!r} has d = {d}; build it with "
                     "dsgrad.mcmc.taylor_proxy(model, theta_star) for this model")
  entries = proxy.hessian_entries
  if entries is not None and (len(entries) != 3 or len({jnp.shape(e) for e in entries}) != 1
                              or jnp.ndim(entries[0]) != 1):
    raise ValueError(f"{name}.hessian_entries must be None or (rows, cols, values) of one "
                     "length each, as dsgrad.mcmc.taylor_proxy builds them")
  return proxy


def check_thetas(model: Model, proxy: TaylorProxy, thetas, name: str = "thetas") -> np.ndarray:
  """``thetas`` as a ``(K, d)`` host array of ``K >= 1`` flat latents in the dtype of
  ``proxy.theta_star`` (float64 draws under ``jax_enable_x64`` would meet the float32
  proxy in a bare dtype error), refusing any other shape, a non-floating dtype and values
  that are not finite (they gave a bare shape error, or NaN variances without one)."""
  given = np.asarray(thetas)
  d = model.latent_dim
  if given.ndim != 2 or given.shape[0] < 1 or given.shape[1] != d:
    raise ValueError(f"{name} must be a (K, {d}) array of K >= 1 flat latents of model "
                     f"{model.name!r} (d = {d}), got shape {given.shape}")
  if not np.issubdtype(given.dtype, np.floating):
    raise ValueError(f"{name} must be a floating array, got dtype {given.dtype}")
  bad = np.flatnonzero(~np.isfinite(given).all(1))
  if bad.size:
    raise ValueError(f"{name} holds NaN or inf values, in {bad.size} of its {len(given)} rows "
                     f"(the first: {bad[:5].tolist()})")
  return given.astype(np.dtype(proxy.theta_star.dtype), copy=False)


def _is_flat_sequence(theta) -> bool:
  return isinstance(theta, (list, tuple)) and all(np.ndim(v) == 0 for v in theta)


def _ravel_like_latent(model: Model, theta, name: str):
  """A pytree position flattened, after checking it has the latent's layout."""
  if model.unravel is None:
    raise ValueError(f"{name} must be a flat array of shape ({model.latent_dim},) for model "
                     f"{model.name!r} (its latent is flat), got a {type(theta).__name__}")
  layout = model.unravel(jnp.zeros(model.latent_dim, jnp.float32))
  expected = jax.tree.map(jnp.shape, layout)
  try:
    given = jax.tree.map(jnp.shape, theta)
  except TypeError as error:
    raise ValueError(f"{name} must be a flat ({model.latent_dim},) array or a pytree laid "
                     f"out like the model's latent {expected}: {error}") from None
  if jax.tree.structure(layout) != jax.tree.structure(theta) or given != expected:
    raise ValueError(f"{name} must be a flat ({model.latent_dim},) array or a pytree laid "
                     f"out like the model's latent, {expected}; got {given}")
  return ravel_pytree(jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float32), theta))[0]


@checks.arguments(model=checks.model(), order=checks.count(1), chunk_size=checks.count(1))
def taylor_proxy(model: Model, theta_star, *, order: int = 2,
                 chunk_size: int = 2048) -> TaylorProxy:
  """Computes the control variates' full-data sums around ``theta_star`` in one pass.

  Args:
    model: the model (its ``log_likelihood(theta, indices)`` gives ``l_k``).
    theta_star: ``(d,)`` expansion point (e.g. :func:`dsgrad.mcmc.find_reference_point`).
    order: 2 (the paper's second-order expansion) or 1.
    chunk_size: data per chunk of the pass (memory: one chunk's Hessian work).

  Returns:
    A :class:`TaylorProxy`. Cost: ``n`` log likelihood, gradient and Hessian
    evaluations, chunked; ``B`` is formed with ``d`` Hessian-vector products per chunk,
    or, for a model whose data declare the ``k`` latent coordinates each reads
    (``model.sparse``), from each datum's ``k x k`` Hessian.

  Raises:
    ValueError: on a ``theta_star`` of the wrong shape or dtype, or an order not 1 or 2.
  """
  theta_star = check_theta(model, theta_star)
  if order not in (1, 2):
    raise ValueError(f"order must be 1 or 2, got {order}")
  value, grad, hess = _full_data_sums(model, theta_star, chunk_size)
  return TaylorProxy(theta_star, value, grad, hess,
                     jnp.asarray(np.asarray(1.0 if order == 2 else 0.0, theta_star.dtype)),
                     _nonzero_entries(hess) if model.sparse is not None else None)


SPARSE_DENSITY = 0.05
"""``B``'s products go through its nonzero entries where they are fewer than this share of
its ``d^2``: a gather and a sorted segment sum cost some ten times a dense product's
work per entry."""


def _nonzero_entries(hessian) -> tuple | None:
  """``(rows, cols, values)`` of ``hessian``'s nonzero entries in row-major order, or
  ``None`` where they are many (:data:`SPARSE_DENSITY`). Read from the dense sums: a
  datum's Hessian adds only where its coordinates meet, so the entries no datum touches
  are exact zeros."""
  matrix = np.asarray(hessian)
  rows, cols = np.nonzero(matrix)
  if rows.size > SPARSE_DENSITY * matrix.size:
    return None
  return (jnp.asarray(rows, jnp.int32), jnp.asarray(cols, jnp.int32),
          jnp.asarray(matrix[rows, cols]))


# The model is an argument: its data are the program's inputs, not constants, and one
# compile serves every model of the same shapes.
@compile_cache.jit_by_text(static_argnames="chunk_size")
def _full_data_sums(model: Model, theta, chunk_size: int):
  """``sum_k (l_k, grad l_k, Hess l_k)`` at ``theta`` over all data, in chunks."""
  n = model.num_data

  def total(theta, idx):
    return jnp.sum(model.log_likelihood_at(theta, idx))

  def chunk_mean(idx):
    value, grad = jax.value_and_grad(total)(theta, idx)
    hess = derivatives.hessian(total)(theta, idx)  # kept for the mass matrix even at order 1
    return value / idx.shape[0], grad / idx.shape[0], hess / idx.shape[0]

  if model.sparse is not None:
    value, grad, hess = _sums_from_declared_coordinates(model, theta, chunk_size)
  else:
    value, grad, hess = jax.tree.map(lambda m: n * m,
                                     full_pass_mean(chunk_mean, n, chunk_size))
  return value, grad, 0.5 * (hess + hess.T)


def _sums_from_declared_coordinates(model: Model, theta, chunk_size: int):
  """:func:`_full_data_sums` for a model whose data each read ``k`` declared coordinates
  (``model.sparse``): each datum's gradient and ``k x k`` Hessian in its own coordinates,
  added into ``A`` and ``B`` where they belong. ``O(n k^2)`` work, where the dense form
  makes ``d`` Hessian-vector products over all the data (11 s a pass at d = 5,002 and
  10^5 rows on 2 cores; at d = 20,002 it had not finished one in five minutes)."""
  n, d, sparse = model.num_data, theta.shape[0], model.sparse

  def datum_value(z_local, row):
    return sparse.log_likelihood_local(
        z_local[None], jax.tree.map(lambda leaf: leaf[None], row))[0]

  datum_hessians = jax.vmap(derivatives.hessian(datum_value))

  def add_chunk(sums, indices):
    value, grad, hess = sums
    rows = model.rows(indices)
    coordinates = sparse.coordinates(rows)
    z_local = theta[coordinates]
    # The values' sum is linear in each datum's value: its gradient with respect to the
    # stacked local latents is each datum's own gradient.
    chunk_value, local_grads = jax.value_and_grad(
        lambda z: jnp.sum(sparse.log_likelihood_local(z, rows)))(z_local)
    hess = hess.at[coordinates[:, :, None], coordinates[:, None, :]].add(
        datum_hessians(z_local, rows))
    return value + chunk_value, grad.at[coordinates].add(local_grads), hess

  sums = (jnp.zeros((), theta.dtype), jnp.zeros(d, theta.dtype), jnp.zeros((d, d), theta.dtype))
  return full_pass_fold(add_chunk, sums, n, chunk_size)


def _curvature(proxy: TaylorProxy, delta) -> jax.Array:
  """``B delta``, or zeros for a first-order proxy without the ``O(d^2)`` product (at a
  few thousand latents, most of a leapfrog step's time)."""
  return jax.lax.cond(proxy.second_order > 0, lambda: _hessian_product(proxy, delta),
                      lambda: jnp.zeros_like(delta))


def _hessian_product(proxy: TaylorProxy, delta) -> jax.Array:
  """``B delta``: from the nonzero entries where the proxy keeps them, else dense."""
  if proxy.hessian_entries is None:
    return proxy.sum_hessian @ delta
  rows, cols, values = proxy.hessian_entries
  return jax.ops.segment_sum(values * delta[cols], rows, num_segments=delta.shape[0],
                             indices_are_sorted=True)


@jax.custom_jvp
def _half_quadratic_form(matrix, delta) -> jax.Array:
  """``delta^T B delta / 2`` for a symmetric ``B``, whose derivative in ``delta``,
  ``B delta``, is the product the value computes: differentiated as written it costs a
  second product, with ``B^T``, which XLA on CPU reads column by column (a leapfrog step's
  gradient took 1.65x as long with ``B`` an argument of the program as with it a constant
  laid out for that product, d = 3,003)."""
  return 0.5 * delta @ (matrix @ delta)


@functools.partial(_half_quadratic_form.defjvp, symbolic_zeros=True)
def _half_quadratic_form_jvp(primals, tangents):
  matrix, delta = primals
  matrix_dot, delta_dot = tangents
  product = matrix @ delta
  tangent = jnp.zeros((), product.dtype)
  if not isinstance(delta_dot, jax.custom_derivatives.SymbolicZero):
    tangent = tangent + product @ delta_dot
  if not isinstance(matrix_dot, jax.custom_derivatives.SymbolicZero):
    tangent = tangent + 0.5 * delta @ (matrix_dot @ delta)
  return 0.5 * delta @ product, tangent


def proxy_sum(proxy: TaylorProxy, theta) -> jax.Array:
  """``sum_k q_k(theta)`` from the precomputed sums: ``O(d^2)``, or ``O(d)`` plus ``B``'s
  nonzero entries where the proxy keeps them, ``O(d)`` at first order."""
  delta = theta - proxy.theta_star
  curvature = jax.lax.cond(proxy.second_order > 0, lambda: _half_quadratic(proxy, delta),
                           lambda: jnp.zeros((), delta.dtype))
  return proxy.sum_value + proxy.sum_grad @ delta + proxy.second_order * curvature


def _half_quadratic(proxy: TaylorProxy, delta) -> jax.Array:
  """``delta^T B delta / 2``. From ``B``'s entries, differentiated as written: the
  transposed product is a scatter of the same entries, as cheap as the product."""
  if proxy.hessian_entries is not None:
    return 0.5 * delta @ _hessian_product(proxy, delta)
  return _half_quadratic_form(proxy.sum_hessian, delta)


def proxy_values(model: Model, proxy: TaylorProxy, theta, indices) -> jax.Array:
  """``q_k(theta)`` for the data ``indices``, shape ``(m,)``: nested JVPs, no Hessians."""
  delta = theta - proxy.theta_star

  def first(z):
    return derivatives.jvp(lambda w: model.log_likelihood_at(w, indices), (z,), (delta,))

  (value, slope), (_, curvature) = derivatives.jvp(first, (proxy.theta_star,), (delta,))
  return value + slope + 0.5 * proxy.second_order * curvature


def differences(model: Model, proxy: TaylorProxy, theta, indices) -> jax.Array:
  """``d_k(theta) = l_k(theta) - q_k(theta)`` for the data ``indices`` (Eq. 4.3)."""
  return model.log_likelihood_at(theta, indices) - proxy_values(model, proxy, theta, indices)


class EstimatorVariance(NamedTuple):
  """The estimated variance of a subsampled log-likelihood estimator at one ``theta``.

  Pseudo-marginal chains mix and stay close to the posterior while this is about 1
  (:data:`RECOMMENDED_VARIANCE`); well above it, the perturbed chain's target drifts away
  from the posterior and the chain sticks.

  Attributes:
    with_control_variate: ``sigma2_hat`` of the estimator the chain uses (Eq. 4.3 for the
      difference estimator).
    without_control_variate: the same subsample's ``(n / m)^2 sum_i (l_{u_i} - mean l)^2``:
      the variance of the plain estimator ``(n / m) sum_i l_{u_i}``, what the Taylor
      control variates remove.
  """

  with_control_variate: jax.Array
  without_control_variate: jax.Array


RECOMMENDED_VARIANCE = 1.0
"""The variance of the log-likelihood estimator that minimizes the computing time of a
pseudo-marginal chain: about 1 (Pitt et al., 2012; Dang et al., 2019, Sec. 3, who choose
``m`` to keep it there). ``subsample_size="auto"`` targets it."""

VARIANCE_WARNING = 3.0
"""Above this variance (averaged over the draws) :func:`dsgrad.mcmc.sample` warns: the top of the range
``sigma`` in [1, 1.7] that Doucet, Pitt, Deligiannidis, Kohn (2015) find efficient."""


def estimate_with_variance(model: Model, proxy: TaylorProxy, theta, indices):
  """``(log_likelihood_estimate, EstimatorVariance)`` from one evaluation of the subsample:
  the bias-corrected ``l_hat - sigma2_hat / 2`` of Eq. 4.5 and both variances.

  Args:
    model: the model.
    proxy: the control variates.
    theta: ``(d,)``.
    indices: ``(m,)`` subsample, drawn uniformly with replacement.
  """
  l_hat, sigma2, plain = _difference_terms(model, proxy, theta, indices)
  return l_hat - 0.5 * sigma2, EstimatorVariance(sigma2, jax.lax.stop_gradient(plain))


def _difference_terms(model: Model, proxy: TaylorProxy, theta, indices):
  """``(l_hat, sigma2_hat, plain)``: the difference estimator, its variance, and the
  plain estimator's variance on the same subsample, from one read of it."""
  values = model.log_likelihood_at(theta, indices)
  d = values - proxy_values(model, proxy, theta, indices)
  n, m = model.num_data, indices.shape[0]
  scale = (n / m) ** 2
  l_hat = proxy_sum(proxy, theta) + n * jnp.mean(d)
  sigma2 = scale * jnp.sum((d - jnp.mean(d)) ** 2)
  plain = scale * jnp.sum((values - jnp.mean(values)) ** 2)
  return l_hat, sigma2, plain


def difference_estimator(model: Model, proxy: TaylorProxy, theta, indices):
  """The difference estimator of the log likelihood and its variance (Eq. 4.1-4.3).

  With ``m`` indices drawn uniformly with replacement,

      l_hat = sum_k q_k(theta) + (n / m) sum_i d_{u_i}(theta),
      sigma2_hat = (n^2 / m^2) sum_i (d_{u_i} - mean d)^2.

  ``l_hat`` is unbiased for ``sum_k l_k(theta)``. Differentiable in ``theta`` (its
  gradient is Eq. 4.7).

  Returns:
    ``(l_hat, sigma2_hat)`` scalars.
  """
  return _difference_terms(model, proxy, theta, indices)[:2]


def log_likelihood_estimate(model: Model, proxy: TaylorProxy, theta, indices) -> jax.Array:
  """``log`` of the bias-corrected likelihood estimator ``l_hat - sigma2_hat / 2``
  (Eq. 4.5), the log likelihood perturbed HMC-ECS uses."""
  return estimate_with_variance(model, proxy, theta, indices)[0]


def gradient_estimate(model: Model, proxy: TaylorProxy, theta, indices) -> jax.Array:
  """Unbiased estimate of ``grad sum_k l_k(theta)`` (Eq. 4.7): the gradient of
  ``l_hat``, used by SGLD and SG-HMC.

  Written out rather than differentiated through :func:`proxy_values`:
  ``grad q_k(theta) = grad l_k(theta*) + H_k(theta*) (theta - theta*)``, so the estimate
  is ``A + B delta + (n / m) sum_i [grad l_{u_i}(theta) - grad l_{u_i}(theta*) -
  H_{u_i}(theta*) delta]``: one gradient at ``theta`` and one forward-over-reverse
  Hessian-vector product at ``theta*`` on the subsample.
  """
  n, m = model.num_data, indices.shape[0]
  delta = theta - proxy.theta_star

  def subsample_grad(t):
    return jax.grad(lambda w: jnp.sum(model.log_likelihood_at(w, indices)))(t)

  grad_now = subsample_grad(theta)
  grad_star, hess_delta = derivatives.jvp(subsample_grad, (proxy.theta_star,), (delta,))
  order = proxy.second_order
  return (proxy.sum_grad + order * _curvature(proxy, delta)
          + (n / m) * (grad_now - grad_star - order * hess_delta))
