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

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad import families
from dsgrad import index_columns
from dsgrad import latent_reads
from dsgrad.models.base import (Model, check_per_datum_terms, model_data, probe_latent,
                                spread_indices)
from dsgrad.objective import Objective


_LEAVES_APART = True
"""Whether ``log_lik`` receives the latent's leaves through an optimization barrier (see
``model_from_logdensity``); off only to measure what it buys
(``python -m benchmarks leaves-apart``)."""


def _latent_unravel(latent) -> tuple[int, Callable]:
  if isinstance(latent, (int, np.integer)) and not isinstance(latent, bool):
    if latent < 1:
      raise ValueError(f"latent must be a positive dimension or an example pytree, got {latent}")
    return int(latent), lambda z: z
  if isinstance(latent, (float, np.floating)):
    # 3.0 would be read as the example value of a scalar latent: one dimension.
    as_int = int(latent) if float(latent).is_integer() and latent >= 1 else "d"
    raise TypeError(f"latent={latent!r} is ambiguous: give the dimension as an int "
                    f"(latent={as_int}) or an example value as an array (jnp.zeros(()) for "
                    "a scalar latent, jnp.zeros(3) for three numbers)")
  return families.latent_unravel(latent, "the latent dimension or an example value of z")


def _log_density_out(what: str, out):
  """``out`` (a traced result's shape and dtype), refused where it is not an array of
  floats: an integer log density has no gradient in z, and training would not move."""
  if not isinstance(out, jax.ShapeDtypeStruct):
    raise TypeError(f"{what} must return an array (a log density of z), got "
                    f"{type(out).__name__}")
  if not jnp.issubdtype(out.dtype, jnp.floating):
    raise TypeError(f"{what} must return floating values (a log density of z), got "
                    f"dtype {out.dtype}")
  return out


def _traced(what: str, fn, latent, *args, columns=None, index=()):
  """``jax.eval_shape(fn, *args)``; an error raised in the user's function gets a note
  with what it was given (a latent of the wrong size shows as a shape error deep inside
  the model's own code)."""
  try:
    return jax.eval_shape(fn, *args)
  except jax.errors.JAXTypeError as error:  # a Python value of a traced one
    raise TypeError(
        f"{what} cannot be traced by JAX ({checks.first_line(error)}): dsgrad evaluates it "
        "under jit, with the latent and the batch's rows traced, so it may not make Python "
        "numbers or branches of their values (float(), int(), if/else on them): use "
        "jnp.where or jax.lax.cond") from error
  except Exception as error:
    given = (f"a flat z of shape ({latent},)" if isinstance(latent, int) else
             f"z shaped like the latent given, {jax.tree.map(jnp.shape, latent)}")
    b = args[-1].shape[0]
    rows = "" if columns is None else f", and a batch of {b} rows of each data column: " + \
        ", ".join(f"{k} {(b,) + tuple(v.shape[1:])} {v.dtype}" for k, v in columns.items())
    error.add_note(f"(raised in {what}, which dsgrad.model_from_logdensity evaluated with "
                   f"{given}{rows})")
    if isinstance(error, KeyError) and error.args and str(error.args[0]) in index:
      error.add_note(f"('{error.args[0]}' is the table's index, not one of its columns: "
                     "pass frame.reset_index())")
    if "Indexer must have integer" in str(error):
      # Ids read from a table where a missing value made the column float.
      whole = [k for k, v in (columns or {}).items() if index_columns.whole_number_floats(v)]
      if whole:
        error.add_note(f"(an index read from a float column? {whole} hold whole numbers "
                       "as floats: give ids as integers, np.asarray(column, np.int32))")
    raise


def _differentiable(what: str, fn, *args) -> None:
  """Refuses ``fn`` (already traced forward) where JAX cannot take its gradient in the
  latent, its first argument: every estimator and sampler needs it, and the error came
  from inside the first compiled step, naming neither the function nor the fix."""
  try:
    jax.eval_shape(jax.grad(lambda z, *rest: jnp.sum(fn(z, *rest))), *args)
  except Exception as error:
    raise ValueError(
        f"{what} cannot be differentiated in z by JAX's reverse mode, which every "
        f"estimator and sampler needs: {checks.first_line(error)} (where JAX has no "
        "derivative, jax.custom_vjp gives one by hand)") from error


def model_from_logdensity(log_prior: Callable[[Any], jax.Array],
                          log_lik: Callable[[Any, Any], jax.Array], data, latent, *,
                          name: str = "logdensity", reads: dict | str | None = "auto") -> Model:
  """A :class:`dsgrad.models.Model` from a log prior and a per-datum log likelihood.

  Args:
    log_prior: ``log_prior(z) -> scalar``, the log prior density of the latent ``z``
      (unconstrained: transform constrained variables yourself, with the Jacobian).
    log_lik: ``log_lik(z, batch) -> (B,)``: ``log p(x_n | z)`` for each datum of
      ``batch``, where ``batch`` is ``data`` indexed by ``B`` datum indices on axis 0.
      One value per datum, not their sum: the estimators need per-datum terms.
    data: an array or pytree of arrays sharing the leading data axis ``N`` (a pandas
      ``DataFrame`` is the dict of its columns: ``batch["y"]``). It is put on
      device once and indexed inside ``jit``; compiled programs receive it as an
      argument, not as constants. A leaf may be a memory-mapped array
      (:func:`dsgrad.data.open_memmap`): it stays on the host and :func:`dsgrad.fit`
      reads each block of steps' rows ahead of the device.
    latent: the latent dimension ``d`` (then ``z`` is a flat ``(d,)`` vector) or an
      example value of ``z`` (any pytree of float arrays; the model's flat latent is its
      ``ravel_pytree`` flattening, and ``log_prior``/``log_lik`` receive the pytree).
    name: label for messages and tables.
    reads: which latent rows each data row reads: ``{latent leaf: data column}``, row
      ``n`` reads, of that latent leaf, only the row ``leaf[column[n]]`` (a tuple of
      columns for several rows, e.g. ``{"skill": ("winner", "loser")}``, or a column of
      shape ``(N, m)`` for the ``m`` rows ``leaf[column[n, j]]``, e.g.
      ``{"skill": "pair"}``), and every leaf not named here whole. A column is integers,
      or whole-number floats that ``log_lik`` casts to an index. Names are the
      leaves' and columns' paths (``"raw"`` for ``latent["raw"]``, ``"a/b"`` for
      ``latent["a"]["b"]``). The model then declares, per row, those ``k`` latent
      coordinates (``model.sparse``, :class:`dsgrad.models.SparseLikelihood`), so
      :func:`dsgrad.joint_saga` keeps a table of ``N x 2k`` numbers instead of
      ``N x 2d`` and works ``O(k)`` per row. Checked on a few rows at a random latent:
      a ``log_lik`` that reads more than declared is refused. ``"auto"`` (default):
      found where it can be, for a pytree latent: a leaf of ``R`` rows is declared with
      the integer columns that point, on 16 rows spread over the data, to the rows of it
      that each row's likelihood term moves (its gradient), where the likelihood from
      those coordinates equals the full one on 64 spread rows (a wrong guess
      would cost joint SAGA efficiency, not correctness: its control variate stays
      unbiased); ``model.sparse`` is ``None`` where nothing is found. ``None``: none.

  Returns:
    A ``Model`` with ``num_data = N`` and ``latent_dim = d``.

  Raises:
    ValueError/TypeError: on empty or ragged data, a bad ``latent``, or functions that do
      not return a scalar prior and ``(B,)`` log likelihoods (checked once, abstractly,
      on a batch of two) or that JAX cannot differentiate in ``z`` (reverse mode, as
      every estimator and sampler does); a ``log_lik`` whose term for a datum depends on
      the batch's other rows, order or size (compared with the rows one at a time, at a
      few rows and a random latent); a ``reads`` that names unknown leaves or columns, a column
      that is not integer or out of its leaf's range, or a ``log_lik`` that reads more
      than it declares; an integer data column that ``log_lik`` uses as an index out of
      the range of what it indexes, negative or past the end (JAX would clamp or wrap
      it; checked on the rows that hold each integer column's extremes).

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
    >>> model.log_likelihood_at(jnp.array([0.5, 2.0]), jnp.arange(3)).shape  # flat latent
    (3,)

  A hierarchical model whose row reads one group's intercept and the shared slope::

    >>> g = jnp.arange(50) % 5
    >>> model = dsgrad.model_from_logdensity(
    ...     lambda z: -0.5 * jnp.sum(z["w"] ** 2) - 0.5 * jnp.sum(z["b"] ** 2),
    ...     lambda z, batch: -0.5 * (batch["y"] - z["w"] * batch["x"]
    ...                              - jnp.take(z["b"], batch["g"])) ** 2,
    ...     {"x": x, "y": 2.0 * x, "g": g}, latent={"w": jnp.zeros(()), "b": jnp.zeros(5)},
    ...     reads={"b": "g"})
    >>> model.sparse.num_coordinates  # b[g[n]] and w, of 6 latents
    2
  """
  d, unravel = _latent_unravel(latent)
  index = data_lib.index_names(data)  # left out of the columns: named if log_lik reads one
  # Checked once where they enter (sizes, values before the cast to float32) and put on
  # the device: model_data below finds them checked instead of reading them again.
  data = data_lib.placed(data, "data")
  leaves = jax.tree.leaves(data, is_leaf=data_lib.is_host)
  n = int(leaves[0].shape[0]) if leaves else 0
  if not n:
    raise ValueError("data is empty or has zero rows; give a pytree of arrays with the data "
                     "on axis 0")
  # The model's data, by name: the leaves of its pytree (so compiled programs take them
  # as arguments instead of folding them in as constants: at 10^6 rows and more,
  # gigabytes of constants and minutes of compiling), and the keys with_data takes. A
  # memory-mapped leaf (dsgrad.data.open_memmap) stays on the host.
  paths, treedef = jax.tree_util.tree_flatten_with_path(data, is_leaf=data_lib.is_host)
  handles = model_data(**{data_lib.leaf_name(path): leaf for path, leaf in paths})
  names = list(handles)

  def prior_flat(z):
    return log_prior(unravel(z))

  apart = _LEAVES_APART

  def lik_flat(z, rows):
    leaves = unravel(z)
    if apart:
      # The barrier's transpose keeps each leaf's gradient whole before the gradients are
      # concatenated into z's. Without it XLA on a GPU fused the batch sum of a leaf every
      # row reads (a hierarchical model's hyper-mean) into that concatenation, where the
      # few threads of that leaf summed the batch serially: 1.4 ms a step at 1,000 rows
      # against 0.05 ms with the barrier, on an H200.
      leaves = jax.lax.optimization_barrier(leaves)
    return log_lik(leaves, jax.tree_util.tree_unflatten(treedef, [rows[k] for k in names]))

  z0 = jax.ShapeDtypeStruct((d,), jnp.float32)
  prior_out = _log_density_out("log_prior", _traced("log_prior(z)", prior_flat, latent, z0))
  if prior_out.shape != ():
    raise ValueError(f"log_prior must return a scalar, got shape {prior_out.shape}")
  model = Model(prior_flat, lik_flat, n, d, name, data=handles, unravel=unravel)
  probe = jax.ShapeDtypeStruct((min(2, n),), jnp.int32)
  lik_out = _log_density_out("log_lik", _traced(
      "log_lik(z, batch)", model.log_likelihood_at, latent, z0, probe, columns=model.data,
      index=index))
  lik_shape = lik_out.shape
  if lik_shape != probe.shape:
    # A column of shape (N, 1) beside (N,) ones broadcasts a batch's terms to (B, B).
    standing = [name for name, leaf in handles.items() if np.shape(leaf)[1:] == (1,)]
    raise ValueError(f"log_lik(z, batch) must return one log likelihood per datum, shape "
                     f"{probe.shape} for a batch of {probe.shape[0]}; got {lik_shape} (" + (
                         "return the per-datum terms, not their sum" if lik_shape == () else
                         f"data {standing} of shape (N, 1): give them as (N,), e.g. y.ravel()"
                         if standing else "one value per datum, without trailing axes") + ")")
  _differentiable("log_prior(z)", prior_flat, z0)
  _differentiable("log_lik(z, batch)", model.log_likelihood_at, z0, probe)
  check_per_datum_terms(
      model.log_likelihood, probe_latent(d, 0.3),
      data_lib.few_rows(model.data, spread_indices(n)), f"{name}: log_lik(z, batch)",
      "Compute each datum's log p(x_n | z) from its own row of batch alone: no mean, sum, "
      "softmax or normalisation over the batch's axis 0")
  if not (reads is None or reads == "auto" or isinstance(reads, dict)):
    raise TypeError(f"reads must be a non-empty dict {{latent leaf: data column(s)}}, 'auto' "
                    f"or None, got {reads!r}")
  # The index columns' kinds first: a column numbered from 1 (z["b"][g - 1]) reads rows
  # from its base, which the declared or found reads then use.
  model = index_columns.declared_and_checked(model)
  declare = functools.partial(latent_reads.declared, model=model, latent=latent,
                              treedef=treedef, log_lik=log_lik)
  if isinstance(reads, dict):
    model = model._replace(sparse=declare(reads))
    latent_reads.check_declared(model, reads)
  elif reads == "auto" and not isinstance(latent, (int, np.integer)):
    found = latent_reads.found(model, latent, declare)
    model = model._replace(sparse=found) if found is not None else model
  return model


def objective_from_logdensity(log_prior, log_lik, data, latent, *,
                              family: str = "meanfield", shared_noise: bool = True,
                              name: str = "logdensity",
                              path_derivative: bool = False,
                              reads: dict | str | None = "auto") -> Objective:
  """The BBVI objective (Eq. 3) of :func:`model_from_logdensity`'s model.

  Args:
    log_prior: as in :func:`model_from_logdensity`.
    log_lik: as in :func:`model_from_logdensity`.
    data: as in :func:`model_from_logdensity`.
    latent: as in :func:`model_from_logdensity`.
    family: ``"meanfield"`` (params ``{"loc", "log_scale"}``) or ``"fullrank"``
      (params ``{"loc", "log_diag", "unit_lower"}``); see :mod:`dsgrad.families`.
    shared_noise: one noise draw for the whole batch (default) or one per datum.
    name: label for messages and tables.
    path_derivative: the "sticking the landing" gradient
      (:func:`dsgrad.families.bbvi_objective`); off by default.
    reads: as in :func:`model_from_logdensity`: which latent rows each data row reads.
      With the mean-field family, ``dsgrad.joint_saga(objective)`` then keeps a table of
      those coordinates (:func:`dsgrad.approx.sparse_linearize`, the objective's
      ``table_approximation``) instead of every parameter; ``"auto"`` searches only for
      that family without ``path_derivative``, where they serve.

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
  if reads == "auto" and (family != "meanfield" or path_derivative):
    reads = None  # found reads serve the mean-field table only: no search
  model = model_from_logdensity(log_prior, log_lik, data, latent, name=name, reads=reads)
  return families.objective_by_name(family, model, shared_noise=shared_noise,
                                    path_derivative=path_derivative)
