"""The checks of a loop of your own: :func:`checked` wraps an optimizer with them.

The estimators' ``update`` functions hold their equations and their state update and
nothing else, as optax's transforms do. What a loop can get wrong where it feeds them is
checked at this boundary instead: a batch of the wrong dtype, shape or range; a NaN in the
gradient, params or noise, which a table or running mean would keep; a state made by
another optimizer, model or data set; a transform chained before the estimator, or a
gradient that is not the objective's. :func:`dsgrad.fit` checks what enters it itself
(it draws the batches and computes the gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dsgrad import checks
from dsgrad.estimators.chain import DESCENT_PROBE, _members, check_chain_order, holds_estimator
from dsgrad.objective import Objective

WHO = "dsgrad.checked"

_NOT_THE_GRADIENT = (
    "dsgrad.checked: the incoming updates are not the mini-batch gradient of the objective "
    "at params (relative gap above {tolerance:g}). The estimator corrects a gradient, so it "
    "must come first in an optax.chain, before any transform that rescales or clips it "
    "(optax.adam, optax.scale, optax.clip_by_global_norm, ...): write "
    "optax.chain(dsgrad.joint_saga(...), optax.adam(...)); and the gradient must be "
    "objective.grad(params, indices, noise) for the indices and noise passed to update.")

_SMISO_CHAINED = (
    "dsgrad.checked: dsgrad.smiso is an optimizer in its own right (App. A): its output is "
    "already the parameter step, so it must be used alone -- not chained after or before "
    "another optimizer or scaling transform (optax.adam, optax.sgd, optax.scale, ...). The "
    "params differ from SMISO's iterate: a transform after it changed its step (or the "
    "params were modified outside the optimizer).")


@checks.arguments(tolerance=checks.positive())
def checked(optimizer, objective: Objective | None = None, *, tolerance: float = 1e-3
            ) -> optax.GradientTransformationExtraArgs:
  """``optimizer`` with the checks of a hand-written loop around it.

  ``init`` and ``update`` are ``optimizer``'s, after these checks:

  * the chain-order rule :func:`dsgrad.fit` applies (nothing before an estimator in an
    ``optax.chain``; from the state's structure, at trace time);
  * the state passed to ``update`` is one that ``optimizer.init`` makes for these params
    (another estimator's, model's or data set's is named, with the first array that
    differs);
  * with an ``objective`` (here, or handed to ``update`` as ``objective=``): the batch's
    ``indices`` and ``noise`` are given, with the dtypes and shapes the objective draws;
    the gradient has the params' structure; the indices lie in ``[0, N)``; the gradient,
    params and noise are finite (a NaN would enter a table or running mean and poison
    later steps); the gradient is the objective's mini-batch gradient at ``params`` (a
    transform chained before the estimator, or other indices or noise, changed it: one
    extra gradient per step); SMISO's params are its own iterate; and the update
    returned is finite.

  Value checks raise at once outside ``jit``; inside, through a host callback on the
  failing path only, or deferred in :func:`dsgrad.checks.deferred`.

  Args:
    optimizer: an optax transformation, e.g. ``optax.chain(dsgrad.cv(objective),
      optax.adam(1e-2))``.
    objective: the objective whose gradient the loop passes (optional: without it, and
      without ``objective=`` at ``update``, only the structural checks run).
    tolerance: the relative gap between the incoming gradient and the objective's above
      which they differ.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with ``optimizer``'s state.

  Raises:
    ValueError/TypeError: from ``init`` or ``update``, naming what is wrong.

  Example::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 50, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = dsgrad.meanfield_init(objective.source[1])
    >>> wrong = optax.chain(optax.clip_by_global_norm(1.0), dsgrad.cv(objective))
    >>> try:
    ...   dsgrad.checked(wrong).init(params)
    ... except ValueError as error:
    ...   print(str(error)[:58])
    dsgrad.checked: the optimizer chains a transformation (pos
    >>> right = dsgrad.checked(optax.chain(dsgrad.cv(objective), optax.adam(1e-2)), objective)
    >>> state = right.init(params)
    >>> indices = jax.numpy.arange(5)
    >>> noise = objective.sample_noise(jax.random.key(1), 5)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = right.update(grads, state, params, indices=indices, noise=noise)
  """
  optimizer = optax.with_extra_args_support(optimizer)

  def init(params):
    state = optimizer.init(params)
    check_chain_order(state, WHO)
    return state

  def update(updates, state, params=None, **extra_args):
    if extra_args.get("indices") is DESCENT_PROBE:  # fit's probe of the rule chained after
      return optimizer.update(updates, state, params, **extra_args)
    check_chain_order(state, WHO)
    corrects = holds_estimator(state)
    if corrects and params is None:
      raise ValueError(f"{WHO}: a dsgrad estimator needs the current params: call "
                       "update(grads, state, params, indices=..., noise=...)")
    if params is not None and jax.tree.leaves(params):
      check_state(optimizer, state, params)
    target = _objective(objective, extra_args.get("objective"))
    pending = []
    if target is not None and corrects:
      if extra_args.get("indices") is None or extra_args.get("noise") is None:
        raise ValueError(f"{WHO}: the estimator needs the batch it is correcting: pass "
                         "indices=... and noise=... to update (the same ones used to "
                         "compute the gradient)")
      pending = _batch_checks(target, updates, state, params, extra_args["indices"],
                              extra_args["noise"], tolerance)
    elif updates is not None:
      if params is not None and jax.tree.leaves(params):
        checks.check_same_structure(updates, params, "updates (gradient)", "params")
      pending = checks.finite_checks(updates, f"updates (gradient) passed to {WHO}")
    checks.value_checks(pending)
    out, state = optimizer.update(updates, state, params, **extra_args)
    if pending:
      # Named only where the inputs were finite: then a NaN comes from the estimator's
      # terms (under jit the input checks' callbacks need not run first).
      inputs_bad = jnp.any(jnp.stack([jnp.any(bad) for bad, _ in pending]))
      checks.value_checks([(~checks.all_finite(out) & ~inputs_bad, checks.RangeOrFiniteMessage(
          f"{WHO}: the optimizer computed a non-finite update from a finite gradient, "
          "params and noise: an estimator's approximation is not finite at these params "
          "(its gradient or its expected gradient; e.g. an expectation that diverges "
          "there). Check it on this batch: approx.grad_and_expected(objective, params, "
          "indices, noise)"))])
    return out, state

  return optax.GradientTransformationExtraArgs(init, update)


def _objective(objective, handed):
  """The objective the step computes with: ``handed`` (``update``'s ``objective=``) or the
  one given to :func:`checked`; the two must be one model (``with_data`` copies)."""
  if handed is None:
    return objective
  if not isinstance(handed, Objective):
    raise TypeError(f"{WHO}: objective= must be a dsgrad.Objective (the one the estimator "
                    f"was built with, or its with_data copy), got {type(handed).__name__}")
  if objective is not None and jax.tree.structure(handed) != jax.tree.structure(objective):
    raise ValueError(
        f"{WHO}: the objective passed to update ({handed.name!r}) is not the estimator's "
        f"({objective.name!r}) on other data: its model, family or number of data differ. "
        "Pass objective.with_data(...) of the estimator's objective, or build the "
        "estimator for this objective")
  return handed


def _batch_checks(objective: Objective, updates, state, params, indices, noise,
                  tolerance: float) -> list:
  """Static checks of a batch (raised now) and its value checks (returned)."""
  objective.check_batch(indices, noise)
  pending = checks.index_checks(indices, objective.num_data)
  pending += checks.finite_checks(params, f"params passed to {WHO}")
  pending += checks.finite_checks(noise, f"noise passed to {WHO}")
  if updates is not None:
    checks.check_same_structure(updates, params, "updates (gradient)", "params")
    pending += checks.finite_checks(updates, f"updates (gradient) passed to {WHO}")
    if jax.tree.leaves(params):
      own = objective.grad(params, indices, noise, validate=False)
      pending.append((_relative_gap(updates, own) > tolerance,
                      _NOT_THE_GRADIENT.format(tolerance=tolerance)))
  for smiso in _smiso_states(state):
    pending.append((_relative_gap(params, smiso.running_mean) > tolerance, _SMISO_CHAINED))
  return pending


def _relative_gap(a, b) -> jax.Array:
  """``||a - b|| / (1 + ||b||)`` over all leaves: a scale-aware distance of two trees."""
  diff = jnp.sqrt(sum(jnp.sum((x - y) ** 2) for x, y in zip(jax.tree.leaves(a),
                                                             jax.tree.leaves(b))))
  scale = jnp.sqrt(sum(jnp.sum(y ** 2) for y in jax.tree.leaves(b)))
  return diff / (1.0 + scale)


def _smiso_states(state) -> list:
  from dsgrad.estimators.smiso import SmisoState  # smiso imports nothing from here
  return [s for s in jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, SmisoState))
          if isinstance(s, SmisoState)]


def check_state(optimizer, state, params, who: str = WHO) -> None:
  """Refuses a state that ``optimizer.init(params)`` does not make (one abstract trace, no
  computation): another estimator's, or one for other shapes, naming the first
  difference. :func:`checked` and :func:`dsgrad.fit` (for an ``opt_state`` passed in)
  call it."""
  expected = jax.eval_shape(optimizer.init, params)
  mismatch = None
  named, named_expected = _named_types(state), _named_types(expected)
  if named and named != named_expected:
    mismatch = (f"it holds {', '.join(named)}, where init makes "
                f"{', '.join(named_expected) or 'no named state'}")
  got = [(path, jnp.shape(x), jnp.result_type(x))
         for path, x in jax.tree.leaves_with_path(state)]
  want = [(x.shape, x.dtype) for x in jax.tree.leaves(expected)]
  for (path, shape, dtype), (shape_w, dtype_w) in zip(got, want):
    if mismatch is None and (shape, dtype) != (shape_w, dtype_w):
      mismatch = (f"{jax.tree_util.keystr(path)}: {shape} {dtype}, expected {shape_w} "
                  f"{dtype_w}")
  if mismatch is None and len(got) != len(want):
    mismatch = f"{len(got)} arrays, expected {len(want)}"
  if mismatch is not None:
    raise ValueError(
        f"{who}: the state passed to update is not one this optimizer's init makes for "
        f"these params ({mismatch}). Was it created by another estimator or approximation "
        "(a compact approx.sparse_linearize table against a dense one), a chain in another "
        "order, another model or parameterization, or another data set? "
        "Pass the state that this optimizer's init returned")


def _named_types(state) -> list:
  """The NamedTuple state types in ``state``, outermost first (containers rebuilt as plain
  tuples, as Flax NNX does, hold none and pass)."""
  named = [type(state).__name__] if hasattr(state, "_fields") else []
  return named + [name for member in _members(state) for name in _named_types(member)]
