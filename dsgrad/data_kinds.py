"""What a model's data values mean, when the model relies on it: signs that must be +1 or
-1, indices that must lie in a range. Declared by the model's factory
(:attr:`dsgrad.models.Model.kinds`), checked there and on data handed in later
(:meth:`dsgrad.Objective.with_data`)."""

from __future__ import annotations

import warnings

import jax
import numpy as np

from dsgrad.training.host_data import HostArray


def check_kinds(kinds, values, who: str = "data") -> None:
  """Checks every leaf of the dict ``values`` that ``kinds`` (``{key: kind}``, a model's
  :attr:`~dsgrad.models.Model.kinds`) names against its kind (:func:`check_kind`)."""
  for key, kind in (kinds or {}).items():
    check_kind(kind, values[key], f"{who}[{key!r}]")


def check_kind(kind, value, label: str) -> None:
  """Refuses ``value`` (in memory, or on the host, read in chunks) when it does not mean
  what ``kind`` says (``"signs"``: +1 or -1; ``("index", n)``: integers in ``[0, n)``;
  :func:`_check_index`): 0/1 labels where signs are meant would turn every 0 into a
  likelihood term that ignores the parameters, an index past the end would read another
  row (JAX clamps gathers) without any error."""
  if kind is None or isinstance(value, jax.core.Tracer) or (
      isinstance(value, HostArray) and value.array is None):
    return
  host = value
  if isinstance(host, HostArray):
    blocks = [host.array[i:i + (1 << 20)] for i in range(0, host.shape[0], 1 << 20)]
  elif isinstance(host, jax.Array) and not host.is_fully_addressable:
    # Data spread over processes: each checks the rows it holds.
    blocks = [np.asarray(shard.data) for shard in host.addressable_shards]
  else:
    blocks = [np.asarray(host)]
  for block in blocks:
    if kind == "signs":
      bad = ~np.isin(block, (-1, 1))
      if np.any(bad):
        raise ValueError(f"{label} holds {np.unique(block[bad])[:3].tolist()}; it holds signs, "
                         "+1 or -1 (0/1 labels become signs as 2 * y - 1)")
    else:
      _check_index(kind, block, label)


def _check_index(kind, block, label: str) -> None:
  """``("index", upper)``: integers in ``[0, upper)``; ``("index", upper, lower)``: in
  ``[lower, upper)`` (a column that ``log_lik`` shifts, ``z[g - 1]``). Either bound may be
  a tuple, one per position of a row (a pair whose positions index two sizes)."""
  upper = np.asarray(kind[1])
  lower = np.asarray(kind[2] if len(kind) > 2 else 0)
  rows = block.reshape(len(block), -1)
  whole = np.issubdtype(block.dtype, np.integer) or bool(np.all(block == np.round(block)))
  bad = (rows < lower) | (rows >= upper) | (not whole)
  if np.any(bad):
    position = int(np.nonzero(np.broadcast_to(bad, rows.shape))[1][0])
    low = int(np.broadcast_to(lower, rows.shape[1:])[position])
    high = int(np.broadcast_to(upper, rows.shape[1:])[position])
    at, found = "", block
    if upper.ndim or lower.ndim:  # bounds per position: name the one refused
      at, found = f" at position {position} of a row", rows[:, position]
    raise ValueError(f"{label} holds values outside the integers {low} .. {high - 1}{at} "
                     f"(found {found.min()} .. {found.max()}); it indexes {high - low} rows")


def extreme_rows(values) -> list[int]:
  """The rows of an integer column (``(N, ...)``) holding its smallest and largest value:
  where an index out of range would be, so where an index check looks."""
  flat = np.asarray(values).reshape(len(values), -1)
  return sorted({int(np.argmin(flat)) // flat.shape[1], int(np.argmax(flat)) // flat.shape[1]})


def negatives_are_markers(log_lik_with, column) -> bool:
  """Whether the negative values of an integer ``column`` are markers the model masks
  (``-1``: no group, ``jnp.where(g >= 0, z[g], 0.0)``) rather than indices JAX would wrap
  to the end: the log likelihood, ``log_lik_with(column)`` at a random latent, does not
  change when they move one further below zero (a read they index would move to another
  entry). Read as unsigned for the index check, such a marker looked out of range."""
  column = np.asarray(column)
  shifted = np.where(column < 0, column - 1, column).astype(column.dtype)
  return bool(np.allclose(np.asarray(log_lik_with(column)), np.asarray(log_lik_with(shifted)),
                          rtol=1e-6, atol=1e-6))


def index_out_of_range(where: str, row: int, value, reader: str, reason: str) -> ValueError:
  """The error for index data out of range, found by reading them (``reason``: what JAX's
  index check said): ``where`` (``"data column 'g'"``) at ``row`` holds ``value``, which
  ``reader`` (``"log_lik"``, ``"the model"``) uses as an index."""
  return ValueError(
      f"{where} at row {row:,} holds {np.asarray(value).tolist()}, which {reader} uses as an "
      f"index out of range: {reason.strip().rstrip('.')}. JAX clamps an index past the end "
      "and wraps a negative one, so the model would read another row without an error: "
      "index data must lie in the range of what they index")


def typical_row(values) -> np.ndarray:
  """One row of an integer column (``(N, ...)``), position by position the median of its
  first 4,096 rows: a value most likely in range, against which a row's failed index
  check is compared (:func:`column_at_fault`)."""
  head = np.asarray(values[:4096]).reshape(min(len(values), 4096), -1)
  return np.median(head, axis=0).round().astype(head.dtype)


def column_at_fault(message, messages_elsewhere, where: str, remedy: str = ""):
  """``message``, an index check's failure on a row, where it is the column's doing: not
  where the same row fails alike with the column at its :func:`typical_row` and at 0
  (``messages_elsewhere``; two values, so that a column holding one value out of range
  throughout is still refused). A log
  density can read out of bounds whatever the data hold (NumPyro's
  ``CorrCholeskyTransform`` reads one past an array's end, and drops what it read): that
  failure is not the data's, and JAX's checks, which stop at the first, cannot see past it
  to the column's own reads: ``where``'s range is then left unchecked, with a warning
  that ends with ``remedy`` (another check the caller offers)."""
  if not message or any(other != message for other in messages_elsewhere):
    return message
  warnings.warn(
      f"{where}: the log density reads out of an array's bounds whatever the index data "
      f"hold ({message.strip().rstrip('.')}), before it reads with them, so JAX's index "
      "checks cannot tell whether they are in range; nothing refuses them here: make sure "
      f"they are{remedy} (JAX clamps an index past the end and wraps a negative one)",
      IndexChecksBlind, stacklevel=3)
  return None


class IndexChecksBlind(UserWarning):
  """Index data whose range could not be checked (:func:`column_at_fault`)."""
