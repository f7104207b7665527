"""dsgrad objectives from NumPyro models: keep the model, swap in a better estimator.

A NumPyro model whose observations sit in one ``numpyro.plate`` (the *data plate*) and
whose latent variables are all global (outside that plate) defines a doubly-stochastic
BBVI objective: the data plate's index is the datum ``n``, the Gaussian family's noise
is ``eps``. :func:`objective` traces the model once, finds the data plate, maps the
latent sites to unconstrained space with NumPyro's own transforms
(``numpyro.infer.util.constrain_fn`` / ``potential_energy``, so the prior carries the
log-Jacobian) and returns a :class:`dsgrad.Objective` that every dsgrad estimator and
:func:`dsgrad.fit` accept::

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
        with numpyro.plate("data", x.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    objective = dsgrad.contrib.numpyro.objective(model, x, y)
    params = objective.init_params()
    ...                                      # any estimator, e.g. dsgrad.joint_saga
    samples = objective.sample_posterior(key, params, 1000)   # {"w": (1000, D)}
    numpyro.infer.Predictive(model, samples)(key, x, y)

The model must index its data with the plate's indices (``x[idx]``), as NumPyro's own
subsampling SVI requires: dsgrad substitutes the indices of its mini-batch for them.
The per-datum loss is ``-N log p(x_n | z) - log p(z) - H(q)`` in unconstrained space
(Eq. 3 of the joint control variate paper), with ``N`` the plate's ``size``; the plate's
``subsample_size`` only sets the batch of the initial trace.

References:
  Wang, Geffner, Domke (2024). Joint control variate for faster black-box variational
  inference. AISTATS (Eq. 3).
  Phan, Pradhan, Jankowiak (2019). Composable effects for flexible and accelerated
  probabilistic programming in NumPyro.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from typing import Callable, NamedTuple

try:
  import numpyro
  from numpyro import handlers
  from numpyro.infer import util as numpyro_util
except ImportError as error:  # pragma: no cover - exercised only without the extra
  raise ImportError("dsgrad.contrib.numpyro needs NumPyro: pip install 'dsgrad[numpyro]'"
                    ) from error

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from dsgrad import families
from dsgrad.data import DataArray
from dsgrad.models.base import Model
from dsgrad.objective import Objective


class NumpyroModel(NamedTuple):
  """What :func:`to_model` found in a NumPyro model.

  Attributes:
    model: the :class:`dsgrad.models.Model` over the flat unconstrained latent.
    data_plate: name of the plate that carries the observations.
    observed_sites: names of the observed sites inside the data plate (the likelihood).
    latent_sites: names of the latent sample sites (all global), in flattening order.
    unravel: flat unconstrained ``z`` -> ``{site: unconstrained value}``.
    constrain: flat unconstrained ``z`` -> ``{site: constrained value}`` (NumPyro's
      ``constrain_fn``).
    batch_size: the plate's ``subsample_size`` (its ``size`` when it does not subsample).
  """

  model: Model
  data_plate: str
  observed_sites: tuple[str, ...]
  latent_sites: tuple[str, ...]
  unravel: Callable[[jax.Array], dict]
  constrain: Callable[[jax.Array], dict]
  batch_size: int


class _PlateMismatch(ValueError):
  """An observed site whose batch shape does not follow the data plate's indices."""


@contextlib.contextmanager
def _other_batch_sizes_allowed():
  """Silences NumPyro's warning about a batch of another size than the plate's
  ``subsample_size``: dsgrad substitutes batches of its own size on purpose."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="subsample_size does not match")
    yield


def _trace(fn, args, kwargs, seed=0):
  with _other_batch_sizes_allowed():
    return handlers.trace(handlers.seed(fn, seed)).get_trace(*args, **kwargs)


def _with_indices(model, plate: str, indices):
  """The model with the data plate's subsample indices fixed to ``indices``."""
  return handlers.substitute(model, data={plate: indices})


def _find_data_plate(trace, data_plate: str | None) -> str:
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
_INDEX_PRIMITIVES = frozenset({
    "lt", "le", "gt", "ge", "add", "sub", "select_n", "broadcast_in_dim", "reshape",
    "convert_element_type", "squeeze", "expand_dims", "concatenate", "copy", "clamp",
    "rem", "max", "min"})


def _plate_reads(jaxpr, array_inputs: dict, index_inputs: set, found: list) -> None:
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
      _plate_reads(inner, inner_arrays, inner_indices, found)
      continue
    if name in _INDEX_PRIMITIVES and any(v in indices for v in ins):
      indices.update(eqn.outvars)
    elif name in ("convert_element_type", "copy", "device_put") and ins and ins[0] in arrays:
      arrays[eqn.outvars[0]] = arrays[ins[0]]


def _argument_name(model, path) -> str:
  """``"argument 'x'"`` for the model-argument leaf at ``path`` in ``(args, kwargs)``."""
  head, first, rest = path[0].idx, path[1], jax.tree_util.keystr(tuple(path[2:]))
  if head == 1:
    return f"argument {first.key!r}{rest}"
  try:
    name = list(inspect.signature(model).parameters)[first.idx]
  except (TypeError, ValueError, IndexError):
    name = f"#{first.idx}"
  return f"argument {name!r}{rest}"


def _check_plate_size(model, log_likelihood_given, model_args, model_kwargs, z, probe, plate: str,
                      num_data: int) -> None:
  """Refuses a data plate whose size differs from the number of rows the model reads with
  the plate's indices.

  JAX clamps out-of-range gathers, so a plate of 120 over 100 rows would silently read
  row 99 again for indices 100-119, and a plate of 80 would never use 20 rows. The check
  reads the model's jaxpr: every gather of a model argument at the plate's indices must
  be over an axis of the plate's size.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path((model_args, model_kwargs))
  positions = [i for i, (_, leaf) in enumerate(leaves) if isinstance(leaf, jax.Array)]
  values = [leaf for _, leaf in leaves]

  def given(arrays, z, indices):
    full = list(values)
    for i, a in zip(positions, arrays):
      full[i] = a
    args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
    return log_likelihood_given(args, kwargs, z, indices)

  closed = jax.make_jaxpr(given)([values[i] for i in positions], z, probe)
  jaxpr = closed.jaxpr
  array_vars = {v: positions[k] for k, v in enumerate(jaxpr.invars[:len(positions)])}
  # Arrays the model closes over (module-level data) are constants of the program; their
  # reads at the plate's indices must match the plate just the same.
  array_vars.update({v: -1 - k for k, v in enumerate(jaxpr.constvars)})
  found: list = []
  _plate_reads(jaxpr, array_vars, {jaxpr.invars[-1]}, found)
  for position, rows in found:
    if rows == num_data:
      continue
    if position >= 0:
      where = _argument_name(model, leaves[position][0])
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


def _probe_indices(num_data: int) -> jax.Array:
  """A few distinct indices spread over the data (first, last, middle, ...)."""
  picks = [0, num_data - 1, num_data // 2, num_data // 3, (2 * num_data) // 3]
  return jnp.asarray(list(dict.fromkeys(p for p in picks if 0 <= p < num_data)), jnp.int32)


def _check_per_datum(log_likelihood, log_joint_subsampled, log_prior, z, plate: str,
                     num_data: int) -> None:
  """Refuses a model whose plate term is not a per-datum function of the plate's indices,
  or whose per-datum terms do not add up to NumPyro's own density of the model.

  dsgrad relies on ``log_likelihood(z, indices)[k]`` depending only on datum
  ``indices[k]``. A model that reads its batch another way (``lax.dynamic_slice`` from the
  first index, a running offset) or nests the data plate so that the per-datum split
  differs from NumPyro's scaling would give a wrong ELBO silently. Both are checked once,
  at a few spread indices: the terms must not depend on the order or company of the
  indices, and ``log p(z) + N/|S| sum_S log p(x_n | z)`` must equal NumPyro's log density of
  the model subsampled at ``S``.
  """
  probe = _probe_indices(num_data)
  batch = log_likelihood(z, probe)
  if not bool(jnp.all(jnp.isfinite(batch))):
    return  # the latent draw is off the model's support; nothing to compare
  flipped = log_likelihood(z, probe[::-1])[::-1]
  singles = jnp.concatenate([log_likelihood(z, probe[k:k + 1]) for k in range(probe.shape[0])])
  scale = 1e-3 * (1.0 + jnp.abs(batch))
  for other, how in ((flipped, "in reversed order"), (singles, "one at a time")):
    if not bool(jnp.all(jnp.abs(other - batch) <= scale)):
      raise ValueError(
          f"the model's terms for plate {plate!r} change when its indices "
          f"{np.asarray(probe).tolist()} are given {how}: they do not depend on each datum's "
          "own index alone (e.g. rows read with lax.dynamic_slice from the first index). "
          "dsgrad substitutes random indices for the plate's, so read the data as "
          "`x[idx]` with the plate's indices")
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


def to_model(model, *model_args, data_plate: str | None = None,
             **model_kwargs) -> NumpyroModel:
  """A :class:`dsgrad.models.Model` from a NumPyro model (see the module docstring).

  Args:
    model: a NumPyro model (a callable with NumPyro primitives).
    *model_args: positional arguments for ``model`` (the data, typically; numpy arrays
      are converted to JAX arrays so that the model can index them inside ``jit``).
    data_plate: name of the plate that carries the observations. By default, the one
      subsampled plate that holds observed sites, else the one plate all observed sites
      share.
    **model_kwargs: keyword arguments for ``model``.

  Returns:
    A :class:`NumpyroModel`. Its ``model.log_prior`` is NumPyro's log density of the
    latent sites and of any observed site outside the data plate, in unconstrained
    space with the log-Jacobian; ``model.log_likelihood(z, indices)`` is the sum of the
    data-plate observed sites' log densities per datum, unscaled.

  Raises:
    ValueError: no observed site; observations in two data plates (or in no common
      plate); a latent site inside the data plate (a local latent variable, named in the
      message); a discrete latent site; a model that does not index its data with the
      plate's indices.
  """
  # numpy data indexed by a traced batch inside jit would fail; put them on device.
  as_jax = lambda a: jnp.asarray(a) if isinstance(a, np.ndarray) else a
  model_args, model_kwargs = jax.tree.map(as_jax, (model_args, model_kwargs))
  try:
    trace = _trace(model, model_args, model_kwargs)
  except ValueError as error:
    if "broadcast" not in str(error).lower():
      raise
    raise ValueError(
        f"tracing the model failed ({error}). If an observed site sits in a subsampled plate, "
        "its data must be indexed with the plate's indices: `with numpyro.plate('data', N, "
        "subsample_size=...) as idx:` and `obs=y[idx]`, with every per-datum array indexed "
        "the same way") from error
  plate = _find_data_plate(trace, data_plate)
  others = sorted(name for name, site in trace.items() if site["type"] == "plate"
                  and name != plate and site["args"][1] not in (None, site["args"][0]))
  if others:
    raise ValueError(f"plate(s) {others} subsample too, besides the data plate {plate!r}: "
                     "dsgrad draws the mini-batch of one plate only, and a second "
                     "subsampled plate would be rescaled at random inside every step. Give "
                     "them no subsample_size")
  num_data, subsample_size = trace[plate]["args"]
  num_data = int(num_data)
  batch_size = int(subsample_size or num_data)
  latent, observed = {}, []
  for name, site in trace.items():
    if site["type"] != "sample" or site["infer"].get("is_auxiliary"):
      continue
    in_plate = any(frame.name == plate for frame in site["cond_indep_stack"])
    if site["is_observed"]:
      if in_plate:
        observed.append(name)
      continue
    if in_plate:
      raise ValueError(f"latent site {name!r} sits inside the data plate {plate!r}: it is a "
                       "local latent variable (one per datum), which dsgrad's global "
                       "variational families do not support yet. Move it out of the plate "
                       "or integrate it out")
    if site["fn"].support.is_discrete:
      raise ValueError(f"latent site {name!r} is discrete ({type(site['fn']).__name__}); "
                       "dsgrad's Gaussian families need continuous latent variables "
                       "(marginalize it in the model)")
    latent[name] = site["value"]
  if not observed:
    raise ValueError(f"no observed site sits inside the data plate {plate!r}")
  if not latent:
    raise ValueError("the model has no latent sample site to infer")

  fixed = _with_indices(model, plate, jnp.arange(batch_size, dtype=jnp.int32))
  unconstrained = numpyro_util.unconstrain_fn(fixed, model_args, model_kwargs, latent)
  flat, unravel = ravel_pytree({k: jnp.asarray(v, jnp.float32)
                                for k, v in unconstrained.items()})
  latent_sites = tuple(sorted(latent))

  def constrain(z):
    return numpyro_util.constrain_fn(fixed, model_args, model_kwargs, unravel(z))

  prior_model = handlers.block(fixed, hide=observed)

  def log_prior(z):
    return -numpyro_util.potential_energy(prior_model, model_args, model_kwargs, unravel(z))

  def log_likelihood_given(args, kwargs, z, indices):
    """The data plate's log-likelihood per datum, with the model's arguments explicit."""
    constrained = numpyro_util.constrain_fn(fixed, args, kwargs, unravel(z))
    batch_trace = _trace(handlers.substitute(_with_indices(model, plate, indices),
                                             data=constrained), args, kwargs)
    total = 0.0
    for name in observed:
      site = batch_trace[name]
      log_prob = site["fn"].log_prob(site["value"])
      log_prob = jnp.broadcast_to(log_prob, site["fn"].batch_shape)
      dim = next(f.dim for f in site["cond_indep_stack"] if f.name == plate)
      axis = log_prob.ndim + dim
      if axis < 0 or log_prob.shape[axis] != indices.shape[0]:
        raise _PlateMismatch(
            f"observed site {name!r} has batch shape {log_prob.shape}, which does not "
            f"follow the {indices.shape[0]} indices of plate {plate!r}: index the data "
            f"with the plate's indices (`with numpyro.plate({plate!r}, N, "
            "subsample_size=...) as idx:` and `obs=y[idx]`)")
      total = total + jnp.sum(jnp.moveaxis(log_prob, axis, 0).reshape(indices.shape[0], -1),
                              axis=1)
    return total

  # The model's per-datum arrays (leading axis N) become data handles, so that compiled
  # programs take them as arguments (dsgrad.data); the likelihood reads them through the
  # handles and hands the current arrays to the NumPyro model.
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path((model_args, model_kwargs))
  handles = {}
  for path, leaf in paths_leaves:
    if isinstance(leaf, jax.Array) and leaf.ndim >= 1 and leaf.shape[0] == num_data:
      name = _argument_label(path)
      handles[name] = DataArray(leaf, name)

  def current_arguments():
    values = [handles[_argument_label(path)].value()
              if _argument_label(path) in handles else leaf for path, leaf in paths_leaves]
    return jax.tree.unflatten(treedef, values)

  def log_likelihood(z, indices):
    args, kwargs = current_arguments()
    return log_likelihood_given(args, kwargs, z, indices)

  probe = jnp.arange(min(2, num_data), dtype=jnp.int32)
  try:
    jax.eval_shape(log_likelihood, flat, probe)
  except _PlateMismatch:
    raise
  except (ValueError, TypeError, IndexError) as error:
    raise ValueError(
        f"evaluating the model on a batch of {probe.shape[0]} indices of plate {plate!r} "
        f"failed ({error}). dsgrad substitutes its mini-batch for the plate's indices, so "
        f"the model must index its data with them: `with numpyro.plate({plate!r}, N, "
        "subsample_size=...) as idx:` and `obs=y[idx]`") from error
  _check_plate_size(model, log_likelihood_given, model_args, model_kwargs, flat, probe, plate,
                    num_data)

  def log_joint_subsampled(z, indices):
    subsampled = _with_indices(model, plate, indices)
    with _other_batch_sizes_allowed():
      return -numpyro_util.potential_energy(subsampled, model_args, model_kwargs, unravel(z))

  _check_per_datum(log_likelihood, log_joint_subsampled, log_prior, flat, plate, num_data)
  dsgrad_model = Model(log_prior, log_likelihood, num_data, int(flat.shape[0]),
                       getattr(model, "__name__", "numpyro_model"), data=handles or None)
  return NumpyroModel(dsgrad_model, plate, tuple(observed), latent_sites, unravel, constrain,
                      batch_size)


def _argument_label(path) -> str:
  """``x`` for keyword argument ``x``, ``arg0`` for the first positional one, and a key
  path below them (``x['a']``): the data names of a NumPyro model's arrays."""
  (group, first), rest = path[:2], path[2:]
  del group
  head = (f"arg{first.idx}" if isinstance(first, jax.tree_util.SequenceKey)
          else str(getattr(first, "key", first)))
  return head + jax.tree_util.keystr(tuple(rest))


@dataclasses.dataclass(frozen=True, eq=False)
class NumpyroObjective(Objective):
  """A :class:`dsgrad.Objective` built from a NumPyro model, with the way back.

  Attributes (beyond :class:`dsgrad.Objective`'s):
    numpyro_model: the :class:`NumpyroModel` (sites, plate, transforms).
    family: ``"meanfield"`` or ``"fullrank"``.
  """

  numpyro_model: NumpyroModel | None = None
  family: str = "meanfield"

  def init_params(self, loc: float | jax.Array = 0.0, scale: float = 0.1) -> dict:
    """Initial variational parameters: mean ``loc`` and standard deviation ``scale`` in
    unconstrained space (NumPyro's ``AutoNormal`` starts at scale 0.1 too)."""
    return families.by_name(self.family, self.numpyro_model.model.latent_dim, loc=loc,
                            log_scale=float(np.log(scale))).params()

  def sample_posterior(self, key: jax.Array, params: dict, num_samples: int) -> dict:
    """Draws from the fitted ``q`` as NumPyro-style posterior samples.

    Args:
      key: PRNG key.
      params: variational parameters (e.g. after training).
      num_samples: number of draws ``S``.

    Returns:
      ``{site: (S, *site_shape)}`` in constrained space, ready for
      ``numpyro.infer.Predictive(model, posterior_samples=...)``.
    """
    transform = families.FAMILIES[self.family].transform
    d = self.numpyro_model.model.latent_dim
    eps = jax.random.normal(key, (num_samples, d))
    z = jax.vmap(lambda e: transform(params, e))(eps)
    return jax.vmap(self.numpyro_model.constrain)(z)

  def autonormal_params(self, params: dict) -> dict:
    """Mean-field params as NumPyro ``AutoNormal`` params (``{site}_auto_loc`` and
    ``{site}_auto_scale``), to compare with or hand over to NumPyro's ``SVI``."""
    if self.family != "meanfield":
      raise ValueError("AutoNormal is mean-field; this objective's family is "
                       f"{self.family!r}")
    unravel = self.numpyro_model.unravel
    locs, scales = unravel(params["loc"]), unravel(jnp.exp(params["log_scale"]))
    out = {}
    for site in self.numpyro_model.latent_sites:
      out[f"{site}_auto_loc"] = locs[site]
      out[f"{site}_auto_scale"] = scales[site]
    return out

  def params_from_autonormal(self, autonormal_params: dict) -> dict:
    """The inverse of :meth:`autonormal_params`: mean-field params from NumPyro
    ``AutoNormal`` params (e.g. ``svi.get_params(svi_state)``)."""
    if self.family != "meanfield":
      raise ValueError("AutoNormal is mean-field; this objective's family is "
                       f"{self.family!r}")
    sites = self.numpyro_model.latent_sites
    missing = [f"{s}_auto_loc" for s in sites if f"{s}_auto_loc" not in autonormal_params]
    if missing:
      raise ValueError(f"AutoNormal params lack {missing}; were they made for another model?")
    loc = ravel_pytree({s: jnp.asarray(autonormal_params[f"{s}_auto_loc"], jnp.float32)
                        for s in sites})[0]
    scale = ravel_pytree({s: jnp.asarray(autonormal_params[f"{s}_auto_scale"], jnp.float32)
                          for s in sites})[0]
    return {"loc": loc, "log_scale": jnp.log(scale)}


def objective(model, *model_args, family: str = "meanfield", shared_noise: bool = True,
              data_plate: str | None = None, **model_kwargs) -> NumpyroObjective:
  """The BBVI objective (Eq. 3) of a NumPyro model, over a Gaussian family in
  unconstrained space.

  Args:
    model: a NumPyro model; observations in one plate that indexes the data, global
      continuous latent sites (see :func:`to_model`).
    *model_args: positional arguments for ``model``.
    family: ``"meanfield"`` or ``"fullrank"`` (:mod:`dsgrad.families`).
    shared_noise: one noise draw for the whole batch (default) or one per datum.
    data_plate: the plate that indexes the data (found automatically by default).
    **model_kwargs: keyword arguments for ``model``.

  Returns:
    A :class:`NumpyroObjective`: a :class:`dsgrad.Objective` with ``init_params``,
    ``sample_posterior`` and ``autonormal_params``.

  Raises:
    ValueError: see :func:`to_model`; an unknown family.
  """
  found = to_model(model, *model_args, data_plate=data_plate, **model_kwargs)
  base = families.by_name(family, found.model.latent_dim).objective(
      found.model, shared_noise=shared_noise)
  return NumpyroObjective(base.loss_fn, base.noise_fn, base.num_data,
                          shared_noise=base.shared_noise, data=base.data,
                          name=f"numpyro:{found.model.name}", numpyro_model=found,
                          family=family)
