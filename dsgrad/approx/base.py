"""Approximations ``f~(w; n, eps)`` whose noise expectation is known in closed form.

The control-variate estimators (``cv``, ``joint_saga``, ``joint_svrg``) need, for a batch
of data, the mean over the batch of

* ``grad_w f~(w; n, eps_n)``          -- the approximation's gradient at the drawn noise;
* ``E_xi grad_w f~(w; n, xi)``        -- its expectation over the noise, in closed form.

This module holds the protocol, which depends only on the
objective. An :class:`Approximation` bundles two functions computing these:

    grad_and_expected(objective, params, indices, noise) -> (mean grad f~, mean E grad f~)
    expected_grad(objective, params, indices)            -> mean E grad f~

Both return trees shaped like ``params`` (means over the batch). Estimators that need
values at per-datum parameters (the SAGA table) call them on batches of size one under
``jax.vmap``. To bring your own approximation, construct ``Approximation`` with two such
functions; :func:`linearize` is the generic choice.

Compact tables: an approximation may also carry :class:`DatumStatistics`, saying that
its per-datum part depends on the parameters only through a small per-datum statistic
(for a GLM, the ``K`` logits ``x_n^T Z``). ``joint_saga`` then stores that statistic
instead of a copy of the parameters per datum (:func:`dsgrad.approx.glm_mean_taylor` for
GLMs, :func:`dsgrad.approx.sparse_linearize` for models whose likelihood terms read a few
coordinates).

References:
  Wang, Geffner, Domke (2024), Sec. 4, App. E (dropout), App. F (mean-field Gaussian).
  Miller et al. (2017). Reducing reparameterization gradient variance. NeurIPS.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import derivatives
from dsgrad.objective import Objective


class DatumStatistics(NamedTuple):
  """An approximation split into a per-datum part held in a compact table and a
  data-independent part evaluated at the current parameters.

  ``grad f~(w; n, eps) = d_n(s_n, w, eps) + c(w, eps)`` where ``s_n = statistics(w^n, x_n)``
  is what the SAGA table stores for datum ``n`` (taken at the parameters ``w^n`` of its
  last visit) and ``c`` is the data-independent part (prior, entropy). Requirements for
  an unbiased ``joint_saga``: ``E_eps d_n(s, w, eps)`` depends on ``s`` and ``n`` only
  (not on ``w``) and ``E_eps c(w, eps)`` is known.

  Attributes:
    statistics: ``(params, rows) -> tree`` with leaves ``(B, ...)``, from a batch's rows
      (:meth:`dsgrad.Objective.rows`).
    datum_terms: ``(objective, params, stats, rows, noise, weights) -> (d, e)``,
      ``d = sum_b weights_b d_b(stats_b, params, eps_b)`` and
      ``e = sum_b weights_b E d_b(stats_b)``, both shaped like ``params``.
    datum_expected: ``(objective, params, stats, rows, weights) -> e`` as above;
      ``params`` serves only as a template for the output's structure.
    global_terms: ``(objective, params, noise) -> (c, E c)``: the data-independent part,
      averaged over the batch's noise draws.
    expected_of_mean: optional ``(params, mean) -> expectation``, linear in ``mean``.
      When set, ``datum_expected`` returns a statistic that does not depend on ``w``
      (what ``joint_saga`` keeps as its running mean) and the expectation of the
      per-datum part at the current parameters is ``expected_of_mean(params, mean)``.
      :func:`glm_taylor` uses it for the scale: ``E d_n = sigma^2 * curvature_n``, with
      the stored curvature and the current ``sigma``. ``None``: the identity.
    expected_change: optional ``(objective, params, new_stats, old_stats, rows,
      weights) -> datum_expected(new) - datum_expected(old)`` (same weights), which
      ``joint_saga`` adds to its running mean each step. Set it when the difference is
      cheaper than two calls (a GLM projects the difference of two ``(B, K)`` logit
      terms onto the batch's rows once). ``None``: one ``datum_expected`` call on the
      stacked rows.
  """

  statistics: Callable[..., Any]
  datum_terms: Callable[..., tuple[Any, Any]]
  datum_expected: Callable[..., Any]
  global_terms: Callable[..., tuple[Any, Any]]
  expected_of_mean: Callable[[Any, Any], Any] | None = None
  expected_change: Callable[..., Any] | None = None

  def expectation(self, params, mean):
    """The per-datum part's expectation at ``params`` from a ``datum_expected`` mean."""
    return mean if self.expected_of_mean is None else self.expected_of_mean(params, mean)


class FusedTerms(NamedTuple):
  """Lets an estimator compute the naive gradient and the approximation's terms in one
  program from one read of the batch's rows (the fused step: :func:`dsgrad.fused_update`).

  A GLM's naive gradient and its approximations are all products of the batch's rows
  with logit-space terms: computed apart, each reads the rows and multiplies them again;
  together, one product of the rows with the stacked parameter matrices gives every
  logit, and one product of the stacked logit-space terms with the rows gives every
  gradient. The numbers are those of the two-call form (tested to float tolerance).

  Attributes:
    applies: ``objective -> bool``: whether these functions compute this objective's
      naive gradient (they are written for one family and one model; anything else uses
      the two-call form).
    at_params: ``(objective, params, at, indices, noise, with_expected) -> (naive,
      g_tilde, e_tilde)``: the naive gradient at ``params`` and the batch means of
      ``grad f~(at; n, eps_n)`` and, with ``with_expected``, ``E grad f~(at; n)``
      (else ``None``), for ``cv`` (``at = params``) and ``joint_svrg`` (``at`` the snapshot).
    at_statistics: ``(objective, params, old, indices, noise, first, store) -> (naive,
      d_old, new, change)`` for ``joint_saga``'s compact table: the naive gradient; the
      uniform batch mean of the per-datum part at the stored statistics ``old``; the
      statistics at ``params``, passed through ``store`` (the table's rounding); and
      ``datum_expected(new) - datum_expected(old)`` with weights ``first``.
  """

  applies: Callable[[Objective], bool]
  at_params: Callable[..., tuple[Any, Any, Any]]
  at_statistics: Callable[..., tuple[Any, Any, Any, Any]]


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
    fused: optional :class:`FusedTerms`: the naive gradient and these terms from one
      read of the batch, used by the estimators' fused step.
  """

  grad_and_expected: Callable[..., tuple[Any, Any]]
  expected_grad: Callable[..., Any]
  name: str = "custom"
  through_objective: bool = False
  statistics: DatumStatistics | None = None
  fused: FusedTerms | None = None

  def fused_for(self, objective: Objective) -> FusedTerms | None:
    """:attr:`fused` if it computes ``objective``'s gradient, else ``None``."""
    return self.fused if self.fused is not None and self.fused.applies(objective) else None


class MaskMismatch(ValueError):
  """A mask whose structure is not the params': the approximation, not the model, is
  at fault."""


def _resolve_mask(mask, params):
  if mask is None:
    return None
  if callable(mask):
    mask = mask(params)
  try:
    return jax.tree.map(lambda m, p: jnp.asarray(m, bool), mask, params)
  except (TypeError, ValueError):
    def layout(tree):
      return ", ".join(jax.tree_util.keystr(path, simple=True, separator="/")
                       for path, _ in jax.tree.leaves_with_path(tree))
    raise MaskMismatch(
        f"the mask must have the structure of the params, one True or False for each of "
        f"their leaves ({layout(params)}); got leaves ({layout(mask)})") from None


def _apply_mask(mask, tree):
  if mask is None:
    return tree
  return jax.tree.map(lambda m, x: jnp.where(m, x, jnp.zeros_like(x)), mask, tree)


class DiscreteNoise(TypeError):
  """An approximation that expands in the noise, given an objective whose noise has
  integer leaves."""


def _require_continuous_noise(objective: Objective, noise) -> None:
  """Refuses noise with integer leaves: it has no derivative to expand in, and its
  expectation is not the value at zero (NS-DAIS's dynamics mini-batch, for example)."""
  discrete = [jax.tree_util.keystr(path) for path, leaf in
              jax.tree_util.tree_leaves_with_path(noise)
              if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating)]
  if discrete:
    raise DiscreteNoise(f"linearize() expands the gradient in continuous noise, but the noise "
                        f"of {objective.name} has discrete leaves {discrete}; its expectation "
                        "is not the value at zero, so no control variate from linearize() is "
                        "unbiased for it. Use the naive estimator (or an approximation written "
                        "for it).")


def linearize(mask: Any = None) -> Approximation:
  """First-order expansion of the gradient in the noise around its mean (zero).

  ``grad f~(w; n, eps) = grad f(w; n, 0) + d/d(eps) grad f(w; n, eps)|_{eps=0} [eps]``,
  so ``E grad f~ = grad f(w; n, 0)`` for zero-mean noise. Both come from one
  forward-over-reverse pass (``jax.jvp`` of ``jax.grad`` in the noise direction; reverse
  over reverse where the log density calls a ``jax.custom_vjp`` function:
  :mod:`dsgrad.derivatives`); the expectation alone costs one gradient at ``eps = 0``.
  For mean-field Gaussian BBVI with ``mask`` selecting ``loc`` this is exactly the
  paper's mean-only second-order Taylor approximation (App. F, Eq. 63-64); see
  :func:`gaussian_mean_taylor`.

  Args:
    mask: optional tree of booleans with the structure of the params (or a callable
      ``params -> mask``, as in ``optax.masked``). Leaves marked ``False`` get no control
      variate (their ``f~`` gradient and its expectation are zero).

  Returns:
    An :class:`Approximation`. Requires the objective's noise to have mean zero.

  References:
    Wang, Geffner, Domke (2024), Sec. 4 and App. F; DESIGN.md, Sec. 3.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> approx = dsgrad.approx.linearize()  # any model: one JVP of the gradient
    >>> expected = approx.expected_grad(objective, params, jnp.arange(10))  # e~ of a batch
    >>> jax.tree.map(jnp.shape, expected)
    {'loc': (3,), 'log_scale': (3,)}
    >>> estimator = dsgrad.joint_saga(objective, approx)  # or dsgrad.cv, dsgrad.joint_svrg
  """

  def grad_and_expected(objective: Objective, params, indices, noise):
    _require_continuous_noise(objective, noise)

    def grad_at(eps):
      return objective.grad(params, indices, eps, validate=False)

    zero = jax.tree.map(jnp.zeros_like, noise)
    expected, deviation = derivatives.jvp(grad_at, (zero,), (noise,))
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


def with_statistics(statistics, datum_terms, datum_expected, global_terms, name: str,
                     dtype, expected_of_mean=None, expected_change=None,
                     fused: FusedTerms | None = None) -> Approximation:
  """An :class:`Approximation` whose batch means come from its :class:`DatumStatistics`
  (statistics at the current parameters, uniform weights, plus the global part)."""

  def uniform(indices):
    return jnp.full(indices.shape, 1.0 / indices.shape[0], dtype)

  def grad_and_expected(objective, params, indices, noise):
    rows = objective.rows(indices)
    d, e = datum_terms(objective, params, statistics(params, rows), rows, noise,
                       uniform(indices))
    c, ec = global_terms(objective, params, noise)
    return optax.tree.add(d, c), optax.tree.add(e, ec)

  fns = DatumStatistics(statistics, datum_terms, datum_expected, global_terms,
                        expected_of_mean, expected_change)

  def expected_grad(objective, params, indices):
    rows = objective.rows(indices)
    e = fns.expectation(params, datum_expected(objective, params, statistics(params, rows),
                                               rows, uniform(indices)))
    zero = objective.zero_noise(indices.shape[0])
    return optax.tree.add(e, global_terms(objective, params, zero)[1])

  return Approximation(grad_and_expected, expected_grad, name, statistics=fns, fused=fused)


EXPECTATION_DRAWS = 256
"""Noise draws with which :func:`check_expectation` compares a user's approximation's
gradient with its closed-form expectation."""


def check_expectation(approx: Approximation, objective: Objective, params, who: str) -> None:
  """Refuses an approximation written outside dsgrad whose closed-form expectation is not
  the mean of its gradient over the noise: every control variate built on it would be
  biased by the difference, and train to a wrong optimum without any error.

  On the first (up to) 4 data at ``params``: the mean of ``grad_and_expected``'s gradient
  over :data:`EXPECTATION_DRAWS` noise draws is compared with ``expected_grad``, each
  coordinate within 6 standard errors (a false alarm below 1e-9 a coordinate for the
  Gaussian noise of the families) plus float32 rounding; ``grad_and_expected``'s second
  output must equal ``expected_grad``. dsgrad's own approximations are exact by
  construction and tested, and are not checked; neither are traced params (``init``
  under ``jit`` or ``eval_shape``). One compiled program, about 0.3 s. A screen, not a
  proof: a bias smaller than a few standard errors of 256 draws passes.

  Raises:
    ValueError: naming the approximation, the coordinate that differs most and by how
      many standard errors.
  """
  # Those of with_statistics are dsgrad's, around the user's DatumStatistics.
  functions = [approx.grad_and_expected, approx.expected_grad] + [
      f for f in (approx.statistics or ()) if callable(f)]
  if all(getattr(f, "__module__", "").startswith("dsgrad.") for f in functions) or any(
      isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(params)):
    return
  indices = jnp.arange(min(objective.num_data, 4), dtype=jnp.int32)
  flat = lambda tree: jax.flatten_util.ravel_pytree(tree)[0].astype(jnp.float32)  # noqa: E731

  @jax.jit
  def moments(objective, params, keys):
    expected = flat(approx.expected_grad(objective, params, indices))

    def add(carry, key):
      g, e = approx.grad_and_expected(objective, params, indices,
                                      objective.sample_noise(key, indices.shape[0]))
      g = flat(g)
      return (carry[0] + g, carry[1] + g * g,
              jnp.maximum(carry[2], jnp.max(jnp.abs(flat(e) - expected)))), None
    zero = jnp.zeros_like(expected)
    sums = jax.lax.scan(add, (zero, zero, jnp.float32(0)), keys)[0]
    return expected, sums

  keys = jax.random.split(jax.random.key(0), EXPECTATION_DRAWS)
  expected, (total, squares, gap) = jax.device_get(moments(objective, params, keys))
  if not (np.all(np.isfinite(expected)) and np.all(np.isfinite(squares))):
    return  # no moments to compare; the estimator's value check names a non-finite approximation
  m = EXPECTATION_DRAWS
  mean = total / m
  se = np.sqrt(np.maximum(squares / m - mean ** 2, 0.0) * m / (m - 1) / m)
  rounding = 1e-4 * (1.0 + np.max(np.abs(expected)) + np.sqrt(np.max(squares) / m))
  if gap > rounding:
    raise ValueError(f"{who}: approximation {approx.name!r}: the expectation that "
                     f"grad_and_expected returns differs from expected_grad's by up to "
                     f"{gap:.3g} at the same params and data; they must be the same function")
  z = np.abs(mean - expected) / (se + rounding / 6)
  worst = int(np.argmax(z))
  if z[worst] > 6.0:
    raise ValueError(
        f"{who}: approximation {approx.name!r} is not unbiased: over {m} noise draws on the "
        f"first {indices.shape[0]} data, the mean of its gradient at coordinate {worst} of "
        f"the flattened params is {mean[worst]:.4g} +- {se[worst]:.2g}, but expected_grad "
        f"gives {expected[worst]:.4g} ({z[worst]:.0f} standard errors apart). The "
        "expectation must be exact (closed form): every control variate built on it would "
        "be biased by the difference")
