"""The fused step of the GLM approximations: the naive gradient of the mean-field
Gaussian objective and an approximation's terms from one read of the batch's rows.

Every GLM approximation (:func:`dsgrad.approx.glm_mean_taylor`,
:func:`dsgrad.approx.glm_taylor`, :func:`dsgrad.approx.logistic_probit`) describes itself
in logit space (:class:`LogitSpec`); :func:`fused_terms` turns that description into
:class:`dsgrad.approx.FusedTerms`, which ``cv``, ``joint_svrg`` and ``joint_saga`` use
when they compute the gradient themselves (:func:`dsgrad.fused_update`).

References:
  Wang, Geffner, Domke (2024), App. F (the mean-field objective and its Taylor terms).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad.approx.base import FusedTerms
from dsgrad.approx.gaussian import _logit_hessian_diag
from dsgrad.models.base import Model


class LogitSpec(NamedTuple):
  """A GLM approximation in logit space, for its fused kernel (:func:`fused_terms`).

  Attributes:
    new_stats: ``(params, logits (B, K), x_rows (B, D), rows) -> stats`` at ``params``
      (``x_rows``: the batch's feature rows; ``rows``: its data rows).
    drawn: ``(params, stats, direction (B, K), rows) -> (t_loc, t_scale)``: the
      logit-space terms whose ``-N x_b`` projections are the per-datum part's ``loc`` and
      (times the scaled noise) ``log_scale`` gradients; ``t_scale`` is ``None`` for an
      approximation without scale terms and may be ``t_loc`` itself.
    expected: ``(stats, rows) -> (B, K)``: the noise expectation of ``t_loc``.
    logits_of: ``stats -> (B, K)`` logits (the curvature's argument).
    second_order: whether the scale's expectation has the curvature term
      ``-N x_b^2 diag ell''(a_b) * exp(2 log_scale)``.
    global_terms: the prior's and entropy's ``(drawn, expected)`` terms.
  """

  new_stats: Callable[..., Any]
  drawn: Callable[..., Any]
  expected: Callable[..., Any]
  logits_of: Callable[[Any], Any]
  second_order: bool
  global_terms: Callable[..., Any]


def _forward(x_rows, vectors, dim: int, k: int):
  """``[x_rows @ v.reshape(D, K) for v in vectors]`` as one product."""
  out = x_rows @ jnp.concatenate([v.reshape(dim, k) for v in vectors], 1)
  return [out[:, i * k:(i + 1) * k] for i in range(len(vectors))]


def _project(x_rows, terms, k: int):
  """``[(sum_b x_b t_b^T).reshape(-1) for t in terms]`` as one product; written
  ``(t^T x)^T``, which XLA:CPU compiles without a slow gather fusion."""
  out = jnp.concatenate(terms, 1).T @ x_rows
  return [out[i * k:(i + 1) * k].T.reshape(-1) for i in range(len(terms))]


def _curvature(glm, spec, stats, rows):
  """``diag ell''(a_b)`` at the statistics' logits, ``(B, K)``: projected on ``x_b^2``, the
  scale's expectation."""
  return _logit_hessian_diag(glm.linear, spec.logits_of(stats), rows)


def _naive_gradient(model: Model, params, projected_data, scaled):
  """The objective's mini-batch gradient from its data part ``-(N/B) sum x_b ell'``."""
  g = projected_data - jax.grad(model.log_prior)(params["loc"] + scaled)
  return {"loc": g, "log_scale": g * scaled - 1.0}


def fused_terms(model: Model, glm, spec: LogitSpec) -> FusedTerms:
  """The fused kernel of a GLM approximation for the mean-field Gaussian objective of the
  same model with one noise draw per batch (:class:`dsgrad.approx.FusedTerms`); ``glm``
  holds the approximation's shared parts (``dsgrad.approx.glm._GlmParts``).

  With ``Z = loc + s * eps`` (``s = exp(log_scale)``), the naive gradient is
  ``G = -(N/B) sum_b x_b ell'(a_b(Z)) - grad log p(Z)`` for ``loc`` and ``G * s * eps - 1``
  for ``log_scale``, and the logits are linear in ``Z``: ``a(Z) = a(loc) + a(s * eps)``.
  So one product of the feature rows with ``[loc, s eps]`` (and a snapshot's) gives every logit,
  and one product of the stacked logit-space terms with the feature rows every gradient.
  """
  x, dim, k, n = glm.x, glm.dim, glm.k, model.num_data

  def applies(objective) -> bool:
    source = objective.source
    return (source is not None and source[0] == "meanfield_gaussian"
            and source[1] is model and objective.shared_noise)

  def scale_part(params, t_scale_projected, scaled):
    if t_scale_projected is None:
      return jnp.zeros_like(params["log_scale"])
    return t_scale_projected * scaled

  def drawn_terms(params, stats, direction, rows):
    t_loc, t_scale = spec.drawn(params, stats, direction, rows)
    terms = [t_loc] if t_scale is None or t_scale is t_loc else [t_loc, t_scale]
    return t_loc, t_scale, terms

  def at_params(objective, params, at, indices, noise, with_expected):
    glm.check(params)
    rows = objective.rows(indices)
    x_rows, b = x(rows), indices.shape[0]
    scaled = jnp.exp(params["log_scale"]) * noise
    same = at is params
    scaled_at = scaled if same else jnp.exp(at["log_scale"]) * noise
    logits = _forward(x_rows, [params["loc"], scaled] + ([] if same else [at["loc"], scaled_at]),
                      dim, k)
    a_mu, direction = logits[0], logits[1]
    a_at, direction_at = (a_mu, direction) if same else (logits[2], logits[3])
    stats = spec.new_stats(at, a_at, x_rows, rows)
    t_loc, t_scale, drawn = drawn_terms(at, stats, direction_at, rows)
    terms = [glm.logit_grad(a_mu + direction, rows)] + drawn
    if with_expected:
      terms.append(spec.expected(stats, rows))
    projected = [-(n / b) * p for p in _project(x_rows, terms, k)]
    data, p_loc = projected[0], projected[1]
    p_scale = None if t_scale is None else (p_loc if t_scale is t_loc else projected[2])
    g_global, e_global = spec.global_terms(objective, at, noise)
    g_tilde = {"loc": p_loc + g_global["loc"],
               "log_scale": scale_part(at, p_scale, scaled_at) + g_global["log_scale"]}
    e_tilde = None
    if with_expected:
      e_scale = jnp.zeros_like(at["log_scale"])
      if spec.second_order:
        uniform = jnp.full((b,), 1.0 / b, x_rows.dtype)
        curvature = glm.weighted_square_outer(rows, _curvature(glm, spec, stats, rows),
                                              uniform).reshape(-1)
        e_scale = -n * curvature * jnp.exp(2.0 * at["log_scale"])
      e_tilde = {"loc": projected[-1] + e_global["loc"],
                 "log_scale": e_scale + e_global["log_scale"]}
      e_tilde = optax.tree.cast_like(e_tilde, params)
    return (optax.tree.cast_like(_naive_gradient(model, params, data, scaled), params),
            optax.tree.cast_like(g_tilde, params), e_tilde)

  def at_statistics(objective, params, old, indices, noise, first, store):
    glm.check(params)
    rows = objective.rows(indices)
    x_rows, b = x(rows), indices.shape[0]
    scaled = jnp.exp(params["log_scale"]) * noise
    a_mu, direction = _forward(x_rows, [params["loc"], scaled], dim, k)
    new = store(spec.new_stats(params, a_mu, x_rows, rows))
    t_loc, t_scale, drawn = drawn_terms(params, old, direction, rows)
    first = first.astype(x_rows.dtype)
    change = first[:, None] * (spec.expected(new, rows) - spec.expected(old, rows))
    terms = [glm.logit_grad(a_mu + direction, rows)] + drawn + [change]
    projected = _project(x_rows, terms, k)
    data, p_loc = -(n / b) * projected[0], -(n / b) * projected[1]
    p_scale = None if t_scale is None else (
        p_loc if t_scale is t_loc else -(n / b) * projected[2])
    d_old = {"loc": p_loc, "log_scale": scale_part(params, p_scale, scaled)}
    change_scale = jnp.zeros_like(params["log_scale"])
    if spec.second_order:
      difference = (_curvature(glm, spec, new, rows)
                    - _curvature(glm, spec, old, rows))
      change_scale = -n * glm.weighted_square_outer(rows, difference, first).reshape(-1)
    change = {"loc": -n * projected[-1], "log_scale": change_scale}
    return (optax.tree.cast_like(_naive_gradient(model, params, data, scaled), params),
            optax.tree.cast_like(d_old, params), new, optax.tree.cast_like(change, params))

  return FusedTerms(applies, at_params, at_statistics)
