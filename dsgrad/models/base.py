"""The model protocol: a log prior and a per-datum log likelihood over a flat latent.

A model's data are its pytree leaves (:attr:`Model.data`), and its functions receive a
batch's rows of them as an argument (``log_likelihood(z, rows)``): a program that takes the
model (or an objective built from it) as an argument computes with whatever data it is
handed (:mod:`dsgrad.data`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad import data_kinds


def model_data(**arrays) -> dict:
  """``{name: array}``: a model's per-datum arrays checked (leading sizes, no NaN or inf)
  and put on the device (a :class:`dsgrad.data.HostArray` stays on the host)."""
  return data_lib.placed(dict(arrays))


class LinearPredictor(NamedTuple):
  """Declares that a likelihood sees the latent only through ``K`` linear predictors.

  ``log p(x_n | z) = log_likelihood_of_logits(x_n^T Z, rows)`` with ``Z = z.reshape(D, K)``
  (row-major). Approximations can then store per datum the ``K`` logits instead of the
  whole parameter vector (see :func:`dsgrad.approx.glm_mean_taylor`).

  Attributes:
    features: ``rows -> (B, D)``: the feature rows ``x_n`` of a batch's data rows.
    num_outputs: ``K``, the number of linear predictors per datum.
    log_likelihood_of_logits: ``(logits (B, K), rows) -> (B,)`` log likelihoods.
    logistic_signs: for a binary logistic likelihood ``log sigmoid(sign_n a_n)`` (``K = 1``),
      ``rows -> (B,)`` signs in ``{-1, +1}``; ``None`` otherwise. Lets
      :func:`dsgrad.approx.logistic_probit` integrate the likelihood's gradient over a
      Gaussian logit in closed form.
  """

  features: Callable[[Any], jax.Array]
  num_outputs: int
  log_likelihood_of_logits: Callable[[jax.Array, Any], jax.Array]
  logistic_signs: Callable[[Any], jax.Array] | None = None


class SparseLikelihood(NamedTuple):
  """Declares that datum ``n``'s likelihood reads only ``k`` coordinates of the latent.

  ``log p(x_n | z) = log_likelihood_local(z[coordinates(rows)], rows)``: the likelihood term
  of a datum depends on ``z`` only through a fixed number ``k`` of coordinates (MovieLens:
  the rating user's ``G C`` weights; Bradley-Terry: the two players). Approximations
  can then keep per datum those ``k`` coordinates instead of all ``d`` (see
  :func:`dsgrad.approx.sparse_linearize`), so a SAGA table holds ``N k`` instead of
  ``N d`` numbers per parameter array.

  Attributes:
    num_coordinates: ``k``.
    coordinates: ``rows -> (B, k)`` int32 latent coordinates of each datum of a batch,
      distinct within a row, in ``[0, d)``.
    log_likelihood_local: ``(z_local (B, k), rows) -> (B,)``: ``log p(x_n | z)`` from the
      datum's coordinates, in the order ``coordinates`` lists them.
  """

  num_coordinates: int
  coordinates: Callable[[Any], jax.Array]
  log_likelihood_local: Callable[[jax.Array, Any], jax.Array]


def terms_in_latent_precision(function):
  """``function`` with its floating result in the latent's precision (its first
  argument's dtype, and at least float32). The terms are the user's to compute, but
  dsgrad sums them over the data, and such sums lose hundreds of nats in bfloat16 at 10^5
  rows and overflow float16 (whose largest number is 65,504); and under
  ``jax_enable_x64`` float64 data made float64 terms at a float32 latent, which met the
  float32 state of a sampler's loops (its step size, its L-BFGS start) in bare dtype
  errors. Wrapped once: a model's copies keep the same function, and so its compiled
  programs."""
  if getattr(function, "terms_in_latent_precision", False):
    return function

  @functools.wraps(function)
  def wrapped(*args):
    out = function(*args)
    if not (hasattr(out, "dtype") and jnp.issubdtype(out.dtype, jnp.floating)):
      return out
    latent = getattr(args[0], "dtype", None) if args else None
    target = (latent if latent is not None and jnp.issubdtype(latent, jnp.floating)
              and jnp.finfo(latent).bits >= 32 else jnp.float32)
    return out if out.dtype == target else jnp.asarray(out, target)
  wrapped.terms_in_latent_precision = True
  return wrapped


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A Bayesian model ``p(z) prod_n p(x_n | z)`` with a flat latent ``z`` in R^d.

  A pytree whose leaves are its data (every other field is static structure), so
  ``jax.jit(f)(model, ...)`` takes the data as arguments.

  Attributes:
    log_prior: ``log_prior(z) -> scalar`` for ``z`` of shape ``(latent_dim,)``.
    log_likelihood: ``log_likelihood(z, rows) -> (B,)``: ``log p(x_n | z)`` for each datum
      of a batch, all at the same ``z``, where ``rows`` are the batch's rows of ``data``
      (:meth:`rows`), or the batch's indices for a model without ``data``.
    num_data: ``N``.
    latent_dim: ``d``.
    name: label for messages and tables.
    linear: optional :class:`LinearPredictor` structure of the likelihood (GLMs).
    sparse: optional :class:`SparseLikelihood`: which coordinates each likelihood term
      reads (hierarchical and pairwise models).
    log_prior_hessian_diag: optional ``z -> (d,)``, the diagonal of the log prior's
      Hessian in closed form. The second-order approximations
      (:func:`dsgrad.approx.gaussian_taylor`, :func:`dsgrad.approx.glm_taylor`) use it;
      without it they compute the diagonal with ``d`` Hessian-vector products.
    data: optional pytree of ``(N, ...)`` arrays (:func:`model_data`), the leaves; a leaf
      may be a :class:`dsgrad.data.HostArray`. ``None``: the likelihood closes over its
      data (as constants of every program) and receives indices.
    unravel: optional ``z -> pytree``: the flat latent arranged as the user wrote it
      (:func:`dsgrad.model_from_logdensity` sets it). Samples and params stay flat;
      ``jax.vmap(model.unravel)(result.samples)`` gives them that shape, and the MCMC
      entry points take a position in it.
    log_evidence_bound: optional number known to be at least the log evidence
      ``log p(x)``: ``0`` for discrete data (the evidence is a probability; dsgrad's
      classification and comparison models set it), or the exact log evidence of a
      conjugate model. No ELBO can exceed it, so an estimate above it is a numerical
      failure, not progress: :func:`dsgrad.fit` and :func:`dsgrad.elbo` flag it.
    kinds: optional ``((key, kind), ...)``: what the values of ``data[key]`` mean
      (:mod:`dsgrad.data_kinds`), checked on data handed in later.
  """

  log_prior: Callable[[jax.Array], jax.Array]
  log_likelihood: Callable[[jax.Array, Any], jax.Array]
  num_data: int
  latent_dim: int
  name: str = "model"
  linear: LinearPredictor | None = None
  sparse: SparseLikelihood | None = None
  log_prior_hessian_diag: Callable[[jax.Array], jax.Array] | None = None
  data: Any = None
  unravel: Callable[[jax.Array], Any] | None = None
  log_evidence_bound: float | None = None
  kinds: tuple = ()

  def __post_init__(self):
    # The user's terms, summed in the latent's precision (at least float32) however
    # they are rounded.
    object.__setattr__(self, "log_prior", terms_in_latent_precision(self.log_prior))
    object.__setattr__(self, "log_likelihood", terms_in_latent_precision(self.log_likelihood))
    if self.sparse is not None:
      object.__setattr__(self, "sparse", self.sparse._replace(
          log_likelihood_local=terms_in_latent_precision(self.sparse.log_likelihood_local)))
    if self.data is not None:
      object.__setattr__(self, "data", data_lib.placed(self.data, f"{self.name}.data"))
      data_lib.check_data(self.data, self.num_data, f"{self.name}.data")
      data_kinds.check_kinds(dict(self.kinds), self.data, f"{self.name}.data")

  def _replace(self, **changes) -> "Model":
    """A copy with ``changes`` (as a NamedTuple's ``_replace``)."""
    return dataclasses.replace(self, **changes)

  def with_data(self, values) -> "Model":
    """This model on other data of the same shapes and dtypes.

    Only the pytree's leaves change, so every program compiled for this model (a
    ``jax.jit`` taking it as an argument, :func:`dsgrad.mcmc.sample`'s chains and
    reference point) serves the copy as it is, without tracing it again. (A model built
    anew from the same functions on the new data traces dsgrad's programs again and finds
    their executables by the programs' text: :func:`dsgrad.training.compile_cache.jit_by_text`.)

    Args:
      values: a pytree like :attr:`data` (``{name: array}`` for dsgrad's models).

    Raises:
      ValueError/TypeError: a missing or extra key, a shape or dtype other than this
        model's, or values that do not mean what the model's data mean.

    Example::

      >>> import jax, dsgrad
      >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
      >>> model = dsgrad.models.logistic_regression(x, y)
      >>> x2, y2, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(1), 100, 3)
      >>> other = model.with_data({"x": x2, "signs": 2.0 * y2 - 1.0})
      >>> jax.tree.structure(other) == jax.tree.structure(model)
      True
    """
    if self.data is None:
      raise ValueError(f"{self.name} declares no data (model.data): its likelihood closes "
                       "over its data; build it from the new data instead")
    return self._replace(data=data_lib.replacement(self.data, values, self.kinds,
                                                   f"{self.name}.with_data"))

  def rows(self, indices):
    """The rows of :attr:`data` at ``indices`` (``indices`` for a model without data)."""
    return data_lib.rows_of(self.data, indices)

  def log_likelihood_at(self, z, indices):
    """``log p(x_n | z)`` for the data ``indices``: :attr:`log_likelihood` of their rows."""
    return self.log_likelihood(z, self.rows(indices))

  def log_joint_datum(self, z, index):
    """``k_n(z) = N log p(x_n | z) + log p(z)`` for one datum (App. F notation)."""
    return self.num_data * self.log_likelihood_at(z, index[None])[0] + self.log_prior(z)


data_lib.register_with_data(Model)


@checks.arguments(num_coordinates=checks.count(1))
def with_coordinates(model: Model, num_coordinates: int,
                     coordinates: Callable[[jax.Array], jax.Array]) -> Model:
  """``model`` with a :class:`SparseLikelihood` built from its full likelihood.

  For a model whose likelihood terms are sparse but which has no hand-written local
  likelihood: ``log_likelihood_local`` writes each datum's ``k`` values into a zero
  latent of size ``d`` and calls ``model.log_likelihood``. Correct for any model whose
  term ``n`` reads only ``coordinates(n)``, at ``O(d)`` work per datum (a hand-written
  local likelihood is ``O(k)``). The declaration is checked on the first 8 data at a
  random latent (:func:`check_sparse_likelihood`): a term that reads a coordinate not
  listed is refused.

  Args:
    model: the model.
    num_coordinates: ``k``.
    coordinates: ``rows -> (B, k)`` int latent coordinates (rows: as the likelihood's).

  Returns:
    The model with ``sparse`` set.
  """
  d = model.latent_dim

  def log_likelihood_local(z_local, rows):
    def one(zl, row):
      row = jax.tree.map(lambda r: r[None], row)
      zero = jnp.zeros((d,), zl.dtype)
      return model.log_likelihood(zero.at[coordinates(row)[0]].set(zl), row)[0]

    return jax.vmap(one)(z_local, rows)

  out = model._replace(sparse=SparseLikelihood(int(num_coordinates), coordinates,
                                               log_likelihood_local))
  z = probe_latent(d, 0.5)
  try:
    check_sparse_likelihood(out, z, np.arange(min(8, model.num_data), dtype=np.int32), 1e-4)
  except ValueError as error:
    raise ValueError(f"dsgrad.models.with_coordinates: {error}; each datum's coordinates() "
                     "must list every latent coordinate its likelihood term reads") from None
  return out


def local_and_full(model: Model, sparse: SparseLikelihood, z: jax.Array,
                   rows) -> tuple[np.ndarray, np.ndarray]:
  """``(local, full)``: the log likelihoods of ``rows`` at ``z`` from ``sparse``'s
  coordinates and from the whole latent, computed in one program."""
  return tuple(map(np.asarray, jax.jit(lambda zz, r: (
      sparse.log_likelihood_local(zz[sparse.coordinates(r)], r),
      model.log_likelihood(zz, r)))(z, rows)))


@checks.arguments(rtol=checks.positive())
def check_sparse_likelihood(model: Model, z: jax.Array, indices: jax.Array,
                            rtol: float = 1e-5) -> None:
  """Raises ``ValueError`` if ``model.sparse`` disagrees with ``model.log_likelihood``.

  Checks, at the latent ``z`` and the data ``indices``: the coordinates' shape, range
  and distinctness; that the local likelihood equals the full one; and that the full
  likelihood's gradient vanishes outside the declared coordinates.
  """
  sparse = model.sparse
  if sparse is None:
    raise ValueError(f"model {model.name!r} declares no sparse likelihood (model.sparse)")
  rows = data_lib.few_rows(model.data, indices)
  coords = np.asarray(sparse.coordinates(rows))
  b, k = indices.shape[0], sparse.num_coordinates
  if coords.shape != (b, k):
    raise ValueError(f"{model.name}: coordinates returned shape {coords.shape}, "
                     f"expected ({b}, {k})")
  if coords.min() < 0 or coords.max() >= model.latent_dim:
    raise ValueError(f"{model.name}: coordinates outside [0, {model.latent_dim})")
  if any(len(set(row.tolist())) != k for row in coords):
    raise ValueError(f"{model.name}: coordinates repeat within a datum's row")
  local, full = local_and_full(model, sparse, z, rows)
  if not np.allclose(full, local, rtol=rtol, atol=rtol * (1 + np.abs(full).max())):
    raise ValueError(f"{model.name}: local likelihood {local[:3]} differs from the full "
                     f"one {full[:3]}")
  grads = np.asarray(jax.jit(jax.vmap(
      jax.grad(lambda zz, row: model.log_likelihood(
          zz, jax.tree.map(lambda r: r[None], row))[0]), in_axes=(None, 0)))(z, rows))
  outside = np.ones_like(grads, bool)
  np.put_along_axis(outside, coords, False, axis=1)
  if np.any(grads[outside] != 0):
    raise ValueError(f"{model.name}: the likelihood depends on coordinates that "
                     f"coordinates() does not list")


def spread_indices(num_data: int) -> jax.Array:
  """A few distinct indices spread over the data (first, last, middle, thirds)."""
  picks = [0, num_data - 1, num_data // 2, num_data // 3, (2 * num_data) // 3]
  return jax.device_put(np.array(list(dict.fromkeys(p for p in picks if 0 <= p < num_data)),
                                 np.int32))


def probe_latent(dim: int, scale: float, seed: int = 0) -> jax.Array:
  """A random latent ``scale * N(0, I_dim)`` (float32) at which a model is checked as it
  is made. Drawn on the host: ``jax.random.normal`` compiles for every ``dim`` (0.25 s the
  first time in a process)."""
  draw = np.random.default_rng(seed).standard_normal(dim) * scale
  return jax.device_put(draw.astype(np.float32))  # jnp.asarray would compile a program


def check_per_datum_terms(log_likelihood: Callable, z: jax.Array, rows, what: str,
                          fix: str) -> jax.Array:
  """Refuses a likelihood whose term for a datum depends on anything but that datum: the
  batch's other rows (a mean or a softmax over the batch, its first row), their order, or
  the batch's size. The estimators subsample and reweight per-datum terms, so such a
  model would train to a wrong answer without an error.

  Compared once at ``z``, on a few rows (:func:`spread_indices`'s): their terms in one
  batch and one at a time must agree (to 1e-3 relative; skipped where ``z`` is off the
  model's support). One compiled program.

  Args:
    log_likelihood: ``(z, rows) -> (B,)`` per-datum log likelihoods.
    z: a latent value.
    rows: a pytree of ``B`` data rows on its leading axis (for a model that reads its own
      arrays by index, the indices).
    what: what the message names (``"log_lik(z, batch)"``).
    fix: the sentence that ends the message (how to write it per datum).

  Returns:
    The rows' terms in one batch, for further checks at the same point.
  """
  # One at a time is enough: a term that reads another row, the batch's order or its
  # size (a mean, a softmax, a slice from the first index) gives another value alone.
  @jax.jit
  def together_and_alone(z, rows):
    def alone(row):
      return log_likelihood(z, jax.tree.map(lambda leaf: leaf[None], row))[0]
    return log_likelihood(z, rows), jax.vmap(alone)(rows)

  # Compared on the host: each eager comparison would compile a program of its own.
  batch, singles = map(np.asarray, together_and_alone(z, rows))
  if not np.all(np.isfinite(batch)):
    return batch  # nothing to compare
  if not np.all(np.abs(singles - batch) <= 1e-3 * (1.0 + np.abs(batch))):
    raise ValueError(
        f"{what} changes when {batch.shape[0]} data are given one at a time "
        f"({np.asarray(batch)[:3]} in one batch, {np.asarray(singles)[:3]} alone): a "
        "datum's term depends on the batch's other rows, their order or their number. "
        "dsgrad's estimators subsample and reweight per-datum terms, which would then "
        f"train to a wrong answer. {fix}")
  return batch
