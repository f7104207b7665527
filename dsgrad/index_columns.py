"""The integer data columns a user's ``log_lik`` uses as indices into the latent: found,
checked in range, and declared (:attr:`dsgrad.models.Model.kinds`) so that data handed in
later are checked too.

JAX clamps a read past an array's end and wraps a negative index to it, so ``z["b"][g]``
with ``g`` out of range reads another group's value without an error. The columns are
found by running ``log_lik`` on a few rows under :mod:`jax.experimental.checkify`'s index
checks, and each one's bounds by bisection over its values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from dsgrad import data as data_lib
from dsgrad import data_kinds
from dsgrad.models.base import Model, probe_latent

__all__ = ["declared_and_checked", "whole_number_floats"]


def _index_checked_likelihood(model: Model, unsigned: bool = True):
  """``(z, rows) -> message or None``: the model's log likelihood on ``rows`` with JAX's
  out-of-bounds index checks (:mod:`jax.experimental.checkify`). ``unsigned``: integer
  columns are read as unsigned, so an index that ``log_lik``'s arithmetic takes below
  zero (``z[g - 1]`` at ``g = 0``), which JAX would wrap to the end without an error,
  shows as one past it."""
  # One program (compiled op by op, the model's operations took 1.4 s on the scale suite's
  # hierarchical model; 0.1 s as one).
  checked = jax.jit(checkify.checkify(model.log_likelihood, errors=checkify.index_checks))

  def failure(z, rows, only=None):  # only: the one column read as unsigned
    if unsigned:
      rows = {k: v.astype(f"u{v.dtype.itemsize}") if np.issubdtype(v.dtype, np.signedinteger)
              and only in (None, k) else v for k, v in rows.items()}
    return checked(z, rows)[0].get()
  return failure


def _index_bound(failure, z, rows: dict, name: str, largest: int = 0,
                 position=Ellipsis) -> tuple[int, int] | None:
  """``(lower, upper)``: the values of the integer column ``name`` (at ``position`` of a
  row, else all of it) at which ``log_lik`` (``failure``, on one datum's ``rows``) reads
  in bounds are ``[lower, upper)``: ``upper`` is the size of what it indexes (the
  smallest, where it indexes several) and ``lower`` 0 unless ``log_lik`` shifts the
  column (``z[g - 1]``: 1); ``None`` where it indexes nothing. ``largest``: a value known
  in bounds there (the data's largest)."""

  def read(value):
    column = np.array(rows[name])
    column.reshape(1, -1)[:, position] = value
    return failure(z, dict(rows, **{name: column}))

  # A failure at the data's largest value (in range: the probes passed) is not the
  # column's: one alike elsewhere is not either (dsgrad.data_kinds.column_at_fault).
  known = read(max(0, largest))
  at = lambda value: None if (message := read(value)) == known else message  # noqa: E731

  def first_in_bounds(out, inside):  # bisects between a value out of bounds and one in
    while abs(inside - out) > 1:
      mid = (out + inside) // 2
      out, inside = (mid, inside) if at(mid) is not None else (out, mid)
    return inside

  # Probes stay within the column's dtype (an int16 column cannot hold 2^30, a float32 one
  # holds whole numbers exactly up to 2^24).
  dtype = np.asarray(rows[name]).dtype
  high = min(2 ** 30, int(np.iinfo(dtype).max) if np.issubdtype(dtype, np.integer) else
             2 ** (np.finfo(dtype).nmant + 1))
  low = max(0, largest)
  if low >= high or at(high) is None:
    return None  # indexes nothing, or nothing this dtype can hold lies past its end
  # The usual case first: the data use every index and nothing is shifted.
  upper = low + 1 if at(low + 1) is not None else first_in_bounds(high, low) + 1
  lower = 0 if at(0) is None else first_in_bounds(0, low)
  return lower, upper


def declared_and_checked(model: Model) -> Model:
  """``model`` with its index columns declared and checked. Refuses integer data that
  index the latent out of its bounds: JAX clamps a read past an array's end and wraps a
  negative index to it, so ``z["b"][g]`` with ``g`` out of range reads another group's
  value without an error. Run once on the rows holding each integer column's smallest and
  largest value, read as unsigned (a negative index, or one that ``log_lik`` shifts below
  zero, is then one past the end). A column that indexes is declared as such
  (:attr:`Model.kinds`, :func:`_index_kind`), so data handed in later
  (``Objective.with_data``) are checked on every row."""
  columns, floats = _index_candidates(model)
  if not columns:
    return model
  z = np.zeros(model.latent_dim, np.float32)  # an argument of compiled checks only
  probes, extremes = [], {}  # (column, row, its values); each position's least and largest
  typical_rows = {}  # each column's typical row, shaped as one row of the data
  for name, leaf in columns.items():
    values = np.asarray(leaf).reshape(len(leaf), -1)  # a host array: its memory map
    extremes[name] = values.min(axis=0), values.max(axis=0)  # per position of a row
    typical_rows[name] = data_kinds.typical_row(values).reshape((1,) + leaf.shape[1:])
    probes += [(name, row, values[row]) for row in data_kinds.extreme_rows(values)]
  # The probes' rows in one compiled gather, then on the host: every call below has one
  # row, so the checked program compiles once (each eager operation would compile too).
  indices = np.asarray([row for _, row, _ in probes], np.int32)
  every = {k: np.asarray(v) for k, v in data_lib.few_rows(model.data, indices).items()}
  one = lambda i: {k: v[i:i + 1] for k, v in every.items()}  # noqa: E731

  def lowest(name):  # the probe holding the column's least value
    least = extremes[name][0].min()
    return next(i for i, p in enumerate(probes) if p[0] == name and p[2].min() == least)

  masked = {}  # whether log_lik masks a column's negative values: tested once, used twice

  def masks(name):
    if name not in masked:
      masked[name] = _marks_missing(model, one(lowest(name)), name)
    return masked[name]

  failure = None
  for unsigned in (True, False):  # a log_lik that refuses unsigned columns: as given
    candidate = _index_checked_likelihood(model, unsigned)
    try:
      candidate(z, one(0))
    except Exception:  # noqa: BLE001  a primitive checkify cannot check: nothing to say
      continue  # (log_lik itself traced already, in the shape checks before this one)
    failure = candidate
    break
  if failure is None:
    return model
  for i, (name, row, value) in enumerate(probes):
    # Where the row fails, it is this column's doing if it fails with only it unsigned,
    # and otherwise than with the column at a typical value.
    message = failure(z, one(i)) and failure(z, one(i), only=name)
    if message:
      elsewhere = [failure(z, dict(one(i), **{name: value}), only=name)
                   for value in (typical_rows[name], np.zeros_like(typical_rows[name]))]
      message = data_kinds.column_at_fault(message, elsewhere,
                                           f"{model.name}: data column {name!r}",
                                           ", or declare the latent leaf it indexes, reads={"
                                           f"leaf: {name!r}}}, which checks it against its rows")
    if value.min() < 0 and (message or not unsigned and _index_bound(failure, z, one(i), name)):
      message = None if masks(name) else "a negative index, which JAX (as NumPy) wraps"
    elif message and "index -" in message:
      message = (message.strip().rstrip(".") + " (log_lik's arithmetic takes it below zero, "
                 "and JAX wraps it to the end)")
    if message:
      raise data_kinds.index_out_of_range(f"{model.name}: data column {name!r}", row, value,
                                          "log_lik", message)
  kinds = dict(model.kinds)
  for name in (n for n in columns if n not in kinds):
    smallest, largest = extremes[name]
    if smallest.min() < 0 and not masks(name):
      smallest = np.zeros_like(smallest)  # read, not masked: the range check refuses them
    kind = _index_kind(failure, z, one(lowest(name)), name, smallest, largest)
    if kind and name in floats:
      kind = _shifted_float_kind(model, one(lowest(name)), name, kind)
    if kind:
      kinds[name] = kind
  for name in floats & set(kinds):
    # A float column cast to an index in log_lik: its negative values, which JAX wraps and
    # the probes above cannot read as unsigned, are refused by its kind's bounds.
    data_kinds.check_kind(kinds[name], columns[name], f"{model.name}: data column {name!r}")
  return model._replace(kinds=tuple(kinds.items())) if len(kinds) > len(model.kinds) else model


def _index_candidates(model: Model) -> tuple[dict, set]:
  """``({name: column}, float names)``: the data columns that may index the latent, integer
  ones and :func:`whole_number_floats`. No float column can index unless ``log_lik`` casts
  one; only then is each read in full (a memory map's reads cost a pass over the file)."""
  columns = {name: leaf for name, leaf in model.data.items()
             if leaf.shape[0] and _may_index(leaf, first_rows=1024)}
  floats = {name for name, leaf in columns.items() if not jnp.issubdtype(leaf.dtype, jnp.integer)}
  keep = ({name for name in floats if whole_number_floats(columns[name])}
          if floats and _casts_floats_to_integers(model) else set())
  return {k: v for k, v in columns.items() if k not in floats or k in keep}, keep


def _may_index(leaf, first_rows: int | None = None) -> bool:
  """Whether a data column may index the latent: an integer one, or one of
  :func:`whole_number_floats` (on its ``first_rows``)."""
  return jnp.issubdtype(leaf.dtype, jnp.integer) or whole_number_floats(leaf, first_rows)


def whole_number_floats(leaf, first_rows: int | None = None) -> bool:
  """Whether a data column of at most 16 floats a row, in memory or memory-mapped, holds
  whole numbers only (in its ``first_rows``; default all): ids read from a table where a
  missing value made the column float (which ``log_lik`` casts to integers). A memory map
  is read in chunks, once."""
  if not jnp.issubdtype(leaf.dtype, jnp.floating) or int(np.prod(leaf.shape[1:])) > 16:
    return False
  if data_lib.is_host(leaf) and leaf.array is None:  # a view inside a program: unread
    return False
  # On the host (a memory map stays one): JAX's eager operations would each compile.
  values = np.asarray(leaf)
  # A float64 bound: 2**24 as a Python int would be cast to a float16 column's dtype (inf).
  limit = np.float64(2 ** 24)
  whole = lambda v: bool(np.all((v == np.round(v)) & (np.abs(v) < limit)))  # noqa: E731
  rows = values.shape[0] if first_rows is None else min(first_rows, values.shape[0])
  # In chunks, the first small: real-valued columns fail on their first rows.
  bounds = sorted({0, min(1024, rows), *range(1 << 20, rows, 1 << 20), rows})
  return all(whole(values[start:end]) for start, end in zip(bounds, bounds[1:]))


def _casts_floats_to_integers(model: Model) -> bool:
  """Whether ``log_lik`` converts a float to an integer anywhere (one trace, nothing
  compiled): JAX refuses a float index, so a float column indexes only through such a
  cast, and probing float columns compiles a checked program (0.5 s) that most models,
  whose whole-number floats are labels or counts, need not pay."""
  rows = {k: jax.ShapeDtypeStruct((1,) + tuple(v.shape[1:]), v.dtype)
          for k, v in model.data.items()}
  z = jax.ShapeDtypeStruct((model.latent_dim,), jnp.float32)

  def found(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
      if (eqn.primitive.name == "convert_element_type"
          and jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.floating)
          and jnp.issubdtype(eqn.params["new_dtype"], jnp.integer)):
        return True
      inner = [getattr(v, "jaxpr", v) for v in eqn.params.values()
               if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
      inner += [getattr(b, "jaxpr", b) for v in eqn.params.values() if isinstance(v, tuple)
                for b in v if hasattr(getattr(b, "jaxpr", b), "eqns")]  # cond's branches
      if any(found(j) for j in inner):
        return True
    return False

  try:
    return found(jax.make_jaxpr(model.log_likelihood)(z, rows).jaxpr)
  except Exception:  # noqa: BLE001  not traceable on one abstract row: probe, as before
    return True


def _marks_missing(model: Model, rows: dict, name: str) -> bool:
  """Whether ``log_lik`` masks the negative values of column ``name`` in ``rows``
  (:func:`dsgrad.data_kinds.negatives_are_markers`), at a random latent."""
  z = probe_latent(model.latent_dim, 0.5)
  likelihood = jax.jit(model.log_likelihood)
  return data_kinds.negatives_are_markers(
      lambda column: likelihood(z, dict(rows, **{name: column})), rows[name])


def _shifted_float_kind(model: Model, rows: dict, name: str, kind: tuple) -> tuple:
  """``kind`` of a float column that ``log_lik`` casts to an index, with the base it reads
  from: ``z[g - 1]`` at ``g = 0`` reads ``z[-1]``, which JAX wraps to the last row without
  an error, and the unsigned reading that finds it for an integer column cannot cast a
  float. Where the value ``b - 1`` reads what the largest value in bounds reads (at a
  random latent, of the values 0 to 15), the column's values start at ``b``."""
  upper = kind[1]
  if len(kind) != 2 or not isinstance(upper, int) or rows[name].shape != (1,) or upper < 2:
    return kind
  values = np.append(np.arange(min(upper - 1, 16)), upper - 1).astype(rows[name].dtype)
  batch = {k: np.repeat(np.asarray(v), len(values), axis=0) for k, v in rows.items()}
  batch[name] = values
  terms = np.asarray(jax.jit(model.log_likelihood)(probe_latent(model.latent_dim, 0.5, 2), batch))
  same = np.flatnonzero(terms[:-1] == terms[-1])
  return ("index", upper, int(same[0]) + 1) if same.size else kind


def _index_kind(failure, z, rows, name: str, smallest, largest) -> tuple | None:
  """The :mod:`dsgrad.data_kinds` kind of the integer column ``name``: ``("index", upper)``
  or ``("index", upper, lower)``, bounds per position of a row where they differ (a
  pair's two positions index two sizes); ``None`` where some position indexes nothing
  (or a row has more than 16). ``lower`` is at most ``smallest`` (the data's least
  values, where ``log_lik`` masks them: a -1 "no group", ``jnp.where(g >= 0, z[g], 0)``)."""
  if len(largest) > 16:
    return None
  bounds = [_index_bound(failure, z, rows, name, int(top), j) for j, top in enumerate(largest)]
  if None in bounds:
    return None
  lower, upper = zip(*bounds)
  lower = tuple(min(low, int(least)) for low, least in zip(lower, smallest))
  one_bound = lambda b: b[0] if len(set(b)) == 1 else b  # noqa: E731
  lower, upper = one_bound(lower), one_bound(upper)
  return ("index", upper) if lower == 0 else ("index", upper, lower)
