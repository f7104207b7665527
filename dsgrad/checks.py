"""Input validation where data and settings enter dsgrad: shared by the objectives,
estimators, models, loaders and the fit loop, and public so that code built on dsgrad
(a new estimator, model or loader) refuses bad input the same way, with the same messages.

Two kinds of checks:

* *static* checks (dtype, rank, shapes, tree structure) run while tracing and raise a
  ``ValueError``/``TypeError`` immediately, inside or outside ``jit``;
* *value* checks (index range, finiteness) need the numbers. Outside ``jit`` they raise
  a ``ValueError`` at once; inside ``jit`` they run as a host callback, and the error
  surfaces as a runtime error whose text contains the same message. Under
  :func:`deferred` they become :func:`jax.experimental.checkify.check` calls instead:
  the program carries the first failure out, and :func:`raise_deferred` raises it as the
  same ``ValueError`` once the program has run. That costs no host round trip per step,
  which on a GPU is most of a small model's step. :func:`dsgrad.fit` goes one step
  further (:func:`collected`): each step's checks fold into one small integer, a loop
  output, checked once after the compiled segment.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
import threading
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

# Arguments by kind live in their own module; re-exported here with the other checks.
from dsgrad.argument_kinds import _is_transformation
from dsgrad.argument_kinds import (  # noqa: F401
    ArgumentError, Kind, approximation, arguments, byte_budget, check_count,
    check_positive, count, estimator, finite_values, floating_dtype, model,
    objective, optimizer, optional, or_word, parameters, positive,
    probability, prng_key, real, sizes)
from dsgrad import data_values
from dsgrad.data_values import (  # noqa: F401
    check_float32_range, check_id_array, check_int32_range, check_numeric_dtype, float32_values,
    numeric_array)


def is_concrete(x) -> bool:
  """Whether ``x`` is a value (not a tracer): value checks can run on it now."""
  return not isinstance(x, jax.core.Tracer)


def value_checks(checks: Sequence[tuple[Any, str]]) -> None:
  """Raises ``ValueError(message)`` for the first check whose flag is true.

  Args:
    checks: pairs ``(bad, message)``; ``bad`` is a boolean scalar array (may be a
      tracer).
  """
  if not checks:
    return
  flags = [jnp.asarray(bad) for bad, _ in checks]
  messages = [m for _, m in checks]
  if all(is_concrete(f) for f in flags):
    for flag, message in zip(flags, messages):
      if bool(np.any(np.asarray(flag))):
        raise ValueError(message)
    return

  found = getattr(_DEFERRED, "found", None)
  if found is not None:
    found.extend(zip(flags, messages))
    return

  if getattr(_DEFERRED, "active", False):
    for flag, message in zip(flags, messages):
      _checkify(~jnp.any(flag), message, _DEFERRED.step)
    return

  def _raise(*host_flags):
    for flag, message in zip(host_flags, messages):
      if np.any(np.asarray(flag)):
        raise ValueError(message)

  # The callback sits in a branch taken only when a check fails, so the common path
  # costs a few reductions and no host round trip.
  any_bad = jnp.any(jnp.stack([jnp.any(f) for f in flags]))
  jax.lax.cond(any_bad, lambda fs: jax.debug.callback(_raise, *fs), lambda fs: None, flags)


def _checkify(ok, message: str, step=None) -> None:
  """``checkify.check(ok, ...)`` with ``message`` as it is, ending with ``(at step t)``
  when ``step`` is given."""
  # checkify formats the message with str.format: braces in it are literal.
  text = message.replace("{", "{{").replace("}", "}}")
  if step is None:
    checkify.check(ok, text)
  else:
    checkify.check(ok, text + " (at step {})", step)


_DEFERRED = threading.local()
_CHECKIFY_SUFFIX = " (`check` failed)"


@contextlib.contextmanager
def deferred(step=None):
  """Value checks traced inside this context are deferred to the end of the program.

  Use it while tracing a function wrapped in :func:`jax.experimental.checkify.checkify`
  (with its default ``errors=checkify.user_checks``): each value check becomes a
  ``checkify.check``, the compiled program returns the first failure with its results,
  and :func:`raise_deferred` raises it on the host. Without it every check is a
  conditional host callback, and on a GPU each conditional reads its predicate on the
  host: one synchronization per check per step.

  Args:
    step: optional step number (a scalar, traced or not) that a failure's message ends
      with.

  Example (``batches``: ``(T, B)`` indices, ``keys``: ``T`` noise keys)::

    def run(carry, batches, keys):
      def body(carry, xs):
        t, indices, key = xs
        with dsgrad.checks.deferred(t):
          return dsgrad.train_step(objective, optimizer, *carry, indices, key), None
      return jax.lax.scan(body, carry, (jnp.arange(len(batches)), batches, keys))[0]

    error, (params, opt_state) = jax.jit(checkify.checkify(run))(
        (params, opt_state), batches, keys)
    dsgrad.checks.raise_deferred(error)  # ValueError: ... (at step t), if one failed
  """
  previous = (getattr(_DEFERRED, "active", False), getattr(_DEFERRED, "step", None))
  _DEFERRED.active, _DEFERRED.step = True, step
  try:
    yield
  finally:
    _DEFERRED.active, _DEFERRED.step = previous


@contextlib.contextmanager
def collected():
  """Value checks traced inside this context are collected, not raised: the block gets a
  list that fills with ``(bad, message)`` pairs, which :func:`failure_code` folds into one
  small integer per step.

  This is how :func:`dsgrad.fit` checks a compiled segment's steps: the steps' codes are a
  ``lax.scan`` output, and the first failure's code and step leave the program as an
  ordinary output (:class:`dsgrad.training.segments.Failure`), instead of a
  :func:`deferred` check per step, whose error state (a code and the step number)
  ``checkify`` threads through every step (measured 1.4x a plain 5 us step on CPU; the
  codes cost 1.03x).
  """
  previous = getattr(_DEFERRED, "found", None)
  _DEFERRED.found = found = []
  try:
    yield found
  finally:
    _DEFERRED.found = previous


def failure_code(found) -> jax.Array | None:
  """The index plus one of the first failing check among ``found`` (:func:`collected`),
  0 if none failed: an ``int32`` scalar; ``None`` without checks."""
  if not found:
    return None
  code = jnp.zeros((), jnp.int32)
  for i in reversed(range(len(found))):
    code = jnp.where(jnp.any(found[i][0]), jnp.int32(i + 1), code)
  return code


def deferred_message(error) -> str | None:
  """The message of the first deferred value check that failed (see :func:`deferred`),
  as the ``ValueError`` would carry it; ``None`` if none failed.

  Args:
    error: the ``checkify.Error`` a checkified program returned.
  """
  message = error.get()
  return message.split(_CHECKIFY_SUFFIX)[0] if message else None


def raise_deferred(error) -> None:
  """Raises the first deferred value check that failed (see :func:`deferred`) as the
  ``ValueError`` it would have raised at once; does nothing if none failed.

  Args:
    error: the ``checkify.Error`` a checkified program returned.
  """
  message = deferred_message(error)
  if message:
    raise ValueError(message)


def check_regular_file(path, what: str) -> None:
  """Refuses a path that is not a regular file (a FIFO, a device such as ``/dev/zero``,
  a directory, a socket): reading one can block forever or never end."""
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    raise FileNotFoundError(f"{what}: no file at {os.fspath(path)!r}") from None
  if not stat.S_ISREG(mode):
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise ValueError(f"{what}: {os.fspath(path)!r} is {kind}, not a regular file")


def unwritable_reason(folder) -> str | None:
  """Why no file can be written in the existing folder ``folder`` (the OS's words), or
  ``None`` where one can. A file is written and removed: ``os.access`` grants root every
  folder, a pseudo-filesystem's (``/proc``) included, and knows nothing of security
  modules, where a later write then fails after the work."""
  try:
    with tempfile.TemporaryFile(dir=folder):
      return None
  except OSError as error:
    return error.strerror or str(error)


@contextlib.contextmanager
def plain_errors():
  """Re-raises a failed value check from inside a compiled program as the ``ValueError``
  it is.

  Inside ``jit`` a check raises in a host callback, and JAX reports it as
  ``JaxRuntimeError: INTERNAL: CpuCallback error ...`` with the message below a second
  traceback. dsgrad's own entry points (:func:`dsgrad.fit`, the diagnostics) run under
  this context, so their users see ``ValueError: <message>`` alone.
  """
  try:
    yield
  except jax.errors.JaxRuntimeError as error:
    text = str(error)
    found = re.findall(r"^ValueError: (.+)$", text, re.M)
    if not found:
      raise
    raise ValueError(found[-1]) from None


def check_batch_size(batch_size: int, num_data: int, who: str = "") -> None:
  """Refuses a batch larger than the data (an epoch would hold no batch); ``who`` (e.g.
  ``"dsgrad.fit"``) begins the message."""
  if batch_size > num_data:
    raise ValueError(f"{who + ': ' if who else ''}batch_size={batch_size} exceeds "
                     f"num_data={num_data}")


OUT_OF_RANGE = " out of range: every index must lie in [0, "
NON_FINITE = " contains non-finite values (NaN or inf)"


class RangeOrFiniteMessage(str):
  """The message of an :func:`index_checks` or :func:`finite_checks` check: its type,
  not its wording, marks the checks that :func:`dsgrad.fit` may settle once per segment
  (its indices are in range by construction, and a non-finite gradient, noise or params
  leaves the params non-finite) instead of once per step."""


def index_checks(indices, num_data: int, name: str = "indices"):
  """Value checks that every index lies in ``[0, num_data)``."""
  return [(jnp.any((indices < 0) | (indices >= num_data)),
           RangeOrFiniteMessage(f"{name}{OUT_OF_RANGE}{num_data})"))]


def finite_checks(tree, name: str, where: str = ""):
  """Value checks that every leaf of ``tree`` is finite; ``where`` follows the message's
  "contains non-finite values" (where such values can come from)."""
  if not _floating_leaves(tree):
    return []
  return [(~all_finite(tree), RangeOrFiniteMessage(f"{name}{NON_FINITE}{where}"))]


def is_range_or_finite_check(message: str) -> bool:
  """Whether ``message`` is that of an :func:`index_checks` or :func:`finite_checks`
  check (a :class:`RangeOrFiniteMessage`); another check's message that happens to use
  the same words is not."""
  return isinstance(message, RangeOrFiniteMessage)


def all_finite(tree) -> jax.Array:
  """Whether every floating leaf of ``tree`` is finite: a boolean scalar."""
  return _all_finite(tree) if _traced(tree) else _all_finite_program(tree)


def _all_finite(tree) -> jax.Array:
  flags = [jnp.all(jnp.isfinite(x)) for x in _floating_leaves(tree)]
  return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


# On concrete values (params as fit starts, a batch checked outside jit): one program,
# where the operations run one by one compiled one each per leaf shape.
_all_finite_program = jax.jit(_all_finite)


def _traced(tree) -> bool:
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def _floating_leaves(tree) -> list:
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]


def check_indices_static(indices) -> int:
  """Checks dtype and rank of a batch of datum indices; returns the batch size."""
  if not hasattr(indices, "dtype") or not hasattr(indices, "shape"):
    raise TypeError(f"indices must be an integer array, got {type(indices).__name__}")
  if not jnp.issubdtype(indices.dtype, jnp.integer):
    raise TypeError(f"indices must have an integer dtype, got {indices.dtype}")
  if indices.ndim != 1:
    raise ValueError(f"indices must be a 1-D array of datum indices, got shape "
                     f"{tuple(indices.shape)}")
  if indices.shape[0] == 0:
    raise ValueError("indices must contain at least one datum index")
  return int(indices.shape[0])


def as_index_array(indices, name: str = "indices"):
  """Datum indices of any integer dtype as ``int32``, the dtype the tables are written with.

  Unsigned indices would break index arithmetic that relies on signed values (JAX's
  negative-index wrapping, masks such as ``index >= -N``), so they are converted here,
  where a batch enters. Concrete indices are range-checked before the conversion, so
  that an unsigned value above ``2**31 - 1`` cannot wrap onto a valid row; traced ones
  that wrap become negative and fail the index range check that follows.
  """
  if not hasattr(indices, "dtype") or not jnp.issubdtype(indices.dtype, jnp.integer):
    return indices  # check_indices_static names the problem
  if indices.dtype == jnp.int32:
    return indices
  if is_concrete(indices):
    values = np.asarray(indices)
    if values.size and (values.max() > np.iinfo(np.int32).max
                        or values.min() < np.iinfo(np.int32).min):
      raise ValueError(f"{name} out of range: got values up to {values.max()} "
                       f"(and down to {values.min()}); every index must lie in [0, N)")
    return jnp.asarray(values.astype(np.int32))
  return indices.astype(jnp.int32)


def check_same_structure(tree, reference, name: str, reference_name: str) -> None:
  """Checks that ``tree`` has the structure and leaf shapes of ``reference``."""
  tree_def, ref_def = jax.tree.structure(tree), jax.tree.structure(reference)
  if tree_def != ref_def:
    raise ValueError(f"{name} does not have the tree structure of {reference_name}: "
                     f"got {tree_def}, expected {ref_def}")
  for path_leaf, ref_leaf in zip(jax.tree.leaves_with_path(tree), jax.tree.leaves(reference)):
    path, leaf = path_leaf
    if jnp.shape(leaf) != jnp.shape(ref_leaf):
      raise ValueError(f"{name}{jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}, "
                       f"expected {jnp.shape(ref_leaf)} (as in {reference_name})")


def leaf_shapes(tree) -> list:
  """The shape of every leaf of ``tree``, for error messages."""
  return [tuple(x.shape) if hasattr(x, "shape") else tuple(jnp.shape(x))
          for x in jax.tree.leaves(tree)]


def first_line(error: Exception) -> str:
  """The first line of an error's message, for quoting it inside another message."""
  text = str(error).strip()
  return text.splitlines()[0].rstrip(".") if text else type(error).__name__


def check_objective_evaluates(target, params, who: str) -> None:
  """Refuses, by name, params at which the objective ``target`` cannot be evaluated (a
  leaf renamed, dropped or of another shape), with one abstract trace instead of an
  internal error inside the first compiled step."""
  # Abstract batch and noise: concrete ones would each compile a small program.
  indices = jax.ShapeDtypeStruct((1,), jnp.int32)
  try:
    jax.eval_shape(lambda p, i, e: target.loss_fn(p, target.rows(i), e), params, indices,
                   target.noise_spec(1))
  except KeyError as error:
    keys = (sorted(map(str, params)) if isinstance(params, dict)
            else jax.tree_util.tree_structure(params))
    raise ValueError(f"dsgrad.{who}: objective {target.name!r} reads params"
                     f"[{error.args[0]!r}], which these params lack (they have {keys}). "
                     "Was a params leaf renamed or dropped, or were the params made for "
                     "another objective?") from error
  except jax.errors.JAXTypeError as error:
    # The params are not at fault: the model's functions need a value while traced.
    raise ValueError(f"dsgrad.{who}: objective {target.name!r} cannot be traced by JAX: "
                     f"{first_line(error)}. Its log density runs under jit with the batch's "
                     "indices traced: index data held as JAX arrays (jnp.asarray(x)), not "
                     "NumPy arrays, and use jnp.where instead of Python if/else on "
                     "values") from error
  except (TypeError, ValueError, IndexError, AttributeError) as error:
    lists = data_values.number_list_paths(params)
    nested = [name for name, value in params.items() if isinstance(value, (dict, list, tuple))
              ] if isinstance(params, dict) else []
    if lists:
      cause = (f"params{lists[0]} is a Python list of numbers, which JAX reads as separate "
               "leaves: give an array (jnp.asarray(value, jnp.float32))")
    elif nested:
      cause = (f"params[{nested[0]!r}] is itself a pytree: a Gaussian family's params are "
               "flat (d,) arrays over the latent's ravel order; dsgrad.meanfield_init("
               "objective) builds them, and jax.flatten_util.ravel_pytree flattens yours")
    else:
      cause = "Were the params made for another model?"
    raise ValueError(f"dsgrad.{who}: objective {target.name!r} cannot be evaluated "
                     f"at these params (shapes {leaf_shapes(params)}): {first_line(error)}. "
                     + cause) from error


def check_floating_params(params, who: str, full_precision: bool = False) -> None:
  """Refuses, by path, a parameter leaf that is not a floating array (an integer leaf
  would get integer gradients, truncated steps, or a dtype error deep inside the
  optimizer), and with ``full_precision`` one below 32 bits: a float16 fit of a logistic
  regression ended at an ELBO of -5,670 where float32 reached -1,847."""
  for path, leaf in jax.tree.leaves_with_path(params):
    dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    where = f"params{jax.tree_util.keystr(path)}"
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(f"{who}: {where} has dtype {dtype.name}; parameters must be floating "
                      "arrays (jnp.asarray(x, jnp.float32))")
    if full_precision and dtype.itemsize < 4:
      raise ValueError(f"{who}: params of dtype {dtype.name} are not supported ({where}); "
                       "pass float32 params (a compact low-precision table: "
                       "dsgrad.joint_saga(..., table_dtype=jnp.bfloat16))")


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
  """``warnings.warn(message, category)`` at the first caller outside dsgrad (and Flax,
  whose modules' class calls ``__init__``, and JAX, whose transformations call a model's
  functions): the argument checks, factories and loops between a warning and the user's
  line would otherwise be what it points at, and their depth differs by entry."""
  packages = tuple(os.path.dirname(os.path.abspath(sys.modules[name].__file__))
                   for name in ("dsgrad", "flax", "jax"))
  frame, level = sys._getframe(0), 1
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(packages):
    frame, level = frame.f_back, level + 1
  warnings.warn(message, category, stacklevel=level)


def optimizer_factory(value, who: str):
  """``num_steps -> transformation`` from an :func:`optimizer` kind with ``factory``: a
  transformation is used as it is; a factory's result is checked where it is built (a
  function returning a float or a schedule would fail later, inside optax)."""
  if _is_transformation(value):
    fixed = lambda steps: value  # noqa: E731
    fixed.fixed = True  # its schedule is the user's, over the steps run: never moved
    return fixed

  def make(steps):
    made = value(steps)
    if np.ndim(made) == 0 and np.issubdtype(np.asarray(made).dtype, np.number):
      raise ArgumentError(f"{who}: optimizer({steps}) must be an optax transformation, got "
                          f"the number {made!r}: a learning-rate schedule? Pass lambda n: "
                          "optax.adam(optax.cosine_decay_schedule(1e-2, n))")
    return optimizer().check(made, f"{who}: optimizer({steps})")
  return make
