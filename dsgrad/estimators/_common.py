"""Helpers shared by the estimators: checks and the optax binding (tables and full
passes are :mod:`dsgrad.tables`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks
from dsgrad.training import host_data
from dsgrad.objective import Objective
from dsgrad.tables import tree_bytes


def has_leaves(params) -> bool:
  return bool(jax.tree.leaves(params))


def require_params(params, estimator: str):
  if params is None:
    raise ValueError(f"dsgrad.{estimator} needs the current params: call "
                     f"update(grads, state, params, indices=..., noise=...)")


def check_update(estimator: str, objective: Objective, updates, params, indices, noise,
                 *, value_checks: bool, table=None,
                 params_like: dict | None = None, first_update=None) -> int:
  """Static checks (always) and, with ``value_checks``, the value checks of one estimator
  update: indices in range; the gradient, ``params`` and ``noise`` finite; and, when
  ``first_update`` (a boolean scalar: whether this is the state's first update) is given,
  that the gradient is the objective's (:func:`first_update_gradient_checks`).
  ``updates=None`` (the fused step: the estimator computes the gradient itself) skips
  the gradient's checks.

  Also checks that ``params`` were passed and, when given, that ``table`` has one row
  per datum and that the state's params-shaped fields (``params_like``: ``{name:
  tree}``) have the params' shapes.
  """
  require_params(params, estimator)
  if table is not None:
    check_table(table, objective.num_data, estimator)
  for field, tree in (params_like or {}).items():
    check_state_matches_params(tree, params, estimator, field)
  if indices is None or noise is None:
    raise ValueError(f"dsgrad.{estimator} needs the batch it is correcting: pass "
                     f"indices=... and noise=... to update (the same ones used to "
                     f"compute the gradient)")
  batch_size = objective.check_batch(indices, noise)
  if updates is not None:
    checks.check_same_structure(updates, params, "updates (gradient)", "params")
  pending = []
  if value_checks:
    pending += checks.index_checks(indices, objective.num_data)
    # Everything that enters the state: a NaN in params or noise would be written into
    # the table or running mean and poison a later, healthy step.
    if updates is not None:
      pending += checks.finite_checks(updates,
                                      f"updates (gradient) passed to dsgrad.{estimator}")
    pending += checks.finite_checks(params, f"params passed to dsgrad.{estimator}")
    pending += checks.finite_checks(noise, f"noise passed to dsgrad.{estimator}")
    if first_update is not None and updates is not None:
      pending += first_update_gradient_checks(estimator, objective, updates, params, indices,
                                              noise, first_update)
  checks.value_checks(pending)
  return batch_size


def naive_if_missing(estimator: str, objective: Objective, updates, params, indices, noise,
                     value_checks: bool):
  """``updates``, or, in the fused step (``updates=None``), the naive mini-batch gradient
  the estimator computes itself in the same program (value-checked as an incoming one
  would be, :func:`check_own_gradient`)."""
  if updates is not None:
    return updates
  return check_own_gradient(estimator, objective.grad(params, indices, noise, validate=False),
                            value_checks)


def check_own_gradient(estimator: str, gradient, value_checks: bool):
  """Value check of a gradient the estimator computed itself (the fused step): finite,
  as :func:`check_update` checks an incoming one. Returns ``gradient``."""
  if value_checks:
    checks.value_checks(checks.finite_checks(
        gradient, f"the mini-batch gradient computed by dsgrad.{estimator}"))
  return gradient


def relative_gap(a, b) -> jax.Array:
  """``||a - b|| / (1 + ||b||)`` over all leaves: a scale-aware distance of two trees."""
  diff = jnp.sqrt(sum(jnp.sum((x - y) ** 2) for x, y in zip(jax.tree.leaves(a),
                                                             jax.tree.leaves(b))))
  scale = jnp.sqrt(sum(jnp.sum(y ** 2) for y in jax.tree.leaves(b)))
  return diff / (1.0 + scale)


CHAIN_ORDER_MESSAGE = (
    "dsgrad.{name}: the incoming updates are not the mini-batch gradient of the objective "
    "at params (relative gap above {tolerance:g}). The estimator corrects a gradient, so "
    "it must come first in an optax.chain, before any transform that rescales or clips "
    "it (optax.adam, optax.scale, optax.clip_by_global_norm, ...): write "
    "optax.chain(dsgrad.{name}(...), optax.adam(...)); and the gradient must be "
    "objective.grad(params, indices, noise) for the indices and noise passed to update. "
    "Checked on the first update only; value_checks=False turns it off.")


def first_update_gradient_checks(name: str, objective: Objective, updates, params, indices,
                                 noise, is_first, tolerance: float = 1e-3):
  """Value checks, on the first update only, that ``updates`` is the naive gradient.

  An estimator placed after a rescaling transform (``optax.chain(optax.adam(..),
  dsgrad.joint_saga(..))``) would add its control variate to the optimizer's step and
  return a wrong update without any sign. One extra mini-batch gradient, on the first
  step alone (a ``lax.cond``), catches that and a gradient taken with other indices,
  noise or loss scaling.
  """
  if not has_leaves(params):
    return []
  gap = jax.lax.cond(
      is_first,
      lambda: relative_gap(updates, objective.grad(params, indices, noise, validate=False)),
      lambda: jnp.zeros((), jnp.result_type(*jax.tree.leaves(updates))))
  return [(gap > tolerance, CHAIN_ORDER_MESSAGE.format(name=name, tolerance=tolerance))]


def require_full_precision(params, estimator: str) -> None:
  """Refuses, by name, floating ``params`` below 32 bits (float16, bfloat16).

  The control variates differentiate the objective through ``jax.jvp`` at the params'
  dtype, which JAX refuses for mixed low-precision inputs (an internal dtype error), and
  a half-precision table or running mean would be built silently. Training in float32
  and storing a compact table in bfloat16 (``joint_saga(table_dtype=jnp.bfloat16)``)
  keeps the memory saving.
  """
  checks.check_floating_params(params, f"dsgrad.{estimator}")
  for leaf in jax.tree.leaves(params):
    dtype = jnp.result_type(leaf)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
      raise ValueError(f"dsgrad.{estimator}: params of dtype {jnp.dtype(dtype).name} are not "
                       "supported; pass float32 params (a compact low-precision table: "
                       "dsgrad.joint_saga(..., table_dtype=jnp.bfloat16))")


def check_params_fit(objective: Objective, params, estimator: str, approx=None) -> None:
  """Static checks, at ``init``: ``params`` of at least 32-bit floats
  (:func:`require_full_precision`), and ``objective`` (and ``approx``, when given) can be
  evaluated at them: params or an approximation made for a model of another dimension
  are refused by name with the shapes involved, not met with an internal
  ``dot_general``/broadcasting error inside the first full pass.

  Costs one abstract trace (``jax.eval_shape``), no computation.
  """
  require_full_precision(params, estimator)
  if not has_leaves(params):  # optax.tree.map_params placeholder
    return
  checks.check_objective_evaluates(objective, params, estimator)
  if approx is None:
    return
  indices = jnp.zeros((1,), jnp.int32)
  noise = objective.zero_noise(1)
  try:
    grads = jax.eval_shape(lambda p: approx.grad_and_expected(objective, p, indices, noise),
                           params)
  except (TypeError, ValueError, IndexError) as error:
    raise ValueError(f"dsgrad.{estimator}: approximation {approx.name!r} cannot be evaluated "
                     f"at these params (shapes {checks.leaf_shapes(params)}): {checks.first_line(error)}. "
                     "Was it built from another model than the objective?") from error
  for which, tree in zip(("gradient", "expected gradient"), grads):
    if checks.leaf_shapes(tree) != checks.leaf_shapes(params):
      raise ValueError(f"dsgrad.{estimator}: approximation {approx.name!r} returns a {which} "
                       f"of shapes {checks.leaf_shapes(tree)} for params of shapes {checks.leaf_shapes(params)}; "
                       "was it built from another model than the objective?")


def check_state_matches_params(tree, params, estimator: str, field: str) -> None:
  """Static check that a params-shaped part of an estimator's state (a snapshot, a running
  mean, a table's rows) has the shapes of ``params``: a state made
  for a model of another dimension is refused by name, not met with an internal
  broadcasting error."""
  if not has_leaves(params) or not has_leaves(tree):
    return
  mine, theirs = checks.leaf_shapes(tree), checks.leaf_shapes(params)
  if mine != theirs:
    raise ValueError(f"dsgrad.{estimator}: the state's {field} has shapes {mine} but params "
                     f"have shapes {theirs}; was this state created for another model or "
                     "parameterization?")


def check_table(table, num_data: int, estimator: str) -> None:
  """Static check that a table has one row per datum of the objective."""
  for leaf in jax.tree.leaves(table):
    if leaf.ndim == 0 or leaf.shape[0] != num_data:
      raise ValueError(f"dsgrad.{estimator}: the state's table has {leaf.shape[:1]} rows but "
                       f"the objective has num_data={num_data}; was this state created "
                       f"for another data set?")


def parameter_table_bytes(params, num_data: int, dtype=None) -> int:
  """Bytes of a table holding one copy of ``params`` per datum (``N x size(params)``)."""
  row = params if dtype is None else jax.tree.map(
      lambda p: jax.ShapeDtypeStruct(jnp.shape(p), dtype), params)
  return int(num_data) * tree_bytes(row)


def check_table_fits(params, num_data: int, dtype, max_bytes, estimator: str) -> None:
  """Refuses, before allocating, a per-datum parameter table larger than ``max_bytes``
  (``"auto"``: 90% of :func:`dsgrad.training.host_data.free_memory_bytes`; ``None``: no check).

  Only concrete parameters are checked: under ``jax.eval_shape`` nothing is allocated,
  and under ``jit`` (e.g. :func:`dsgrad.training.parallel.init_sharded`) the table may be split
  across devices, which one device's memory does not describe.
  """
  if max_bytes is None or not has_leaves(params):
    return
  if any(isinstance(p, jax.core.Tracer) for p in jax.tree.leaves(params)):
    return
  if max_bytes == "auto":
    available = host_data.free_memory_bytes()
    if available is None:
      return
    max_bytes, where = int(0.9 * available), "90% of the free memory of one device"
  else:
    max_bytes, where = int(max_bytes), "max_table_bytes"
  need = parameter_table_bytes(params, num_data, dtype)
  if need > max_bytes:
    size = sum(int(np.prod(jnp.shape(p), dtype=np.int64)) for p in jax.tree.leaves(params))
    raise MemoryError(
        f"dsgrad.{estimator}: the per-datum table would hold {num_data:,} copies of "
        f"{size:,} parameters = {need / 2**30:.2f} GiB, more than {where} "
        f"({max_bytes / 2**30:.2f} GiB). If each datum reads a few latent rows (per group, "
        f"user or item), declare them, dsgrad.objective_from_logdensity(..., reads="
        f"{{'latent leaf': 'index column'}}), and pass dsgrad.approx.sparse_linearize("
        f"objective): a table of those coordinates only; for a GLM, dsgrad.approx.glm_mean_taylor keeps "
        f"its logits. Else: dsgrad.joint_svrg (no table), table_dtype=jnp.bfloat16, "
        f"several devices (dsgrad.training.parallel), or max_table_bytes=None to skip this check.")


def reweighted(objective: Objective, weights) -> Objective:
  """The objective whose per-datum losses on a batch are multiplied by ``weights``."""
  def loss_fn(params, indices, noise):
    return weights * objective.loss_fn(params, indices, noise)
  return dataclasses.replace(objective, loss_fn=loss_fn, name=objective.name + "*weights",
                             source=None)


def masked_sum(tree, mask):
  """``sum_b mask_b * tree[b]`` over the leading axis."""
  return jax.tree.map(
      lambda x: jnp.tensordot(mask.astype(x.dtype), x, axes=(0, 0)), tree)


def bound_transformation(objective: Objective, init_fn, update_fn, name: str = "estimator",
                         *, approx=None, value_checks: bool = False):
  """``optax.GradientTransformationExtraArgs(init_fn, update_fn)`` for an estimator of
  ``objective``, whose functions read ``objective``'s data.

  ``update(..., objective=obj)`` computes with ``obj``'s data instead (``obj`` must be
  ``objective`` or a :meth:`~dsgrad.Objective.with_data` copy of it): the step runs a copy
  of ``update_fn`` whose data handles hold ``obj``'s arrays
  (:meth:`dsgrad.Objective.computing_with`). In a user's own jitted step that takes the
  objective as an argument, the data are then arguments of the compiled program, not
  constants; :func:`dsgrad.fit` hands its objective this way.

  ``update`` also refuses, by name, a state that this estimator's ``init`` does not make
  (another estimator's state, or a chain's states in another order), which would
  otherwise fail deep inside the step on a missing field. With ``value_checks`` and an
  ``approx``, it checks that the update it returns is finite: its inputs are checked
  already, so a NaN there comes from the approximation's terms, and is named so.
  """
  expected_types: dict = {}

  def update(updates, state, params=None, **extra_args):
    if "indices" in extra_args:
      extra_args["indices"] = checks.as_index_array(extra_args["indices"])
    if params is not None and has_leaves(params):
      _check_state_type(state, params, init_fn, expected_types, name)
    handed = explicit_objective(objective, extra_args.pop("objective", None), name)
    step = update_fn if handed is objective else handed.computing_with(update_fn)
    try:
      out, next_state = step(updates, state, params, **extra_args)
    except TypeError as error:
      # The update's own checks passed but its arithmetic did not: a state of this
      # estimator's type built for other shapes (a compact sparse_linearize table handed
      # to the dense estimator, another table dtype) is named instead of a broadcast error.
      mismatch = _state_shape_mismatch(state, params, init_fn, expected_types)
      if mismatch is None:
        raise
      raise ValueError(
          f"dsgrad.{name}: the state passed to update is a {type(state).__name__} of other "
          f"shapes than this estimator's init makes ({mismatch}). It was made by this "
          "estimator built with another approximation (a compact table from "
          "approx.sparse_linearize against a dense one), table dtype or data: pass the "
          "state that this optimizer's init returned") from error
    if value_checks and approx is not None:
      checks.value_checks([(~checks.all_finite(out), checks.RangeOrFiniteMessage(
          f"dsgrad.{name} computed a non-finite update from a finite gradient, params and "
          f"noise: its approximation {approx.name!r} is not finite at these params (its "
          "gradient or its expected gradient; e.g. an expectation that diverges there). "
          "Check the approximation on this batch: approx.grad_and_expected(objective, "
          "params, indices, noise)"))])
    return out, next_state

  return optax.GradientTransformationExtraArgs(init_fn, update)


def explicit_objective(objective: Objective, handed, name: str) -> Objective:
  """The objective whose data a step computes with: ``handed`` (the ``objective=`` extra
  argument of ``update``, e.g. a jit argument of the user's step) when given, else the
  one the estimator was built with.

  Raises:
    TypeError: ``handed`` is not an :class:`dsgrad.Objective`.
    ValueError: ``handed`` is not this estimator's objective on other data (another
      model, family or number of data), which the estimator's state does not describe.
  """
  if handed is None or handed is objective:
    return objective
  if not isinstance(handed, Objective):
    raise TypeError(f"dsgrad.{name}: objective= must be a dsgrad.Objective (the one the "
                    f"estimator was built with, or its with_data copy), got "
                    f"{type(handed).__name__}")
  if handed.model_key() != objective.model_key():
    raise ValueError(
        f"dsgrad.{name}: the objective passed to update ({handed.name!r}) is not the one "
        f"this estimator was built with ({objective.name!r}) on other data: its model, "
        "family or number of data differ. Pass objective.with_data(...) of the estimator's "
        "objective, or build the estimator for this objective")
  return handed


def _state_shape_mismatch(state, params, init, cache: dict) -> str | None:
  """The first array of ``state`` whose shape or dtype differs from what ``init`` makes
  for ``params``, described, or ``None``."""
  if params is None or not has_leaves(params):
    return None
  got = [(path, jnp.shape(x), jnp.result_type(x)) for path, x in
         jax.tree.leaves_with_path(state)]
  want = [(x.shape, x.dtype) for x in jax.tree.leaves(_expected_state(params, init, cache))]
  for (path, shape, dtype), (shape_w, dtype_w) in zip(got, want):
    if (shape, dtype) != (shape_w, dtype_w):
      return (f"{jax.tree_util.keystr(path)}: {shape} {dtype}, expected {shape_w} "
              f"{dtype_w}")
  return None if len(got) == len(want) else f"{len(got)} arrays, expected {len(want)}"


def _expected_state(params, init, cache: dict):
  """``init``'s abstract state for ``params``: one trace per params structure, cached."""
  key = jax.tree.structure(params), tuple((jnp.shape(p), jnp.result_type(p))
                                          for p in jax.tree.leaves(params))
  if key not in cache:
    cache[key] = jax.eval_shape(init, params)
  return cache[key]


def _check_state_type(state, params, init, cache: dict, name: str) -> None:
  expected = _expected_state(params, init, cache)
  if type(state) is type(expected):
    return
  # Containers rebuilt by other code (Flax NNX turns NamedTuples into tuples; `()` for a
  # stateless estimator) pass when their arrays are the ones init makes; another
  # NamedTuple (another estimator's state) never does.
  same_arrays = ([(jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(state)]
                 == [(x.shape, x.dtype) for x in jax.tree.leaves(expected)])
  if same_arrays and not hasattr(state, "_fields"):
    return
  raise ValueError(
      f"dsgrad.{name}: the state passed to update is a {type(state).__name__}, but this "
      f"estimator's init makes a {type(expected).__name__}. Was the state created by another "
      "estimator (or by a chain with its transforms in another order)? Pass the state "
      "that this optimizer's init returned")
