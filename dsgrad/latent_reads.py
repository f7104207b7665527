"""Which latent rows each data row reads: declared (``reads={"b": "g"}``), found, checked.

A model whose datum ``n`` reads one group's row of a latent leaf (``z["b"][g[n]]``) and the
shared leaves has ``k`` latent coordinates per datum, not ``d``. Declared, that map gives
the model's :class:`~dsgrad.models.SparseLikelihood`: the coordinates of each row and a
likelihood computed from them alone (the latent rebuilt from a few rows), so that joint
SAGA keeps a table of ``N x 2k`` numbers and works ``O(k)`` per datum.

Ids numbered from 1 (or any base), ``z["b"][g - 1]``, are read with the base the model's
index check found (:attr:`dsgrad.models.Model.kinds`): the column's value less its base is
the leaf's row. A value below 0 that ``log_lik`` masks (``-1``: no group) reads nothing.

References:
  Wang, Geffner, Domke (2024), Sec. 4 (the joint control variate's table, one entry per
  datum); its sparse form is this library's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import data as data_lib
from dsgrad.models.base import Model, SparseLikelihood, local_and_full, probe_latent


def lowest_values(kinds) -> dict:
  """``{column: the least value its kind allows}`` for the index columns with one bound:
  0, or above 0 where ``log_lik`` shifts the column before indexing (``z["b"][g - 1]``: 1,
  the column's base: its value less the base is the leaf's row), or below 0 where it
  masks markers (``-1``: no group, ``jnp.where(g >= 0, z[g], 0)``; the base is 0, a marker
  reads nothing and keeps its value in the local likelihood)."""
  return {name: kind[2] if len(kind) == 3 else 0 for name, kind in kinds
          if kind[0] == "index" and all(isinstance(b, int) for b in kind[1:])}


def _index_columns(reads, data_names) -> list[str]:
  """The data columns named in ``reads``, in first-seen order."""
  columns = []
  for leaf, cols in reads.items():
    for col in (cols,) if isinstance(cols, str) else tuple(cols):
      if not isinstance(col, str):
        raise TypeError(f"reads[{leaf!r}] must name data columns (a string or a tuple of "
                        f"strings), got {col!r}")
      if col not in data_names:
        raise ValueError(f"reads[{leaf!r}] names the data column {col!r}; data has "
                         f"{sorted(data_names)}")
      if col not in columns:
        columns.append(col)
  return columns


def declared(reads, model: Model, latent, treedef, log_lik) -> SparseLikelihood:
  """The :class:`SparseLikelihood` of a ``log_lik`` whose row ``n`` reads, of each latent
  leaf named in ``reads``, only the rows given by the named data columns at ``n``, and
  reads every other leaf whole.

  Row ``n``'s coordinates: for a declared leaf of shape ``(R, *rest)`` and each of its
  columns ``c``, the ``prod(rest)`` coordinates of ``leaf[c[n]]`` (of ``leaf[c[n, j]]``
  for each ``j`` of a column ``(N, m)``); for every other leaf, all of its coordinates.
  The local likelihood calls the user's ``log_lik`` on one row at a time with a latent
  rebuilt from those coordinates: a declared leaf becomes a small array with one row
  per index read, and the row's index columns are replaced by their positions in it
  (plus the column's base, :func:`lowest_values`; a marker below it stays, and its
  coordinates are row 0's, where its gradient is zero). Work per row is proportional to
  ``k``, not to ``d``.
  """
  handles, lowest = model.data, lowest_values(model.kinds)
  layout, columns = _reads_layout(reads, latent, model.latent_dim, handles, lowest)
  base = {col: max(lowest.get(col, 0), 0) for col in columns}
  # Rows of a declared leaf one data row reads from a column: 1, or its width (N, m).
  per_row = {col: handles[col].shape[1] if handles[col].ndim == 2 else 1 for col in columns}
  position = dict(zip(columns, np.cumsum([0] + [per_row[c] for c in columns]).tolist()))
  k = sum(width * (sum(per_row[c] for c in cols) if cols else 1)
          for _, _, cols, width in layout)
  data_names = list(handles)

  def coordinates(rows):
    b = rows[data_names[0]].shape[0]
    leaf_row = lambda col: jnp.maximum(  # noqa: E731
        rows[col].astype(jnp.int32) - base[col], 0).reshape(b, per_row[col])
    return stacked_coordinates([(start, width, cols and [leaf_row(c) for c in cols])
                                for start, _, cols, width in layout], b)

  def local_latent(z_local):
    parts, at = [], 0
    for _, shape, cols, width in layout:
      if cols is None:
        parts.append(z_local[at:at + width].reshape(shape))
        at += width
        continue
      small = jnp.zeros((sum(per_row.values()),) + shape[1:], z_local.dtype)
      for col in cols:
        for j in range(per_row[col]):
          small = small.at[position[col] + j].set(z_local[at:at + width].reshape(shape[1:]))
          at += width
      parts.append(small)
    return jax.tree_util.tree_unflatten(jax.tree.structure(latent), parts)

  def log_likelihood_local(z_local, rows):
    rows = [rows[name] for name in data_names]

    def one(zl, row):
      # The row's index columns point into the small leaves local_latent builds.
      row = [jnp.where(leaf < base[col], leaf, (position[col] + base[col] + jnp.arange(
          per_row[col], dtype=leaf.dtype)).reshape(leaf.shape))[None] if col in position
             else leaf[None] for col, leaf in zip(data_names, row)]
      return log_lik(local_latent(zl), jax.tree_util.tree_unflatten(treedef, row))[0]

    return jax.vmap(one)(z_local, rows)

  return SparseLikelihood(k, coordinates, log_likelihood_local)


def stacked_coordinates(blocks, b: int) -> jax.Array:
  """``(b, k)`` latent coordinates of ``b`` data rows from ``blocks`` in ravel order:
  ``(start, width, rows)`` for a leaf of ``width`` coordinates per row starting at flat
  offset ``start``; ``rows`` ``None`` for a leaf read whole (its ``width`` coordinates),
  else the ``(b, m)`` leaf rows each data row reads, per index column."""
  pieces = []
  for start, width, rows in blocks:
    step = jnp.arange(width, dtype=jnp.int32)
    if rows is None:
      pieces.append(jnp.broadcast_to(start + step, (b, width)))
    for row in rows or ():
      pieces.append((start + row[:, :, None] * width + step).reshape(b, -1))
  return jnp.concatenate(pieces, axis=1)


def _reads_layout(reads, latent, d, handles, lowest) -> tuple[list, list]:
  """``reads`` checked against the latent and the data: ``[(offset, leaf shape, index
  columns or None for a leaf read whole, coordinates per read: one row's for a declared
  leaf, all of them for a leaf read whole)]`` in ravel order, and the index columns."""
  if not isinstance(reads, dict) or not reads:
    raise TypeError(f"reads must be a non-empty dict {{latent leaf: data column(s)}}, got "
                    f"{type(reads).__name__}")
  if isinstance(latent, (int, np.integer)):
    raise ValueError("reads needs a pytree latent whose leaves it can name (e.g. "
                     "latent={'beta': jnp.zeros(D), 'u': jnp.zeros(U)}), not a dimension")
  columns = _index_columns(reads, handles)
  leaves = jax.tree_util.tree_flatten_with_path(latent)[0]
  leaf_names = [data_lib.leaf_name(path) for path, _ in leaves]
  unknown = sorted(set(reads) - set(leaf_names))
  if unknown:
    raise ValueError(f"reads names latent leaves {unknown} that the latent does not have; "
                     f"it has {leaf_names}")
  for col in columns:
    # Whole-number floats that log_lik casts to an index (ids made float by a missing
    # value) are index columns too, once the index check found them (Model.kinds).
    if handles[col].ndim not in (1, 2) or not (
        jnp.issubdtype(handles[col].dtype, jnp.integer) or col in lowest):
      raise TypeError(f"data column {col!r} indexes latent rows (reads), so it must be an "
                      "integer array of one index per data row, (N,), or several, (N, m) "
                      "(or whole numbers that log_lik casts to one); got shape "
                      f"{handles[col].shape}, dtype {handles[col].dtype}")
  layout, offset = [], 0
  for leaf_name, (_, leaf) in zip(leaf_names, leaves):
    shape = tuple(np.shape(leaf))
    cols = reads.get(leaf_name)
    if cols is not None:
      cols = (cols,) if isinstance(cols, str) else tuple(cols)
      if not shape:
        raise ValueError(f"reads[{leaf_name!r}]: a scalar latent leaf has no rows to index")
      for col in cols:
        lo, hi = _column_range(handles[col])
        least = lowest.get(col, 0)
        base = max(least, 0)
        if lo < least or hi - base >= shape[0]:
          raise ValueError(f"data column {col!r} holds values in [{lo}, {hi}], but it "
                           f"indexes latent {leaf_name!r} with {shape[0]} rows "
                           f"(reads[{leaf_name!r}]" + (f", from {base})" if base else ")"))
    size = int(np.prod(shape, dtype=np.int64))
    layout.append((offset, shape, cols, size // shape[0] if cols else size))
    offset += size
  assert offset == d
  return layout, columns


def _column_range(column) -> tuple[int, int]:
  """``(min, max)`` of an index column, read in chunks (it may be memory-mapped)."""
  value = np.asarray(column)  # a memory map stays one: rows are read chunk by chunk
  lo, hi = None, None
  for start in range(0, int(value.shape[0]), 1 << 22):
    chunk = value[start:start + (1 << 22)]
    lo = chunk.min() if lo is None else min(lo, chunk.min())
    hi = chunk.max() if hi is None else max(hi, chunk.max())
  return int(lo), int(hi)


def found(model: Model, latent, declare) -> SparseLikelihood | None:
  """The reads the model's index columns make, found. Each data row's term is
  differentiated at a random latent on up to 16 rows spread over the data: a latent leaf
  of ``R`` rows whose moved rows are, on every such data row, among those that columns
  found to index ``R`` rows (:attr:`Model.kinds`, from 0 or their base) point to, is
  declared with the columns that point to a moved row on every data row
  (``declare(reads)``). Kept where
  the local likelihood the declaration gives equals the full one on 64 spread rows (a
  column also used as a value, a gradient zero by chance); ``None`` where nothing is
  found or kept."""
  kinds = dict(model.kinds)
  bases = {name: max(least, 0) for name, least in lowest_values(model.kinds).items()}
  sizes = {name: kinds[name][1] - base for name, base in bases.items()}  # the leaf's rows
  leaves = jax.tree_util.tree_flatten_with_path(latent)[0]
  if not any(np.ndim(leaf) and np.shape(leaf)[0] in sizes.values() for _, leaf in leaves):
    return None
  n, d = model.num_data, model.latent_dim
  z = probe_latent(d, 0.3, seed=1)
  rows = data_lib.few_rows(model.data, gradient_rows(n, d))
  moved = moved_coordinates(model.log_likelihood, z, rows)
  found, offset = {}, 0
  for path, leaf in leaves:
    shape, size = np.shape(leaf), int(np.size(leaf))
    offset += size
    columns = [c for c, rows_of in sizes.items() if shape and rows_of == shape[0]]
    if not columns:
      continue
    # (data rows, leaf rows): the leaf rows each data row's term moves.
    read = moved[:, offset - size:offset].reshape(len(moved), shape[0], -1).any(-1)
    touched = read.any(1)
    points = {c: np.maximum(np.asarray(rows[c]).reshape(len(read), -1).astype(np.int64)
                            - bases.get(c, 0), 0) for c in columns}  # float ids: cast
    used = [c for c in columns if touched.any()
            and np.take_along_axis(read, points[c], axis=1)[touched].all()]
    covered = np.zeros_like(read)
    for c in used:
      np.put_along_axis(covered, points[c], True, axis=1)
    if used and not (read & ~covered).any():
      found[data_lib.leaf_name(path)] = tuple(used)
  if not found:
    return None
  sparse = declare(found)
  checked = data_lib.few_rows(model.data, evenly_spread(n, 64))
  return sparse if _local_and_full(model, sparse, z, checked)[2] else None


def evenly_spread(n: int, m: int) -> np.ndarray:
  """Up to ``m`` distinct indices of ``n`` data, evenly spread from the first to the last."""
  return np.unique(np.linspace(0, n - 1, min(n, m)).astype(np.int32))


def gradient_rows(n: int, d: int) -> np.ndarray:
  """The spread data whose terms' gradients a search for reads takes: up to 16, at most
  2^26 numbers (256 MiB) in all."""
  return evenly_spread(n, max(1, min(16, 2 ** 26 // d)))


def moved_coordinates(log_likelihood, z, rows) -> np.ndarray:
  """``(len(rows), d)`` booleans: the coordinates of the flat latent ``z`` that each row's
  term of ``log_likelihood(z, rows)`` moves (its gradient is not zero), in one program.
  ``rows``: a pytree of per-row arrays (a model's data rows, or a bridge's indices)."""
  term = lambda zz, row: log_likelihood(zz, jax.tree.map(lambda v: v[None], row))[0]  # noqa: E731
  return np.asarray(jax.jit(jax.vmap(jax.grad(term), (None, 0)))(z, rows)) != 0


def _local_and_full(model: Model, sparse: SparseLikelihood, z, rows) -> tuple:
  """``(local, full, same)``: the log likelihood of ``rows`` at ``z`` from ``sparse``'s
  coordinates and from the whole latent, and whether they agree (to 1e-4)."""
  local, full = local_and_full(model, sparse, z, rows)
  # A term that is not finite (a datum the model deems impossible; fit refuses it with its
  # row) agrees where both give it, and leaves the tolerance to the finite terms.
  scale = np.abs(full[np.isfinite(full)]).max(initial=0.0)
  return local, full, np.allclose(full, local, rtol=1e-4, atol=1e-4 * (1 + scale),
                                  equal_nan=True)


def check_declared(model: Model, reads) -> None:
  """Refuses a ``reads`` under which the local likelihood differs from the full one on
  the first rows at a random latent: ``log_lik`` reads what it did not declare."""
  indices = np.arange(min(8, model.num_data), dtype=np.int32)
  z = probe_latent(model.latent_dim, 0.3)
  local, full, same = _local_and_full(model, model.sparse, z,
                                      data_lib.few_rows(model.data, indices))
  if not same:
    raise ValueError(
        f"{model.name}: with reads={reads}, log_lik on the first rows gives {local[:3]} where "
        f"the full latent gives {full[:3]}: log_lik reads latent values reads does not declare "
        f"(another row of a declared leaf, or one indexed by another column), or uses an index "
        f"column besides indexing, e.g. to look up another array (a school per student): give "
        f"what it looks up as a data column of its own and declare that column"
        + _undeclared_rows_hint(model, reads))


def _undeclared_rows_hint(model: Model, reads: dict) -> str:
  """A sentence naming the leaves read whole that a declared column could index (their
  leading axis has its leaf's length): indexed with it, they must be declared too, since
  the local likelihood replaces the column by a position in a few rows."""
  leaves = jax.tree_util.tree_flatten_with_path(model.unravel(jnp.zeros(model.latent_dim)))[0]
  shapes = {data_lib.leaf_name(path): leaf.shape for path, leaf in leaves}
  column_of_length = {shapes[leaf][0]: column for leaf, column in reads.items()}
  more = {name: column_of_length[shape[0]] for name, shape in shapes.items()
          if name not in reads and shape and shape[0] in column_of_length}
  if not more:
    return ""
  return (f". A leaf read whole may not be indexed by a declared column: if log_lik "
          f"indexes {sorted(more)} with it, declare them too: reads={dict(reads, **more)}")


