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
subsampling SVI requires: dsgrad substitutes the indices of its mini-batch for them. A
``numpyro.factor`` in the data plate is a per-datum likelihood term like an observation.
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

import dataclasses
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

from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad import families
from dsgrad.contrib import _numpyro_reads as reads_lib
from dsgrad.contrib import _numpyro_trace as trace_lib
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


def to_model(model, *model_args, data_plate: str | None = None,
             reads: dict | str | None = "auto", **model_kwargs) -> NumpyroModel:
  """A :class:`dsgrad.models.Model` from a NumPyro model (see the module docstring).

  Args:
    model: a NumPyro model (a callable with NumPyro primitives).
    *model_args: positional arguments for ``model`` (the data, typically; numpy arrays
      are converted to JAX arrays so that the model can index them inside ``jit``).
    data_plate: name of the plate that carries the observations. By default, the one
      subsampled plate that holds observed sites, else the one plate all observed sites
      share.
    reads: which rows of a latent site each datum reads: ``{site: argument}``, datum
      ``n`` reads only row ``site[argument[n]]`` of that site (a tuple of arguments for
      several rows, ``{"skill": ("winner", "loser")}``, or an argument of shape
      ``(N, m)``), and every other site whole; arguments are named as the model's
      parameters (or keywords). The model then declares those ``k`` coordinates per datum
      (``model.sparse``, :func:`dsgrad.models.with_coordinates`), so
      :func:`dsgrad.joint_saga` keeps a table of ``N x 2k`` numbers instead of ``N x 2d``;
      each datum's term is then the model run on that datum's arguments with the
      declared sites cut to the rows it reads (``O(k)``; ``O(d)``, the rows written into
      a zero latent, where the model cannot run so). Checked at a random latent on a few
      data spread over the plate: a site whose unconstrained rows mix (an ordered
      transform across groups) or a likelihood that reads more is refused. ``"auto"``
      (default): found where it can be: a site of ``R`` rows is declared with the integer
      arguments (values in ``[0, R)``, one or ``m`` per datum) that point, on 16 data
      spread over the plate, to the rows of it that each datum's term moves (its
      gradient), where that declaration passes the same check; ``model.sparse`` is
      ``None`` where nothing is found (a model without such arguments compiles nothing
      more). ``None``: none.
    **model_kwargs: keyword arguments for ``model``.

  Returns:
    A :class:`NumpyroModel`. Its ``model.log_prior`` is NumPyro's log density of the
    latent sites and of any observed site outside the data plate, in unconstrained
    space with the log-Jacobian; ``model.log_likelihood(z, indices)`` is the sum of the
    data-plate observed sites' log densities per datum, unscaled.

  Raises:
    ValueError: no observed site; observations in two data plates (or in no common
      plate); a latent site inside the data plate (a local latent variable, named in the
      message); a discrete latent site; a ``numpyro.param`` site (it would stay at its
      initial value); a model that does not index its data with the plate's indices; a
      NaN in a per-datum argument that makes its datum's log-likelihood or gradient NaN
      (one the model masks is kept).
  """
  model_args, model_kwargs = jax.tree_util.tree_map_with_path(
      lambda path, a: _on_device(model, path, a), (model_args, model_kwargs))
  try:
    trace = trace_lib.prior_trace(model, model_args, model_kwargs)
  except ValueError as error:
    if "broadcast" not in str(error).lower():
      raise
    raise ValueError(
        f"tracing the model failed ({error}). If an observed site sits in a subsampled plate, "
        "its data must be indexed with the plate's indices: `with numpyro.plate('data', N, "
        "subsample_size=...) as idx:` and `obs=y[idx]`, with every per-datum array indexed "
        "the same way") from error
  plate = trace_lib.find_data_plate(trace, data_plate)
  _check_one_subsampled_plate(trace, plate)
  num_data, subsample_size = trace[plate]["args"]
  num_data = int(num_data)
  batch_size = int(subsample_size or num_data)
  latent, observed = _global_latents_and_observations(trace, plate)

  fixed = trace_lib.with_indices(model, plate, jnp.arange(batch_size, dtype=jnp.int32))
  # Compiled, with the model's arrays as arguments: op by op, each NumPyro density
  # compiled a small program per operation; closed over, the arrays would be folded into
  # the program.
  arrays, rebuild = trace_lib.array_arguments(model_args, model_kwargs)
  unconstrain = trace_lib.one_at_a_time(
      lambda arrays, latent: numpyro_util.unconstrain_fn(fixed, *rebuild(arrays), latent))
  unconstrained = jax.jit(unconstrain)(arrays, latent)
  arguments = trace_lib.named_arguments(model, model_args, model_kwargs)
  layout = None if reads is None or reads == "auto" else reads_lib.read_layout(
      reads, unconstrained, arguments, num_data)  # before anything compiles
  flat, unravel = ravel_pytree({k: jnp.asarray(v, jnp.float32)
                                for k, v in unconstrained.items()})
  latent_sites = tuple(sorted(latent))

  @trace_lib.one_at_a_time
  def constrain(z):
    return numpyro_util.constrain_fn(fixed, model_args, model_kwargs, unravel(z))

  log_prior, log_joint_subsampled = _compiled_densities(model, plate, fixed, observed,
                                                        unravel, (arrays, rebuild))
  log_likelihood_given = trace_lib.per_datum_log_likelihood(model, plate, observed, fixed, unravel)

  # The NumPyro model indexes its own arrays with the plate's indices, so it receives
  # indices (a dsgrad model without data): its arrays are constants of its programs.
  def log_likelihood(z, indices):
    return log_likelihood_given(model_args, model_kwargs, z, indices)

  probe = jnp.arange(min(2, num_data), dtype=jnp.int32)
  try:
    jax.eval_shape(log_likelihood, flat, probe)
  except trace_lib.PlateMismatch:
    raise
  except (ValueError, TypeError, IndexError) as error:
    raise ValueError(
        f"evaluating the model on a batch of {probe.shape[0]} indices of plate {plate!r} "
        f"failed ({error}). dsgrad substitutes its mini-batch for the plate's indices, so "
        f"the model must index its data with them: `with numpyro.plate({plate!r}, N, "
        "subsample_size=...) as idx:` and `obs=y[idx]`") from error
  trace_lib.check_plate_size(model, log_likelihood_given, model_args, model_kwargs, flat, probe, plate,
                    num_data)

  trace_lib.check_per_datum(log_likelihood, log_joint_subsampled, log_prior, flat, plate, num_data)
  trace_lib.check_index_arguments(model, log_likelihood_given, model_args, model_kwargs, flat,
                                  num_data)
  trace_lib.check_missing_values(model, log_likelihood_given, model_args, model_kwargs, flat,
                                 num_data)
  dsgrad_model = Model(log_prior, log_likelihood, num_data, int(flat.shape[0]),
                       getattr(model, "__name__", "numpyro_model"), unravel=unravel)
  dsgrad_model = _with_reads(dsgrad_model, reads, layout, unconstrained, arguments,
                             (model, plate, observed, model_args, model_kwargs))
  return NumpyroModel(dsgrad_model, plate, tuple(observed), latent_sites, unravel, constrain,
                      batch_size)


def _check_one_subsampled_plate(trace, plate: str) -> None:
  """Refuses a plate other than the data plate that subsamples."""
  others = sorted(name for name, site in trace.items() if site["type"] == "plate"
                  and name != plate and site["args"][1] not in (None, site["args"][0]))
  if others:
    raise ValueError(f"plate(s) {others} subsample too, besides the data plate {plate!r}: "
                     "dsgrad draws the mini-batch of one plate only, and a second "
                     "subsampled plate would be rescaled at random inside every step. Give "
                     "them no subsample_size")


def _with_reads(found: Model, reads, layout, unconstrained: dict, arguments: dict,
                traced: tuple) -> Model:
  """``found`` with its declared reads (``layout``, :func:`_numpyro_reads.read_layout`), or
  with those :func:`_numpyro_reads.found` finds (``reads="auto"``) where they pass the
  check a declaration passes; as it is where none are found or they do not pass (a
  wrong guess would cost joint SAGA its compact table, not its unbiased updates)."""
  if reads is None:
    return found
  if reads != "auto":
    return reads_lib.with_reads(reads, layout, found, unconstrained, traced)
  reads = reads_lib.found(unconstrained, arguments, found.log_likelihood, found.num_data)
  if reads is None:
    return found
  try:
    layout = reads_lib.read_layout(reads, unconstrained, arguments, found.num_data)
    return reads_lib.with_reads(reads, layout, found, unconstrained, traced)
  except ValueError:
    return found


def _compiled_densities(model, plate: str, fixed, observed, unravel, arguments):
  """``(log_prior(z), log_joint_subsampled(z, indices))``: NumPyro's log density of the
  latent sites (and of observed sites outside the data plate), and of the whole model with
  the plate subsampled at ``indices``, each compiled with the model's arrays
  (``arguments = (arrays, rebuild)``, :func:`_numpyro_trace.array_arguments`) as
  arguments."""
  arrays, rebuild = arguments
  prior_model = handlers.block(fixed, hide=observed)

  @jax.jit
  @trace_lib.one_at_a_time
  def log_prior_given(arrays, z):
    return -numpyro_util.potential_energy(prior_model, *rebuild(arrays), unravel(z))

  @jax.jit
  @trace_lib.one_at_a_time
  def log_joint_given(arrays, z, indices):
    subsampled = trace_lib.with_indices(model, plate, indices)
    with trace_lib.other_batch_sizes_allowed():
      return -numpyro_util.potential_energy(subsampled, *rebuild(arrays), unravel(z))

  return (lambda z: log_prior_given(arrays, z),
          lambda z, indices: log_joint_given(arrays, z, indices))


def _global_latents_and_observations(trace, plate: str):
  """``({latent site: value}, [observed sites in the plate])``; refuses local, discrete
  or missing latent sites and a plate without observations."""
  params = [name for name, site in trace.items() if site["type"] == "param"]
  if params:
    raise ValueError(f"numpyro.param site(s) {params}: dsgrad infers the model's sample "
                     "sites and would hold a param at its initial value, untrained. Give "
                     "it a prior (numpyro.sample), or pass a fixed value as an argument")
  latent, observed = {}, []
  for name, site in trace.items():
    # An auxiliary site is skipped unless observed: numpyro.factor is one, and in the data
    # plate it is a per-datum log-likelihood term like any observation.
    if site["type"] != "sample" or (site["infer"].get("is_auxiliary")
                                    and not site["is_observed"]):
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

  return latent, observed


@dataclasses.dataclass(frozen=True, eq=False)
class NumpyroObjective(Objective):
  """A :class:`dsgrad.Objective` built from a NumPyro model, with the way back.

  Attributes (beyond :class:`dsgrad.Objective`'s):
    numpyro_model: the :class:`NumpyroModel` (sites, plate, transforms).
    family: ``"meanfield"`` or ``"fullrank"``.
  """

  numpyro_model: NumpyroModel | None = None
  family: str = "meanfield"

  @checks.arguments(loc=checks.finite_values(), scale=checks.positive())
  def init_params(self, loc: float | jax.Array = 0.0, scale: float = 0.1) -> dict:
    """Initial variational parameters: mean ``loc`` and standard deviation ``scale`` in
    unconstrained space (NumPyro's ``AutoNormal`` starts at scale 0.1 too)."""
    return families.by_name(self.family, self.numpyro_model.model.latent_dim, loc=loc,
                            log_scale=float(np.log(scale))).params()

  @checks.arguments(key=checks.prng_key(), params=checks.parameters(),
                    num_samples=checks.count(1))
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
    checks.check_objective_evaluates(self, params, "contrib.numpyro.sample_posterior")
    transform = families.FAMILIES[self.family].transform
    d = self.numpyro_model.model.latent_dim
    eps = jax.random.normal(key, (num_samples, d))
    z = jax.vmap(lambda e: transform(params, e))(eps)
    return jax.vmap(self.numpyro_model.constrain)(z)

  @checks.arguments(params=checks.parameters())
  def autonormal_params(self, params: dict) -> dict:
    """Mean-field params as NumPyro ``AutoNormal`` params (``{site}_auto_loc`` and
    ``{site}_auto_scale``), to compare with or hand over to NumPyro's ``SVI``."""
    if self.family != "meanfield":
      raise ValueError("AutoNormal is mean-field; this objective's family is "
                       f"{self.family!r}")
    checks.check_objective_evaluates(self, params, "contrib.numpyro.autonormal_params")
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


def _on_device(model, path, value):
  """A model argument as the model will index it: a NumPy array (or a pandas column, read
  as one) on the device, where a traced batch can index it; 64-bit integers beyond 32
  bits, which JAX would wrap without ``jax_enable_x64``, refused by name."""
  value = data_lib.as_array(value)  # a pandas Series failed when indexed by a traced batch
  if not isinstance(value, np.ndarray):
    return value
  if not jax.config.jax_enable_x64:
    checks.check_int32_range(value, f"dsgrad.contrib.numpyro: "
                                    f"{trace_lib.argument_name(model, path)}")
  return jnp.asarray(value)


def objective(model, *model_args, family: str = "meanfield", shared_noise: bool = True,
              data_plate: str | None = None, path_derivative: bool = False,
              reads: dict | str | None = "auto", **model_kwargs) -> NumpyroObjective:
  """The BBVI objective (Eq. 3) of a NumPyro model, over a Gaussian family in
  unconstrained space.

  Args:
    model: a NumPyro model; observations in one plate that indexes the data, global
      continuous latent sites (see :func:`to_model`).
    *model_args: positional arguments for ``model``.
    family: ``"meanfield"`` or ``"fullrank"`` (:mod:`dsgrad.families`).
    shared_noise: one noise draw for the whole batch (default) or one per datum.
    data_plate: the plate that indexes the data (found automatically by default).
    path_derivative: the "sticking the landing" gradient
      (:func:`dsgrad.families.bbvi_objective`); off by default.
    reads: which rows of a latent site each datum reads (see :func:`to_model`): then
      ``dsgrad.joint_saga(objective)`` keeps a table of those coordinates only
      (mean-field, without ``path_derivative``; ``"auto"``, the default, searches only
      there).
    **model_kwargs: keyword arguments for ``model``.

  Returns:
    A :class:`NumpyroObjective`: a :class:`dsgrad.Objective` with ``init_params``,
    ``sample_posterior`` and ``autonormal_params``.

  Raises:
    ValueError: see :func:`to_model`; an unknown family.
  """
  if reads == "auto" and (family != "meanfield" or path_derivative):
    reads = None  # found reads serve the mean-field table only: no search
  found = to_model(model, *model_args, data_plate=data_plate, reads=reads, **model_kwargs)
  base = families.objective_by_name(family, found.model, shared_noise=shared_noise,
                                    path_derivative=path_derivative)
  return NumpyroObjective(base.loss_fn, base.noise_fn, base.num_data,
                          shared_noise=base.shared_noise, data=base.data,
                          log_q_offset=base.log_q_offset, source=base.source,
                          table_approximation=base.table_approximation,
                          name=f"numpyro:{found.model.name}", numpyro_model=found,
                          family=family)
