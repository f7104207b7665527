"""The reference point ``theta*`` of the control variates and the Laplace approximation
around it: the mode on a data subset, refined to the full-data mode by Newton steps, and
the posterior precision there.

References:
  Dang et al. (2019), Sec. 4.1 (the expansion point) and Sec. 6.3 (``M`` from the
  Hessian at ``theta*``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks
from dsgrad import derivatives
from dsgrad.mcmc import subsample as subsample_lib
from dsgrad.mcmc.hmcecs import checked_cholesky, lapack_threads_for
from dsgrad.mcmc.proxy import TaylorProxy, check_proxy, check_theta, taylor_proxy
from dsgrad.models.base import Model
from dsgrad.training import batching
from dsgrad.training import compile_cache
from dsgrad.training import host_data


REFERENCE_STEPS = 200


def default_subset_size(n: int) -> int:
  return min(n, 10 * math.isqrt(n) + 1000)


@checks.arguments(model=checks.model(),
                  key=checks.prng_key(), subset_size=checks.optional(checks.count(1)),
                  num_steps=checks.count(0))
def find_reference_point(model: Model, key, *, subset_size: int | None = None,
                         num_steps: int = REFERENCE_STEPS, position=None) -> jax.Array:
  """``theta*``: the posterior mode on a random data subset, rescaled to ``n`` data.

  Maximizes ``(n / n_sub) sum_{k in subset} l_k(theta) + log p(theta)`` with L-BFGS
  (``optax.lbfgs``) for ``num_steps`` iterations from ``position`` (default zeros).

  Args:
    model: the model.
    key: picks the subset.
    subset_size: ``n_sub`` (default ``min(n, 10 sqrt(n) + 1000)``).
    num_steps: L-BFGS iterations.
    position: starting point.

  Returns:
    ``(d,)`` reference point.
  """
  n = model.num_data
  size = min(n, int(subset_size or default_subset_size(n)))
  start = (np.zeros(model.latent_dim, np.float32) if position is None
           else check_theta(model, position, "position"))
  return _subset_mode(model, key, start, num_steps, size)


# The model, the key and the start are arguments (not constants): one compile serves every
# call on models of the same shapes. The subset is drawn inside (drawn eagerly, its
# permutation was a dozen small programs compiled on a first call).
@compile_cache.jit_by_text(static_argnames=("num_steps", "size"))
def _subset_mode(model: Model, key, theta, num_steps: int, size: int):
  """L-BFGS on the log posterior with the likelihood of ``size`` data drawn without
  replacement with ``key``, scaled to all data."""
  subset = batching.uniform_indices(key, model.num_data, size, replace=False)
  scale = model.num_data / size
  opt = optax.lbfgs()

  def loss(theta):
    return -scale * jnp.sum(model.log_likelihood_at(theta, subset)) - model.log_prior(theta)

  value_and_grad = optax.value_and_grad_from_state(loss)

  def step(carry, _):
    theta, state = carry
    value, grad = value_and_grad(theta, state=state)
    updates, state = opt.update(grad, state, theta, value=value, grad=grad, value_fn=loss)
    return (optax.apply_updates(theta, updates), state), None
  return jax.lax.scan(step, (theta, opt.init(theta)), None, length=num_steps)[0][0]


@checks.arguments(order=checks.count(1, 2), max_steps=checks.count(0))
def refine_reference_point(model: Model, proxy: TaylorProxy, *, order: int = 2,
                           max_steps: int = 10) -> tuple[TaylorProxy, int]:
  """Newton steps with a backtracking line search on the full-data log posterior, from
  ``proxy.theta_star``: each step from the sums the proxy already holds (its gradient
  ``A`` and Hessian ``B``), shortened until the log posterior climbs (one likelihood pass
  per trial), then the new point's proxy (one pass with curvature).

  Why: :func:`find_reference_point` maximizes on a data subset, so its ``theta*`` can be
  many posterior standard deviations from the full-data mode the paper expands around
  (Sec. 4.1): on an item-response model (30,000 answers, 501 latents) one student's
  ability was 15 standard deviations off, from the few of their answers in the subset.
  The control variates' error grows with ``|theta - theta*|`` (as its cube at second
  order, its square at first), and with it the estimator's variance where the chain goes:
  a first-order proxy at a subset's mode gave a variance of 100 at the posterior, and a
  chain 25-60 standard deviations off. For a log-concave posterior (logistic, Poisson,
  linear-Gaussian models) damped Newton converges from anywhere.

  Stops when the Newton decrement ``g^T P^{-1} g`` is below 0.01 (a step under a tenth of
  a posterior standard deviation), when no step of at least 1/32 of Newton's climbs, or
  after ``max_steps`` steps.

  Returns:
    ``(proxy at the refined point, O(n) passes made)``.
  """
  proxy = check_proxy(model, proxy)
  log_posterior = functools.partial(_log_posterior, model)

  current, passes = float(log_posterior(proxy.theta_star)), 1
  for _ in range(max_steps):
    grad = np.asarray(_posterior_gradient(model, proxy), np.float64)
    # The floored precision's solve (laplace_precision's matrix, in float64).
    step = floored_solve(np.asarray(_symmetric_precision(model, proxy), np.float64), grad)
    decrement = float(grad @ step)
    if not np.all(np.isfinite(step)) or decrement < 0.01:
      break
    fraction, start = 1.0, np.asarray(proxy.theta_star)
    while fraction >= 1 / 32:
      # In the latent's float32 on the host, as on the device (an eager sum compiles a
      # program).
      trial = jnp.asarray(start + (fraction * step).astype(start.dtype))
      value, passes = float(log_posterior(trial)), passes + 1
      # Armijo's condition, with float32 sums' rounding allowed for.
      if value > current + 1e-4 * fraction * decrement - 1e-6 * abs(current):
        break
      fraction /= 2
    else:
      break
    proxy, current, passes = taylor_proxy(model, trial, order=order), value, passes + 1
  return proxy, passes


@compile_cache.jit_by_text
def _log_posterior(model: Model, theta):
  """The full-data log posterior (unnormalized) at ``theta``."""
  full = subsample_lib.full_data(model)
  return full.log_likelihood(None, theta, None)[0] + model.log_prior(theta)


def laplace_precision(model: Model, proxy: TaylorProxy) -> jax.Array:
  """``-(B + Hess log p(theta*))``: the full-data posterior precision at ``theta*``, the
  mass matrix of Sec. 6.3. Symmetrized; eigenvalues floored at ``1e-6`` times the
  largest, so that it is positive definite."""
  precision = np.asarray(_symmetric_precision(model, check_proxy(model, proxy)), np.float64)
  return jnp.asarray(floored_eigenvalues(precision).astype(np.float32))


DENSE_BYTES_PER_ENTRY = 32
"""The setup's peak memory per entry of a ``d x d`` matrix: the float32 Taylor sums and
their symmetrized copy on the device, the float64 precision, its shifted copy and factor on
the host (13.0 GB measured at d = 20,002, 32.5 bytes an entry)."""


def check_dense_matrices_fit(model: Model) -> None:
  """Refuses, before anything runs, a latent whose ``d x d`` matrices (the Taylor sums, the
  Laplace precision and its factors, the mass matrix) do not fit in the free memory: the
  process would otherwise be killed minutes into the setup."""
  d, available = model.latent_dim, host_data.free_memory_bytes()
  needed = DENSE_BYTES_PER_ENTRY * d * d
  if available is not None and needed > available:
    raise ValueError(
        f"dsgrad.mcmc.sample: model {model.name!r} has d = {d:,} latent coordinates, and "
        f"HMC-ECS holds d x d matrices (its Taylor sums, the Laplace precision and its "
        f"factors: about {needed / 1e9:.1f} GB at the setup's peak), more than the "
        f"{available / 1e9:.1f} GB free. It suits models of up to some ten thousand "
        "latents; for this one fit a variational approximation (dsgrad.fit, with a control "
        "variate such as dsgrad.joint_saga)")


EIGENVALUE_FLOOR = 1e-6
"""The Laplace precision's eigenvalues are floored at this times the largest."""


def floored_eigenvalues(precision: np.ndarray) -> np.ndarray:
  """``precision`` (symmetric, float64) with its eigenvalues floored at
  :data:`EIGENVALUE_FLOOR` times the largest.

  Where one Cholesky factorization shows the smallest eigenvalue above the floor of an
  upper bound on the largest (the smaller of the matrix's infinity and Frobenius norms),
  the floor changes nothing and the matrix is returned as it is; only otherwise is it
  decomposed. Why: the eigendecomposition costs some 20 times the factorization, and at a
  few thousand latents it set the setup's time (12 s of each of the reference point's
  Newton steps at d = 5,002, 2 cores), where a posterior precision is usually well inside
  the floor.
  """
  if _shifted_factor(precision) is not None:
    return precision
  values, vectors = _floored_eigenpairs(precision)
  return (vectors * values) @ vectors.T


def _floored_eigenpairs(precision: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``precision``'s eigenvalues, floored, and eigenvectors."""
  values, vectors = np.linalg.eigh(precision)
  return np.maximum(values, EIGENVALUE_FLOOR * max(values.max(), 1e-12)), vectors


def floored_solve(precision: np.ndarray, vector: np.ndarray) -> np.ndarray:
  """``floored_eigenvalues(precision)^{-1} vector`` for a symmetric float64 ``precision``,
  with one factorization where the floor changes nothing: the factor of ``S = precision -
  c I`` that shows it (:func:`floored_eigenvalues`) also solves, by iterative refinement
  ``x += S^{-1} (vector - precision x)``, whose error shrinks by ``c / lambda_min(S)`` a
  step (``c`` is a millionth of the largest eigenvalue's bound). Why: at d = 20,002 a
  factorization takes about 68 s, and each of the reference point's Newton steps made two.
  Where the refinement stalls (the smallest eigenvalue within a few ``c`` of the floor),
  ``precision`` is factored itself; where the floor changes it, the solve is the
  eigendecomposition's that floors it."""
  factor = _shifted_factor(precision)
  if factor is None:
    values, vectors = _floored_eigenpairs(precision)
    return vectors @ ((vectors.T @ vector) / values)
  linalg, target, previous = _scipy_linalg(), 1e-10 * np.linalg.norm(vector), np.inf
  with lapack_threads_for(len(precision)):
    solution = linalg.cho_solve(factor, vector, check_finite=False)
    for _ in range(30):
      residual = vector - precision @ solution
      size = np.linalg.norm(residual)
      if size <= target:
        return solution
      if size > 0.5 * previous:  # contracting slowly, or not: near the floor
        break
      previous = size
      solution = solution + linalg.cho_solve(factor, residual, check_finite=False)
  return positive_definite_solve(precision, vector)


def _shifted_factor(precision: np.ndarray):
  """``scipy.linalg.cho_factor`` of ``precision`` less :data:`EIGENVALUE_FLOOR` times an
  upper bound on its largest eigenvalue on the diagonal, or ``None`` where that is not
  positive definite (the floor would change ``precision``)."""
  bound = min(np.linalg.norm(precision, np.inf), np.linalg.norm(precision, "fro"))
  shifted = precision.copy()
  shifted[np.diag_indices_from(shifted)] -= EIGENVALUE_FLOOR * max(bound, 1e-12)
  with lapack_threads_for(len(precision)):
    try:
      return _scipy_linalg().cho_factor(shifted, lower=True, overwrite_a=True,
                                        check_finite=False)
    except np.linalg.LinAlgError:
      return None


def positive_definite_solve(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
  """``matrix^{-1} vector`` for a symmetric float64 ``matrix``: by Cholesky (half the work
  of a general solve), or by LU where rounding leaves it not quite positive definite."""
  linalg = _scipy_linalg()
  with lapack_threads_for(len(matrix)):
    try:
      return linalg.cho_solve(linalg.cho_factor(matrix, lower=True, check_finite=False),
                              vector)
    except np.linalg.LinAlgError:
      return np.linalg.solve(matrix, vector)


def inverse_diagonal(matrix: np.ndarray) -> np.ndarray:
  """The diagonal of ``matrix^{-1}`` for a symmetric positive definite float64 ``matrix``:
  the column sums of squares of its Cholesky factor's inverse (a third of a general
  inverse's work)."""
  linalg = _scipy_linalg()
  with lapack_threads_for(len(matrix)):
    lower = linalg.cholesky(matrix, lower=True, check_finite=False)
    inverse = linalg.solve_triangular(lower, np.eye(len(matrix)), lower=True, overwrite_b=True,
                                      check_finite=False)
  return np.sum(inverse ** 2, axis=0)


def _scipy_linalg():
  # Imported on first use: scipy.linalg is not otherwise imported with dsgrad.
  import scipy.linalg  # pylint: disable=import-outside-toplevel
  return scipy.linalg


# Programs taking the model as an argument: differentiated eagerly, the prior's gradient
# and Hessian were dozens of small programs compiled one by one on a first call.
@compile_cache.jit_by_text
def _posterior_gradient(model: Model, proxy: TaylorProxy):
  """The full-data log posterior's gradient at ``theta*``, from the proxy's sums."""
  return proxy.sum_grad + jax.grad(model.log_prior)(proxy.theta_star)


@compile_cache.jit_by_text
def _symmetric_precision(model: Model, proxy: TaylorProxy):
  precision = -(proxy.sum_hessian + derivatives.hessian(model.log_prior)(proxy.theta_star))
  return 0.5 * (precision + precision.T)


@checks.arguments(key=checks.prng_key(), num=checks.count(1))
def laplace_draws(proxy: TaylorProxy, precision, key, num: int) -> jax.Array:
  """``num`` draws from ``N(theta*, precision^{-1})``.

  Raises:
    ValueError: ``precision`` is not a symmetric positive definite ``(d, d)`` matrix
      (its draws would be NaN).
  """
  chol = checked_cholesky(precision, "precision", proxy.theta_star.shape[0])
  return _draws(proxy.theta_star, chol, key, num)


@functools.partial(jax.jit, static_argnames="num")
def _draws(mean, chol, key, num: int):
  """``num`` draws of ``N(mean, (chol chol^T)^{-1})``, in one program (eagerly, six)."""
  z = jax.random.normal(key, (num, mean.shape[0]), mean.dtype)  # float32 under x64 too
  return mean + jax.scipy.linalg.solve_triangular(chol.T, z.T, lower=False).T
