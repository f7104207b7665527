"""What a model's data values mean, when the model relies on it: signs that must be +1 or
-1, indices that must lie in a range. Declared by the model's factory
(:attr:`dsgrad.models.Model.kinds`), checked there and on data handed in later
(:meth:`dsgrad.Objective.with_data`)."""

from __future__ import annotations

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
  what ``kind`` says (``"signs"``: +1 or -1; ``("index", n)``: integers in ``[0, n)``):
  0/1 labels where signs are meant would turn every 0 into a likelihood term that ignores
  the parameters, an index past the end would read another row (JAX clamps gathers)
  without any error."""
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
      upper = kind[1]
      whole = np.issubdtype(block.dtype, np.integer) or bool(np.all(block == np.round(block)))
      if not whole or (block.size and (block.min() < 0 or block.max() >= upper)):
        raise ValueError(f"{label} holds values outside the integers 0 .. {upper - 1} "
                         f"(found {block.min()} .. {block.max()}); it indexes {upper} rows")
