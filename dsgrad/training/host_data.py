"""Per-datum arrays kept in host memory or memory-mapped from disk (never on a device),
and the reads that feed their rows to compiled programs.

A :class:`HostArray` holds the array; compiled programs name it by a small integer handle
(an argument), so one program serves every host array of the same shape and dtype. Inside
``jit`` rows are read by a host callback (:func:`host_gather`); :class:`RowReader` reads
whole blocks of future batches on a thread so that :func:`dsgrad.fit`'s steps receive
their rows as an argument instead. :mod:`dsgrad.data` puts these arrays behind a model's
handles and re-exports the public names here.

Example::

    >>> import numpy as np
    >>> from dsgrad.training.host_data import HostArray
    >>> x = HostArray(np.arange(12.0).reshape(6, 2), "x")
    >>> x.rows([4, 1]).tolist()
    [[8.0, 9.0], [2.0, 3.0]]
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks, data_values, tables


def free_memory_bytes() -> int | None:
  """Memory a new array could take now on the default device: its allocator's free bytes
  where it reports them (GPUs), else the host's available memory (``MemAvailable``: free
  pages and reclaimable cache); ``None`` when neither is known."""
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001 -- some backends do not implement memory_stats
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
  except (ValueError, OSError, AttributeError):
    return None


def check_training_state_fits(optimizer, params, num_data: int, who: str) -> None:
  """Refuses, before anything is allocated, training whose state does not fit in the free
  memory (:func:`free_memory_bytes`): a copy of the params, a step's gradient (as large)
  and the optimizer's state (the update fuses into the step; other temporaries come on
  top, so the estimate errs low rather than refuse a run that fits). A full-rank family
  over 40,000 latents (a 6.4 GB factor) ended in XLA's bare RESOURCE_EXHAUSTED, or in
  the process killed by the kernel. Leaves with a row per datum (an estimator's table)
  are left to the estimator's own check, which names the compact tables that serve
  instead."""
  leaves = jax.tree.leaves(params)
  if not all(hasattr(p, "dtype") and hasattr(p, "shape") for p in leaves):
    return  # numbers or lists where arrays belong: fit's own checks name them
  free = free_memory_bytes()
  params_bytes = tables.tree_bytes(leaves)
  # No optimizer keeps more than a few copies of the params besides per-datum tables: the
  # abstract trace of its init is skipped where even eight would fit.
  if free is None or 8 * params_bytes <= free or any(
      isinstance(p, jax.core.Tracer) for p in leaves):
    return
  state_bytes = tables.tree_bytes([x for x in jax.tree.leaves(jax.eval_shape(
      optimizer.init, params)) if not (x.ndim and x.shape[0] == num_data)])
  need = 2 * params_bytes + state_bytes
  if need <= free:
    return
  path, largest = max(jax.tree_util.tree_leaves_with_path(params), key=lambda p: np.size(p[1]))
  size = lambda b: f"{b / 2**30:,.2f} GiB" if b >= 2**30 else f"{b / 2**20:,.1f} MiB"
  raise MemoryError(
      f"{who}: training needs about {size(need)} more: a copy of the params and a step's "
      f"gradient ({size(params_bytes)} each; the largest leaf, "
      f"params{jax.tree_util.keystr(path)}, has shape {tuple(np.shape(largest))}) and the "
      f"optimizer's state ({size(state_bytes)}), but {size(free)} are free on "
      f"{jax.devices()[0].platform}. Fewer parameters (the mean-field family: "
      "family='meanfield', O(d) where full-rank is O(d^2)) or an optimizer with less state "
      "(optax.sgd keeps none) would fit.")


class HostSpec(NamedTuple):
  """What a program knows of a host array: its shape, dtype and name (static)."""

  shape: tuple
  dtype: Any
  name: str


LOOKUP_BATCHES = 4  # the most batches' worth looked up (HostArray.from_batch)


class HostArray:
  """A per-datum array kept in host memory (or on disk, memory-mapped), never on device.

  Rows are read on demand (``host_array[indices]``): eagerly by NumPy indexing, inside
  ``jit`` by a host callback (``jax.pure_callback``) that receives the indices and returns
  their rows. The callback identifies the array by a small integer handle, an argument of
  the program (a host array is a pytree whose one leaf is its handle,
  :mod:`dsgrad.data`), so one compiled program serves every host array of the same shape
  and dtype. Inside a program the array is a view: its :class:`HostSpec`, its (traced)
  handle and, in :func:`dsgrad.fit`'s steps, the batch's rows read ahead (``batch``).

  Attributes:
    array: the NumPy array or ``np.memmap`` (``None`` in a view inside a program).
    name: label for messages.
    batch: ``None``, or ``(indices, rows)``: reads at exactly these indices, or at indices
      all of which are among them, return these rows without another host read.
  """

  batch = None

  _registry: "weakref.WeakValueDictionary[int, HostArray]" = weakref.WeakValueDictionary()
  _next = [1]
  _lock = threading.Lock()

  def __init__(self, array, name: str = "host array"):
    array = np.asarray(array) if not isinstance(array, np.ndarray) else array
    if array.ndim < 1:
      raise ValueError(f"{name}: a per-datum array needs a leading datum axis, got a scalar")
    if array.dtype.kind not in "biuf":
      raise TypeError(f"{name}: dtype {array.dtype} is not numeric")
    # A row whose values lie apart on disk (Fortran order, as np.save of pandas'
    # DataFrame.to_numpy() writes it) makes each batch read from all over the file.
    if (isinstance(array, np.memmap) and array.ndim > 1 and len(array)
        and not array[0].flags.c_contiguous):
      raise ValueError(f"{name}: {getattr(array, 'filename', None)!r} is in Fortran "
                       "(column-major) order, as np.save of pandas' DataFrame.to_numpy() "
                       "writes it: a row's values lie a column apart on disk. Save it in "
                       "row order: np.save(path, np.ascontiguousarray(array))")
    self.array = array
    self.name = name
    # Rows reach programs in JAX's dtype for the array's (float32 and int32 for 64-bit
    # files unless x64 is on), cast as they are read: as jnp.asarray casts data in memory.
    self.spec = HostSpec(tuple(array.shape),
                         np.dtype(jax.dtypes.canonicalize_dtype(array.dtype)), name)
    # A memory map reads the file lazily: if the file is truncated or rewritten after it
    # was opened, a read past the new end kills the process (SIGBUS) and a rewritten one
    # reads other (or zero) bytes. Its identity is recorded here and checked per read.
    filename = getattr(array, "filename", None) if isinstance(array, np.memmap) else None
    self._file = (filename, file_identity(filename)) if filename else None
    with HostArray._lock:
      self.handle = HostArray._next[0]
      HostArray._next[0] += 1
      HostArray._registry[self.handle] = self

  shape = property(lambda self: self.spec.shape)
  dtype = property(lambda self: self.spec.dtype)
  ndim = property(lambda self: len(self.spec.shape))

  @classmethod
  def view(cls, spec: HostSpec, handle, batch=None) -> "HostArray":
    """The array as a program sees it: ``spec``, a (maybe traced) ``handle`` and
    optionally the batch's ``(indices, rows)``."""
    out = object.__new__(cls)
    out.array, out.name, out.spec, out._file = None, spec.name, spec, None
    out.handle, out.batch = handle, batch
    return out

  def from_batch(self, index) -> bool:
    """Whether a read inside a step is served by the batch's rows read ahead: its indices
    are the batch's or made from them (the batch twice), looked up among those rows. The
    lookup compares every index with every batch row: a full pass's chunk (16,384 against
    500) found none, 1.3 s of a refresh of 10^7 rows; more indices than
    :data:`LOOKUP_BATCHES` batches' worth are read from the host."""
    if self.batch is None or index is self.batch[0]:
      return self.batch is not None
    return (jnp.ndim(index) >= 1 and jnp.issubdtype(jnp.result_type(index), jnp.integer)
            and jnp.size(index) <= LOOKUP_BATCHES * jnp.size(self.batch[0]))

  def __getitem__(self, index):
    if self.batch is not None and index is not self.batch[0]:
      index = jnp.asarray(index)
    if self.from_batch(index):
      batch_index, rows = self.batch
      if index is batch_index:
        return rows  # this step's rows, already read
      match = index[..., None] == batch_index
      found = jnp.all(jnp.any(match, axis=-1))
      return jax.lax.cond(found, lambda: rows[jnp.argmax(match, axis=-1)],
                          lambda: HostArray.view(self.spec, self.handle)[index])
    if isinstance(index, tuple):
      raise TypeError(f"{self.name}: host data support row indexing x[indices] only")
    if not isinstance(index, jax.core.Tracer) and not isinstance(self.handle, jax.core.Tracer):
      # device_put: jnp.asarray of a NumPy array compiles a program for each new shape.
      return jax.device_put(host_gather(self.handle, np.asarray(index)))
    index = jnp.asarray(index)
    if not jnp.issubdtype(index.dtype, jnp.integer):
      raise TypeError(f"{self.name}: host data support integer row indices only, got "
                      f"{index.dtype}")
    out = jax.ShapeDtypeStruct(index.shape + tuple(self.shape[1:]), self.dtype)
    return jax.pure_callback(host_gather, out, self.handle, index, vmap_method="expand_dims")

  def __len__(self):
    return self.shape[0]

  def __array__(self, dtype=None, copy=None):
    # Without it np.asarray(host_array) reads it as a sequence, a row per __getitem__:
    # the range of one index column of 2,000,000 rows took 410 s.
    if self.array is None:
      raise TypeError(f"{self.name}: inside a program a host array is read by rows "
                      "(host_array[indices]), not whole")
    self.check_unchanged()
    out = np.asarray(self.array, dtype)  # a memory map stays one: read as it is used
    return out.copy() if copy else out

  def __repr__(self):
    return f"HostArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"

  def rows(self, indices) -> np.ndarray:
    """The rows ``array[indices]`` read on the host, in the order of ``indices``.

    Read in that order: sorting a block's indices first (for sequential reads) did not
    make reads from disk faster on the machine of ``docs/benchmarks.md`` and made reads
    of cached pages about three times slower (the sort, and putting the rows back in
    order). The result is aligned to 64 bytes, so that ``jax.device_put`` on a CPU
    device can use it in place instead of copying it."""
    self.check_unchanged()
    idx = np.asarray(indices)
    if not np.issubdtype(idx.dtype, np.integer):
      # astype would truncate 1.7 to row 1.
      raise TypeError(f"{self.name}: row indices must be integers, got {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    flat = idx.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= self.shape[0]):
      raise IndexError(f"{self.name}: indices outside [0, {self.shape[0]})")
    out = aligned_empty((flat.size,) + self.shape[1:], self.dtype)
    # mode="clip" (the indices are checked above): "raise" would read through a buffer.
    if self.array.dtype == self.dtype:
      np.take(self.array, flat, axis=0, out=out, mode="clip")
    else:
      self._narrow(np.take(self.array, flat, axis=0, mode="clip"), out)
    return out.reshape(idx.shape + self.shape[1:])

  def _narrow(self, rows: np.ndarray, out: np.ndarray) -> None:
    """``rows`` (the file's 64-bit dtype) cast into ``out``, refusing values the cast
    would change: beyond int32's range (they would wrap to other rows' indices) or
    float32's (they would become inf)."""
    with np.errstate(over="ignore"):  # an overflow is what the check below refuses
      out[...] = rows
    if np.issubdtype(out.dtype, np.integer):
      data_values.check_int32_range(rows, self.name)
    elif np.isfinite(rows[np.isinf(out)]).any():
      raise ValueError(f"{self.name} holds {rows.dtype} values beyond {out.dtype}'s range, "
                       f"in which JAX computes (jax_enable_x64 is off); rescale them or "
                       f"save the file as {out.dtype}")

  def check_unchanged(self) -> None:
    """Raises ``ValueError`` if the memory-mapped file was truncated or rewritten since
    it was opened (a no-op for an in-memory array)."""
    if self._file is None:
      return
    path, opened = self._file
    try:
      now = file_identity(path)
    except OSError as error:
      raise ValueError(f"{self.name}: the memory-mapped file {path!r} is gone ({error}); "
                       "reopen it") from error
    if now != opened:
      raise ValueError(
          f"{self.name}: the memory-mapped file {path!r} changed after it was opened (size "
          f"{opened[0]:,} -> {now[0]:,} bytes, or rewritten): reading it would crash the "
          "process or return other rows. Reopen it (dsgrad.data.open_memmap) once it is "
          "complete")


def check_finite_rows(host_data: dict, indices) -> None:
  """Raises ``ValueError`` naming the first of ``indices`` at which a floating leaf of
  ``host_data`` (``{name: HostArray}``) holds NaN or inf. Data in memory are refused
  where they enter; a file's rows, only where a step has failed (checking every block as
  it is read cost as much as reading it, and a scan at opening reads every byte)."""
  flat = np.unique(np.asarray(indices).reshape(-1))
  for leaf in host_data.values():
    if not np.issubdtype(leaf.dtype, np.inexact):
      continue
    for start in range(0, flat.size, 4096):
      rows = flat[start:start + 4096]
      bad = ~np.isfinite(leaf.rows(rows).reshape(rows.size, -1)).all(axis=1)
      if bad.any():
        raise ValueError(f"{leaf.name}: row {int(rows[np.argmax(bad)]):,} holds NaN or inf "
                         "(read from the host while training; the step that used it failed)")


def file_identity(path) -> tuple:
  """(size, modification time, inode) of a file: what changes if it is rewritten."""
  info = os.stat(path)
  return info.st_size, info.st_mtime_ns, info.st_ino


def aligned_empty(shape, dtype, alignment: int = 64) -> np.ndarray:
  """An uninitialized C-contiguous array whose data start at a multiple of ``alignment``
  bytes (NumPy's own large allocations are 16-byte aligned)."""
  size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  raw = np.empty(size + alignment, np.uint8)
  start = -raw.ctypes.data % alignment
  return raw[start:start + size].view(dtype).reshape(shape)


_READ_INTERRUPTED = threading.Event()


def host_gather(handle, indices):
  """The rows of the live host array numbered ``handle``: the host side of a callback."""
  try:
    # Under vmap the handle arrives with the indices' added axes; every entry is the same.
    number = int(np.asarray(handle).reshape(-1)[0])
    array = HostArray._registry.get(number)
    if array is None:
      raise ValueError(f"host array handle {number} is no longer alive")
    return array.rows(indices)
  except KeyboardInterrupt:  # XLA reports it as its own error: marked for reads_interruptible
    _READ_INTERRUPTED.set()
    raise


@contextlib.contextmanager
def reads_interruptible():
  """Re-raises, as the ``KeyboardInterrupt`` it is, a Ctrl-C that struck while a program
  read host rows (:func:`host_gather`): XLA reports an exception raised in a callback as a
  ``JaxRuntimeError``, which the callers that keep a run on an interrupt did not catch."""
  _READ_INTERRUPTED.clear()
  try:
    yield
  except jax.errors.JaxRuntimeError as error:
    if not (_READ_INTERRUPTED.is_set() or "KeyboardInterrupt" in str(error)):
      raise
    _READ_INTERRUPTED.clear()
    raise KeyboardInterrupt from None


def interruptible(function):
  """``function`` (which runs a compiled program) under :func:`reads_interruptible`."""
  @functools.wraps(function)
  def call(*args, **kwargs):
    with reads_interruptible():
      return function(*args, **kwargs)
  return call


def open_memmap(path, *, dtype=None, shape=None, name: str | None = None) -> HostArray:
  """Opens a ``.npy`` file memory-mapped (read-only) as a :class:`HostArray`.

  Args:
    path: a ``.npy`` file (written by ``np.save`` or ``np.lib.format.open_memmap``).
    dtype: the dtype the caller expects; a file of another dtype is refused.
    shape: the shape the caller expects (``None`` entries match anything).
    name: label for messages (default: the file name).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a ``.npy`` file, truncated (fewer bytes than its header declares), or
      a dtype/shape other than expected.
  """
  path = os.fspath(path)
  name = name or os.path.basename(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{name}: no such file {path!r}")
  checks.check_regular_file(path, name)
  with open(path, "rb") as f:
    try:
      version = np.lib.format.read_magic(f)
      header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)(f)
    except ValueError as error:
      raise ValueError(f"{name}: {path!r} is not a .npy file ({error})") from error
    offset = f.tell()
  file_shape, _, file_dtype = header  # Fortran order: refused by HostArray, as from np.load
  if file_dtype.hasobject or not (np.issubdtype(file_dtype, np.number)
                                  or np.issubdtype(file_dtype, np.bool_)):
    raise ValueError(f"{name}: {path!r} holds {file_dtype} values; data on disk must be a "
                     "numeric array (np.save of a float or integer array)")
  expected = offset + int(np.prod(file_shape, dtype=np.int64)) * file_dtype.itemsize
  actual = os.path.getsize(path)
  if actual < expected:
    raise ValueError(f"{name}: {path!r} is truncated: its header declares shape {file_shape} "
                     f"of {file_dtype} ({expected:,} bytes with the header) but the file has "
                     f"{actual:,} bytes")
  if dtype is not None and np.dtype(dtype) != file_dtype:
    raise ValueError(f"{name}: {path!r} holds {file_dtype}, expected {np.dtype(dtype)}; "
                     "convert the file (no silent cast)")
  if shape is not None:
    if len(shape) != len(file_shape) or any(
        s is not None and s != t for s, t in zip(shape, file_shape)):
      raise ValueError(f"{name}: {path!r} has shape {file_shape}, expected {tuple(shape)}")
  array = np.load(path, mmap_mode="r")
  return HostArray(array, name)


def read_rows(host_arrays: Mapping[str, HostArray], indices) -> dict:
  """``{name: rows}`` of every host array at ``indices`` (any shape), read on the host."""
  idx = np.asarray(indices)
  return {k: a.rows(idx) for k, a in host_arrays.items()}


class RowReader:
  """Reads blocks of future batches' rows of host arrays on a background thread.

  ``submit(indices)`` starts reading the rows of an ``(S, B)`` block of batch indices for
  every host array and copying them to the device; ``take()`` waits for them and returns
  ``{name: (S, B, ...) jax.Array}``. :func:`dsgrad.fit` submits block ``t + 1`` before it
  runs block ``t`` on the device, so the disk and host reads *and the host-to-device copy*
  of the next steps overlap the current steps' computation, and the compiled steps
  receive their rows as an argument (no host callback in a step, and no copy on the
  dispatching thread, where passing NumPy rows to the compiled call would copy them;
  ``python -m benchmarks scale steps`` measures a step with its rows on the device).

  Args:
    host_arrays: ``{name: HostArray}``.
    placement: where the rows go (a device or a sharding, as for ``jax.device_put``);
      default the default device.
  """

  def __init__(self, host_arrays: Mapping[str, HostArray], placement=None):
    self.arrays = dict(host_arrays)
    self.placement = placement
    self._thread = None
    self._result = None
    self._error = None

  def submit(self, indices, steps: int | None = None) -> None:
    """Starts reading the rows of the ``(S, B)`` batch ``indices`` (waits for the block
    in flight first), followed by zero rows up to ``steps`` batches where given (a
    program of ``steps`` steps that runs ``S`` of them)."""
    self.take_pending()
    idx = np.asarray(indices)
    pad = 0 if steps is None else steps - len(idx)

    def padded(rows):
      return {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) if pad else v
              for k, v in rows.items()}

    def read():
      try:
        self._result = jax.block_until_ready(
            jax.device_put(padded(read_rows(self.arrays, idx)), self.placement))
      except BaseException as error:  # re-raised by take()
        self._error = error

    self._thread = threading.Thread(target=read, daemon=True)
    self._thread.start()

  def take_pending(self):
    """Waits for the block in flight (if any) and returns its rows (``None`` if none)."""
    if self._thread is None:
      return None
    self._thread.join()
    self._thread = None
    result, error, self._result, self._error = self._result, self._error, None, None
    if error is not None:
      raise error
    return result

  def take(self) -> dict:
    """Waits for the submitted block and returns ``{name: (S, B, ...) rows}`` on the
    device."""
    rows = self.take_pending()
    if rows is None:
      raise RuntimeError("RowReader.take() without a submitted block")
    return rows


def on_device(value, name: str) -> jax.Array:
  """``value`` on the default device, or a ``MemoryError`` that names the way to keep it
  on disk when it does not fit (checked before copying, and on the device's refusal)."""
  if isinstance(value, jax.Array):
    return value
  nbytes = int(np.prod(np.shape(value), dtype=np.int64)) * np.result_type(value).itemsize
  free = free_memory_bytes()
  if free is not None and nbytes > free:
    raise MemoryError(_too_large(name, nbytes, free))
  try:
    # device_put copies a NumPy array in 2.5 s per 4 GB on CPU, where jnp.asarray took
    # 7-10 s; both cast to JAX's default dtypes (float64 to float32 without x64).
    return jax.device_put(value) if isinstance(value, np.ndarray) else jnp.asarray(value)
  except jax.errors.JaxRuntimeError as error:
    if "RESOURCE_EXHAUSTED" not in str(error):
      raise
    raise MemoryError(_too_large(name, nbytes, free)) from error


def _too_large(name: str, nbytes: int, free: int | None) -> str:
  room = f"the {free / 2**20:,.1f} MiB free" if free is not None else "the free memory"
  return (f"data {name!r}: {nbytes / 2**20:,.1f} MiB do not fit in {room} on "
          f"{jax.devices()[0].platform}. Keep it on disk and read each batch's rows from "
          f"there: save it once with np.save(path, array) and pass "
          f"dsgrad.data.open_memmap(path) in its place (dsgrad.data.HostArray(array) for "
          f"an array already in host memory).")
