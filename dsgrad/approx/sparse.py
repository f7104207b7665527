""":func:`linearize` with a compact table for models whose per-datum terms read a
few coordinates of the latent vector (e.g. Bradley-Terry, hierarchical models).

References:
  Wang, Geffner, Domke (2024), Sec. 4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dsgrad import derivatives
from dsgrad.approx.base import Approximation, with_statistics
from dsgrad.families.gaussian import meanfield_entropy
from dsgrad.models.base import Model
from dsgrad.objective import Objective


def _model_of(model_or_objective) -> Model:
  """The model of a mean-field objective (``source``), or the model itself; refused where
  it declares no sparse likelihood."""
  model = model_or_objective
  if isinstance(model_or_objective, Objective):
    source = model_or_objective.source or ()
    if source[:1] != ("meanfield_gaussian",):
      raise ValueError(f"sparse_linearize needs a mean-field Gaussian objective built from a "
                       f"model (dsgrad.objective_from_logdensity, dsgrad.meanfield_gaussian, "
                       f"without path_derivative); {model_or_objective.name!r} is not one")
    model = source[1]
  elif not isinstance(model_or_objective, Model):
    raise TypeError(f"sparse_linearize takes a dsgrad.models.Model or the dsgrad.Objective "
                    f"built from it, got {type(model_or_objective).__name__}")
  if model.sparse is None:
    raise ValueError(f"sparse_linearize needs a model that declares which coordinates "
                     f"each likelihood term reads (model.sparse); {model.name!r} has none. "
                     f"Declare it with dsgrad.models.with_coordinates(model, k, fn), or "
                     f"use linearize().")
  return model


def _table_carried_by(objective):
  """The compact table an objective over params shaped like the latent
  (:func:`dsgrad.families.structured`) carries; ``None`` for any other argument."""
  if (isinstance(objective, Objective) and objective.source is None
      and objective.table_approximation is not None):
    table = objective.table_approximation(objective)
    return table if table.name.startswith("sparse_linearize") else None
  return None


def _check_params(params, name: str, d: int) -> None:
  if not isinstance(params, dict) or set(params) != {"loc", "log_scale"}:
    raise ValueError(f"sparse_linearize({name}) works on mean-field Gaussian "
                     f"params {{'loc', 'log_scale'}}, got {jax.tree.structure(params)}")
  for key, value in params.items():
    if jnp.shape(value) != (d,):
      raise ValueError(f"sparse_linearize({name}): params[{key!r}] has shape "
                       f"{jnp.shape(value)}, expected ({d},)")


def sparse_linearize(model: Model | Objective) -> Approximation:
  """:func:`linearize` for mean-field Gaussian BBVI with a table of each datum's coordinates.

  For a model that declares which latent coordinates each likelihood term reads
  (``model.sparse``, a :class:`dsgrad.models.SparseLikelihood`), the per-datum loss of
  :func:`dsgrad.meanfield_gaussian` splits into a likelihood term that depends on the
  variational parameters only through ``w_n = (loc[c_n], log_scale[c_n])`` and a
  data-independent term (prior and entropy):

      f(w; n, eps) = l_n(w_n, eps[c_n]) + c(w, eps),
      l_n = -N log p(x_n | loc[c_n] + exp(log_scale[c_n]) * eps[c_n]),
      c   = -log p(loc + exp(log_scale) * eps) - H(w).

  Both terms are linearized in the noise around zero, exactly as :func:`linearize`
  does for the whole loss (linearization is linear in the loss, so at the current
  parameters the two approximations coincide -- tested). ``joint_saga`` then stores
  per datum only ``w_n``: ``2 k`` numbers instead of ``2 d`` (MovieLens 100K: 180
  instead of 170,100), evaluates ``l_n``'s terms at the stored ``w_n`` and ``c``'s at the
  current parameters. With a flat prior this is the dense ``joint_saga(objective,
  linearize())`` estimator update for update (tested); with a prior, the prior's
  control variate is taken at the current parameters rather than the stored ones
  (both are unbiased; the prior is cheap to evaluate at ``w``).

  Cost per step: one gradient and one JVP of ``l_n`` per batch datum on ``k``
  coordinates, a gather and a scatter-add of ``B k`` values, and one gradient and JVP
  of the prior over ``d`` -- no ``d``-sized work per datum.

  Args:
    model: a model with ``model.sparse`` set (``dsgrad.models.movielens``,
      ``dsgrad.models.bradley_terry``, a model written with
      :func:`dsgrad.model_from_logdensity`'s ``reads``, or any model via
      :func:`dsgrad.models.with_coordinates`), used with
      :func:`dsgrad.meanfield_gaussian` (shared or per-datum noise); or that mean-field
      objective itself (e.g. :func:`dsgrad.objective_from_logdensity` with ``reads``),
      also over params shaped like the latent (:func:`dsgrad.families.structured`).

  Returns:
    An :class:`Approximation` with :class:`DatumStatistics` for params
    ``{"loc", "log_scale"}`` (flat, or shaped like the latent for a structured objective).

  Raises:
    ValueError: if the model declares no sparse likelihood, or (when called) the params
      are not mean-field Gaussian params of the model's dimension.

  References:
    Wang, Geffner, Domke (2024), Sec. 4 (the approximation), Sec. 7.1 (MovieLens, where
    the dense table did not fit in memory).

  Example: on a Bradley-Terry model of 50 players, joint SAGA's table holds each match's
  two players' ``(loc, log_scale)``: 4 numbers per match instead of 100::

    >>> import jax, dsgrad
    >>> winners, losers, _ = dsgrad.models.synthetic_bradley_terry_data(
    ...     jax.random.key(0), 50, 1000)
    >>> model = dsgrad.models.bradley_terry(winners, losers, 50)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> estimator = dsgrad.joint_saga(objective, dsgrad.approx.sparse_linearize(model))
    >>> dsgrad.table_bytes(estimator.init(dsgrad.meanfield_init(model, 0.0, -1.0)))
    16000
  """
  if (table := _table_carried_by(model)) is not None:
    return table
  model = _model_of(model)
  sparse = model.sparse
  n, d, k = model.num_data, model.latent_dim, sparse.num_coordinates

  def check(params):
    _check_params(params, model.name, d)

  def coordinates(rows):
    coords = sparse.coordinates(rows)
    b = jax.tree.leaves(rows)[0].shape[0]
    if coords.shape != (b, k):
      raise ValueError(f"{model.name}: sparse.coordinates returned shape {coords.shape}, "
                       f"expected {(b, k)}")
    return coords

  def statistics(params, rows):
    check(params)
    coords = coordinates(rows)
    return {"loc": params["loc"][coords], "log_scale": params["log_scale"][coords]}

  def local_noise(objective, noise, coords):
    if objective.shared_noise:
      return noise[coords]
    return jnp.take_along_axis(noise, coords, axis=1)

  def batch_loss(local, rows, eps):
    # Datum b's term reads only its own coordinates' values, so the gradient of the sum
    # with respect to the stacked values is each datum's own gradient: no vmap over the
    # data.
    z = local["loc"] + jnp.exp(local["log_scale"]) * eps
    return -n * jnp.sum(sparse.log_likelihood_local(z, rows))

  def local_terms(local, rows, eps):
    def grad_at(e):
      return jax.grad(batch_loss)(local, rows, e)
    expected, deviation = derivatives.jvp(grad_at, (jnp.zeros_like(eps),), (eps,))
    return optax.tree.add(expected, deviation), expected

  def scatter(params, local, coords, weights):
    flat = coords.reshape(-1)
    return {key: jnp.zeros_like(params[key]).at[flat].add(
        (local[key] * weights[:, None].astype(local[key].dtype)).reshape(-1)
        .astype(params[key].dtype)) for key in ("loc", "log_scale")}

  def datum_terms(objective, params, stats, rows, noise, weights):
    check(params)
    coords = coordinates(rows)
    eps = local_noise(objective, noise, coords)
    local = jax.tree.map(lambda v: v.astype(params["loc"].dtype), stats)
    d_rows, e_rows = local_terms(local, rows, eps)
    return scatter(params, d_rows, coords, weights), scatter(params, e_rows, coords, weights)

  def datum_expected(objective, params, stats, rows, weights):
    del objective
    coords = coordinates(rows)
    local = jax.tree.map(lambda v: v.astype(params["loc"].dtype), stats)
    e_rows = jax.grad(batch_loss)(local, rows, jnp.zeros_like(local["loc"]))
    return scatter(params, e_rows, coords, weights)

  def global_loss(params, eps):
    z = params["loc"] + jnp.exp(params["log_scale"]) * eps
    return -model.log_prior(z) - meanfield_entropy(params["log_scale"])

  def global_terms(objective, params, noise):
    check(params)
    if not objective.shared_noise:
      noise = jnp.mean(noise, 0)  # the linearization is linear in the noise
    expected, deviation = derivatives.jvp(lambda e: jax.grad(global_loss)(params, e),
                                          (jnp.zeros_like(noise),), (noise,))
    return optax.tree.add(expected, deviation), expected

  return with_statistics(statistics, datum_terms, datum_expected, global_terms,
                          "sparse_linearize", jnp.float32)
