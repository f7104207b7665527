"""Which latent rows each datum of a NumPyro model reads, declared by naming the argument
that indexes each site (``reads={"b": "g"}``) or found (``reads="auto"``): the model's
:class:`~dsgrad.models.SparseLikelihood`, so that joint SAGA keeps a table of those
coordinates only (:func:`dsgrad.contrib.numpyro.to_model`).

References:
  Wang, Geffner, Domke (2024), Sec. 4 (the joint control variate's table, one entry per
  datum); its sparse form is this library's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from dsgrad import latent_reads
from dsgrad.contrib import _numpyro_trace as trace_lib
from dsgrad.models import base as model_base
from dsgrad.models.base import Model


WHO = "dsgrad.contrib.numpyro: reads"


def read_layout(reads, unconstrained: dict, arguments: dict, n: int) -> list:
  """``reads`` checked against the sites and the model's ``arguments`` (named as
  :func:`~dsgrad.contrib._numpyro_trace.named_arguments` names them), before anything
  compiles: ``[(offset, index columns (N, m) or None for a site read whole, coordinates
  per row read)]`` in the flat latent's order (``ravel_pytree`` of the sites, by name)."""
  if not isinstance(reads, dict) or not reads:
    raise TypeError(f"{WHO} must be a non-empty dict {{latent site: argument}}, 'auto' or "
                    "None, got " + ("an empty dict" if isinstance(reads, dict) else repr(reads)))
  for site, names in reads.items():
    if not (isinstance(names, str) or isinstance(names, (tuple, list)) and names
            and all(isinstance(name, str) for name in names)):
      raise TypeError(f"{WHO}[{site!r}] must name the model's argument that indexes it (a "
                      f"string, or a tuple of strings for several rows), got {names!r}")
  unknown = sorted(set(reads) - set(unconstrained))
  if unknown:
    raise ValueError(f"{WHO} names latent sites {unknown}; the model's are {sorted(unconstrained)}")
  layout, offset = [], 0
  for site in sorted(unconstrained):
    shape = np.shape(unconstrained[site])
    size = int(np.prod(shape, dtype=np.int64))
    names = reads.get(site)
    columns = None
    if names is not None:
      if not shape:
        raise ValueError(f"{WHO}[{site!r}]: a scalar site has no rows to index")
      columns = [_read_column(arguments, name, n, shape[0], f"{WHO}[{site!r}]")
                 for name in ((names,) if isinstance(names, str) else tuple(names))]
      # A row read twice would be two coordinates of one value: its gradient counted twice.
      rows = np.sort(np.concatenate([np.asarray(c) for c in columns], axis=1), axis=1)
      twice = np.flatnonzero((rows[:, 1:] == rows[:, :-1]).any(axis=1))
      if twice.size:
        raise ValueError(f"{WHO}[{site!r}]: datum {twice[0]:,} reads row "
                         f"{rows[twice[0]][np.flatnonzero(np.diff(rows[twice[0]]) == 0)[0]]} of "
                         f"{site!r} twice ({twice.size:,} data do): declare it once")
    layout.append((offset, columns, size // shape[0] if columns else size))
    offset += size
  return layout


def found(unconstrained: dict, arguments: dict, log_likelihood, n: int) -> dict | None:
  """The ``reads`` of a model whose data's terms each read one row (or a few) of some
  sites, found as :func:`dsgrad.latent_reads.found` finds a ``log_lik``'s: each datum's
  term is differentiated at a random latent on up to 16 data spread over the plate; a
  site of ``R`` rows is declared with the integer arguments (one or ``m`` per datum,
  values in ``[0, R)``) that point, on every such datum, to the rows its term moves, and
  that together point to all of them (an argument that adds no row, a copy of another,
  is left out). ``None`` where no site is found; :func:`with_reads` then checks what is."""
  sites = {site: np.shape(value) for site, value in unconstrained.items()}
  ranges = {name: _value_range(value, n) for name, value in arguments.items()}
  candidates = {site: [name for name, span in ranges.items()
                       if span is not None and span[0] >= 0 and span[1] < shape[0]]
                for site, shape in sites.items() if len(shape) and shape[0] > 1}
  if not any(candidates.values()):  # nothing could index a site: nothing is compiled
    return None
  d = sum(int(np.prod(shape, dtype=np.int64)) for shape in sites.values())
  data = latent_reads.gradient_rows(n, d)
  moved = latent_reads.moved_coordinates(log_likelihood, model_base.probe_latent(d, 0.3, seed=1),
                                         data)
  points = {name: np.asarray(arguments[name])[data].reshape(len(data), -1)
            for name in set().union(*candidates.values())}  # each argument read once
  reads, offset = {}, 0
  for site in sorted(sites):  # the flat latent's order (ravel_pytree of a dict: by name)
    shape, size = sites[site], int(np.prod(sites[site], dtype=np.int64))
    offset += size
    if not candidates.get(site):
      continue
    read = moved[:, offset - size:offset].reshape(len(data), shape[0], -1).any(-1)
    touched = read.any(1)  # a datum whose term moves none of it (masked) says nothing
    covered, used = np.zeros_like(read), []
    for name in candidates[site]:
      pointed = np.zeros_like(read)
      np.put_along_axis(pointed, points[name], True, axis=1)
      pointed &= touched[:, None]
      if touched.any() and (pointed <= read).all() and (pointed & ~covered).any():
        used.append(name)
        covered |= pointed
    if used and (covered == read).all():
      reads[site] = used[0] if len(used) == 1 else tuple(used)
  return reads or None


def _value_range(value, n: int) -> tuple[int, int] | None:
  """``(least, largest)`` of a model argument that could index a site, one or ``m`` rows
  per datum of ``n`` (integers of shape ``(n,)`` or ``(n, m)``); ``None`` for any other."""
  if not (hasattr(value, "dtype") and np.issubdtype(value.dtype, np.integer)
          and np.ndim(value) in (1, 2) and np.shape(value)[0] == n and n):
    return None
  values = np.asarray(value)
  return int(values.min()), int(values.max())


def with_reads(reads, layout: list, found: Model, unconstrained: dict, traced: tuple) -> Model:
  """``found`` with the coordinates of ``layout`` (:func:`read_layout`) as its
  :class:`~dsgrad.models.SparseLikelihood`, checked on data spread over the plate.
  ``traced``: ``(model, data plate, observed sites, args, kwargs)``."""
  n, arguments = found.num_data, trace_lib.named_arguments(traced[0], traced[3], traced[4])

  def coordinates(indices):
    return latent_reads.stacked_coordinates(
        [(start, width, columns and [c[indices] for c in columns])
         for start, columns, width in layout], indices.shape[0])

  k = sum(width * (sum(c.shape[1] for c in columns) if columns else 1)
          for _, columns, width in layout)
  z = model_base.probe_latent(found.latent_dim, 0.5)
  data = np.unique(np.concatenate([np.arange(min(8, n)), model_base.spread_indices(n)]))
  try:  # O(k) a datum: the model run on its own rows, its sites cut to the rows it reads
    local = _small_site_likelihood(reads, unconstrained, arguments, traced, n)
    declared = found._replace(sparse=model_base.SparseLikelihood(k, coordinates, local))
    model_base.check_sparse_likelihood(declared, z, data.astype(np.int32), 1e-4)
    return declared
  except Exception:  # noqa: BLE001  a model that cannot run so: O(d) a datum, as checked
    pass
  try:
    declared = model_base.with_coordinates(found, k, coordinates)
    model_base.check_sparse_likelihood(declared, z, data.astype(np.int32), 1e-4)
  except ValueError as error:
    raise ValueError(f"{WHO}={reads}: the likelihood reads latent values reads does not "
                     "declare (another row of a declared site, or a site whose transform "
                     f"mixes its rows, as an ordered one does): {error}") from None
  return declared


def _small_site_likelihood(reads, unconstrained: dict, arguments: dict, traced: tuple, n: int):
  """The :class:`~dsgrad.models.SparseLikelihood` local likelihood of a NumPyro model whose
  datum reads the rows ``reads`` declares: each datum's term from the model run on that
  datum's arguments alone, its declared sites cut to the rows it reads and their index
  arguments replaced by positions among them, as :mod:`dsgrad.latent_reads` does for a
  ``log_lik``. Raises where an argument indexes two sites at different positions among
  their rows (no one replacement serves both)."""
  model, plate, observed, model_args, model_kwargs = traced
  small, positions = {}, {}
  for site in sorted(unconstrained):
    shape = np.shape(unconstrained[site])
    names = reads.get(site)
    if names is None:
      small[site] = jnp.zeros(shape, jnp.float32)
      continue
    at = 0
    for name in ((names,) if isinstance(names, str) else tuple(names)):
      row = np.shape(arguments[name])[1:]
      width = int(np.prod(row, dtype=np.int64))
      if positions.setdefault(name, (at, row)) != (at, row):  # (user effects, user scales)
        raise ValueError(f"argument {name!r} indexes two sites at different positions")
      at += width
    small[site] = jnp.zeros((at,) + shape[1:], jnp.float32)
  positions = {name: jnp.arange(at, at + int(np.prod(row, dtype=np.int64)),
                                dtype=jnp.int32).reshape((1,) + row)
               for name, (at, row) in positions.items()}
  _, unravel = ravel_pytree(small)
  one = jnp.zeros(1, jnp.int32)
  given = trace_lib.per_datum_log_likelihood(
      model, plate, observed, trace_lib.with_indices(model, plate, one), unravel)
  names = list(trace_lib.named_arguments(model, model_args, {}))

  def own(name, value, i):  # a datum's own row of a per-datum argument
    if name in positions:
      return positions[name]
    per_datum = isinstance(value, jax.Array) and value.ndim and value.shape[0] == n
    return jax.lax.dynamic_slice_in_dim(value, i, 1) if per_datum else value

  def term(z_local, i):
    args = tuple(own(name, value, i) for name, value in zip(names, model_args))
    kwargs = {name: own(name, value, i) for name, value in model_kwargs.items()}
    with trace_lib.other_batch_sizes_allowed():  # one datum, not the plate's batch
      return given(args, kwargs, z_local, one)[0]

  return lambda z_local, indices: jax.vmap(term)(z_local, indices)


def _read_column(arguments: dict, name, n: int, rows: int, who: str) -> jax.Array:
  """The model argument ``name`` as an ``(N, m)`` int32 array of row numbers of a site
  of ``rows`` rows; a name, shape, dtype or value that cannot be one is refused."""
  if not isinstance(name, str) or name not in arguments:
    raise ValueError(f"{who} names the argument {name!r}; the model's are {sorted(arguments)}")
  column = np.asarray(arguments[name])
  if (column.ndim not in (1, 2) or len(column) != n
      or not np.issubdtype(column.dtype, np.integer)):
    raise TypeError(f"{who}: argument {name!r} must be integers, one (N,) or several (N, m) "
                    f"per datum of the plate's {n:,}; got shape {column.shape}, dtype "
                    f"{column.dtype}")
  if column.min() < 0 or column.max() >= rows:
    raise ValueError(f"{who}: argument {name!r} holds values in [{column.min()}, "
                     f"{column.max()}], but the site has {rows} rows")
  return jnp.asarray(column.reshape(n, -1), jnp.int32)
