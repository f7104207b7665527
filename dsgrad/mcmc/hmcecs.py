"""HMC with energy-conserving subsampling (HMC-ECS): perturbed and signed.

HMC-within-Gibbs on ``(theta, u)`` (Alg. 1): first the subsample ``u`` is updated by a
pseudo-marginal Metropolis-Hastings step with a correlated proposal (Eq. 3.5), then
``theta`` by HMC whose leapfrog dynamics *and* acceptance use the same estimated
Hamiltonian ``U_hat(theta) + K(p)`` with ``U_hat = -log |L_hat(theta; u)| - log p(theta)``
for the current ``u`` (Eq. 3.3-3.7). With the perturbed scheme the chain targets a
slightly perturbed posterior; with the block-Poisson scheme it targets ``|L_hat|`` and
expectations are sign-corrected (:func:`dsgrad.mcmc.signed_mean`).

The API follows BlackJAX: :func:`init` and :func:`build_kernel` are pure and jit-able,
states are NamedTuples, PRNG keys are explicit; the ``theta`` move is a kernel composed
in (:mod:`dsgrad.mcmc.hmc` by default, any kernel of its shape otherwise, as NumPyro's
``HMCECS`` wraps an inner kernel); :func:`dsgrad.mcmc.sample` adds warm-up and a
progress bar.

References:
  Dang, Quiroz, Kohn, Tran, Villani (2019). Hamiltonian Monte Carlo with energy
  conserving subsampling. JMLR 20. Sec. 3 (Alg. 1), 4, 5.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from dsgrad import checks
from dsgrad.mcmc import hmc
from dsgrad.mcmc import proxy as proxy_lib
from dsgrad.mcmc.proxy import TaylorProxy
from dsgrad.mcmc.subsample import SubsampleScheme
from dsgrad.models.base import Model


class HMCECSState(NamedTuple):
  """State of the HMC-ECS chain.

  Attributes:
    position: ``(d,)`` current ``theta``.
    subsample: the current ``u`` (scheme-specific).
    log_likelihood: ``log |L_hat(theta; u)|`` at the current position and subsample.
    sign: sign of ``L_hat`` (always 1 for the perturbed scheme).
    variance: the estimator's :class:`dsgrad.mcmc.proxy.EstimatorVariance` there.
    potential: ``U_hat = -log |L_hat| - log p(theta)``.
    potential_grad: ``(d,)`` its gradient.
  """

  position: jax.Array
  subsample: Any
  log_likelihood: jax.Array
  sign: jax.Array
  variance: proxy_lib.EstimatorVariance
  potential: jax.Array
  potential_grad: jax.Array


class HMCECSInfo(NamedTuple):
  """Per-iteration diagnostics.

  Attributes:
    acceptance_rate: ``min(1, exp(-Delta H))`` of the HMC proposal.
    is_accepted: whether ``theta`` moved.
    subsample_accepted: whether the proposed subsample was accepted.
    energy_change: ``Delta H`` of the proposal (estimated Hamiltonian).
    num_integration_steps: leapfrog steps ``L``.
    num_evaluations: data log-likelihood (with gradient) evaluations this iteration.
    variance: the likelihood estimator's :class:`dsgrad.mcmc.proxy.EstimatorVariance` at
      the iteration's end (its position and subsample), at no extra evaluation.
  """

  acceptance_rate: jax.Array
  is_accepted: jax.Array
  subsample_accepted: jax.Array
  energy_change: jax.Array
  num_integration_steps: jax.Array
  num_evaluations: jax.Array
  variance: proxy_lib.EstimatorVariance


class HMCParameters(NamedTuple):
  """Tuning of the HMC move.

  Attributes:
    step_size: leapfrog step ``epsilon``.
    num_integration_steps: ``L`` (int32 scalar; may vary during warm-up).
    inverse_mass_matrix: ``(d, d)`` ``M^{-1}``, or ``(d,)``: the diagonal of a diagonal
      ``M^{-1}`` (each leapfrog step then costs ``O(d)`` in it, not ``O(d^2)``).
    mass_cholesky: ``(d, d)`` lower Cholesky factor of ``M`` (momentum ``p = chol z``),
      or ``(d,)``: ``sqrt`` of a diagonal ``M``.
  """

  step_size: jax.Array
  num_integration_steps: jax.Array
  inverse_mass_matrix: jax.Array
  mass_cholesky: jax.Array


@checks.arguments(step_size=checks.positive(), num_integration_steps=checks.count(1),
                  dim=checks.optional(checks.count(1)))
def hmc_parameters(step_size: float, num_integration_steps: int, mass_matrix=None,
                   dim: int | None = None) -> HMCParameters:
  """Builds :class:`HMCParameters` from a mass matrix ``M``: ``(d, d)``, or ``(d,)``, the
  diagonal of a diagonal one, kept as such (default: the identity of ``dim``, diagonal).

  The Cholesky factor and the inverse are computed here, once, outside any loop.
  """
  if mass_matrix is None:
    if dim is None:
      raise ValueError("pass mass_matrix or dim")
    mass_matrix = jnp.ones(dim)
  mass_matrix = jnp.asarray(mass_matrix, jnp.float32)
  if mass_matrix.ndim == 1:
    diagonal = np.asarray(mass_matrix)
    if not np.all(np.isfinite(diagonal)) or not np.all(diagonal > 0):
      raise ValueError("mass_matrix, a diagonal, must hold finite positive values, got "
                       f"values from {diagonal.min()} to {diagonal.max()}")
    return HMCParameters(jnp.asarray(step_size, jnp.float32),
                         jnp.asarray(num_integration_steps, jnp.int32), 1.0 / mass_matrix,
                         jnp.sqrt(mass_matrix))
  chol = checked_cholesky(mass_matrix, "mass_matrix")
  with lapack_threads_for(chol.shape[0]):
    inverse = jax.block_until_ready(_inverse(chol))
  return HMCParameters(jnp.asarray(step_size, jnp.float32),
                       jnp.asarray(num_integration_steps, jnp.int32), inverse, chol)


def checked_cholesky(matrix, name: str, dim: int | None = None) -> jax.Array:
  """The lower Cholesky factor of ``matrix``, refusing one that is not square (of side
  ``dim`` when given), symmetric and positive definite: a factor of anything else is
  NaN, or belongs to another matrix than the one given."""
  matrix = jnp.asarray(matrix, jnp.float32)
  if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or (
      dim is not None and matrix.shape[0] != dim):
    side = "square" if dim is None else f"of shape ({dim}, {dim})"
    raise ValueError(f"{name} must be {side}, got shape {matrix.shape}")
  with lapack_threads_for(matrix.shape[0]):
    chol, finite, asymmetry, largest, factored = jax.block_until_ready(_factor(matrix))
  if not bool(finite):
    raise ValueError(f"{name} holds NaN or inf values")
  if float(asymmetry) > 1e-5 * max(float(largest), 1e-30):
    # Symmetrizing it would use another matrix than the one given.
    raise ValueError(f"{name} is not symmetric (largest |M - M^T| = {float(asymmetry):.3g}): "
                     "it must be a symmetric positive definite matrix; pass (M + M.T) / 2 if "
                     "that is what you meant")
  if not bool(factored):
    raise ValueError(f"{name} is not positive definite")
  return chol


ONE_LAPACK_THREAD_FROM = 8192
"""Matrices of at least this side are factored on one BLAS thread."""


def lapack_threads_for(side: int):
  """A context in which a ``side x side`` factorization runs safely: on one BLAS thread
  from :data:`ONE_LAPACK_THREAD_FROM` on. The threaded Cholesky of the OpenBLAS that numpy,
  scipy and jaxlib ship (0.3.31) ended the process with a segmentation fault at 16,000 x
  16,000 on 2 cores, and not at 14,000 nor on one thread (OpenBLAS issues 352 and 2562
  report it at other sizes and thread counts); one thread took 68 s at 20,002, where two
  would have taken some 40."""
  if side < ONE_LAPACK_THREAD_FROM:
    return contextlib.nullcontext()
  # Imported where it is used: only factorizations this large need it.
  import threadpoolctl  # pylint: disable=import-outside-toplevel
  return threadpoolctl.threadpool_limits(limits=1, user_api="blas")


# One program each (run eagerly, the checks and the factorization were a dozen small
# programs, each compiled on a first call).
@jax.jit
def _factor(matrix):
  """``(chol, finite, largest |M - M^T|, largest |M|, chol finite)``."""
  chol = jnp.linalg.cholesky(matrix)
  return (chol, jnp.all(jnp.isfinite(matrix)), jnp.max(jnp.abs(matrix - matrix.T)),
          jnp.max(jnp.abs(matrix)), jnp.all(jnp.isfinite(chol)))


@jax.jit
def _inverse(chol):
  return jax.scipy.linalg.cho_solve((chol, True), jnp.eye(chol.shape[0], dtype=chol.dtype))


def _potential_fn(model: Model, scheme: SubsampleScheme, proxy: TaylorProxy, subsample):
  def potential(theta):
    log_lik, sign, variance = scheme.log_likelihood(proxy, theta, subsample)
    return -log_lik - model.log_prior(theta), (log_lik, sign, variance)
  return potential


@checks.arguments(key=checks.prng_key())
def init(model: Model, scheme: SubsampleScheme, proxy: TaylorProxy, position,
         key) -> HMCECSState:
  """The chain's state at ``position`` with a fresh subsample drawn with ``key``.

  Raises:
    ValueError: if ``position`` is neither a finite ``(d,)`` floating array nor a pytree
      laid out like the model's latent (:func:`dsgrad.mcmc.proxy.check_theta`).
  """
  position = proxy_lib.check_theta(model, position, "position")
  proxy = proxy_lib.check_proxy(model, proxy)
  return reset(model, scheme, proxy, position, scheme.init(key))


def reset(model: Model, scheme: SubsampleScheme, proxy: TaylorProxy, position,
          subsample) -> HMCECSState:
  """The state at ``(position, subsample)`` recomputed (e.g. after the proxy changed)."""
  inner = hmc.init(position, _potential_fn(model, scheme, proxy, subsample))
  return HMCECSState(position, subsample, *inner.aux, inner.potential, inner.potential_grad)


def check_parameters(model: Model, parameters) -> HMCParameters:
  """Refuses ``parameters`` that are not :class:`HMCParameters` with a mass matrix of
  ``model``'s latent dimension (made for another model, or with ``dim`` unset)."""
  if not isinstance(parameters, HMCParameters):
    raise TypeError(f"parameters must be dsgrad.mcmc.HMCParameters (dsgrad.mcmc.hmc_parameters)"
                    f", got {type(parameters).__name__}")
  d = model.latent_dim
  if jnp.shape(parameters.inverse_mass_matrix) not in ((d, d), (d,)):
    raise ValueError(f"parameters hold a mass matrix of shape "
                     f"{jnp.shape(parameters.inverse_mass_matrix)}, where model {model.name!r} "
                     f"has d = {d}: build them with dsgrad.mcmc.hmc_parameters(step_size, "
                     f"num_integration_steps, mass_matrix, dim={d})")
  return parameters


def build_kernel(model: Model, scheme: SubsampleScheme, move: Callable | None = None):
  """The HMC-ECS transition ``kernel(key, state, proxy, parameters) -> (state, info)``.

  One iteration of Alg. 1, a Gibbs sampler on ``(theta, u)``: the pseudo-marginal
  subsample update, then ``move`` on ``theta`` with the estimated potential of the (new)
  subsample, ``U_hat(theta) = -log |L_hat(theta; u)| - log p(theta)``, in its dynamics
  *and* its acceptance. Pure and jit-able; ``proxy`` and ``parameters`` are arguments so
  that warm-up can change them without recompiling.

  Args:
    model: the model.
    scheme: the subsample scheme.
    move: the ``theta`` kernel ``move(key, hmc_state, potential_fn, parameters) ->
      (hmc_state, hmc_info)`` (:func:`dsgrad.mcmc.hmc.build_kernel`'s shape); default
      fixed-length HMC with velocity Verlet, as in the paper. Its info must have
      ``acceptance_rate``, ``is_accepted``, ``energy_change`` and
      ``num_integration_steps``.
  """
  move = hmc.build_kernel() if move is None else move

  def kernel(key, state: HMCECSState, proxy: TaylorProxy, params: HMCParameters):
    k_u, k_u_accept, k_move = jax.random.split(key, 3)

    # 1. u | theta: pseudo-marginal MH with a correlated proposal (Eq. 3.5).
    if scheme.fixed:
      take_u = jnp.asarray(False)
    else:
      proposal = scheme.propose(k_u, state.subsample)
      candidate = reset(model, scheme, proxy, state.position, proposal)
      log_ratio = candidate.log_likelihood - state.log_likelihood
      take_u = jnp.log(jax.random.uniform(k_u_accept)) < log_ratio
      state = jax.tree.map(lambda new, old: jnp.where(take_u, new, old), candidate, state)

    # 2. theta | u: the move on the estimated Hamiltonian (Eq. 3.6-3.7).
    inner = hmc.HMCState(state.position, state.potential, state.potential_grad,
                         (state.log_likelihood, state.sign, state.variance))
    inner, info = move(k_move, inner, _potential_fn(model, scheme, proxy, state.subsample),
                       params)
    state = HMCECSState(inner.position, state.subsample, *inner.aux, inner.potential,
                        inner.potential_grad)

    evaluations = scheme.evaluations(state.subsample) * (
        info.num_integration_steps + (0 if scheme.fixed else 1))
    return state, HMCECSInfo(info.acceptance_rate, info.is_accepted, take_u,
                             info.energy_change, info.num_integration_steps, evaluations,
                             state.variance)

  return kernel


class SamplingAlgorithm(NamedTuple):
  """``init(position, key) -> state`` and ``step(key, state) -> (state, info)``: the
  fields of ``blackjax.base.SamplingAlgorithm`` (BlackJAX is not a dependency of dsgrad),
  so code written for BlackJAX's algorithms runs these too."""

  init: Any
  step: Any


def hmcecs(model: Model, proxy: TaylorProxy, scheme: SubsampleScheme,
           parameters: HMCParameters, move: Callable | None = None) -> SamplingAlgorithm:
  """HMC-ECS with fixed tuning, as a BlackJAX-style pair of pure functions.

  Args:
    model: the model.
    proxy: the Taylor control variates (:func:`dsgrad.mcmc.taylor_proxy`).
    scheme: :func:`dsgrad.mcmc.perturbed` or :func:`dsgrad.mcmc.block_poisson`.
    parameters: :func:`hmc_parameters`.
    move: the ``theta`` kernel (:func:`build_kernel`); default fixed-length HMC.

  Returns:
    A :class:`SamplingAlgorithm`; jit ``step`` yourself or use :func:`dsgrad.mcmc.sample`.

  Example: the perturbed scheme (50 data per estimate, updated in 10 blocks), stepped
  in a jitted loop as one would step a BlackJAX kernel::

    >>> import jax, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 2000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> theta_star = dsgrad.mcmc.find_reference_point(model, jax.random.key(1))
    >>> proxy = dsgrad.mcmc.taylor_proxy(model, theta_star)
    >>> parameters = dsgrad.mcmc.hmc_parameters(
    ...     0.3, 4, dsgrad.mcmc.laplace_precision(model, proxy))
    >>> algorithm = dsgrad.mcmc.hmcecs(model, proxy, dsgrad.mcmc.perturbed(model, 50, 10),
    ...                                parameters)
    >>> state = algorithm.init(theta_star, jax.random.key(2))
    >>> step = jax.jit(algorithm.step)
    >>> accepted = 0.0
    >>> for key in jax.random.split(jax.random.key(3), 100):
    ...   state, info = step(key, state)
    ...   accepted += float(info.acceptance_rate) / 100
    >>> bool(accepted > 0.5), state.position.shape
    (True, (3,))
  """
  proxy = proxy_lib.check_proxy(model, proxy)
  check_parameters(model, parameters)
  kernel = build_kernel(model, scheme, move)
  return SamplingAlgorithm(
      lambda position, key: init(model, scheme, proxy, position, key),
      lambda key, state: kernel(key, state, proxy, parameters))
