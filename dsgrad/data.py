"""Per-datum data that compiled programs receive as arguments, not as constants.

A model reads its data through :class:`DataArray` handles (``x[indices]``); each handle
holds its array. A program that should take the data as arguments (a training segment of
:func:`dsgrad.fit`, an estimator's full pass, a user's ``jax.jit(step)(objective, ...)``)
does not read them through a global binding: it builds, from the values it was handed,
*a copy* of the objects it calls whose handles hold those values (:func:`substitute`).
Hence

* a compiled training segment holds no copy of the data and XLA does not constant-fold
  gathers over them;
* one compiled program serves every data set of the same shapes and dtypes
  (:meth:`dsgrad.Objective.with_data` is :func:`substitute` with new arrays);
* a handle may hold a :class:`HostArray` (e.g. a memory-mapped ``.npy`` file larger than
  memory). :func:`dsgrad.fit` then reads each block of steps' rows on the host, on a
  thread (:class:`RowReader`), and copies them to the device, while the device runs the
  previous block, and hands them to the compiled steps as an argument (:class:`HostView`);
  any other read (a full pass, an SVRG refresh, the ELBO) gathers the rows it asks for,
  in chunks, by a host callback.

Why handles and a copy, and not ``loss_fn(params, data, indices, noise)``: every estimator,
approximation and model keeps its ``(params, indices, noise)`` signature and its
``optax.chain(dsgrad.joint_saga(objective, ...), optax.adam(...))`` one-liner; the data
become arguments of the *compiled program* (what costs compile time and memory) without a
second calling convention in forty functions. The copy is made at trace time only, from
what the caller hands over; nothing is looked up in a global or thread-local state.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.training.host_data import (HostArray, RowReader, free_memory_bytes, host_gather,  # noqa: F401
                                      on_device, open_memmap, read_rows)

__all__ = ["DataArray", "HostArray", "HostView", "open_memmap", "read_rows", "RowReader",
           "substitute", "is_host", "split_host", "join_host", "with_batch_rows", "check_data",
           "jit", "as_argument", "values_of"]


class DataArray:
  """A model's per-datum array (see module docstring).

  Supports what models and approximations need: ``x[indices]`` (rows), ``shape``,
  ``dtype``, ``ndim``, ``len``, :meth:`value` (the whole array) and ``np.asarray(x)``.

  Args:
    value: the ``(N, ...)`` array (a JAX or NumPy array, a :class:`HostArray`, or, in a
      copy made by :func:`substitute`, a tracer or a :class:`HostView`).
    name: the array's name in the data pytree (``objective.data``).

  Attributes:
    origin: the handle this one was copied from by :func:`substitute` (itself for an
      original): copies of one model share it, which is how a program built for a model
      recognises that model on other data.
    kind: what the values mean (:mod:`dsgrad.data_kinds`), or ``None``.
  """
  kind = None

  def __init__(self, value, name: str):
    if not isinstance(value, (HostArray, HostView, jax.core.Tracer)):
      # Checked once, here: every objective built from the model shares the handle.
      _check_finite_leaf(value, f"data {name!r}")
      value = on_device(value, name)
    if len(value.shape) < 1:
      raise ValueError(f"data {name!r}: a per-datum array needs a leading datum axis")
    self._value, self.name, self.origin = value, name, self

  @classmethod
  def _copy_holding(cls, value, original: "DataArray") -> "DataArray":
    # Unchecked: the value may be a tracer or a placeholder JAX unflattens with.
    out = object.__new__(cls)
    out._value, out.name, out.origin = value, original.name, original.origin
    return out

  def value(self):
    """The array this handle holds."""
    return self._value

  shape = property(lambda self: tuple(self._value.shape))
  dtype = property(lambda self: self._value.dtype)
  ndim = property(lambda self: len(self._value.shape))

  def __len__(self):
    return self.shape[0]

  def __repr__(self):
    return f"DataArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"

  def __array__(self, dtype=None, copy=None):
    value = self._value
    if isinstance(value, HostView):
      value = value.host
    value = value.array if isinstance(value, HostArray) else np.asarray(value)
    return value if dtype is None else value.astype(dtype)

  def __getitem__(self, index):
    value = self._value
    if isinstance(value, HostArray):
      value = HostView(value, value.handle)
    return value[index]


class HostView:
  """A host array as a compiled program sees it: the array (for shapes) and its handle
  (a jit argument, so the program does not name a particular array); optionally the
  current batch's indices and their rows, read once per step and handed over as an
  argument (:func:`dsgrad.fit`).

  Args:
    host: the :class:`HostArray`.
    handle: its int32 handle (``host.handle``, or a traced argument).
    batch: optional ``(indices, rows)``: reads at exactly these indices, or at indices
      all of which are among them, return these rows without another host read.
  """

  def __init__(self, host: HostArray, handle, batch=None):
    self.host, self.handle, self.batch = host, handle, batch

  shape = property(lambda self: self.host.shape)
  dtype = property(lambda self: self.host.dtype)
  ndim = property(lambda self: self.host.ndim)

  def __getitem__(self, index):
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
                            lambda: HostView(self.host, self.handle)[index])
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


def is_host(value) -> bool:
  """Whether a data value lives on the host (a :class:`HostArray`)."""
  return isinstance(value, HostArray)


def values_of(refs: Mapping[str, DataArray] | None) -> dict:
  """``{name: array}`` the handles ``refs`` hold."""
  return {k: r.value() for k, r in (refs or {}).items()}


def split_host(values: Mapping[str, Any]):
  """``(device_values, host_arrays)``: the pytree a jitted program takes as argument
  (device arrays and the host arrays' int32 handles; a :class:`HostView`'s handle as it
  is, maybe traced) and the host arrays themselves."""
  host = {k: (v.host if isinstance(v, HostView) else v) for k, v in values.items()
          if isinstance(v, (HostArray, HostView))}
  args = {k: (v.handle if isinstance(v, HostView) else jnp.int32(v.handle) if k in host
              else v) for k, v in values.items()}
  return args, host


def join_host(args: Mapping[str, Any], host: Mapping[str, HostArray]):
  """The values to :func:`substitute` inside a program that received ``split_host``'s
  args: host arrays as :class:`HostView` of their (traced) handles."""
  return {k: (HostView(host[k], v) if k in host else v) for k, v in args.items()}


def with_batch_rows(values: Mapping[str, Any], indices, rows: Mapping[str, Any]) -> dict:
  """``values`` (from :func:`join_host`) where each host array's view also holds this
  step's ``indices`` and their ``rows`` (read ahead on the host and handed over as an
  argument), so that the step's reads of them need no host callback."""
  return {k: (HostView(v.host, v.handle, (indices, rows[k]))
              if isinstance(v, HostView) and k in rows else v) for k, v in values.items()}


# ------------------------------------------------------------------ substitution
# Objects a copy never looks into: they hold no handles, or are not ours to copy.
_OPAQUE = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType,
           types.BuiltinFunctionType, np.ndarray, np.generic, np.dtype, jax.Array,
           jax.core.Tracer, HostArray, HostView, DataArray)


def _children(obj):
  """The objects ``obj`` refers to that a copy may need to replace, or ``None`` when
  ``obj`` is not copied into (opaque)."""
  if isinstance(obj, _OPAQUE):
    return None
  if isinstance(obj, types.FunctionType):
    cells = [c.cell_contents for c in (obj.__closure__ or ()) if _filled(c)]
    return cells + list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
  if isinstance(obj, functools.partial):
    return [obj.func, *obj.args, *obj.keywords.values()]
  if isinstance(obj, types.MethodType):
    return [obj.__func__, obj.__self__]
  if isinstance(obj, (tuple, list)):
    return list(obj)
  if isinstance(obj, dict):
    return list(obj.values())
  if dataclasses.is_dataclass(obj) or type(obj).__module__.split(".")[0] in ("dsgrad",
                                                                           "benchmarks"):
    return list(_attributes(obj).values())
  if _is_wrapper(obj):  # looked into, to know whether it reads a handle: not copied
    return [obj.__wrapped__]
  return None


def _is_wrapper(obj) -> bool:
  """A callable wrapping another that a copy cannot rebuild (``jax.jit``'s, a memoizing
  cache's): it may hold results computed from the handles' old values."""
  return not isinstance(obj, types.FunctionType) and callable(getattr(obj, "__wrapped__", None))


def _filled(cell) -> bool:
  try:
    cell.cell_contents
  except ValueError:  # a cell not yet assigned
    return False
  return True


def _attributes(obj) -> dict:
  out = {}
  for cls in type(obj).__mro__:
    for slot in getattr(cls, "__slots__", ()):
      if hasattr(obj, slot):
        out[slot] = getattr(obj, slot)
  out.update({k: v for k, v in getattr(obj, "__dict__", {}).items()
              if not k.startswith("_cached_")})
  return out


def _reaching(root, targets) -> set:
  """ids of the objects from which a handle whose origin is in ``targets`` is reachable."""
  edges, seen, stack, handles = {}, {}, [root], []
  while stack:
    obj = stack.pop()
    if id(obj) in seen:
      continue
    seen[id(obj)] = obj
    if isinstance(obj, DataArray):
      if id(obj.origin) in targets:
        handles.append(id(obj))
      continue
    children = _children(obj)
    if children is None:
      continue
    edges[id(obj)] = [id(c) for c in children]
    stack.extend(children)
  parents: dict = {}
  for parent, kids in edges.items():
    for kid in kids:
      parents.setdefault(kid, []).append(parent)
  reach, stack = set(handles), list(handles)
  while stack:
    for parent in parents.get(stack.pop(), ()):
      if parent not in reach:
        reach.add(parent)
        stack.append(parent)
  return reach


def substitute(obj, refs: Mapping[str, DataArray] | None, values: Mapping[str, Any],
               *, new_data: bool = False):
  """A copy of ``obj`` whose data handles hold ``values`` instead of their arrays.

  Every handle reachable from ``obj`` (through closures, default arguments, partials,
  bound methods, tuples, lists, dicts, dataclasses and dsgrad's own objects) whose origin
  is one of ``refs``' is replaced by a new handle holding ``values[name]``; every object on
  the way to one is copied, and everything else is shared. ``obj`` itself is unchanged.
  Used at trace time with traced values: the copy's functions then compute with the
  program's arguments (what :meth:`dsgrad.Objective.with_data`, :func:`jit` and
  :func:`dsgrad.fit`'s segments do).

  Args:
    obj: anything: an objective, a model, an optax transformation, a function, a tuple.
    refs: ``{name: DataArray}``, the handles to replace (their copies match too).
    values: ``{name: value}`` for every key of ``refs``: arrays, tracers,
      :class:`HostArray` or :class:`HostView`.

    new_data: ``values`` are other data (``with_data``): a handle reached through a
      wrapper a copy cannot rebuild (``jax.jit``, a memoizing cache) is then an error
      (the copy would compute with the old data); otherwise it reads them as constants.

  Returns:
    ``obj`` with those handles holding ``values`` (``obj`` itself when it reaches none).

  Raises:
    ValueError: a key of ``refs`` without a value; with ``new_data``, a handle behind a
      wrapper.
  """
  refs = dict(refs or {})
  missing = set(refs) - set(values)
  if missing:
    raise ValueError(f"no value given for data {sorted(missing)}")
  targets = {id(r.origin): values[k] for k, r in refs.items()}  # refs keep the origins alive
  if not targets:
    return obj
  reach = _reaching(obj, targets)
  memo: dict = {}

  def copy_of(x):
    key = id(x)
    if key not in reach:
      return x
    if key in memo:
      return memo[key]
    if isinstance(x, DataArray):
      memo[key] = out = DataArray._copy_holding(targets[id(x.origin)], x)
      return out
    if _is_wrapper(x):
      if new_data:
        raise ValueError(
            f"the model reads its data through {type(x).__name__} "
            f"{getattr(x, '__qualname__', '')!r}, a wrapper (jax.jit, a memoizing cache) "
            "that a copy on other data cannot rebuild: it would go on computing with the "
            "old arrays. Call the wrapped function directly in the model (jit the step "
            "that takes the objective instead), or build the model on the new data")
      return x
    if isinstance(x, types.FunctionType):
      cells = tuple(types.CellType() for _ in (x.__closure__ or ()))
      out = types.FunctionType(x.__code__, x.__globals__, x.__name__, None, cells or None)
      memo[key] = out
      for new, old in zip(cells, x.__closure__ or ()):
        if _filled(old):
          new.cell_contents = copy_of(old.cell_contents)
      out.__defaults__ = tuple(copy_of(d) for d in x.__defaults__ or ()) or None
      out.__kwdefaults__ = ({k: copy_of(v) for k, v in x.__kwdefaults__.items()}
                            if x.__kwdefaults__ else None)
      out.__dict__.update(x.__dict__)
      # The copy computes what ``x`` computes, on other data: the same model for every
      # cache and check keyed by functions (dsgrad.objective.function_key).
      out.__dict__.setdefault("_dsgrad_function_key", x)
      out.__qualname__, out.__doc__, out.__module__ = x.__qualname__, x.__doc__, x.__module__
      return out
    if isinstance(x, functools.partial):
      out = functools.partial(copy_of(x.func), *[copy_of(a) for a in x.args],
                              **{k: copy_of(v) for k, v in x.keywords.items()})
    elif isinstance(x, types.MethodType):
      out = types.MethodType(copy_of(x.__func__), copy_of(x.__self__))
    elif isinstance(x, list):
      memo[key] = out = []
      out.extend(copy_of(v) for v in x)
    elif isinstance(x, dict):
      memo[key] = out = type(x)() if type(x) is dict else copy.copy(x)
      out.update({k: copy_of(v) for k, v in x.items()})
    elif isinstance(x, tuple):
      items = [copy_of(v) for v in x]
      out = type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    else:
      memo[key] = out = copy.copy(x)
      for name, value in _attributes(x).items():
        object.__setattr__(out, name, copy_of(value))
      hook = getattr(out, "_after_substitute", None)
      if hook is not None:
        hook()
    memo[key] = out
    return out

  return copy_of(obj)


def _check_finite_leaf(value, label: str) -> None:
  """Refuses NaN or inf in an in-memory floating data leaf, and float64 values beyond
  float32's range where JAX would cast them to inf (checked before that cast). Host and
  memory-mapped arrays are left to their loaders, which read them in chunks."""
  # A handle's array was checked when the handle was made.
  if isinstance(value, (DataArray, HostArray, HostView, jax.core.Tracer)) or \
      not hasattr(value, "dtype") and not isinstance(value, (list, tuple)):
    return
  dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype
  checks.check_numeric_dtype(dtype, label)
  if not np.issubdtype(dtype, np.inexact):
    return
  if isinstance(value, jax.Array):  # on the device already: its values, not a copy
    with jax.ensure_compile_time_eval():  # eager even while a caller is being traced
      if not bool(jnp.all(jnp.isfinite(value))):
        raise ValueError(f"{label} contains non-finite values (NaN or inf)")
    return
  array = np.asarray(value)
  checks.check_float32_range(array, label, cast=array.dtype.itemsize > 4
                             and not jax.config.jax_enable_x64)


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
    shape = (np.shape(value) if not isinstance(value, (HostArray, HostView, DataArray))
             else value.shape)
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


def jit(refs: Mapping[str, DataArray] | None, fn):
  """``jax.jit(fn)`` with the arrays behind ``refs`` passed as arguments.

  At each call the arrays the handles ``fn`` reaches hold become arguments of the
  compiled program, which runs a :func:`substitute` copy of ``fn`` reading them, so a
  cached compilation never holds stale data and never embeds them as constants; a
  :func:`substitute` copy of the caller (e.g. an estimator on other data) passes its own
  arrays to the same compilation. Use it for every jitted function that reads data
  handles and is called more than once (e.g. an estimator's initial full pass).

  Args:
    refs: ``{name: DataArray}`` (``objective.data``); ``None`` or empty: plain ``jax.jit``.
    fn: the function; its own arguments are passed through.

  Returns:
    A callable with ``fn``'s signature.
  """
  if not refs:
    return jax.jit(fn)
  refs = dict(refs)
  compiled: dict = {}

  def call(*args):
    data, host = split_host(values_of(refs))
    which = tuple(sorted(host))
    if which not in compiled:
      compiled[which] = jax.jit(as_argument(refs, fn, dict(host))[0])
    return compiled[which](data, *args)

  return call


def as_argument(refs: Mapping[str, DataArray] | None, fn, host=None):
  """``(wrapped, values)`` with ``wrapped(values, *args) == fn(*args)``, where
  ``wrapped`` computes with the ``values`` it is given (a :func:`substitute` copy of
  ``fn``): jit ``wrapped`` (or lower and compile it) to have the data as an argument of
  the compiled program instead of constants. ``values`` are the arrays ``refs`` hold now
  (host arrays as int32 handles)."""
  refs = dict(refs or {})
  values, found = split_host(values_of(refs))
  host = found if host is None else host

  def wrapped(data, *args):
    return substitute(fn, refs, join_host(data, host))(*args)

  return wrapped, values
