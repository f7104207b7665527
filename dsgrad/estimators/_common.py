"""Helpers shared by the estimators: checks and the optax binding (tables and full
passes are :mod:`dsgrad.tables`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks
from dsgrad.approx.base import DiscreteNoise, MaskMismatch, check_expectation
from dsgrad.estimators import chain
from dsgrad.training import compile_cache, host_data
from dsgrad.objective import Objective
from dsgrad.tables import tree_bytes


def has_leaves(params) -> bool:
  return bool(jax.tree.leaves(params))


def naive_gradient(objective: Objective, updates, params, indices, noise):
  """The naive mini-batch gradient: ``updates``, or, in the fused step (``updates=None``,
  :func:`dsgrad.fused_update`), computed here in the same program as the estimator."""
  if updates is not None:
    return updates
  return objective.grad(params, indices, noise, validate=False)


def gradient_and_terms(objective: Objective, approx, updates, params, at, indices, noise,
                       with_expected: bool):
  """``(g, mean grad f~(at), mean E grad f~(at) or None)`` for a batch: the naive gradient
  at ``params`` and the approximation's terms at ``at`` (``params`` for ``cv``, the
  snapshot for ``joint_svrg``). In the fused step, an approximation with a fused kernel
  (:class:`dsgrad.approx.FusedTerms`) gives all three from one read of the batch's rows;
  the numbers are those of the two calls."""
  fused = approx.fused_for(objective) if updates is None else None
  if fused is not None:
    return fused.at_params(objective, params, at, indices, noise, with_expected)
  g = naive_gradient(objective, updates, params, indices, noise)
  g_tilde, e_tilde = approx.grad_and_expected(objective, at, indices, noise)
  return g, g_tilde, e_tilde if with_expected else None


def require_full_precision(params, estimator: str) -> None:
  """Refuses, by name, floating ``params`` below 32 bits (float16, bfloat16).

  The control variates differentiate the objective through ``jax.jvp`` at the params'
  dtype, which JAX refuses for mixed low-precision inputs (an internal dtype error), and
  a half-precision table or running mean would be built silently. Training in float32
  and storing a compact table in bfloat16 (``joint_saga(table_dtype=jnp.bfloat16)``)
  keeps the memory saving.
  """
  checks.check_floating_params(params, f"dsgrad.{estimator}", full_precision=True)


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
  except DiscreteNoise:
    raise  # says what is wrong: the objective's noise, not the params or the model
  except (TypeError, ValueError, IndexError) as error:
    cause = "" if isinstance(error, MaskMismatch) else (
        ". Was it built from another model than the objective?")
    raise ValueError(f"dsgrad.{estimator}: approximation {approx.name!r} cannot be evaluated "
                     f"at these params (shapes {checks.leaf_shapes(params)}): "
                     f"{checks.first_line(error)}{cause}") from error
  for which, tree in zip(("gradient", "expected gradient"), grads):
    if checks.leaf_shapes(tree) != checks.leaf_shapes(params):
      raise ValueError(f"dsgrad.{estimator}: approximation {approx.name!r} returns a {which} "
                       f"of shapes {checks.leaf_shapes(tree)} for params of shapes {checks.leaf_shapes(params)}; "
                       "was it built from another model than the objective?")
  check_expectation(approx, objective, params, f"dsgrad.{estimator}")


def parameter_table_bytes(params, num_data: int, dtype=None) -> int:
  """Bytes of a table holding one copy of ``params`` per datum (``N x size(params)``)."""
  row = params if dtype is None else jax.tree.map(
      lambda p: jax.ShapeDtypeStruct(jnp.shape(p), dtype), params)
  return int(num_data) * tree_bytes(row)


def check_table_fits(params, num_data: int, dtype, max_bytes, estimator: str,
                     objective: Objective | None = None) -> None:
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
    # reads= names data columns: an objective without them (a likelihood that indexes
    # arrays of its own, as the NumPyro bridge's does) names its arguments instead.
    no_columns = objective is not None and objective.data is None
    raise MemoryError(
        f"dsgrad.{estimator}: the per-datum table would hold {num_data:,} copies of "
        f"{size:,} parameters = {need / 2**30:.2f} GiB, more than {where} "
        f"({max_bytes / 2**30:.2f} GiB). If each datum reads a few latent rows (per group, "
        "user or item), declare them, "
        + ("for a model without data columns (its likelihood indexes arrays of its own): "
           "a NumPyro model with dsgrad.contrib.numpyro.objective(model, ..., reads={'latent "
           "site': 'index argument'}), a Model with dsgrad.models.with_coordinates; else "
           if no_columns else "")
        + "dsgrad.objective_from_logdensity(..., reads={'latent leaf': 'index column'}), "
        "and pass dsgrad.approx.sparse_linearize(objective): a table of those coordinates "
        "only; for a GLM, dsgrad.approx.glm_mean_taylor keeps its logits. Else: "
        "dsgrad.joint_svrg (no table), table_dtype=jnp.bfloat16, several devices "
        "(dsgrad.training.parallel), or max_table_bytes=None to skip this check.")


DENSE_TABLE_WARNING_BYTES = 64 * 2**20
"""A table of every parameter beyond this size, where a compact one applies, is warned of."""


def warn_of_declared_coordinates(objective: Objective, params, num_data: int, dtype) -> None:
  """Warns where a table of every parameter (over :data:`DENSE_TABLE_WARNING_BYTES`) is built for a mean-field
  objective whose model declares which coordinates each datum reads (``reads=``, or
  ``model.sparse``): :func:`dsgrad.approx.sparse_linearize` keeps those only, with the
  same updates, and each step then moves ``k`` of them per row instead of ``d``."""
  source = objective.source or (None, None)  # the compact table is the plain gradient's
  model = source[1] if source[0] == "meanfield_gaussian" else None
  sparse = getattr(model, "sparse", None)
  if sparse is None or any(isinstance(p, jax.core.Tracer) for p in jax.tree.leaves(params)):
    return
  dense = parameter_table_bytes(params, num_data, dtype)
  if dense <= DENSE_TABLE_WARNING_BYTES:
    return
  compact = dense * sparse.num_coordinates // max(model.latent_dim, 1)
  checks.warn_at_caller(
      f"dsgrad.joint_saga: a table of every parameter, {dense / 2**30:.2f} GiB, for a model "
      f"that declares the {sparse.num_coordinates} of {model.latent_dim} coordinates each "
      f"datum reads. dsgrad.joint_saga(objective) (its default for dsgrad.meanfield_gaussian"
      f"'s objective) or dsgrad.joint_saga(objective, dsgrad.approx.sparse_linearize("
      f"objective)) keeps those only (about {compact / 2**20:.0f} MiB), with the same "
      "updates at a fraction of the work per step")


def reweighted(objective: Objective, weights) -> Objective:
  """The objective whose per-datum losses on a batch are multiplied by ``weights``."""
  def loss_fn(params, rows, noise):
    return weights * objective.loss_fn(params, rows, noise)
  return dataclasses.replace(objective, loss_fn=loss_fn, name=objective.name + "*weights",
                             source=None, table_approximation=None)


def masked_sum(tree, mask):
  """``sum_b mask_b * tree[b]`` over the leading axis."""
  return jax.tree.map(
      lambda x: jnp.tensordot(mask.astype(x.dtype), x, axes=(0, 0)), tree)


def transformation(objective: Objective, init_fn, update_fn, name: str
                   ) -> optax.GradientTransformationExtraArgs:
  """``optax.GradientTransformationExtraArgs(init_fn, update)`` for an estimator of
  ``objective``: ``update(..., objective=obj)`` hands ``update_fn`` the objective it
  computes with: ``obj`` (a :meth:`~dsgrad.Objective.with_data` copy, or a jit argument of
  the caller's step, whose data are then arguments of the compiled program), else
  ``objective`` itself. ``init_fn`` reads no data, so that one state serves both. An
  ``obj`` over another number of data is refused (at trace time, by ``name``): the state's
  per-datum tables and the N/B scaling were sized by ``objective``, and a gather past a
  table's end is clamped, not an error. Nothing else is checked here:
  :func:`dsgrad.checked` wraps an optimizer with the checks of a user's loop, and
  :func:`dsgrad.fit` checks what enters it.

  Called outside ``jit`` (a loop written without it), ``update_fn`` runs as one compiled
  program with the objective's data among its arguments, not one small program per
  operation; inside a trace it inlines."""
  program = compile_cache.jit_by_text(update_fn)

  def update(updates, state, params=None, **extra_args):
    if extra_args.get("indices") is chain.DESCENT_PROBE:  # the rule after it is probed
      return updates, state
    if "indices" in extra_args:  # the dtype the tables are written with (a conversion)
      extra_args["indices"] = checks.as_index_array(extra_args["indices"])
    given = extra_args["objective"] = extra_args.get("objective") or objective
    if given.num_data != objective.num_data:
      raise ValueError(f"dsgrad.{name} was built for an objective of {objective.num_data:,} "
                       f"data and is updated with one of {given.num_data:,}: build the "
                       "estimator from the objective it trains")
    run = program if _compilable(given, (updates, state, params, extra_args)) else update_fn
    return run(updates, state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(init_fn, update)


def _compilable(objective: Objective, arguments) -> bool:
  """Whether an update on ``arguments`` can run as one program: the objective declares
  its data (else its arrays, closed over, would be compiled in as constants) and every
  argument is an array or a number."""
  return objective.data is not None and all(
      isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float))
      for leaf in jax.tree.leaves(arguments))
