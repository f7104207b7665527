"""Which values data may hold, checked where data enter (model factories, loaders,
``with_data``): numbers (not objects, strings or complex), finite and within float32's
range where JAX will compute in float32, and ids that are whole numbers. What a value
*means* to a model (signs, indices in a range) is :mod:`dsgrad.data_kinds`'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad.argument_kinds import ArgumentError


def is_numeric_dtype(dtype) -> bool:
  """Whether a model computes with data of ``dtype``: bool, integer or floating; not
  object (mixed Python values), complex (JAX would drop the imaginary part or fail inside
  a product), strings or dates."""
  dtype = np.dtype(dtype)
  # jnp.issubdtype also counts bfloat16 (not a NumPy floating type) as floating.
  return dtype == np.bool_ or bool(jnp.issubdtype(dtype, jnp.integer)
                                   or jnp.issubdtype(dtype, jnp.floating))


def check_numeric_dtype(dtype, label: str) -> None:
  """Refuses data of a dtype no model computes with (:func:`is_numeric_dtype`)."""
  dtype = np.dtype(dtype)
  if is_numeric_dtype(dtype):
    return
  labels = dtype.kind in "OUS"  # objects and strings: most often names or categories
  raise ArgumentError(f"{label} has dtype {dtype}; data must be numbers (bool, integer or "
                      "floating): convert it, e.g. np.asarray(x, np.float32)" + (
                          "; labels (names, categories) become integer codes, e.g. "
                          "pd.Categorical(x).codes or np.unique(x, return_inverse=True)[1]"
                          if labels else ""))


def check_not_masked(values, label: str) -> None:
  """Refuses a NumPy masked array: ``np.asarray`` keeps its masked entries' stored values
  (often a fill such as -999), which a model would read as data."""
  if np.ma.isMaskedArray(values):
    raise ArgumentError(f"{label} is a NumPy masked array ({int(np.ma.count_masked(values))} "
                        "masked values): dsgrad would read every stored value, the masked "
                        "ones too. Drop their rows or fill them, and pass x.filled(value)")


def numeric_array(values, label: str) -> np.ndarray:
  """``values`` as a NumPy array of a numeric dtype (see :func:`check_numeric_dtype`);
  not a masked array (:func:`check_not_masked`)."""
  check_not_masked(values, label)
  array = np.asarray(values)
  check_numeric_dtype(array.dtype, label)
  return array


def check_float32_range(array: np.ndarray, label: str, *, cast: bool = True,
                        first_row: int = 0) -> None:
  """Refuses NaN or inf in a floating NumPy array (naming how many, and where: rows are
  counted from ``first_row``, for a block of a larger array) and, where it will be cast
  to float32 (``cast``), values beyond float32's range, which the cast turns into inf.
  The one check of data before they become JAX arrays."""
  if not np.issubdtype(array.dtype, np.inexact) or not array.size:
    return
  # Two reductions with no temporary (NaN propagates to both, inf to one): on 10^6 x
  # 1,000 floats, isfinite and abs wrote 5 GB of temporaries and took 15 s.
  low, high = float(np.min(array)), float(np.max(array))
  if not (np.isfinite(low) and np.isfinite(high)):
    raise ArgumentError(non_finite_message(array, label, first_row))
  largest = max(-low, high)
  if cast and largest > float(np.finfo(np.float32).max):
    row = first_row + (int(np.argmax(np.abs(array).reshape(len(array), -1).max(axis=1)))
                       if array.ndim else 0)  # the error path only: a temporary is fine
    raise ArgumentError(f"{label} holds values up to {largest:.3g} (row {row:,}), beyond "
                        "float32's range (3.4e38): JAX computes in float32 and they would "
                        "become inf. Rescale them")


def non_finite_message(array: np.ndarray, label: str, first_row: int = 0) -> str:
  """What :func:`check_float32_range` says of data holding NaN or inf: how many, the
  first row that holds one, and how a missing value is coded instead (a stand-in and a
  mask the likelihood reads), since NaN is how a table marks one. Read in chunks of
  rows, on the error path only."""
  rows = array.reshape(len(array), -1) if array.ndim else array.reshape(1, 1)
  count, first, step = 0, None, max(1, (1 << 24) // max(1, rows.shape[1]))
  for start in range(0, len(rows), step):
    bad = ~np.isfinite(rows[start:start + step])
    count += int(np.count_nonzero(bad))
    if first is None and bad.any():
      first = first_row + start + int(np.argmax(bad.any(axis=1)))
  return (f"{label} contains non-finite values ({count} NaN or inf, the first in row "
          f"{first:,}). Where they mark missing values, give a finite stand-in and a 0/1 "
          "column of which values are observed, and mask the term with it in log_lik "
          "(jnp.where(batch['observed'] == 1, term, 0.0))")


def check_int32_range(array: np.ndarray, label: str) -> None:
  """Refuses 64-bit integers beyond the 32-bit type JAX stores them in without
  ``jax_enable_x64`` (int64 as int32, uint64 as uint32): the conversion wraps them onto
  other values without an error (an id of 9e10 became -194,313,216)."""
  if not np.issubdtype(array.dtype, np.integer) or array.dtype.itemsize <= 4 or not array.size:
    return
  target = np.iinfo(np.int32 if np.issubdtype(array.dtype, np.signedinteger) else np.uint32)
  low, high = int(np.min(array)), int(np.max(array))
  if low < target.min or high > target.max:
    raise ArgumentError(f"{label} holds {array.dtype} values from {low} to {high}, beyond "
                        f"{target.dtype}'s range: JAX stores integers in 32 bits (unless "
                        "jax_enable_x64 is on) and would wrap them onto other values. Re-code "
                        "ids as 0..K-1 (np.unique(x, return_inverse=True)[1]) or pass "
                        "quantities as floats")


def float32_values(values, label: str) -> np.ndarray:
  """``values`` as a float32 NumPy array, refusing what the cast would hide: a
  non-numeric dtype, NaN or inf, and values beyond float32's range
  (:func:`check_float32_range`)."""
  array = numeric_array(values, label)
  check_float32_range(array, label)
  return array.astype(np.float32)


def check_id_array(values, label: str) -> np.ndarray:
  """Integer ids as an int64 array: floats are accepted only if every value is a finite
  whole number (a NaN id would become a user of its own, 1.5 would be truncated)."""
  array = numeric_array(values, label)
  if np.issubdtype(array.dtype, np.floating):
    if not np.all(np.isfinite(array)):
      raise ArgumentError(f"{label} holds NaN or inf; ids must be whole numbers")
    if not np.all(array == np.round(array)):
      raise ArgumentError(f"{label} holds non-integer values; ids must be whole numbers")
    if array.size and np.max(np.abs(array)) >= 2 ** 63:
      raise ArgumentError(f"{label} holds values beyond the int64 range")
  return array.astype(np.int64)


def _number_list(x) -> bool:
  """A (nested) Python list of numbers (or 0-d arrays, as ``jax.tree.map`` of
  ``jnp.asarray`` leaves it): what a user means as an array."""
  return isinstance(x, list) and bool(x) and all(
      _number_list(v) or isinstance(v, (bool, int, float, np.number))
      or (isinstance(v, (np.ndarray, jax.Array)) and v.ndim == 0) for v in x)


def number_list_paths(values) -> list[str]:
  """The paths (``['x']``) of the Python lists of numbers in a pytree."""
  return [jax.tree_util.keystr(path) for path, leaf in
          jax.tree_util.tree_flatten_with_path(values, is_leaf=_number_list)[0]
          if _number_list(leaf)]


def check_no_number_lists(values, who: str = "data") -> None:
  """Refuses, by path, a data column given as a Python list of numbers: JAX reads a list
  as a pytree node, so the column would arrive as one scalar leaf per row."""
  paths = number_list_paths(values)
  if paths:
    raise TypeError(f"{who}{paths[0]} is a Python list of numbers: JAX reads a list as a "
                    "pytree of separate leaves; give an array, e.g. np.asarray(column)")
