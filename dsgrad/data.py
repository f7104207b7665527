"""Per-datum data that compiled programs receive as arguments, not as constants.

A model reads its data through :class:`DataArray` handles (``x[indices]``). Outside any
binding a handle reads the array it was made with, so a model behaves as a plain closure
over its data. Inside :func:`bind` (which :func:`dsgrad.fit`, the estimators and the
diagnostics use while tracing) the same handle reads the value bound to it: a jit
*argument*. Hence

* a compiled training segment holds no copy of the data and XLA does not constant-fold
  gathers over them;
* one compiled program serves every data set of the same shapes and dtypes
  (:meth:`dsgrad.Objective.with_data`);
* a handle may hold a :class:`HostArray` (e.g. a memory-mapped ``.npy`` file larger than
  memory). :func:`dsgrad.fit` then reads each block of steps' rows on the host, on a
  thread (:class:`RowReader`), and copies them to the device, while the device runs the
  previous block, and passes them to the compiled steps as an argument; any other read (a full pass, an SVRG refresh,
  the ELBO) gathers the rows it asks for, in chunks, by a host callback.

Why a handle and not ``loss_fn(params, data, indices, noise)``: every estimator,
approximation and model keeps its ``(params, indices, noise)`` signature and its
``optax.chain(dsgrad.joint_saga(objective, ...), optax.adam(...))`` one-liner; the data
become arguments of the *compiled program* (what costs compile time and memory) without a
second calling convention in forty functions. The binding is dynamic scope at trace time
only, like NumPyro's effect handlers; nothing is looked up when the program runs.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.host_data import (HostArray, RowReader, host_gather, open_memmap,  # noqa: F401
                               read_rows)

__all__ = ["DataArray", "HostArray", "open_memmap", "read_rows", "RowReader", "bind",
           "batch_rows", "is_bound", "is_host", "split_host", "join_host", "check_data",
           "jit", "as_argument"]

_STATE = threading.local()


def _bindings() -> list:
  if not hasattr(_STATE, "stack"):
    _STATE.stack = []
  return _STATE.stack


class DataArray:
  """A model's per-datum array, read through the current binding (see module docstring).

  Supports what models and approximations need: ``x[indices]`` (rows), ``shape``,
  ``dtype``, ``ndim``, ``len``, :meth:`value` (the whole current array) and
  ``np.asarray(x)`` (the array it was made with).

  Args:
    value: the ``(N, ...)`` array (a JAX or NumPy array, or a :class:`HostArray`).
    name: the array's name in the data pytree (``objective.data``).
  """

  def __init__(self, value, name: str):
    if not isinstance(value, HostArray):
      value = jnp.asarray(value)
    if value.ndim < 1:
      raise ValueError(f"data {name!r}: a per-datum array needs a leading datum axis")
    self.default = value
    self.name = name

  def value(self):
    """The bound value if this array is bound in the current trace, else its own."""
    for refs, values in reversed(_bindings()):
      for key, ref in refs.items():
        if ref is self:
          return values[key]
    return self.default

  shape = property(lambda self: tuple(self.default.shape))
  dtype = property(lambda self: self.default.dtype)
  ndim = property(lambda self: self.default.ndim)

  def __len__(self):
    return self.shape[0]

  def __repr__(self):
    return f"DataArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"

  def __array__(self, dtype=None, copy=None):
    value = self.default
    value = value.array if isinstance(value, HostArray) else np.asarray(value)
    return value if dtype is None else value.astype(dtype)

  def __getitem__(self, index):
    value = self.value()
    if isinstance(value, _BoundHost):
      return value.gather(index)
    if isinstance(value, HostArray):
      return _BoundHost(value, value.handle).gather(index)
    return value[index]


class _BoundHost:
  """A host array as seen inside a trace: the array (for shapes) and its handle (a jit
  argument, so the compiled program does not name a particular array); optionally the
  current batch's indices and their rows, gathered once per step (:func:`batch_rows`)."""

  def __init__(self, host: HostArray, handle, batch=None):
    self.host, self.handle, self.batch = host, handle, batch

  def gather(self, index):
    if self.batch is not None:
      batch_index, rows = self.batch
      if index is batch_index:
        return rows  # this step's rows, already read
      index = jnp.asarray(index)
      if index.ndim >= 1 and jnp.issubdtype(index.dtype, jnp.integer):
        # Indices made from the batch's (e.g. the batch twice, concatenated): look them up
        # among the rows already read; a host read only if one is not in the batch.
        match = index[..., None] == batch_index
        found = jnp.all(jnp.any(match, axis=-1))
        return jax.lax.cond(found, lambda: rows[jnp.argmax(match, axis=-1)],
                            lambda: _BoundHost(self.host, self.handle).gather(index))
    if isinstance(index, tuple):
      raise TypeError(f"{self.host.name}: host data support row indexing x[indices] only")
    if not isinstance(index, jax.core.Tracer) and not isinstance(self.handle, jax.core.Tracer):
      return jnp.asarray(self.host.rows(np.asarray(index)))
    index = jnp.asarray(index)
    if not jnp.issubdtype(index.dtype, jnp.integer):
      raise TypeError(f"{self.host.name}: host data support integer row indices only, "
                      f"got {index.dtype}")
    spec = jax.ShapeDtypeStruct(index.shape + self.host.shape[1:], self.host.dtype)
    return jax.pure_callback(host_gather, spec, self.handle, index,
                             vmap_method="expand_dims")


@contextlib.contextmanager
def batch_rows(refs: Mapping[str, DataArray], indices, rows: Mapping[str, Any] | None = None
               ) -> Iterator[None]:
  """Within the block, reads of host-bound ``refs`` at ``indices`` (this very array, or
  indices all of which are in it) return the batch's rows without another host read.

  Args:
    refs: the data handles.
    indices: the step's batch indices.
    rows: ``{name: rows}`` already read on the host (:class:`RowReader`) and passed to the
      compiled step as an argument; for host arrays not in it, the rows are gathered on
      entry by one host callback.

  Reads of other indices (full passes, per-datum vmaps) still gather by callback.
  """
  rows = dict(rows or {})
  bound = {k: r.value() for k, r in refs.items()}
  host = {k: v for k, v in bound.items() if isinstance(v, (_BoundHost, HostArray))}
  if not host:
    yield
    return
  views = {}
  for key, value in host.items():
    array, handle = (value.host, value.handle) if isinstance(value, _BoundHost) else (
        value, value.handle)
    read = rows[key] if key in rows else _BoundHost(array, handle).gather(indices)
    views[key] = _BoundHost(array, handle, (indices, read))
  with bind({k: refs[k] for k in views}, views):
    yield


def is_host(value) -> bool:
  """Whether a data value lives on the host (a :class:`HostArray`)."""
  return isinstance(value, HostArray)


@contextlib.contextmanager
def bind(refs: Mapping[str, DataArray], values: Mapping[str, Any]) -> Iterator[None]:
  """Within the block, each ``refs[k]`` reads ``values[k]`` (e.g. a jit argument).

  Host arrays may be bound directly or as ``(host_array, handle)`` pairs whose handle is a
  traced int32 (see :func:`split_host`).
  """
  values = {k: (_BoundHost(*v) if isinstance(v, tuple) else v) for k, v in values.items()}
  missing = set(refs) - set(values)
  if missing:
    raise ValueError(f"no value bound for data {sorted(missing)}")
  stack = _bindings()
  stack.append((dict(refs), values))
  try:
    yield
  finally:
    stack.pop()


def is_bound(ref: DataArray) -> bool:
  """Whether ``ref`` is bound in the current context."""
  return any(r is ref for refs, _ in _bindings() for r in refs.values())


def split_host(values: Mapping[str, Any]):
  """``(device_values, host_arrays)``: the pytree a jitted program takes as argument
  (device arrays and the host arrays' int32 handles) and the host arrays themselves."""
  host = {k: v for k, v in values.items() if isinstance(v, HostArray)}
  args = {k: (jnp.int32(v.handle) if k in host else v) for k, v in values.items()}
  return args, host


def join_host(args: Mapping[str, Any], host: Mapping[str, HostArray]):
  """The values to :func:`bind` inside a program that received ``split_host``'s args."""
  return {k: ((host[k], v) if k in host else v) for k, v in args.items()}


def _check_finite_leaf(value, label: str) -> None:
  """Refuses NaN or inf in an in-memory floating data leaf, and float64 values beyond
  float32's range where JAX would cast them to inf (checked before that cast). Host and
  memory-mapped arrays are left to their loaders, which read them in chunks."""
  if isinstance(value, DataArray):
    # A handle's default is checked once: objectives derived from one (reweighted,
    # with_data copies) share it.
    if getattr(value, "_finite_checked", False):
      return
    _check_finite_leaf(value.default, label)
    value._finite_checked = True
    return
  if isinstance(value, (HostArray, jax.core.Tracer)) or not hasattr(value, "dtype") and \
      not isinstance(value, (list, tuple)):
    return
  dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype
  checks.check_numeric_dtype(dtype, label)
  if not np.issubdtype(dtype, np.inexact):
    return
  if isinstance(value, jax.Array):
    with jax.ensure_compile_time_eval():  # eager even while a caller is being traced
      finite = bool(jnp.all(jnp.isfinite(value)))
  else:
    array = np.asarray(value)
    finite = bool(np.all(np.isfinite(array)))
    if (finite and array.size and array.dtype.itemsize > 4
        and not jax.config.jax_enable_x64
        and float(np.max(np.abs(array))) > float(np.finfo(np.float32).max)):
      raise ValueError(f"{label} holds values up to {float(np.max(np.abs(array))):.3g}, "
                       "beyond float32's range: JAX computes in float32 and they would "
                       "become inf. Rescale the data")
  if not finite:
    raise ValueError(f"{label} contains non-finite values (NaN or inf)")


def check_finite_data(tree, who: str = "data") -> None:
  """Refuses NaN or inf (or float64 values beyond float32's range) in any floating leaf
  of a data pytree, naming the leaf."""
  for path, leaf in jax.tree.leaves_with_path(tree):
    _check_finite_leaf(leaf, f"{who}{jax.tree_util.keystr(path)}")


def check_data(values: Mapping[str, Any], num_data: int | None = None,
               who: str = "data") -> int:
  """Checks a data pytree: every leaf an array with the same leading size ``N``.

  Returns:
    ``N``.

  Raises:
    ValueError: naming the leaves whose leading sizes disagree, or that disagree with
      ``num_data``.
  """
  sizes = {}
  for key, value in values.items():
    shape = np.shape(value) if not isinstance(value, (HostArray, DataArray)) else value.shape
    if len(shape) < 1:
      raise ValueError(f"{who}[{key!r}] is a scalar; every data leaf needs a leading datum "
                       "axis")
    sizes[key] = shape[0]
    _check_finite_leaf(value, f"{who}[{key!r}]")
  distinct = set(sizes.values())
  if len(distinct) > 1:
    listing = ", ".join(f"{k}: {n}" for k, n in sizes.items())
    raise ValueError(f"{who}: the leaves disagree on the number of data N ({listing}); "
                     "every leaf's leading axis must be the datum axis")
  n = distinct.pop() if distinct else num_data
  if num_data is not None and n != num_data:
    raise ValueError(f"{who} has {n} rows per leaf but num_data is {num_data}")
  return n


def _current_values(refs: Mapping[str, DataArray]):
  """``(arguments, host arrays)`` for what ``refs`` read now: device values as they are,
  host arrays as their int32 handles (bound handles stay traced)."""
  data, host = {}, {}
  for key, ref in refs.items():
    value = ref.value()
    if isinstance(value, HostArray):
      host[key], data[key] = value, jnp.int32(value.handle)
    elif isinstance(value, _BoundHost):
      host[key], data[key] = value.host, value.handle
    else:
      data[key] = value
  return data, host


def jit(refs: Mapping[str, DataArray] | None, fn):
  """``jax.jit(fn)`` with the arrays behind ``refs`` passed as arguments.

  At each call the values ``refs`` currently read (bound or their own) become arguments of
  the compiled program, so a cached compilation never holds stale data and never embeds
  them as constants. Use it for every jitted function that reads data handles and is
  called more than once (e.g. an estimator's initial full pass).

  Args:
    refs: ``{name: DataArray}`` (``objective.data``); ``None`` or empty: plain ``jax.jit``.
    fn: the function; its own arguments are passed through.

  Returns:
    A callable with ``fn``'s signature.
  """
  if not refs:
    return jax.jit(fn)
  refs = dict(refs)
  compiled = {}

  def call(*args):
    data, host = _current_values(refs)
    which = tuple(sorted(host))
    if which not in compiled:
      def inner(data, *args, _host=dict(host)):
        with bind(refs, join_host(data, _host)):
          return fn(*args)
      compiled[which] = jax.jit(inner)
    return compiled[which](data, *args)

  return call


def as_argument(refs: Mapping[str, DataArray] | None, fn):
  """``(wrapped, values)`` with ``wrapped(values, *args) == fn(*args)`` and ``fn``'s reads
  of ``refs`` served by ``values``: jit ``wrapped`` (or lower and compile it) to have the
  data as an argument of the compiled program instead of constants. ``values`` are the
  arrays ``refs`` read now (host arrays as int32 handles)."""
  refs = dict(refs or {})
  values, host = _current_values(refs)

  def wrapped(data, *args):
    with bind(refs, join_host(data, host)):
      return fn(*args)

  return wrapped, values
