"""Per-datum tables and full passes over the data: the memory layout of the stateful
estimators, shared by the estimators, the diagnostics and the MCMC proxies.

A *table* is a pytree whose leaves have a leading datum axis ``N`` (one row per datum):
the SAGA and ``inc`` tables of parameters, or a compact table of per-datum statistics.
:func:`set_rows` writes a batch's rows so that XLA updates a donated table in place.
A *full pass* evaluates a batch function over all ``N`` data in chunks inside ``jit``
(:func:`full_pass_mean`, :func:`full_pass_rows`), in the memory of one chunk. A mean
kept from a full pass belongs to the data it read: :func:`data_digest` marks them, and
:func:`for_data` has a state continued on other data make its pass again.

Example::

    >>> import jax.numpy as jnp
    >>> from dsgrad import tables
    >>> table = tables.new_table({"w": jnp.zeros(2)}, num_data=4)
    >>> table = tables.set_rows(table, jnp.array([1, 3]), {"w": jnp.ones(2)})
    >>> table["w"].sum(axis=1).tolist()
    [0.0, 2.0, 0.0, 2.0]
    >>> float(tables.full_pass_mean(lambda idx: jnp.mean(idx * 1.0), 10, chunk_size=4))
    4.5
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks

__all__ = ["EMPTY_TABLE", "new_table", "gather_rows", "set_rows", "set_row_values", "first_occurrence",
           "full_pass_rows", "full_pass_chunk", "full_pass_mean", "tree_bytes",
           "FULL_PASS_CHUNK_BYTES", "data_digest", "for_data"]

# The table of params without leaves (optax's ``tree.map_params`` placeholder): a leaf, so
# that a state's table field is never mistaken for params.
EMPTY_TABLE = np.zeros((0,), np.float32)


def new_table(params, num_data: int, dtype=None):
  """A per-datum table with every row equal to ``params`` (leaves ``(N, *shape)``)."""
  if not jax.tree.leaves(params):
    return EMPTY_TABLE
  return jax.tree.map(
      lambda p: jnp.broadcast_to(jnp.asarray(p, dtype or jnp.asarray(p).dtype),
                                 (num_data,) + jnp.shape(p)), params)


def gather_rows(table, indices, like):
  """Rows ``table[indices]`` cast to the dtypes of ``like``."""
  return jax.tree.map(lambda t, p: t[indices].astype(p.dtype), table, like)


def set_rows(table, indices, params):
  """``table[indices] = params`` for every index (duplicates write the same value).

  Written so that XLA updates a donated table in place. When the rows read earlier in
  the step (``table[indices]``) and the values written do not depend on each other, XLA
  cannot order the read before the in-place write and copies the whole table (measured:
  ~300 ms instead of ~2 ms per step for a 377 MB table). Selecting the new values with a
  condition that is true for every index that can write (``index >= -N``; JAX wraps
  negative indices) but that XLA cannot fold makes the written values depend on the
  read rows, which removes the copy.
  """
  return set_row_values(table, indices, jax.tree.map(
      lambda t, p: jnp.broadcast_to(p, indices.shape + t.shape[1:]), table, params))


def set_row_values(table, indices, values):
  """``table[indices[b]] = values[b]`` (leaves of ``values`` are ``(B, ...)``), in place
  for a donated table (see :func:`set_rows`). Repeated indices must carry equal values."""
  def one(t, v):
    old = t[indices]
    keep_new = (indices >= -t.shape[0]).reshape((-1,) + (1,) * (t.ndim - 1))
    return t.at[indices].set(jnp.where(keep_new, v.astype(t.dtype), old))
  return jax.tree.map(one, table, values)


def first_occurrence(indices):
  """Boolean mask: ``True`` where ``indices[b]`` has not appeared earlier in the batch.

  A stable sort, ``O(B log B)`` (the ``B x B`` comparison it replaces cost 10^6
  comparisons a step at ``B = 1,000``).
  """
  order = jnp.argsort(indices, stable=True)
  ranked = indices[order]
  first_in_sorted = jnp.concatenate([jnp.ones((1,), bool), ranked[1:] != ranked[:-1]])
  return jnp.zeros(indices.shape, bool).at[order].set(first_in_sorted)


def full_pass_rows(batch_fn: Callable[[jax.Array], Any], num_data: int, chunk_size: int):
  """``batch_fn(arange(N))`` computed in chunks inside ``jit``: per-datum outputs (leaves
  with leading axis ``N``) while reading at most ``chunk_size`` data at a time (a table's
  initial rows from data that live on the host or on disk)."""
  chunk_size = max(1, min(int(chunk_size), num_data))
  num_full, remainder = divmod(num_data, chunk_size)
  starts = chunk_size * jnp.arange(num_full, dtype=jnp.int32)
  parts = jax.lax.map(lambda s: batch_fn(s + jnp.arange(chunk_size, dtype=jnp.int32)), starts)
  rows = jax.tree.map(lambda v: v.reshape((num_full * chunk_size,) + v.shape[2:]), parts)
  if remainder:
    rest = batch_fn(num_full * chunk_size + jnp.arange(remainder, dtype=jnp.int32))
    rows = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), rows, rest)
  return rows


FULL_PASS_CHUNK_BYTES = 64 * 2**20
"""The data rows a full pass's default chunk reads: 64 MiB (see :func:`full_pass_chunk`)."""


@checks.arguments(chunk_size=checks.optional(checks.count(1)))
def full_pass_chunk(data, chunk_size: int | None = None) -> int:
  """``chunk_size``, or the default chunk of a full pass over ``data``: as many rows as
  hold :data:`FULL_PASS_CHUNK_BYTES`, at least 1,024 and at most 16,384 (1,024 where
  ``data`` has no array leaves to size a row by).

  On a GPU each iteration of a pass costs its kernel launches whatever its rows: on an
  H200 joint SVRG's refresh of 10^6 rows took 0.020-0.045 s in chunks of 1,024 rows
  against 0.001-0.015 s in chunks of 16,384; on two CPU cores 0.058-0.380 s against
  0.015-0.400 s (``python -m benchmarks scale-batch``). The bound in bytes keeps a chunk
  of wide rows (images, thousands of features) to 64 MiB of data, where 16,384 of them
  could take gigabytes.

  Args:
    data: the data pytree (``objective.data``); leaves with a leading datum axis.
    chunk_size: the caller's chunk, if given.

  Returns:
    Rows per chunk.
  """
  if chunk_size is not None:
    return int(chunk_size)
  # An array on the host (dsgrad.data.open_memmap) is a pytree whose leaf is its handle:
  # sized as the array it stands for, or its pass read 1,024 rows a callback.
  leaves = [x for x in jax.tree.leaves(data, is_leaf=lambda x: hasattr(x, "shape"))
            if hasattr(x, "dtype") and len(np.shape(x)) >= 1]
  if not leaves:
    return 1_024
  row = sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape[1:])) for x in leaves)
  return int(min(16_384, max(1_024, FULL_PASS_CHUNK_BYTES // max(row, 1))))


@checks.arguments(num_data=checks.count(1), chunk_size=checks.count(1))
def full_pass_mean(batch_mean_fn: Callable[[jax.Array], Any], num_data: int,
                   chunk_size: int):
  """Mean over all data of a batch-mean function, in chunks inside ``jit``.

  Args:
    batch_mean_fn: ``indices -> tree``, the mean over a batch of data; ``indices`` are
      always a range ``start + arange(size)`` (rows may be read as a slice:
      :func:`dsgrad.data.rows_of`'s ``contiguous``).
    num_data: ``N``.
    chunk_size: data per chunk; memory is that of one chunk.

  Returns:
    ``(1/N) sum_n value(n)`` as a tree. Cost: ``N`` evaluations in ``ceil(N/C)`` chunks.
  """
  chunk_size = max(1, min(int(chunk_size), num_data))

  def add(total, indices):
    return jax.tree.map(lambda t, v: t + v * indices.shape[0], total, batch_mean_fn(indices))

  # The first chunk outside the loop: it gives the total's structure and dtypes.
  first = jax.tree.map(lambda v: v * chunk_size, batch_mean_fn(jnp.arange(chunk_size)))
  total = full_pass_fold(add, first, num_data - chunk_size, chunk_size, start=chunk_size)
  return jax.tree.map(lambda t: t / num_data, total)


def full_pass_fold(add_chunk: Callable[[Any, jax.Array], Any], initial, num_data: int,
                   chunk_size: int, start: int = 0):
  """``initial`` folded with ``add_chunk(carry, indices)`` over the data ``start`` to
  ``start + num_data``, in chunks of ``chunk_size`` (the last one shorter) inside ``jit``:
  a ``lax.scan`` over the whole chunks, then the rest. For sums whose chunks add into a
  part of a large carry (a scatter into a ``d x d`` matrix), which a sum of per-chunk
  trees (:func:`full_pass_mean`) would build whole for every chunk.

  Args:
    add_chunk: ``(carry, indices) -> carry``; ``indices`` a range ``begin + arange(size)``.
    initial: the carry before any data.
    num_data: how many data to fold in (0: ``initial`` is returned).
    chunk_size: data per chunk.
    start: the first datum's index.
  """
  size = max(1, min(int(chunk_size), num_data))
  whole = num_data // size
  carry = initial
  if whole:
    carry, _ = jax.lax.scan(lambda c, begin: (add_chunk(c, begin + jnp.arange(size)), None),
                            carry, start + size * jnp.arange(whole))
  if num_data > whole * size:
    carry = add_chunk(carry, start + whole * size + jnp.arange(num_data - whole * size))
  return carry


def tree_bytes(tree) -> int:
  """Total bytes of the array leaves of a tree."""
  return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
                 for x in jax.tree.leaves(tree) if hasattr(x, "dtype")))


DIGEST_ROWS = 16
"""The evenly spaced rows (first and last included) that :func:`data_digest` reads."""


def data_digest(objective) -> jax.Array:
  """A uint32 digest of :data:`DIGEST_ROWS` evenly spaced rows of every data leaf: their
  bits times fixed odd weights, summed modulo 2^32 (exact in any order, so the same inside
  a compiled update and outside it). Two data sets of the same shapes that differ in those
  rows differ here; an objective without data gives a constant."""
  n = objective.num_data
  at = jnp.asarray(np.unique(np.linspace(0, n - 1, min(DIGEST_ROWS, n)).round()), jnp.int32)
  total = jnp.zeros((), jnp.uint32)
  for k, leaf in enumerate(jax.tree.leaves(objective.rows(at))):
    leaf = jnp.asarray(leaf)
    bits = (jax.lax.bitcast_convert_type(leaf.astype(jnp.float32), jnp.uint32)
            if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf.astype(jnp.uint32)).ravel()
    position = jnp.arange(bits.size, dtype=jnp.uint32) + jnp.uint32(k * 7919)
    total = total + jnp.sum(bits * (position * jnp.uint32(2654435761) | jnp.uint32(1)),
                            dtype=jnp.uint32)  # under x64 a sum would be uint64
  return total


def for_data(opt_state, objective):
  """``opt_state`` with every estimator state whose full-data mean was computed on other
  data than ``objective``'s (a :meth:`~dsgrad.Objective.with_data` copy, another fold) set
  to make its full pass again at its next update: its ``count`` back to 0, so joint SAGA
  fills its running mean (and warms up) again and joint SVRG takes a snapshot. Kept, the
  old mean would bias every gradient after it (joint SAGA's for good). States without a
  ``data_digest`` field, and those not filled yet, are returned as they are."""
  is_state = lambda s: hasattr(s, "data_digest")  # noqa: E731
  filled = [s for s in jax.tree.leaves(opt_state, is_leaf=is_state)
            if is_state(s) and int(s.count) > 0]
  if not filled:
    return opt_state
  digest = int(data_digest(objective))  # read only where a filled state asks

  def one(state):
    if not is_state(state) or int(state.count) == 0 or int(state.data_digest) == digest:
      return state
    return state._replace(count=jnp.zeros_like(state.count))

  return jax.tree.map(one, opt_state, is_leaf=is_state)
