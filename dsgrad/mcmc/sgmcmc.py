"""Stochastic-gradient MCMC baselines: SGLD and SG-HMC, with or without control variates.

Both use a fixed step size (as in the HMC-ECS paper's comparison, Sec. 6.2) and, by
default, the same control-variate gradient estimator as HMC-ECS (Eq. 4.7); neither has
a Metropolis correction, so the step size biases the stationary distribution.

References:
  Dang et al. (2019), Sec. 6.2. Welling, Teh (2011). Bayesian learning via stochastic
  gradient Langevin dynamics. ICML. Chen, Fox, Guestrin (2014). Stochastic gradient
  Hamiltonian Monte Carlo. ICML. Baker, Fearnhead, Fox, Nemeth (2019). Control variates
  for stochastic gradient MCMC. Statistics and Computing.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dsgrad.training import batching
from dsgrad import checks
from dsgrad.mcmc import proxy as proxy_lib
from dsgrad.mcmc.hmc import mass_apply
from dsgrad.mcmc.hmcecs import HMCParameters, SamplingAlgorithm, check_parameters
from dsgrad.mcmc.proxy import TaylorProxy
from dsgrad.models.base import Model


class SGState(NamedTuple):
  """State of SGLD / SG-HMC: the position only (momentum is resampled each iteration)."""

  position: jax.Array


class SGInfo(NamedTuple):
  """Per-iteration diagnostics: data log-likelihood gradient evaluations."""

  num_evaluations: jax.Array


def _check(model, subsample_size, who: str):
  # The declared kinds check the arguments alone; this, against the model.
  checks.check_count(subsample_size, f"dsgrad.mcmc.{who}: subsample_size", 1, model.num_data)


def log_posterior_gradient(model: Model, proxy: TaylorProxy | None,
                           control_variates: bool = True):
  """``(theta, indices) -> estimate of grad log p(theta | y)`` from the subsample
  ``indices`` (the minibatch is an argument, as in BlackJAX's SG-MCMC kernels): with
  control variates, Eq. 4.7 (needs ``proxy``); without, ``(n/m) sum_i grad
  l_{u_i}(theta)``."""
  n = model.num_data
  if control_variates and proxy is None:
    raise ValueError("control variates need a TaylorProxy (dsgrad.mcmc.taylor_proxy)")
  if control_variates:
    proxy = proxy_lib.check_proxy(model, proxy)

  def grad(theta, indices):
    if control_variates:
      g_lik = proxy_lib.gradient_estimate(model, proxy, theta, indices)
    else:
      g_lik = jax.grad(lambda t: n * jnp.mean(model.log_likelihood_at(t, indices)))(theta)
    return g_lik + jax.grad(model.log_prior)(theta)

  return grad


def sgld_kernel(grad_estimator):
  """The SGLD transition ``kernel(key, state, indices, step_size) -> (state, info)``: one
  step ``theta += (eps/2) grad_hat(theta, indices) + N(0, eps I)`` on the minibatch
  ``indices`` (``(m,)``) handed in, as BlackJAX's ``sgld`` kernel takes it.

  Args:
    grad_estimator: ``(theta, indices) -> gradient`` (:func:`log_posterior_gradient`).
  """
  def kernel(key, state, indices, step_size):
    theta = state.position
    noise = jnp.sqrt(step_size) * jax.random.normal(key, theta.shape, theta.dtype)
    theta = theta + 0.5 * step_size * grad_estimator(theta, indices) + noise
    return SGState(theta), SGInfo(jnp.asarray(indices.shape[0]))
  return kernel


@checks.arguments(friction=checks.positive())
def sghmc_kernel(grad_estimator, parameters: HMCParameters, friction: float):
  """The SG-HMC transition ``kernel(key, state, indices) -> (state, info)``: momentum
  ``p ~ N(0, M)``, then ``L`` steps, step ``l`` on the minibatch ``indices[l]``
  (``indices``: ``(L, m)``, handed in).

  Args:
    grad_estimator: ``(theta, indices) -> gradient`` (:func:`log_posterior_gradient`).
    parameters: step size, ``L`` and mass matrix (:func:`dsgrad.mcmc.hmc_parameters`).
    friction: ``C``.
  """
  def kernel(key, state, indices):
    k_p, k_steps = jax.random.split(key)
    eps, inv_mass = parameters.step_size, parameters.inverse_mass_matrix
    theta = state.position
    p = mass_apply(parameters.mass_cholesky, jax.random.normal(k_p, theta.shape, theta.dtype))

    def one(i, carry):
      theta, p = carry
      k_noise = jax.random.fold_in(k_steps, i)
      theta = theta + eps * mass_apply(inv_mass, p)
      noise = jnp.sqrt(2 * friction * eps) * jax.random.normal(k_noise, theta.shape,
                                                                 theta.dtype)
      p = (p + eps * grad_estimator(theta, indices[i])
           - eps * friction * mass_apply(inv_mass, p) + noise)
      return theta, p

    theta, _ = jax.lax.fori_loop(0, indices.shape[0], one, (theta, p))
    return SGState(theta), SGInfo(jnp.asarray(indices.size))
  return kernel


@checks.arguments(model=checks.model(), step_size=checks.positive(), subsample_size=checks.count(1))
def sgld(model: Model, proxy: TaylorProxy | None, *, step_size: float, subsample_size: int,
         control_variates: bool = True) -> SamplingAlgorithm:
  """SGLD with a fixed step: ``theta += (eps/2) grad_hat log p(theta | y) + N(0, eps I)``.

  Args:
    model: the model.
    proxy: Taylor control variates (``None`` with ``control_variates=False``).
    step_size: ``epsilon``.
    subsample_size: ``m`` per gradient.
    control_variates: use Eq. 4.7's estimator (default) or the plain mini-batch one.

  Returns:
    A :class:`dsgrad.mcmc.SamplingAlgorithm` (``init(position, key)``, ``step(key, state)``).

  Example: SGLD with control variates around the mode ``theta*``, run for 2,000
  iterations of 50 data each::

    >>> import jax, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 2000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> theta_star = dsgrad.mcmc.find_reference_point(model, jax.random.key(1))
    >>> proxy = dsgrad.mcmc.taylor_proxy(model, theta_star)
    >>> algorithm = dsgrad.mcmc.sgld(model, proxy, step_size=1e-3, subsample_size=50)
    >>> draws, *_ = dsgrad.mcmc.run_chain(jax.random.key(2), algorithm.step,
    ...                                   algorithm.init(theta_star, None), 2000,
    ...                                   chunk_size=1000, progress=False)
    >>> draws.shape, bool(np.all(np.abs(draws.mean(0) - theta_star) < 0.2))
    ((2000, 3), True)
  """
  _check(model, subsample_size, "sgld")
  kernel = sgld_kernel(log_posterior_gradient(model, proxy, control_variates))
  n, m, eps = model.num_data, int(subsample_size), float(step_size)

  def step(key, state):
    k_batch, k_noise = jax.random.split(key)
    return kernel(k_noise, state, batching.uniform_indices(k_batch, n, (m,)), eps)

  return SamplingAlgorithm(
      lambda position, key: SGState(proxy_lib.check_theta(model, position, "position")), step)


@checks.arguments(model=checks.model(), subsample_size=checks.count(1), friction=checks.positive())
def sghmc(model: Model, proxy: TaylorProxy | None, parameters: HMCParameters, *,
          subsample_size: int, friction: float = 1.0,
          control_variates: bool = True) -> SamplingAlgorithm:
  """SG-HMC (Chen et al. 2014, as in Sec. 6.2): momentum ``p ~ N(0, M)`` each iteration,
  then ``L`` steps of

      theta += eps M^{-1} p,
      p += -eps grad_hat U(theta) - eps C M^{-1} p + N(0, 2 C eps)

  with ``C = friction * I`` and ``B_hat = 0``, a fresh subsample per step, no
  Metropolis correction.

  Args:
    model: the model.
    proxy: Taylor control variates (``None`` with ``control_variates=False``).
    parameters: :func:`dsgrad.mcmc.hmc_parameters` (step size, ``L``, mass matrix).
    subsample_size: ``m`` per gradient.
    friction: ``C``.
    control_variates: use Eq. 4.7's estimator (default) or the plain mini-batch one.

  Returns:
    A :class:`dsgrad.mcmc.SamplingAlgorithm`, as :func:`sgld` returns.

  Example: with the Laplace precision at ``theta*`` as the mass matrix::

    >>> import jax, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 2000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> theta_star = dsgrad.mcmc.find_reference_point(model, jax.random.key(1))
    >>> proxy = dsgrad.mcmc.taylor_proxy(model, theta_star)
    >>> parameters = dsgrad.mcmc.hmc_parameters(
    ...     0.1, 10, dsgrad.mcmc.laplace_precision(model, proxy))
    >>> algorithm = dsgrad.mcmc.sghmc(model, proxy, parameters, subsample_size=50)
    >>> draws, *_ = dsgrad.mcmc.run_chain(jax.random.key(2), algorithm.step,
    ...                                   algorithm.init(theta_star, None), 500,
    ...                                   chunk_size=500, progress=False)
    >>> draws.shape, bool(np.all(np.isfinite(draws)))
    ((500, 3), True)
  """
  _check(model, subsample_size, "sghmc")
  check_parameters(model, parameters)
  kernel = sghmc_kernel(log_posterior_gradient(model, proxy, control_variates), parameters,
                        friction)
  n, m, steps = model.num_data, int(subsample_size), int(parameters.num_integration_steps)

  def step(key, state):
    k_batch, k_move = jax.random.split(key)
    return kernel(k_move, state, batching.uniform_indices(k_batch, n, (steps, m)))

  return SamplingAlgorithm(
      lambda position, key: SGState(proxy_lib.check_theta(model, position, "position")), step)
