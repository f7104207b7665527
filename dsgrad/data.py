"""Per-datum data: pytree leaves of models and objectives, read as a batch's rows.

A model's data are a pytree of ``(N, ...)`` arrays (``model.data``); its functions receive
the rows of a batch, ``log_likelihood(z, rows)`` with ``rows = rows_of(model.data,
indices)``, never the arrays themselves. Models and objectives are pytrees whose leaves are
these arrays (their functions are static structure), so ``jax.jit(step)(objective, ...)``
takes the data as arguments of the compiled program: it holds no copy of them, XLA does
not constant-fold gathers over them, and one compilation serves every data set of the
same shapes and dtypes (:meth:`dsgrad.Objective.with_data`).

A leaf may be a :class:`HostArray` (e.g. a memory-mapped ``.npy`` file larger than
memory). Inside a program it is a view: the array's shape and an int32 handle (an
argument, so one program serves every host array of that shape). Its rows are read by
a host callback, in chunks for a full pass; :func:`dsgrad.fit` instead reads each block
of steps' rows ahead on a thread and hands every step its batch's rows
(:func:`with_batch_rows`), so that a step makes no host read.
"""

from __future__ import annotations

import dataclasses
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks, data_kinds, data_values
from dsgrad.data_values import check_no_number_lists  # noqa: F401  (re-exported)
from dsgrad.training import host_data
from dsgrad.training.host_data import (HostArray, HostSpec, RowReader, on_device,  # noqa: F401
                                      open_memmap, read_rows)

__all__ = ["HostArray", "open_memmap", "read_rows", "RowReader", "rows_of",
           "is_host", "host_leaves", "with_batch_rows", "check_data", "check_no_number_lists",
           "check_finite_data", "as_array", "columns_of", "placed", "register_with_data"]


def _flatten_host(array: HostArray):
  handle = array.handle
  return ((np.int32(handle) if isinstance(handle, int) else handle, array.batch), array.spec)


def _unflatten_host(spec: HostSpec, leaves):
  # JAX unflattens with placeholders (tracers, None, shardings) too: only a concrete live
  # handle without a batch is the array itself.
  handle, batch = leaves
  if batch is None and isinstance(handle, (int, np.integer, np.ndarray)) and \
      np.ndim(handle) == 0:
    array = HostArray._registry.get(int(handle))
    if array is not None:
      return array
  return HostArray.view(spec, handle, batch)


jax.tree_util.register_pytree_node(HostArray, _flatten_host, _unflatten_host)


def is_host(value) -> bool:
  """Whether a data leaf lives on the host (a :class:`HostArray`, or its view inside a
  program)."""
  return isinstance(value, HostArray)


def rows_of(data, indices, contiguous: bool = False):
  """The rows ``leaf[indices]`` of every leaf of ``data``; ``indices`` themselves when
  ``data`` is ``None`` (a model or objective whose functions close over their data).
  ``contiguous``: the caller's promise that ``indices`` are ``indices[0] + arange(size)``
  (a chunk of a pass over all data), read as a slice of the device leaves: XLA on CPU
  gathers them row by row, which doubled an ELBO evaluation's pass over 2,000,000 rows of
  a survival model (40 ns a row against 20)."""
  if data is None:
    return indices
  leaves, treedef = jax.tree.flatten(data, is_leaf=is_host)
  together = _read_together(leaves, indices)

  def read(k, leaf):
    if k in together:
      return together[k]
    if contiguous and not is_host(leaf):
      return jax.lax.dynamic_slice_in_dim(leaf, indices[0], indices.shape[0])
    return leaf[indices]

  return jax.tree.unflatten(treedef, [read(k, leaf) for k, leaf in enumerate(leaves)])


def _read_together(leaves, indices) -> dict:
  """``{position: rows}`` of the host leaves that a program reads from the host at
  ``indices``, in one callback: one per leaf cost about 0.16 ms each on a CPU, and an
  ELBO evaluation of 10^7 rows of four columns on disk made ten thousand of them."""
  if not isinstance(indices, jax.core.Tracer) or not jnp.issubdtype(indices.dtype, jnp.integer):
    return {}
  host = {k: leaf for k, leaf in enumerate(leaves)
          if is_host(leaf) and not leaf.from_batch(indices)}
  if len(host) < 2:
    return {}
  shapes = tuple(jax.ShapeDtypeStruct(indices.shape + leaf.shape[1:], leaf.dtype)
                 for leaf in host.values())
  rows = jax.pure_callback(
      lambda handles, idx: tuple(host_data.host_gather(h, idx) for h in handles), shapes,
      tuple(leaf.handle for leaf in host.values()), indices, vmap_method="expand_dims")
  return dict(zip(host, rows))


# Rows read outside a program, as one: each leaf's gather would compile on its own (22
# programs, 0.5 s, when a model of a few columns is checked as it is made).
_rows_program = jax.jit(rows_of)


def few_rows(data, indices):
  """:func:`rows_of` for a few ``indices`` outside a compiled program: one program for all
  the device leaves (cached per layout of the data and number of rows), the host leaves
  read on the host."""
  if data is None or any(is_host(leaf) for leaf in jax.tree.leaves(data, is_leaf=is_host)):
    return rows_of(data, indices)
  return _rows_program(data, jnp.asarray(indices, jnp.int32))


def host_leaves(tree) -> dict:
  """``{path: HostArray}`` of the host leaves of ``tree`` (a model, an objective)."""
  found = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_host)[0]
  return {jax.tree_util.keystr(path): leaf for path, leaf in found
          if isinstance(leaf, HostArray)}


def with_batch_rows(tree, indices, rows: dict):
  """``tree`` (inside a program) whose host views also hold this step's ``indices`` and
  their ``rows`` (``{path: rows}`` as :func:`host_leaves` names them, read ahead and handed
  over), so that the step's reads of them need no host callback."""
  if not rows:
    return tree
  return jax.tree_util.tree_map_with_path(
      lambda path, v: (HostArray.view(v.spec, v.handle,
                                      (indices, rows[jax.tree_util.keystr(path)]))
                       if is_host(v) else v), tree, is_leaf=is_host)


# ids of device arrays checked finite, each dropped with its array.
_known_finite: dict[int, weakref.ref] = {}
# One sum, where NaN and inf become NaN (0.2 s on 10^6 x 1,000 floats; ``all(isfinite)``
# took 0.6 s, and ``min``/``max`` do not propagate NaN on XLA's CPU backend).
_all_finite = jax.jit(lambda value: jnp.isfinite(jnp.sum(value * 0)))


def _known_finite_array(value: jax.Array) -> jax.Array:
  """Records the device array ``value`` as checked finite, for as long as it lives."""
  key = id(value)
  _known_finite[key] = weakref.ref(value, lambda _: _known_finite.pop(key, None))
  return value


def _check_leaf_values(value, label: str) -> None:
  """Refuses NaN or inf in an in-memory floating data leaf, and 64-bit values beyond the
  32-bit type JAX would store them in (float64 to inf, int64 wrapped), checked before that
  cast. Host and memory-mapped arrays are left to their loaders, which read them in
  chunks (and to :meth:`HostArray.rows`, which narrows each read)."""
  if is_host(value) or isinstance(value, jax.core.Tracer) or \
      not hasattr(value, "dtype") and not isinstance(value, (list, tuple)):
    return
  data_values.check_not_masked(value, label)
  dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype
  checks.check_numeric_dtype(dtype, label)
  if not np.issubdtype(dtype, np.inexact):
    if not isinstance(value, jax.Array) and not jax.config.jax_enable_x64:
      checks.check_int32_range(np.asarray(value), label)
    return
  if isinstance(value, jax.Array):  # on the device already: its values, not a copy
    if id(value) in _known_finite:
      return
    with jax.ensure_compile_time_eval():  # eager even while a caller is being traced
      if not bool(_all_finite(value)):
        raise ValueError(data_values.non_finite_message(np.asarray(value), label))
    # A model, its objective and each copy of them (``_replace``, ``with_data``) check
    # their data: on 10^6 x 1,000 floats each pass took 0.7-4 s. JAX arrays are
    # immutable, so one pass serves every holder of this array while it lives.
    _known_finite_array(value)
    return
  array = np.asarray(value)
  checks.check_float32_range(array, label, cast=array.dtype.itemsize > 4
                             and not jax.config.jax_enable_x64)


def check_finite_data(tree, who: str = "data") -> None:
  """Refuses NaN or inf (or float64 values beyond float32's range) in any floating leaf
  of a data pytree, naming the leaf."""
  for path, leaf in jax.tree.leaves_with_path(tree, is_leaf=is_host):
    _check_leaf_values(leaf, f"{who}{jax.tree_util.keystr(path)}")


def leaf_name(path) -> str:
  """A data leaf's name: its path in the data pytree, ``"x"`` for ``data["x"]``,
  ``"a/0"`` for ``data["a"][0]``, ``"data"`` for a single array."""
  parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
  return "/".join(parts) or "data"


def check_data(values, num_data: int | None = None, who: str = "data") -> int:
  """Checks a data pytree: every leaf an array with the same leading size ``N``, and no
  NaN or inf in floating leaves.

  Returns:
    ``N``.

  Raises:
    ValueError: naming the leaves whose leading sizes disagree, or that disagree with
      ``num_data``.
  """
  check_no_number_lists(values, who)
  sizes = {}
  for path, value in jax.tree.leaves_with_path(values, is_leaf=is_host):
    key = leaf_name(path)
    shape = tuple(value.shape) if is_host(value) else np.shape(value)
    if len(shape) < 1:
      raise ValueError(f"{who}[{key!r}] is a scalar; every data leaf needs a leading datum "
                       "axis (close over constants in the function that reads them)")
    sizes[key] = shape[0]
    _check_leaf_values(value, f"{who}[{key!r}]")
  distinct = set(sizes.values())
  if len(distinct) > 1:
    listing = ", ".join(f"{k}: {n}" for k, n in sizes.items())
    raise ValueError(f"{who}: the leaves disagree on the number of data N ({listing}); "
                     "every leaf's leading axis must be the datum axis (close over arrays "
                     "that are not per datum, such as a (K, K) matrix, in the function that "
                     "reads them)")
  n = distinct.pop() if distinct else num_data
  if num_data is not None and n != num_data:
    raise ValueError(f"{who} has {n} rows per leaf but num_data is {num_data}")
  return n


def as_array(leaf):
  """``leaf`` as the NumPy array it converts to, where it is an array to its user but a
  leaf without a dtype to JAX (a pandas ``DataFrame`` or ``Series``, an xarray, a CPU torch
  tensor); anything else (arrays, host arrays, NumPy scalars, numbers) as it is."""
  if is_host(leaf) or isinstance(leaf, (np.ndarray, np.generic, jax.Array)) or not hasattr(
      leaf, "__array__"):
    return leaf  # NumPy scalars too: a list of them is refused by name as a list of numbers
  return np.asarray(leaf)


def columns_of(values):
  """``values`` as the data pytree it stands for: a table given where the whole data go
  (a pandas ``DataFrame``: anything with ``columns`` and ``to_numpy``) is the dict of its
  columns, ``{"y": frame["y"], ...}``, each with its own dtype, so that a function reads
  ``batch["y"]`` as it would read the frame; anything else as it is. (One table as *a
  leaf* of the data, ``{"x": features_frame}``, is its matrix: :func:`as_array`.)"""
  if isinstance(values, (np.ndarray, jax.Array)) or not (
      hasattr(values, "columns") and hasattr(values, "to_numpy")):
    return values
  names = [str(name) for name in values.columns]
  if len(set(names)) != len(names):
    raise ValueError(f"data: a table with repeated column names {names}: give each column "
                     "its own name, or pass a dict of arrays")
  # An integer column (a group index) stays an integer: the table's single matrix would
  # turn it into floats, which cannot index a latent.
  columns = {name: np.asarray(values[column]) for name, column in zip(names, values.columns)}
  text = [name for name, column in columns.items()
          if not data_values.is_numeric_dtype(column.dtype)]
  if text:  # names, labels, dates: a table's usual company, which a model reads as codes
    raise ValueError(f"data: the table's columns {text} are not numbers; select the columns "
                     f"the model reads (frame[{[n for n in names if n not in text]}]) or "
                     "encode them (frame[name].astype('category').cat.codes)")
  return columns


def index_names(values) -> list[str]:
  """The named index levels of a table (``frame.set_index("user")`` moves the column
  ``"user"`` there), which :func:`columns_of` leaves out; ``[]`` for anything else."""
  if not (hasattr(values, "columns") and hasattr(values, "index")):
    return []
  return [str(name) for name in getattr(values.index, "names", ()) if name is not None]


def placed(values, who: str = "data"):
  """``values`` (a data pytree, or a table: :func:`columns_of`) checked
  (:func:`check_data`) with each in-memory leaf on the device; host leaves stay where they
  are, ``np.memmap`` leaves become :class:`HostArray`."""
  values = jax.tree.map(as_array, columns_of(values), is_leaf=is_host)
  check_data(values, None, who)

  def place(path, leaf):
    name = leaf_name(path)
    if isinstance(leaf, np.memmap):
      return HostArray(leaf, name)
    if is_host(leaf) or isinstance(leaf, jax.Array):
      return leaf
    # Checked above in host memory (finite, within float32): so is its copy.
    return _known_finite_array(on_device(leaf, name))

  return jax.tree_util.tree_map_with_path(place, values, is_leaf=is_host)


def register_with_data(cls):
  """Registers the dataclass ``cls`` as a pytree whose one child is its ``data`` field
  (the leaves: the data arrays) and whose other fields (functions, sizes, names) are its
  static structure, compared field by field: copies that differ only in their data share
  every compiled program."""
  names = tuple(f.name for f in dataclasses.fields(cls) if f.name != "data")

  def flatten(obj):
    return ((jax.tree_util.GetAttrKey("data"), obj.data),), tuple(getattr(obj, n) for n in names)

  def unflatten(static, children):
    # No validation: JAX unflattens with placeholders (tracers, None, shardings) too.
    out = object.__new__(cls)
    for name, value in zip(names, static):
      object.__setattr__(out, name, value)
    object.__setattr__(out, "data", children[0])
    return out

  jax.tree_util.register_pytree_with_keys(
      cls, flatten, unflatten, flatten_func=lambda obj: ((obj.data,), flatten(obj)[1]))
  return cls


def batch_of_one(row):
  """One datum's row (as ``jax.vmap`` over a batch's rows hands it) as a batch of one."""
  return jax.tree.map(lambda r: r[None], row)


def replacement(old, values, kinds, who: str):
  """``values`` checked as a replacement of the data ``old``: the same keys, shapes and
  dtypes, values that mean what ``kinds`` (:mod:`dsgrad.data_kinds`) says; placed as
  :func:`placed` places them. What ``with_data`` of an objective or a model returns.

  Raises:
    ValueError/TypeError: a missing or extra key, leaves that disagree on ``N``, a leaf
      whose shape or dtype differs from ``old``'s, or values that do not mean what the
      model's data mean.
  """
  values = columns_of(values)
  check_no_number_lists(values, who)  # before the keys: a list has one per row
  ours = jax.tree.structure(old, is_leaf=is_host)
  theirs = jax.tree.structure(values, is_leaf=lambda v: is_host(v) or
                              isinstance(v, np.ndarray))
  if ours != theirs:
    keys = lambda t: sorted(leaf_name(p) for p, _ in
                            jax.tree.leaves_with_path(t, is_leaf=is_host))
    raise ValueError(f"{who}: expected the keys {keys(old)}, got {keys(values)}")
  values = placed(values, who)
  shapes, dtypes = [], []
  for (path, new), was in zip(jax.tree.leaves_with_path(values, is_leaf=is_host),
                              jax.tree.leaves(old, is_leaf=is_host)):
    key = repr(leaf_name(path))
    if tuple(new.shape) != tuple(was.shape):
      shapes.append(f"data {key} has shape {tuple(new.shape)}, expected {tuple(was.shape)}")
    elif np.dtype(new.dtype) != np.dtype(was.dtype):
      dtypes.append(f"data {key} has dtype {new.dtype}, expected {was.dtype}")
  if shapes:
    raise ValueError(f"{who}: {'; '.join(shapes)} (same shapes as the data it replaces)")
  if dtypes:
    raise TypeError(f"{who}: {'; '.join(dtypes)} (no cast)")
  data_kinds.check_kinds(dict(kinds), values, who)
  return values
