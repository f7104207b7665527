"""Gaussian variational families and the BBVI objective they define (Eq. 3).

A family is an ``nnx.Module`` holding its variational parameters as ``nnx.Param``s. The
estimators work on plain pytrees, so each family exposes its parameters as a dict
(``family.params()``, the pure dict of ``nnx.state(family, nnx.Param)``) and pure
functions of such a dict (``transform``, ``log_prob_at``, ``entropy_at``); the methods
``sample``, ``log_prob`` and ``entropy`` evaluate them at the module's own parameters.

    family = dsgrad.families.MeanFieldGaussian(model.latent_dim)
    objective = family.objective(model)            # an Objective over family.params()
    params = family.params()
    ...                                            # optimize params with any estimator
    family.set_params(params)                      # write them back into the module

References:
  Wang, Geffner, Domke (2024), Eq. 1-3, App. F.
  Kucukelbir et al. (2017). Automatic differentiation variational inference. JMLR.
  Titsias, Lazaro-Gredilla (2014). Doubly stochastic variational Bayes. ICML.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import jax.scipy as jsp
from flax import nnx

from dsgrad import checks
from dsgrad.families.pytree import INITIAL_LOG_SCALE
from dsgrad.models.base import Model
from dsgrad.objective import Objective, gaussian_noise

_LOG_2PI = math.log(2.0 * math.pi)
PATH_DERIVATIVE = "[path derivative]"
"""Appended to the family name in an objective's ``source`` made with the path derivative."""


def bbvi_objective(model: Model, transform: Callable, entropy: Callable, *,
                   shared_noise: bool = True, name: str = "bbvi",
                   source: tuple | None = None, path_derivative: bool = False,
                   log_prob: Callable | None = None,
                   inverse: Callable | None = None) -> Objective:
  """The BBVI objective ``f(w; n, eps) = -N log p(x_n | z) - log p(z) - H(w)``, ``z = T_w(eps)``.

  Args:
    model: log prior and per-datum log likelihood over a flat latent of size ``d``.
    transform: ``(params, eps (d,)) -> z (d,)``, the reparameterization ``T_w``.
    entropy: ``params -> H(w)``, the family's entropy in closed form.
    shared_noise: one ``eps ~ N(0, I_d)`` for the whole batch (the default, as in the
      authors' code) or one per datum.
    name: label.
    source: what the objective is, for fused kernels (:attr:`dsgrad.Objective.source`);
      only the family's own constructors set it.
    path_derivative: "sticking the landing": replace ``-H(w)`` by ``log q_v(z)`` at
      ``v = stop_gradient(w)``, so the gradient keeps only the path through
      ``z = T_w(eps)`` and drops the score term ``grad_w log q_w(z)`` (mean zero). The
      gradient stays unbiased, and it vanishes draw by draw (with the full data) where
      ``q`` equals the posterior; far from it the variance can be *larger* than with the
      closed-form entropy (Dhaka et al., 2020), hence off by default. The loss values
      then estimate the same negative ELBO with the draw's ``log q`` in place of ``-H``.
    log_prob: ``(params, z (d,)) -> log q_w(z)``, needed with ``path_derivative``.
    inverse: optional ``(params, z (d,)) -> eps``, the inverse of ``transform``. With the
      path derivative it gives the score ``grad_z log q(z) = -(dT/deps)^{-T} eps`` from the
      draw's own ``eps``; without it the score is differentiated through ``log_prob``,
      which recovers ``eps`` from ``z`` and loses it in float32 once the scale matrix is
      ill-conditioned.
  ``transform`` must be affine in ``eps`` (a location-scale family), which makes
  ``log q(z) + H(q) = d/2 - |eps|^2/2`` the objective's ``log_q_offset`` (PSIS).

  Returns:
    An :class:`dsgrad.Objective` whose mean over data and noise is the negative ELBO.
    Cost per datum: one likelihood evaluation; with per-datum noise, ``B`` transforms
    and ``B`` prior evaluations per batch.

  References:
    Wang, Geffner, Domke (2024), Eq. 3.
    Roeder, Wu, Duvenaud (2017). Sticking the landing: simple, lower-variance gradient
    estimators for variational inference. NeurIPS (Eq. 8, ``path_derivative``).
    Dhaka et al. (2020). Robust, accurate stochastic optimization for variational
    inference. NeurIPS (when the path derivative raises the variance).
  """
  n, d = model.num_data, model.latent_dim
  # The model's functions, not the model: the loss reads the data from the rows it is
  # handed, never from the model it was built from.
  log_likelihood, log_prior_of = model.log_likelihood, model.log_prior
  if path_derivative and log_prob is None:
    raise ValueError("path_derivative=True needs the family's log_prob(params, z)")

  def minus_entropy(params, z, noise):
    if not path_derivative:
      return -entropy(params)
    frozen = jax.lax.stop_gradient(params)
    # The value: for an affine T, log q_v(T_v(eps)) = d/2 - |eps|^2/2 - H(v) exactly.
    # Through log_prob(v, z) it would solve with the scale matrix for eps again, which in
    # float32 returns |eps|^2 of 1e30 once L is ill-conditioned (a random triangular L of
    # size 50 already is): an ELBO of +1e25 that reads as progress.
    value = 0.5 * d - 0.5 * jnp.sum(jnp.square(noise), axis=-1) - entropy(frozen)
    # The gradient: only the path term grad_z log q_v(z) . dz/dw. Its score
    # -(dT/deps)^{-T} eps is the gradient of -eps . T_v^{-1}(z) at the draw's own eps.
    if inverse is not None:
      path = lambda zb, e: -jnp.dot(jax.lax.stop_gradient(e), inverse(frozen, zb))
    else:
      path = lambda zb, e: log_prob(frozen, zb)
    term = path(z, noise) if shared_noise else jax.vmap(path)(z, noise)
    return value + term - jax.lax.stop_gradient(term)

  def loss_fn(params, rows, noise):
    if shared_noise:
      z = transform(params, noise)
      log_lik = log_likelihood(z, rows)
      log_prior = log_prior_of(z)
    else:
      z = jax.vmap(lambda e: transform(params, e))(noise)
      log_lik = jax.vmap(lambda zb, row: log_likelihood(
          zb, jax.tree.map(lambda r: r[None], row))[0])(z, rows)
      log_prior = jax.vmap(log_prior_of)(z)
    return -n * log_lik - log_prior + minus_entropy(params, z, noise)

  def log_q_offset(params, noise):
    # For z = T_w(eps) affine in standard normal eps, log q(z) = log N(eps; 0, I) - log|det T'|
    # and H(q) = d/2 (1 + log 2 pi) + log|det T'|: their sum is d/2 - |eps|^2 / 2.
    # With the path derivative the draw already holds -log q(z): nothing to add back.
    del params
    return 0.0 * jnp.sum(noise) if path_derivative else 0.5 * d - 0.5 * jnp.sum(
        jnp.square(noise))

  label = f"{name}({model.name})" + (PATH_DERIVATIVE if path_derivative else "")
  # A fused kernel computes the closed-form-entropy gradient: not this objective's, whose
  # source names the path derivative (no kernel takes it; meanfield_init does).
  source = (f"{source[0]}{PATH_DERIVATIVE}", source[1]) if path_derivative and source else source
  # The mean-field gradient of a model that declares its reads: a table of those.
  compact = (_declared_coordinates_table if source is not None and source[0] ==
             "meanfield_gaussian" and model.sparse is not None else None)
  return Objective(loss_fn, gaussian_noise((d,), shared=shared_noise), n,
                   shared_noise=shared_noise, name=label, data=model.data,
                   log_q_offset=log_q_offset, source=source, table_approximation=compact,
                   log_evidence_bound=model.log_evidence_bound, kinds=model.kinds)


class _Family(nnx.Module):
  """Shared plumbing: parameters as a pure dict, and methods at the module's params."""

  def params(self) -> dict:
    """The variational parameters as a plain dict of arrays (what estimators see)."""
    return nnx.to_pure_dict(nnx.state(self, nnx.Param))

  def set_params(self, params: dict) -> None:
    """Writes a dict from :meth:`params` (e.g. after optimization) into the module.

    Raises:
      ValueError: ``params`` lacks a field, has another shape (another family or
        dimension), or holds NaN or inf (a diverged run's params would make every later
        draw and density NaN).
    """
    who = f"{type(self).__name__}.set_params"
    checks.check_same_structure(params, self.params(), f"{who}: params",
                                f"{type(self).__name__}(dim={self.dim}).params()")
    checks.parameters().check(params, f"{who}: params")
    state = nnx.state(self, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(self, state)

  def _points(self, x, what: str) -> jax.Array:
    """``x`` as an array whose last axis is the family's dimension, or a named error."""
    x = jnp.asarray(x)
    if x.ndim == 0 or x.shape[-1] != self.dim:
      raise ValueError(f"{type(self).__name__}: {what} must have shape (..., {self.dim}) (the "
                       f"family's dimension last), got {x.shape}")
    return x

  def sample(self, noise: jax.Array) -> jax.Array:
    """``z = T_w(noise)`` for standard normal ``noise`` of shape ``(..., d)``."""
    return jnp.vectorize(lambda e: self.transform(self.params(), e),
                         signature="(d)->(d)")(self._points(noise, "noise"))

  def sample_from_key(self, key: jax.Array, num_samples: int) -> jax.Array:
    """``num_samples`` draws ``(num_samples, d)`` from ``q_w``."""
    who = f"{type(self).__name__}.sample_from_key"
    key = checks.prng_key().check(key, f"{who}: key")
    num_samples = checks.count(0).check(num_samples, f"{who}: num_samples")
    return self.sample(jax.random.normal(key, (num_samples, self.dim)))

  def log_prob(self, z: jax.Array) -> jax.Array:
    """``log q_w(z)`` for ``z`` of shape ``(..., d)``."""
    return jnp.vectorize(lambda x: self.log_prob_at(self.params(), x),
                         signature="(d)->()")(self._points(z, "z"))

  def entropy(self) -> jax.Array:
    """``H(q_w)`` in closed form."""
    return self.entropy_at(self.params())

  def objective(self, model: Model, *, shared_noise: bool = True,
                path_derivative: bool = False) -> Objective:
    """The BBVI objective of ``model`` over this family's :meth:`params` (Eq. 3).

    ``path_derivative=True`` selects the "sticking the landing" gradient
    (:func:`bbvi_objective`)."""
    if model.latent_dim != self.dim:
      raise ValueError(f"{type(self).__name__} has dim={self.dim} but {model.name!r} "
                       f"has latent_dim={model.latent_dim}")
    source = ("meanfield_gaussian", model) if isinstance(self, MeanFieldGaussian) else None
    return bbvi_objective(model, self.transform, self.entropy_at, shared_noise=shared_noise,
                          name=type(self).__name__, source=source,
                          path_derivative=path_derivative, log_prob=self.log_prob_at,
                          inverse=self.inverse_transform)


def initial_vector(value, dim: int, name: str) -> jax.Array:
  """``value`` (a scalar or a ``(dim,)`` vector) as a float32 ``(dim,)`` vector; any other
  shape is refused by name instead of a raw broadcasting error."""
  array = jnp.asarray(value, jnp.float32)
  if array.shape not in ((), (dim,)):
    raise ValueError(f"{name} has shape {array.shape} but the family's dimension is {dim}: "
                     f"pass a scalar or an array of shape ({dim},)")
  return jnp.broadcast_to(array, (dim,))


@checks.arguments(dim=checks.count(1), loc=checks.finite_values(),
                  log_scale=checks.finite_values())
class MeanFieldGaussian(_Family):
  """``q_w(z) = N(loc, diag(exp(log_scale))^2)``, params ``{"loc", "log_scale"}``.

  ``T_w(eps) = loc + exp(log_scale) * eps``; entropy ``sum(log_scale) + d/2 (1 + log 2 pi)``.
  Its objective equals :func:`dsgrad.meanfield_gaussian`, so the paper's App. F
  approximations (``gaussian_mean_taylor``, ``glm_mean_taylor``) apply.

  Args:
    dim: latent dimension ``d``.
    loc: initial mean (scalar or ``(d,)``).
    log_scale: initial log standard deviation (scalar or ``(d,)``); by default
      ``log(0.1)``, as :func:`meanfield_init`.
  """

  def __init__(self, dim: int, *, loc=0.0, log_scale=INITIAL_LOG_SCALE):
    self.dim = int(dim)
    self.loc = nnx.Param(initial_vector(loc, self.dim, "loc"))
    self.log_scale = nnx.Param(
        initial_vector(log_scale, self.dim, "log_scale"))

  @staticmethod
  def transform(params, eps):
    return params["loc"] + jnp.exp(params["log_scale"]) * eps

  @staticmethod
  def inverse_transform(params, z):
    """The noise ``eps`` with ``T_w(eps) = z``."""
    return (z - params["loc"]) * jnp.exp(-params["log_scale"])

  @staticmethod
  def log_prob_at(params, z):
    u = MeanFieldGaussian.inverse_transform(params, z)
    return -0.5 * jnp.sum(u ** 2) - jnp.sum(params["log_scale"]) - 0.5 * z.shape[-1] * _LOG_2PI

  @staticmethod
  def entropy_at(params):
    return meanfield_entropy(params["log_scale"])

  @staticmethod
  def variance_at(params):
    """The marginal variances ``exp(2 log_scale)``, ``(d,)``."""
    return jnp.exp(2.0 * params["log_scale"])


FULL_RANK_WARN_BYTES = 2 ** 28
"""A full-rank family whose ``d x d`` factor holds more bytes than this warns where it is
made (``d`` above 8,192 in float32): a user who asked for ``"fullrank"`` on a model with a
latent per group may not have counted ``d^2``."""


@checks.arguments(dim=checks.count(1), loc=checks.finite_values(),
                  log_scale=checks.finite_values())
class FullRankGaussian(_Family):
  """``q_w(z) = N(loc, L L^T)`` with ``L = U D``: ``U`` unit lower triangular, ``D`` diagonal.

  Params ``{"loc": (d,), "log_diag": (d,), "unit_lower": (d, d)}``:
  ``U = I + tril(unit_lower, -1)`` (the diagonal and upper triangle of ``unit_lower`` are
  ignored and get zero gradient), ``D = diag(exp(log_diag))``, so
  ``cov = U D^2 U^T`` (the LDL^T factorization). ``T_w(eps) = loc + U (D eps)``; entropy
  ``sum(log_diag) + d/2 (1 + log 2 pi)``. Memory ``d^2``; a transform costs ``O(d^2)``
  (made with a factor past :data:`FULL_RANK_WARN_BYTES`, it warns).

  Why ``U D`` and not a plain Cholesky factor with free entries below the diagonal: the
  entries of ``U`` are ratios, free of the latent's units, so an optimizer's step of
  ``1e-2`` on them moves ``z`` in proportion to the posterior's own scales, as a step on
  ``log_diag`` does. With free Cholesky entries the same step moves ``z`` by ``1e-2``
  in absolute units; on a posterior whose scales are below that (a correlated regression
  with 1,000 rows) Adam at ``1e-2``, where the mean-field family converges, leaves the
  full-rank ELBO thousands of nats below it and oscillating.

  Args:
    dim: latent dimension ``d``.
    loc: initial mean.
    log_scale: initial ``log_diag`` (``unit_lower`` starts at zero: ``U = I``); by
      default ``log(0.1)``, as :func:`meanfield_init`.

  Example::

    >>> import jax.numpy as jnp, dsgrad
    >>> family = dsgrad.families.FullRankGaussian(2, log_scale=jnp.log(2.0))
    >>> params = dict(family.params(), unit_lower=jnp.array([[0.0, 0.0], [0.5, 0.0]]))
    >>> dsgrad.families.FullRankGaussian.cholesky(params)
    Array([[2., 0.],
           [1., 2.]], dtype=float32)
  """

  def __init__(self, dim: int, *, loc=0.0, log_scale=INITIAL_LOG_SCALE):
    self.dim = int(dim)
    factor_bytes = 4 * self.dim ** 2
    if factor_bytes > FULL_RANK_WARN_BYTES:
      checks.warn_at_caller(
          f"FullRankGaussian({self.dim:,}): its factor is a {self.dim:,} x {self.dim:,} "
          f"matrix, {factor_bytes / 1e9:.2g} GB of params; an optimizer's state and the "
          "gradient hold two to four times that again, and every Monte Carlo draw's "
          f"transform costs d^2 = {self.dim ** 2:.2g} multiply-adds. The mean-field family "
          "(family='meanfield', dsgrad.families.by_name('meanfield', d)) costs O(d).")
    self.loc = nnx.Param(initial_vector(loc, self.dim, "loc"))
    self.log_diag = nnx.Param(
        initial_vector(log_scale, self.dim, "log_scale"))
    self.unit_lower = nnx.Param(jnp.zeros((self.dim, self.dim), jnp.float32))

  @staticmethod
  def unit_factor(params):
    """``U = I + tril(unit_lower, -1)``."""
    lower = params["unit_lower"]
    return jnp.tril(lower, -1) + jnp.eye(lower.shape[-1], dtype=lower.dtype)

  @staticmethod
  def cholesky(params):
    """The lower-triangular factor ``L = U D`` of the covariance, positive diagonal."""
    return FullRankGaussian.unit_factor(params) * jnp.exp(params["log_diag"])

  @staticmethod
  def params_from_cholesky(loc, cholesky) -> dict:
    """The params of ``N(loc, cholesky cholesky^T)`` for a lower-triangular ``cholesky``
    with positive diagonal (e.g. to continue from params saved with a plain Cholesky
    factor: ``L = tril(off_diag, -1) + diag(exp(log_diag))``).

    Raises:
      ValueError: ``cholesky`` is not a square ``(d, d)`` matrix for a ``(d,)`` ``loc``,
        or its diagonal is not positive, or either holds NaN or inf.
    """
    who = "FullRankGaussian.params_from_cholesky"
    loc = jnp.asarray(checks.finite_values().check(loc, f"{who}: loc"))
    cholesky = jnp.asarray(checks.finite_values().check(cholesky, f"{who}: cholesky"))
    if loc.ndim != 1 or cholesky.shape != loc.shape * 2:
      raise ValueError(f"{who}: loc must have shape (d,) and cholesky (d, d); got "
                       f"{loc.shape} and {cholesky.shape}")
    cholesky = jnp.tril(cholesky)
    diag = jnp.diagonal(cholesky)
    if checks.is_concrete(diag) and not bool(jnp.all(diag > 0)):
      raise ValueError(f"{who}: the diagonal of cholesky must be positive (a covariance's "
                       f"Cholesky factor), got {diag}")
    return {"loc": jnp.asarray(loc), "log_diag": jnp.log(diag),
            "unit_lower": jnp.tril(cholesky / diag[None, :], -1)}

  @staticmethod
  def transform(params, eps):
    scaled = jnp.exp(params["log_diag"]) * eps
    return params["loc"] + FullRankGaussian.unit_factor(params) @ scaled

  @staticmethod
  def inverse_transform(params, z):
    """The noise ``eps = D^{-1} U^{-1} (z - loc)`` with ``T_w(eps) = z``."""
    scaled = jsp.linalg.solve_triangular(FullRankGaussian.unit_factor(params),
                                         z - params["loc"], lower=True, unit_diagonal=True)
    return scaled * jnp.exp(-params["log_diag"])

  @staticmethod
  def log_prob_at(params, z):
    u = FullRankGaussian.inverse_transform(params, z)
    return -0.5 * jnp.sum(u ** 2) - jnp.sum(params["log_diag"]) - 0.5 * z.shape[-1] * _LOG_2PI

  @staticmethod
  def entropy_at(params):
    d = params["log_diag"].shape[-1]
    return jnp.sum(params["log_diag"]) + 0.5 * d * (1.0 + _LOG_2PI)

  @staticmethod
  def variance_at(params):
    """The marginal variances ``diag(L L^T)``, ``(d,)``."""
    return jnp.sum(FullRankGaussian.cholesky(params) ** 2, axis=1)


# ------------------------------------------------- the mean-field objective as functions
# ``q_w(z) = N(loc, diag(exp(log_scale))^2)`` with ``w = {"loc", "log_scale"}``: the paper's
# family (Wang, Geffner, Domke 2024, Eq. 1-3 and App. F), whose approximations
# (gaussian_mean_taylor, glm_mean_taylor) apply; MeanFieldGaussian above is the same
# family as a Flax module.


def meanfield_entropy(log_scale: jax.Array) -> jax.Array:
  """Entropy ``H(w) = sum(log_scale) + d/2 (1 + log 2 pi)`` of a diagonal Gaussian."""
  d = log_scale.shape[-1]
  return jnp.sum(log_scale, axis=-1) + 0.5 * d * (1.0 + jnp.log(2.0 * jnp.pi))


@checks.arguments(loc=checks.finite_values(), log_scale=checks.finite_values())
def meanfield_init(model: Model | Objective, loc: float | jax.Array = 0.0,
                   log_scale: float | jax.Array = INITIAL_LOG_SCALE) -> dict:
  """Variational parameters ``{"loc": (d,), "log_scale": (d,)}`` filled with constants.

  Args:
    model: the model (gives ``d``), or the mean-field objective built from it (as
      :func:`dsgrad.objective_from_logdensity` returns).
    loc: the mean, a scalar or a ``(d,)`` vector.
    log_scale: the log standard deviation, a scalar or a ``(d,)`` vector; by default
      ``log(0.1)``, a standard deviation of 0.1, as NumPyro's and Pyro's ``AutoNormal``
      and :func:`dsgrad.families.structured_init` start (pass ``0.0`` for the prior's
      scale of a standard normal prior).

  Returns:
    The params of :func:`meanfield_gaussian`'s objective, float32.

  Example::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> params = dsgrad.meanfield_init(dsgrad.models.logistic_regression(x, y), 0.0, -1.0)
    >>> params["log_scale"].tolist()
    [-1.0, -1.0, -1.0]
  """
  if isinstance(model, Objective):
    if not (model.source and model.source[0].removesuffix(PATH_DERIVATIVE)
            == "meanfield_gaussian"):
      raise TypeError(f"dsgrad.meanfield_init: the objective {model.name!r} is not a mean-field "
                      "one; what made it makes its params: dsgrad.families.by_name(name, d)"
                      ".params() or families.structured_init(latent) for another family, "
                      "init_params() of an AnnealedVI, a MonteCarloVAE or a NumPyro objective")
    model = model.source[1]
  if not isinstance(model, Model):
    raise TypeError(f"dsgrad.meanfield_init takes the model or its mean-field objective, got "
                    f"{type(model).__name__}")
  d = model.latent_dim
  return {"loc": initial_vector(loc, d, "loc"),
          "log_scale": initial_vector(log_scale, d, "log_scale")}


@checks.arguments(model=checks.model())
def meanfield_gaussian(model: Model, *, shared_noise: bool = True,
                       path_derivative: bool = False) -> Objective:
  """The mean-field Gaussian BBVI objective of a model (Eq. 3).

  Args:
    model: the model (log prior and per-datum log likelihood).
    shared_noise: if true (the default, as in the authors' code), one draw
      ``eps ~ N(0, I_d)`` serves the whole mini-batch; otherwise each datum has its own.
    path_derivative: "sticking the landing" (Roeder et al., 2017): the gradient drops the
      score term of ``log q``; unbiased, exact at a posterior inside the family, but it
      can raise the variance where ``q`` is far from the posterior, so it is off by
      default (:func:`dsgrad.families.bbvi_objective`).

  Returns:
    An :class:`dsgrad.Objective` with params ``{"loc", "log_scale"}``; its mean over data
    and noise is the negative ELBO. Cost per datum: one likelihood evaluation at one
    ``z``; with per-datum noise the likelihood is evaluated at ``B`` different ``z``.

  Example::

    >>> import jax, jax.numpy as jnp, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)}
    >>> noise = objective.sample_noise(jax.random.key(1), 4)
    >>> objective.loss(params, jnp.arange(4), noise).shape  # one loss per datum
    (4,)
  """
  return bbvi_objective(model, MeanFieldGaussian.transform, MeanFieldGaussian.entropy_at,
                        shared_noise=shared_noise, name="meanfield_gaussian",
                        source=("meanfield_gaussian", model),
                        path_derivative=path_derivative, log_prob=MeanFieldGaussian.log_prob_at,
                        inverse=MeanFieldGaussian.inverse_transform)


def _declared_coordinates_table(objective: Objective):
  """:func:`dsgrad.approx.sparse_linearize` of ``objective``: a per-datum table of the
  coordinates its model declares each datum reads."""
  from dsgrad.approx.sparse import sparse_linearize  # it imports this module
  return sparse_linearize(objective)
