"""Objectives from plain log-density functions: the lowest-level way to bring a model.

A user who has ``log_prior(z)`` and a per-datum ``log_lik(z, batch)`` gets a
:class:`dsgrad.models.Model` (and from it a BBVI :class:`dsgrad.Objective`) without
writing anything else; every estimator then applies. ``z`` may be a flat vector or any
pytree of arrays (the variational family works on its flattening, see
``jax.flatten_util.ravel_pytree``).

    objective = dsgrad.objective_from_logdensity(
        log_prior, log_lik, data={"x": x, "y": y}, latent=jnp.zeros(d))

References:
  Wang, Geffner, Domke (2024), Eq. 1-3 (the BBVI objective built here).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import data as data_lib
from dsgrad import families
from dsgrad.models.base import Model, model_data
from dsgrad.objective import Objective


def _latent_unravel(latent) -> tuple[int, Callable]:
  if isinstance(latent, (int, np.integer)) and not isinstance(latent, bool):
    if latent < 1:
      raise ValueError(f"latent must be a positive dimension or an example pytree, got {latent}")
    return int(latent), lambda z: z
  return families.latent_unravel(latent, "the latent dimension or an example value of z")


def _num_data(data) -> int:
  leaves = jax.tree.leaves(data)
  if not leaves:
    raise ValueError("data is empty; give a pytree of arrays with the data on axis 0")
  shapes = [tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf) for leaf in leaves]
  sizes = {int(shape[0]) if shape else None for shape in shapes}
  if None in sizes:
    raise ValueError("every leaf of data needs a leading data axis; a scalar leaf has none "
                     "(close over constants in log_lik instead)")
  if len(sizes) != 1:
    raise ValueError(f"the leaves of data disagree on the number of data (axis 0): "
                     f"{sorted(sizes)}")
  n = sizes.pop()
  if n < 1:
    raise ValueError("data have zero rows")
  return n


def _leaf_name(path) -> str:
  """A data leaf's name in ``objective.data`` (the keys ``with_data`` takes): its path in
  the data pytree, ``"x"`` for ``data["x"]``, ``"a/0"`` for ``data["a"][0]``, ``"data"``
  for a single array."""
  parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
  return "/".join(parts) or "data"


def model_from_logdensity(log_prior: Callable[[Any], jax.Array],
                          log_lik: Callable[[Any, Any], jax.Array], data, latent, *,
                          name: str = "logdensity") -> Model:
  """A :class:`dsgrad.models.Model` from a log prior and a per-datum log likelihood.

  Args:
    log_prior: ``log_prior(z) -> scalar``, the log prior density of the latent ``z``
      (unconstrained: transform constrained variables yourself, with the Jacobian).
    log_lik: ``log_lik(z, batch) -> (B,)``: ``log p(x_n | z)`` for each datum of
      ``batch``, where ``batch`` is ``data`` indexed by ``B`` datum indices on axis 0.
      One value per datum, not their sum: the estimators need per-datum terms.
    data: an array or pytree of arrays sharing the leading data axis ``N``. It is put on
      device once and indexed inside ``jit``; compiled programs receive it as an
      argument, not as constants. A leaf may be a memory-mapped array
      (:func:`dsgrad.data.open_memmap`): it stays on the host and :func:`dsgrad.fit`
      reads each block of steps' rows ahead of the device.
    latent: the latent dimension ``d`` (then ``z`` is a flat ``(d,)`` vector) or an
      example value of ``z`` (any pytree of float arrays; the model's flat latent is its
      ``ravel_pytree`` flattening, and ``log_prior``/``log_lik`` receive the pytree).
    name: label for messages and tables.

  Returns:
    A ``Model`` with ``num_data = N`` and ``latent_dim = d``.

  Raises:
    ValueError/TypeError: on empty or ragged data, a bad ``latent``, or functions that do
      not return a scalar prior and ``(B,)`` log likelihoods (checked once, abstractly,
      on a batch of two).

  Example::

    >>> import jax.numpy as jnp, dsgrad
    >>> x = jnp.linspace(-1.0, 1.0, 50)
    >>> data = {"x": x, "y": 2.0 * x + 0.5}
    >>> model = dsgrad.model_from_logdensity(
    ...     lambda z: -0.5 * jnp.sum(z["w"] ** 2 + z["b"] ** 2),   # N(0, 1) priors
    ...     lambda z, batch: -0.5 * (batch["y"] - z["w"] * batch["x"] - z["b"]) ** 2,
    ...     data, latent={"w": jnp.zeros(()), "b": jnp.zeros(())})
    >>> model.num_data, model.latent_dim
    (50, 2)
    >>> model.log_likelihood(jnp.array([0.5, 2.0]), jnp.arange(3)).shape  # flat latent
    (3,)
  """
  d, unravel = _latent_unravel(latent)
  n = _num_data(data)
  data_lib.check_finite_data(data, "data")  # before the cast to float32
  # Each leaf behind a handle: compiled programs (fit's segments, full passes, the ELBO)
  # take the rows as arguments instead of folding the data into the program as constants
  # (at 10^6 rows and more, gigabytes of constants and minutes of compiling), and a
  # memory-mapped leaf (dsgrad.data.open_memmap) stays on the host.
  paths, treedef = jax.tree_util.tree_flatten_with_path(data)
  handles = model_data(**{_leaf_name(path): leaf for path, leaf in paths})

  def prior_flat(z):
    return log_prior(unravel(z))

  def lik_flat(z, indices):
    batch = jax.tree_util.tree_unflatten(treedef, [h[indices] for h in handles.values()])
    return log_lik(unravel(z), batch)

  z0 = jax.ShapeDtypeStruct((d,), jnp.float32)
  prior_shape = jax.eval_shape(prior_flat, z0).shape
  if prior_shape != ():
    raise ValueError(f"log_prior must return a scalar, got shape {prior_shape}")
  probe = jax.ShapeDtypeStruct((min(2, n),), jnp.int32)
  lik_shape = jax.eval_shape(lik_flat, z0, probe).shape
  if lik_shape != probe.shape:
    raise ValueError(f"log_lik(z, batch) must return one log likelihood per datum, shape "
                     f"{probe.shape} for a batch of {probe.shape[0]}; got {lik_shape} "
                     "(return the per-datum terms, not their sum)")
  return Model(prior_flat, lik_flat, n, d, name, data=handles, unravel=unravel)


def objective_from_logdensity(log_prior, log_lik, data, latent, *,
                              family: str = "meanfield", shared_noise: bool = True,
                              name: str = "logdensity",
                              path_derivative: bool = False) -> Objective:
  """The BBVI objective (Eq. 3) of :func:`model_from_logdensity`'s model.

  Args:
    log_prior: as in :func:`model_from_logdensity`.
    log_lik: as in :func:`model_from_logdensity`.
    data: as in :func:`model_from_logdensity`.
    latent: as in :func:`model_from_logdensity`.
    family: ``"meanfield"`` (params ``{"loc", "log_scale"}``) or ``"fullrank"``
      (params ``{"loc", "log_diag", "off_diag"}``); see :mod:`dsgrad.families`.
    shared_noise: one noise draw for the whole batch (default) or one per datum.
    name: label for messages and tables.
    path_derivative: the "sticking the landing" gradient
      (:func:`dsgrad.families.bbvi_objective`); off by default.

  Returns:
    An :class:`dsgrad.Objective`; initial params from
    ``dsgrad.families.by_name(family, d).params()``.

  Example: Bayesian linear regression with unit noise, whose posterior mean
  ``(X^T X + I)^{-1} X^T y`` the fitted mean-field mean approaches::

    >>> import jax, jax.numpy as jnp, numpy as np, optax, dsgrad
    >>> x = jax.random.normal(jax.random.key(0), (200, 2))
    >>> y = x @ jnp.array([1.0, -2.0]) + jax.random.normal(jax.random.key(1), (200,))
    >>> objective = dsgrad.objective_from_logdensity(
    ...     lambda z: -0.5 * jnp.sum(z ** 2),
    ...     lambda z, batch: -0.5 * (batch["y"] - batch["x"] @ z) ** 2,
    ...     {"x": x, "y": y}, latent=2)
    >>> params = dsgrad.families.by_name("meanfield", 2).params()
    >>> result = dsgrad.fit(objective, optax.adam(0.05), params, jax.random.key(2),
    ...                     num_steps=400, batch_size=20, progress=False)
    >>> exact = np.linalg.solve(x.T @ x + np.eye(2), x.T @ y)
    >>> bool(np.allclose(result.params["loc"], exact, atol=0.05))
    True
  """
  model = model_from_logdensity(log_prior, log_lik, data, latent, name=name)
  return families.by_name(family, model.latent_dim).objective(
      model, shared_noise=shared_noise, path_derivative=path_derivative)
