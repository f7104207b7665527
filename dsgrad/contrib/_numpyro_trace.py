"""Tracing a NumPyro model and checking what :mod:`dsgrad.contrib.numpyro` assumes of it:
one data plate, per-datum terms that sum to NumPyro's own density, arrays that follow the
plate's size. Private to :mod:`dsgrad.contrib`."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings

from numpyro import handlers
from numpyro.infer import util as numpyro_util
from numpyro.infer.initialization import init_to_uniform

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import data_kinds
from dsgrad.models import base as model_base


HANDLERS = threading.RLock()
"""Held while a NumPyro model runs (traced into a dsgrad program or traced for a check):
NumPyro's effect handlers live on one global stack, so two threads running models at once
put one's sites in the other's trace ("all sites must have unique names"). dsgrad traces on
two threads where :func:`dsgrad.recommend` compiles its candidates beside naive's run."""


def one_at_a_time(function):
  """``function`` (which runs a NumPyro model) with :data:`HANDLERS` held."""
  @functools.wraps(function)
  def call(*args, **kwargs):
    with HANDLERS:
      return function(*args, **kwargs)
  return call


class PlateMismatch(ValueError):
  """An observed site whose batch shape does not follow the data plate's indices."""


@contextlib.contextmanager
def other_batch_sizes_allowed():
  """Silences NumPyro's warning about a batch of another size than the plate's
  ``subsample_size``: dsgrad substitutes batches of its own size on purpose."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="subsample_size does not match")
    yield


@one_at_a_time
def trace(fn, args, kwargs, seed=0):
  """The model's trace from a prior draw; a latent site whose distribution cannot be
  sampled (an improper prior such as ``ImproperUniform``, whose ``sample`` raises a bare
  ``NotImplementedError``) takes a point drawn uniformly in ``(-2, 2)`` of its
  unconstrained space instead, NumPyro's own ``init_to_uniform``."""
  with other_batch_sizes_allowed():
    try:
      return handlers.trace(handlers.seed(fn, seed)).get_trace(*args, **kwargs)
    except NotImplementedError:
      seeded = handlers.substitute(handlers.seed(fn, seed), substitute_fn=init_to_uniform)
      return handlers.trace(seeded).get_trace(*args, **kwargs)


def array_arguments(args, kwargs):
  """``(arrays, rebuild)``: the JAX arrays among a model's arguments, and
  ``rebuild(arrays) -> (args, kwargs)``, which puts (traced) arrays back in their places
  while the other arguments (sizes, flags) stay Python values."""
  leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
  positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

  def rebuild(arrays):
    full = list(leaves)
    for i, array in zip(positions, arrays):
      full[i] = array
    return jax.tree_util.tree_unflatten(treedef, full)

  return [leaves[i] for i in positions], rebuild


def prior_trace(fn, args, kwargs, seed=0):
  """:func:`trace`, run as one compiled program with the model's arrays as its arguments
  (op by op, a model's prior draw compiled a small program per operation): the sites as
  traced, each sample site's value the program's output."""
  arrays, rebuild = array_arguments(args, kwargs)
  sites = {}

  def values(arrays):
    sites.update(trace(fn, *rebuild(arrays), seed))
    return {name: site["value"] for name, site in sites.items() if site["type"] == "sample"}

  drawn = jax.jit(values)(arrays)
  return {name: dict(site, value=drawn[name]) if name in drawn else site
          for name, site in sites.items()}


def with_indices(model, plate: str, indices):
  """The model with the data plate's subsample indices fixed to ``indices``."""
  return handlers.substitute(model, data={plate: indices})


def find_data_plate(trace, data_plate: str | None) -> str:
  plates = {name: site for name, site in trace.items() if site["type"] == "plate"}
  observed = {name: site for name, site in trace.items()
              if site["type"] == "sample" and site["is_observed"]}
  if not observed:
    raise ValueError("the model has no observed sample site (obs=...), so there are no data "
                     "to subsample")
  stacks = {name: {frame.name for frame in site["cond_indep_stack"]}
            for name, site in observed.items()}
  if data_plate is not None:
    if data_plate not in plates:
      raise ValueError(f"data_plate={data_plate!r} is not a plate of the model; its plates "
                       f"are {sorted(plates)}")
    return data_plate
  subsampled = sorted({p for stack in stacks.values() for p in stack
                       if plates[p]["args"][1] not in (None, plates[p]["args"][0])})
  if len(subsampled) > 1:
    raise ValueError(f"the observations sit in two subsampled data plates {subsampled}; "
                     "dsgrad needs one plate that indexes the data. Merge them into one "
                     "plate, or pass data_plate=... to choose one (observations outside it "
                     "are then evaluated in full at every step)")
  if len(subsampled) == 1:
    return subsampled[0]
  common = set.intersection(*stacks.values())
  if not common:
    raise ValueError("the observed sites " + ", ".join(
        f"{n!r} (plates {sorted(s) or 'none'})" for n, s in stacks.items())
        + " share no plate; dsgrad needs the observations in one data plate, e.g. "
        "`with numpyro.plate('data', N, subsample_size=100) as idx:`")
  if len(common) > 1:
    raise ValueError(f"every observation sits in the nested plates {sorted(common)}; pass "
                     "data_plate=... to say which one indexes the data")
  return common.pop()


# Primitives through which an array stays "the plate's indices" (index arithmetic and
# reshaping, as ``x[idx]`` lowers to); a gather's output is data, not indices, so a lookup
# such as ``table[user[idx]]`` is not mistaken for a per-datum read of ``table``.
INDEX_PRIMITIVES = frozenset({
    "lt", "le", "gt", "ge", "add", "sub", "select_n", "broadcast_in_dim", "reshape",
    "convert_element_type", "squeeze", "expand_dims", "concatenate", "copy", "clamp",
    "rem", "max", "min"})


def plate_reads(jaxpr, array_inputs: dict, index_inputs: set, found: list) -> None:
  """Appends ``(input position, axis size)`` for every gather in ``jaxpr`` that reads an
  input array along one axis at the plate's indices.

  Args:
    jaxpr: a ``jax.core.Jaxpr``.
    array_inputs: variable -> position of the model argument it is (or is a cast of).
    index_inputs: variables that hold the plate's indices (or index arithmetic on them).
    found: the list the reads are appended to.
  """
  arrays, indices = dict(array_inputs), set(index_inputs)
  is_var = lambda v: not hasattr(v, "val")  # literals carry a value
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    ins = [v for v in eqn.invars if is_var(v)]
    if name == "gather":
      operand, where = eqn.invars[0], eqn.invars[1]
      axes = eqn.params["dimension_numbers"].start_index_map
      if is_var(operand) and operand in arrays and is_var(where) and where in indices \
          and len(axes) == 1:
        found.append((arrays[operand], operand.aval.shape[axes[0]]))
      continue
    inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    if inner is not None:
      inner = getattr(inner, "jaxpr", inner)
      inner_arrays = {iv: arrays[ov] for iv, ov in zip(inner.invars, eqn.invars)
                      if is_var(ov) and ov in arrays}
      inner_indices = {iv for iv, ov in zip(inner.invars, eqn.invars)
                       if is_var(ov) and ov in indices}
      plate_reads(inner, inner_arrays, inner_indices, found)
      continue
    if name in INDEX_PRIMITIVES and any(v in indices for v in ins):
      indices.update(eqn.outvars)
    elif name in ("convert_element_type", "copy", "device_put") and ins and ins[0] in arrays:
      arrays[eqn.outvars[0]] = arrays[ins[0]]


def argument_name(model, path) -> str:
  """``"argument 'x'"`` for the model-argument leaf at ``path`` in ``(args, kwargs)``."""
  head, first, rest = path[0].idx, path[1], jax.tree_util.keystr(tuple(path[2:]))
  if head == 1:
    return f"argument {first.key!r}{rest}"
  try:
    name = list(inspect.signature(model).parameters)[first.idx]
  except (TypeError, ValueError, IndexError):
    name = f"#{first.idx}"
  return f"argument {name!r}{rest}"


def named_arguments(model, model_args, model_kwargs) -> dict:
  """``{name: value}`` of a model's arguments: positional ones by the model's parameter
  names (``arg0``, ... where its signature cannot be read), keyword ones by their keys."""
  try:
    names = list(inspect.signature(model).parameters)
  except (TypeError, ValueError):
    names = []
  positional = {(names[i] if i < len(names) else f"arg{i}"): value
                for i, value in enumerate(model_args)}
  return {**positional, **model_kwargs}


def check_plate_size(model, log_likelihood_given, model_args, model_kwargs, z, probe, plate: str,
                      num_data: int) -> None:
  """Refuses a data plate whose size differs from the number of rows the model reads with
  the plate's indices.

  JAX clamps out-of-range gathers, so a plate of 120 over 100 rows would silently read
  row 99 again for indices 100-119, and a plate of 80 would never use 20 rows. The check
  reads the model's jaxpr: every gather of a model argument at the plate's indices must
  be over an axis of the plate's size.
  """
  leaves = jax.tree_util.tree_flatten_with_path((model_args, model_kwargs))[0]
  positions = [i for i, (_, leaf) in enumerate(leaves) if isinstance(leaf, jax.Array)]
  values = [leaf for _, leaf in leaves]
  arrays, rebuild = array_arguments(model_args, model_kwargs)  # the arrays at `positions`
  closed = jax.make_jaxpr(lambda arrays, z, indices: log_likelihood_given(
      *rebuild(arrays), z, indices))(arrays, z, probe)
  jaxpr = closed.jaxpr
  array_vars = {v: positions[k] for k, v in enumerate(jaxpr.invars[:len(positions)])}
  # Arrays the model closes over (module-level data) are constants of the program; their
  # reads at the plate's indices must match the plate just the same.
  array_vars.update({v: -1 - k for k, v in enumerate(jaxpr.constvars)})
  found: list = []
  plate_reads(jaxpr, array_vars, {jaxpr.invars[-1]}, found)
  for position, rows in found:
    if rows == num_data:
      continue
    if position >= 0:
      where = argument_name(model, leaves[position][0])
      shape = tuple(values[position].shape)
    else:
      shape = tuple(np.shape(closed.consts[-1 - position]))
      where = "an array the model closes over (not one of its arguments)"
    consequence = (f"indices {rows}-{num_data - 1} would silently read row {rows - 1} again "
                   "(JAX clamps out-of-range reads)" if rows < num_data else
                   f"rows {num_data}-{rows - 1} would never be used")
    raise ValueError(
        f"plate {plate!r} has size {num_data} but the model reads {where} "
        f"(shape {shape}) with the plate's indices along an axis "
        f"of {rows}: {consequence}. Give the plate the data's length, "
        f"`numpyro.plate({plate!r}, {rows}, subsample_size=...)`")


def check_per_datum(log_likelihood, log_joint_subsampled, log_prior, z, plate: str,
                     num_data: int) -> None:
  """Refuses a model whose plate term is not a per-datum function of the plate's indices,
  or whose per-datum terms do not add up to NumPyro's own density of the model.

  dsgrad relies on ``log_likelihood(z, indices)[k]`` depending only on datum
  ``indices[k]``. A model that reads its batch another way (``lax.dynamic_slice`` from the
  first index, a running offset) or nests the data plate so that the per-datum split
  differs from NumPyro's scaling would give a wrong ELBO silently. Both are checked once,
  at a few spread indices: each term must be the same in one batch and alone
  (:func:`dsgrad.models.base.check_per_datum_terms`), and ``log p(z) + N/|S| sum_S
  log p(x_n | z)`` must equal NumPyro's log density of the model subsampled at ``S``.
  """
  probe = model_base.spread_indices(num_data)
  batch = model_base.check_per_datum_terms(
      log_likelihood, z, probe, f"the model's terms for plate {plate!r}",
      "dsgrad substitutes random indices for the plate's, so read the data as `x[idx]` "
      "with the plate's indices (not with lax.dynamic_slice from the first index)")
  if not bool(jnp.all(jnp.isfinite(batch))):
    return  # the latent draw is off the model's support; nothing to compare
  theirs = log_joint_subsampled(z, probe)
  ours = log_prior(z) + num_data / probe.shape[0] * jnp.sum(batch)
  if bool(jnp.isfinite(theirs)) and not bool(jnp.abs(theirs - ours)
                                             <= 1e-3 * (1.0 + jnp.abs(theirs))):
    raise ValueError(
        f"the per-datum terms dsgrad reads from plate {plate!r} do not add up to NumPyro's "
        f"log density of the model ({float(ours):.6g} against {float(theirs):.6g} at one "
        "latent draw): the observations carry a scale besides the plate's N/B (a "
        "numpyro.handlers.scale, or a data plate nested in another scaled plate). dsgrad "
        "weighs each datum's log-likelihood by N; remove the extra scale (temper the "
        "likelihood in the distribution instead)")


def argument_label(path) -> str:
  """``x`` for keyword argument ``x``, ``arg0`` for the first positional one, and a key
  path below them (``x['a']``): the data names of a NumPyro model's arrays."""
  (group, first), rest = path[:2], path[2:]
  del group
  head = (f"arg{first.idx}" if isinstance(first, jax.tree_util.SequenceKey)
          else str(getattr(first, "key", first)))
  return head + jax.tree_util.keystr(tuple(rest))


def check_index_arguments(model, log_likelihood_given, model_args, model_kwargs, z,
                          num_data: int) -> None:
  """Refuses an integer data argument (one row per datum) that the model uses as an index
  out of the range of what it indexes: JAX clamps a read past the end and wraps a negative
  index, so ``b[g[idx]]`` with ``g`` out of range reads another group's value without an
  error. Run once, under :mod:`jax.experimental.checkify`'s index checks, on the rows
  holding the argument's smallest and largest value, read as unsigned (a negative index,
  or one the model shifts below zero, is then one past the end)."""
  from jax.experimental import checkify  # noqa: PLC0415  (only here)
  for path, leaf, replaced in _per_datum_arguments(model_args, model_kwargs, num_data,
                                                   np.signedinteger):
    column = np.asarray(leaf)
    values = column.reshape(num_data, -1)

    def one_argument(column, rows, at=z, replaced=replaced):
      return log_likelihood_given(*replaced(column), at, rows)

    negative = np.flatnonzero((values < 0).any(axis=1))[:1]
    at = z + 0.5 * jax.random.normal(jax.random.key(0), jnp.shape(z), jnp.result_type(z))
    if negative.size and data_kinds.negatives_are_markers(
        lambda c: one_argument(c, jnp.asarray(negative, jnp.int32), at), column):
      column = np.where(column < 0, 0, column)  # "no group" markers the model masks
    unsigned = column.astype(f"u{values.dtype.itemsize}")
    checked = jax.jit(checkify.checkify(one_argument, errors=checkify.index_checks))
    typical = data_kinds.typical_row(values).astype(unsigned.dtype)
    for row in data_kinds.extreme_rows(values):
      at_row = jnp.asarray([row], jnp.int32)
      try:
        message = checked(unsigned, at_row)[0].get()
        if message:  # the argument's doing only where another value reads in bounds
          elsewhere = []
          for value in (typical, np.zeros_like(typical)):
            alike = unsigned.copy()
            alike.reshape(num_data, -1)[row] = value
            elsewhere.append(checked(alike, at_row)[0].get())
          message = data_kinds.column_at_fault(message, elsewhere, argument_name(model, path))
      except Exception:  # noqa: BLE001  a model checkify cannot run: nothing to say
        return
      if message:
        raise data_kinds.index_out_of_range(argument_name(model, path), row, values[row],
                                            "the model", message)


def check_missing_values(model, log_likelihood_given, model_args, model_kwargs, z,
                         num_data: int, most_rows: int = 4096) -> None:
  """Refuses a NaN in a data argument (one row per datum) that makes its datum's
  log-likelihood or its gradient NaN, naming the argument and row: in training it would
  surface steps later as a non-finite update, blamed on the gradient. A NaN the model
  masks (``numpyro.handlers.mask`` keeps it out of the density and its gradient) is kept.
  Run once, at the prior draw ``z``, on up to ``most_rows`` rows holding NaN, with and
  without a stand-in 0 for the NaN: only where the stand-in gives a finite value is the
  NaN to blame (an overflow at that draw is not the data's)."""
  for path, leaf, replaced in _per_datum_arguments(model_args, model_kwargs, num_data,
                                                   np.floating):
    rows = np.flatnonzero(np.isnan(np.asarray(leaf).reshape(num_data, -1)).any(axis=1))
    if not rows.size:
      continue

    @jax.jit  # traced, where NumPyro's argument validation (when on) does not raise
    def finite(column, replaced=replaced, rows=jnp.asarray(rows[:most_rows], jnp.int32)):
      args, kwargs = replaced(column)
      # The gradient too: a NaN logit gives BernoulliLogits a log-probability of 0.
      terms, grads = jax.vmap(jax.value_and_grad(
          lambda at, row: log_likelihood_given(args, kwargs, at, row[None])[0]),
          in_axes=(None, 0))(z, rows)
      return jnp.isfinite(terms) & jnp.all(jnp.isfinite(grads), axis=1)

    blamed = ~np.asarray(finite(leaf)) & np.asarray(finite(jnp.nan_to_num(leaf, nan=0.0)))
    if blamed.any():
      row = int(rows[np.argmax(blamed)])
      raise ValueError(
          f"dsgrad.contrib.numpyro: {argument_name(model, path)} holds NaN at row {row:,}, "
          "which makes that datum's log-likelihood or its gradient NaN (training would stop at a "
          "non-finite step). Where NaN marks a missing value, give it a finite stand-in and "
          "mask the datum's term (numpyro.handlers.mask), or drop the row")


def _per_datum_arguments(model_args, model_kwargs, num_data: int, kind):
  """``(path, array, replaced)`` for each of a model's array arguments with one row per
  datum and a dtype of ``kind`` (``np.floating``, ``np.signedinteger``);
  ``replaced(value)`` is ``(args, kwargs)`` with ``value`` in that argument's place."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path((model_args, model_kwargs))
  for position, (path, leaf) in enumerate(leaves):
    if not (hasattr(leaf, "dtype") and np.ndim(leaf) >= 1 and len(leaf) == num_data
            and np.issubdtype(leaf.dtype, kind)):
      continue

    def replaced(value, position=position):
      given = [v for _, v in leaves]
      given[position] = value
      return jax.tree_util.tree_unflatten(treedef, given)

    yield path, leaf, replaced


def per_datum_log_likelihood(model, plate: str, observed, fixed, unravel):
  """``(args, kwargs, z, indices) -> (B,)``: the data plate's log-likelihood per datum,
  with the model's arguments explicit."""

  @one_at_a_time
  def log_likelihood_given(args, kwargs, z, indices):
    # Each site's gradient summed whole before they are concatenated into z's, as in
    # dsgrad.objective_from_logdensity (XLA on a GPU otherwise fused a site's batch sum
    # into that concatenation, a few threads summing the batch serially).
    sites = jax.lax.optimization_barrier(unravel(z))
    constrained = numpyro_util.constrain_fn(fixed, args, kwargs, sites)
    batch_trace = trace(handlers.substitute(with_indices(model, plate, indices),
                                            data=constrained), args, kwargs)
    total = 0.0
    for name in observed:
      site = batch_trace[name]
      log_prob = site["fn"].log_prob(site["value"])
      log_prob = jnp.broadcast_to(log_prob, site["fn"].batch_shape)
      dim = next(f.dim for f in site["cond_indep_stack"] if f.name == plate)
      axis = log_prob.ndim + dim
      if axis < 0 or log_prob.shape[axis] != indices.shape[0]:
        raise PlateMismatch(
            f"observed site {name!r} has batch shape {log_prob.shape}, which does not "
            f"follow the {indices.shape[0]} indices of plate {plate!r}: index the data "
            f"with the plate's indices (`with numpyro.plate({plate!r}, N, "
            "subsample_size=...) as idx:` and `obs=y[idx]`)")
      total = total + jnp.sum(jnp.moveaxis(log_prob, axis, 0).reshape(indices.shape[0], -1),
                              axis=1)
    return total

  return log_likelihood_given
