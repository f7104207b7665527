"""Running chains: the reference point, warm-up (dual averaging, periodic ``theta*`` and
mass-matrix updates) and sampling with a progress bar.

References:
  Dang et al. (2019), Sec. 6.3 (tuning: ``M`` from the Hessian at ``theta*``, updated
  every 200 burn-in iterations; dual averaging to acceptance 0.8 with a fixed
  trajectory length ``epsilon L = 1.2``).
  Hoffman, Gelman (2014). The No-U-Turn sampler. JMLR 15 (dual averaging, Alg. 5).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad.training import batching
from dsgrad import checks
from dsgrad.mcmc import estimator_noise
from dsgrad.mcmc.chain import run_chain
from dsgrad.mcmc.dual_averaging import (dual_averaging_init, dual_averaging_update,
                                        integration_steps)
from dsgrad.training.progress import Interrupted
from dsgrad.mcmc.diagnostics import effective_sample_size
from dsgrad.mcmc.hmcecs import (HMCParameters, build_kernel, checked_cholesky, hmc_parameters,
                                init, reset)
from dsgrad.mcmc import subsample as subsample_lib
from dsgrad.mcmc.proxy import TaylorProxy, check_proxy, check_theta, taylor_proxy
from dsgrad.models.base import Model


REFERENCE_STEPS = 200


def _default_subset_size(n: int) -> int:
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
  size = min(n, int(subset_size or _default_subset_size(n)))
  subset = batching.uniform_indices(key, n, size, replace=False)
  start = (jnp.zeros(model.latent_dim, jnp.float32) if position is None
           else check_theta(model, position, "position"))

  opt = optax.lbfgs()

  # The model is an argument: its data are the program's inputs, not constants.
  @jax.jit
  def run(model, theta):
    def loss(theta):
      return (-(n / size) * jnp.sum(model.log_likelihood_at(theta, subset))
              - model.log_prior(theta))

    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry, _):
      theta, state = carry
      value, grad = value_and_grad(theta, state=state)
      updates, state = opt.update(grad, state, theta, value=value, grad=grad, value_fn=loss)
      return (optax.apply_updates(theta, updates), state), None
    return jax.lax.scan(step, (theta, opt.init(theta)), None, length=num_steps)[0][0]

  return run(model, start)


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
  @jax.jit
  def log_posterior_of(model, theta):
    full = subsample_lib.full_data(model)
    return full.log_likelihood(None, theta, None)[0] + model.log_prior(theta)

  log_posterior = functools.partial(log_posterior_of, model)

  current, passes = float(log_posterior(proxy.theta_star)), 1
  for _ in range(max_steps):
    grad = np.asarray(proxy.sum_grad + jax.grad(model.log_prior)(proxy.theta_star), np.float64)
    step = np.linalg.solve(np.asarray(laplace_precision(model, proxy), np.float64), grad)
    decrement = float(grad @ step)
    if not np.all(np.isfinite(step)) or decrement < 0.01:
      break
    fraction = 1.0
    while fraction >= 1 / 32:
      trial = proxy.theta_star + jnp.asarray(fraction * step, proxy.theta_star.dtype)
      value, passes = float(log_posterior(trial)), passes + 1
      # Armijo's condition, with float32 sums' rounding allowed for.
      if value > current + 1e-4 * fraction * decrement - 1e-6 * abs(current):
        break
      fraction /= 2
    else:
      break
    proxy, current, passes = taylor_proxy(model, trial, order=order), value, passes + 1
  return proxy, passes


def laplace_precision(model: Model, proxy: TaylorProxy) -> jax.Array:
  """``-(B + Hess log p(theta*))``: the full-data posterior precision at ``theta*``, the
  mass matrix of Sec. 6.3. Symmetrized; eigenvalues floored at ``1e-6`` times the
  largest, so that it is positive definite."""
  proxy = check_proxy(model, proxy)
  prior_hess = jax.hessian(model.log_prior)(proxy.theta_star)
  precision = -(proxy.sum_hessian + prior_hess)
  precision = 0.5 * (precision + precision.T)
  values, vectors = np.linalg.eigh(np.asarray(precision, np.float64))
  values = np.maximum(values, 1e-6 * max(values.max(), 1e-12))
  return jnp.asarray((vectors * values) @ vectors.T, jnp.float32)


@checks.arguments(key=checks.prng_key(), num=checks.count(1))
def laplace_draws(proxy: TaylorProxy, precision, key, num: int) -> jax.Array:
  """``num`` draws from ``N(theta*, precision^{-1})``.

  Raises:
    ValueError: ``precision`` is not a symmetric positive definite ``(d, d)`` matrix
      (its draws would be NaN).
  """
  chol = checked_cholesky(precision, "precision", proxy.theta_star.shape[0])
  z = jax.random.normal(key, (num, proxy.theta_star.shape[0]))
  offsets = jax.scipy.linalg.solve_triangular(chol.T, z.T, lower=False).T
  return proxy.theta_star + offsets


class MCMCResult(NamedTuple):
  """What :func:`sample` returns.

  Attributes:
    samples: ``(R, d)`` numpy array of draws after warm-up.
    signs: ``(R,)`` signs of the likelihood estimates (all 1 for the perturbed scheme);
      use :func:`dsgrad.mcmc.signed_mean` for signed runs.
    info: the per-iteration :class:`dsgrad.mcmc.HMCECSInfo`, numpy, leading axis ``R``.
    state: the final chain state (to continue).
    proxy: the final :class:`dsgrad.mcmc.TaylorProxy`.
    parameters: the tuned :class:`dsgrad.mcmc.HMCParameters`.
    scheme: the subsample scheme sampled with.
    warmup_seconds: wall-clock of the setup and warm-up (compilation included).
    sampling_seconds: wall-clock of the sampling phase (compilation excluded).
    setup_evaluations: data evaluations spent before sampling (reference point, the
      O(n) proxy passes, choosing ``m``, warm-up iterations).
    subsample_size: the ``m`` sampled with (chosen with ``"auto"``); ``None`` for
      ``estimator="full"``.
    ess: ``(d,)`` effective sample size of each coordinate of ``samples``
      (:func:`dsgrad.mcmc.effective_sample_size`; NaN for a chain that diverged, and
      without arviz-stats, which ``warnings`` then names).
    warnings: sentences on what makes the draws untrustworthy (an estimator variance
      well above 1: :func:`dsgrad.mcmc.estimator_noise.variance_warnings`; a reference
      point that drifted from the full-data mode in warm-up:
      :func:`~dsgrad.mcmc.estimator_noise.reference_drift_warnings`); printed with
      ``progress``.
    estimator_variance: the perturbed scheme's estimator variance at up to 50 draws spread
      over the chain, from data read afresh
      (:func:`~dsgrad.mcmc.estimator_noise.variance_at_draws`, 2,048 data per draw, not
      counted in ``setup_evaluations``); the variance warning reads it. ``info.variance``
      holds the chain's own estimate at every draw, which is conditioned on the subsamples
      the chain accepted and can be far lower; ``None`` for the other estimators.
  """

  samples: np.ndarray
  signs: np.ndarray
  info: Any
  state: Any
  proxy: TaylorProxy
  parameters: HMCParameters
  scheme: subsample_lib.SubsampleScheme
  warmup_seconds: float
  sampling_seconds: float
  setup_evaluations: int
  subsample_size: int | None = None
  ess: np.ndarray | None = None
  warnings: tuple = ()
  estimator_variance: np.ndarray | None = None

  def __repr__(self) -> str:
    # The fields' own reprs run to thousands of subsample indices: a summary instead.
    accepted = np.mean(np.asarray(self.info.is_accepted)) if hasattr(
        self.info, "is_accepted") else float("nan")
    return (f"MCMCResult(samples={np.shape(self.samples)}, scheme={self.scheme.name!r}, "
            f"accepted={accepted:.3g}, step_size={float(self.parameters.step_size):.3g}, "
            f"warmup_seconds={self.warmup_seconds:.3g}, "
            f"sampling_seconds={self.sampling_seconds:.3g}, "
            f"setup_evaluations={self.setup_evaluations})")


def _effective_sample_size(samples) -> tuple[np.ndarray, tuple]:
  """``(ess, warnings)`` of a finished chain: NaN for a chain that diverged, and without
  arviz-stats, with a warning that names it (the draws are kept either way)."""
  try:
    return effective_sample_size(samples), ()
  except ValueError:  # a chain that diverged
    return np.full(samples.shape[1], np.nan), ()
  except ImportError as error:
    return np.full(samples.shape[1], np.nan), (f"ess not computed: {error}",)


@checks.arguments(model=checks.model(), key=checks.prng_key(), num_samples=checks.count(1),
                  subsample_size=checks.or_word(checks.count(1), "auto"),
                  num_warmup=checks.count(0),
                  num_blocks=checks.count(1), proxy_order=checks.count(1),
                  trajectory_length=checks.positive(),
                  target_accept=checks.probability(low_open=True, high_open=True),
                  initial_step_size=checks.positive(),
                  max_integration_steps=checks.count(1),
                  reference_updates_every=checks.count(0),
                  signed_blocks_per_update=checks.count(1), mass_window=checks.count(1))
def sample(key, model: Model, *, num_samples: int, subsample_size: int | str,
           num_warmup: int = 1000, num_blocks: int = 100, estimator: str = "perturbed",
           position=None, reference_point=None, proxy_order: int = 2,
           trajectory_length: float = 1.2, target_accept: float = 0.8,
           initial_step_size: float = 0.25, max_integration_steps: int = 256,
           reference_updates_every: int = 200, signed_blocks_per_update: int = 1,
           mass_matrix="laplace", mass_window: int = 200,
           progress: bool = True) -> MCMCResult:
  """HMC-ECS from start to finish, tuned as in the paper (Sec. 6.3).

  1. ``theta*`` = :func:`find_reference_point` (unless given) made the full-data mode by
     :func:`refine_reference_point` (damped Newton steps, two O(n) passes each), the Taylor
     proxy around it (one O(n) pass) and the mass matrix ``M`` (by default :func:`laplace_precision`;
     see ``mass_matrix``).
  2. Warm-up of ``num_warmup`` iterations with the perturbed scheme: dual averaging of
     the step size towards ``target_accept`` with ``L = ceil(trajectory_length / eps)``;
     every ``reference_updates_every`` iterations ``theta*`` moves to the mean of the
     last window's draws, and the proxy (and, with ``mass_matrix="laplace"``, ``M``) is
     recomputed.
  3. ``num_samples`` iterations with the tuned step size and ``estimator``:
     ``"perturbed"`` (Sec. 4) or ``"signed"`` (Sec. 5; block-Poisson with ``(lambda, a)``
     from :func:`dsgrad.mcmc.suggest_block_poisson` at Laplace draws, and ``m`` =
     ``subsample_size`` per factor), or ``"full"``: plain HMC on all data with the
     same tuning (the baseline; ``subsample_size`` and ``num_blocks`` are then unused).

  Args:
    key: PRNG key (the whole run is reproducible from it).
    model: the model.
    num_samples: draws kept.
    subsample_size: ``m``, or ``"auto"``: the ``m`` whose estimator variance is at most 1
      at 90% of 50 draws of the Laplace approximation
      (:func:`dsgrad.mcmc.estimator_noise.choose_subsample_size`; it costs 50 reads of
      2,048 data, counted in ``setup_evaluations``).
    num_warmup: warm-up iterations (not kept).
    num_blocks: ``G`` for the perturbed scheme (``m`` must be a multiple).
    estimator: ``"perturbed"``, ``"signed"`` or ``"full"``.
    position: initial ``theta`` (default ``theta*``).
    reference_point: ``theta*`` to use instead of :func:`find_reference_point`.
    proxy_order: 2 (paper) or 1.
    trajectory_length: ``epsilon L``.
    target_accept: dual-averaging target.
    initial_step_size: first ``epsilon``.
    max_integration_steps: cap on ``L``.
    reference_updates_every: warm-up window length; 0 keeps ``theta*`` fixed.
    signed_blocks_per_update: ``kappa`` for the signed scheme.
    mass_matrix: ``"laplace"`` (default, the paper's Sec. 6.3: ``M`` is the posterior
      precision at ``theta*``, recomputed with the proxy); ``"adapt"``: a diagonal ``M``
      adapted from the warm-up draws as Stan and NumPyro do -- ``M^{-1}`` starts at the
      identity and, at the end of every ``mass_window`` warm-up iterations but the last
      window, becomes the regularized variance of that window's draws
      ``(w / (w + 5)) var + 1e-3 (5 / (w + 5))``, and dual averaging restarts; or a
      fixed ``(d, d)`` mass matrix ``M`` (a ``(d,)`` array is its diagonal), used
      unchanged throughout -- e.g. the same Laplace precision handed to another library.
    mass_window: warm-up window for ``mass_matrix="adapt"``.
    progress: progress bar while sampling.

  Returns:
    An :class:`MCMCResult`.

  Raises:
    ValueError: on an unknown estimator, ``m > n``, non-positive block counts, a
      reference point, position or mass matrix of the wrong shape or not finite, a mass
      matrix that is not positive definite, an unknown ``mass_matrix`` string,
      ``target_accept`` outside (0, 1), or a non-positive trajectory length, initial step
      size or step cap.

  Example: a logistic regression on 2,000 data, 50 data per likelihood estimate; the
  draws centre on the posterior mode with the spread of the Laplace approximation::

    >>> import jax, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 2000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> result = dsgrad.mcmc.sample(jax.random.key(1), model, num_samples=300,
    ...                             num_warmup=300, subsample_size=50, num_blocks=10,
    ...                             progress=False)
    >>> result.samples.shape
    (300, 3)
    >>> sd = np.sqrt(np.diag(np.linalg.inv(dsgrad.mcmc.laplace_precision(model, result.proxy))))
    >>> mean_error = np.abs(result.samples.mean(0) - result.proxy.theta_star) / sd
    >>> bool(np.all(mean_error < 1.0)), bool(np.all(np.abs(result.samples.std(0) / sd - 1) < 0.4))
    (True, True)
  """
  # The numeric settings are checked by the argument declarations above.
  if estimator not in ("perturbed", "signed", "full"):
    raise ValueError(f"estimator must be 'perturbed', 'signed' or 'full', got {estimator!r}")
  start_time = time.perf_counter()
  k_ref, k_init, k_warm, k_tune, k_sample, k_signed = jax.random.split(key, 6)
  evaluations, refine = 0, reference_point is None
  if refine:
    reference_point = find_reference_point(model, k_ref)
    # Line searches not counted.
    evaluations += REFERENCE_STEPS * _default_subset_size(model.num_data)
  reference_point = check_theta(model, reference_point, "reference_point")
  proxy = taylor_proxy(model, reference_point, order=proxy_order)
  evaluations += model.num_data
  if refine:
    proxy, passes = refine_reference_point(model, proxy, order=proxy_order)
    evaluations += passes * model.num_data
  # The posterior precision at theta*, computed once for all that use it: the mass matrix,
  # the Laplace draws that choose m, the drift check's standard deviations.
  laplace = (laplace_precision(model, proxy) if refine or subsample_size == "auto"
             or (isinstance(mass_matrix, str) and mass_matrix == "laplace") else None)
  mode = (proxy.theta_star, laplace) if refine else None
  mass_mode, precision = _initial_precision(model, laplace, mass_matrix)
  if estimator == "full":
    subsample_size, make_scheme = None, subsample_lib.full_data
  else:
    if subsample_size == "auto":
      k_auto = jax.random.fold_in(key, 7)  # the other keys stay those of a given m
      draws = laplace_draws(proxy, laplace, k_auto, 50)
      subsample_size, _ = estimator_noise.choose_subsample_size(
          model, proxy, draws, k_auto, num_blocks=num_blocks)
      evaluations += 50 * min(model.num_data, 2048)
    make_scheme = functools.partial(subsample_lib.perturbed, subsample_size=subsample_size,
                                    num_blocks=num_blocks)
  # Compiled programs take the model as an argument (its data are their inputs) and build
  # the scheme from it; ``scheme`` serves the eager calls. The default start is theta*.
  scheme = make_scheme(model)
  position = proxy.theta_star if position is None else check_theta(model, position, "position")
  warmup = _Warmup(model, make_scheme, trajectory_length, max_integration_steps, target_accept,
                   initial_step_size, proxy_order)
  state = init(model, scheme, proxy, position, k_init)
  state, proxy, params, warm_evaluations = warmup.run(
      state, proxy, hmc_parameters(initial_step_size, 1, precision), k_warm, num_warmup,
      reference_updates_every, mass_mode, mass_window)
  evaluations += warm_evaluations
  if estimator == "signed":
    make_scheme = _signed_scheme(model, proxy, k_tune, subsample_size, signed_blocks_per_update)
    scheme = make_scheme(model)
    state = init(model, scheme, proxy, state.position, k_signed)
  warmup_seconds = time.perf_counter() - start_time

  def result(samples, signs, info, state, seconds):
    ess, missing = _effective_sample_size(samples)
    estimator_variance, warnings = estimator_noise.diagnose(
        model, proxy, samples, info, jax.random.fold_in(key, 8), subsample_size,
        estimator == "perturbed", mode)
    warnings = tuple(warnings) + missing
    for message in warnings if progress else ():
      print("warning: " + message, flush=True)
    return MCMCResult(samples, signs, info, state, proxy, params, scheme, warmup_seconds,
                      seconds, evaluations, subsample_size, ess, warnings, estimator_variance)

  try:
    drawn = run_chain(
        k_sample, lambda m, k, s: build_kernel(m, make_scheme(m))(k, s, proxy, params), state,
        num_samples, progress=progress, model=model)
  except Interrupted as stop:
    stop.result = result(*stop.result)  # the draws kept, as sample returns them
    raise
  return result(*drawn)


def _signed_scheme(model, proxy, key, subsample_size: int, blocks_per_update: int):
  """``model -> scheme``: block-Poisson with ``(lambda, a)`` suggested at Laplace draws."""
  draws = laplace_draws(proxy, laplace_precision(model, proxy), key, 50)
  lam, a = subsample_lib.suggest_block_poisson(model, proxy, draws, key, subsample_size)
  return functools.partial(subsample_lib.block_poisson, subsample_size=subsample_size,
                           num_blocks=lam, lower_bound=a,
                           blocks_per_update=min(blocks_per_update, lam))


def _initial_precision(model: Model, laplace, mass_matrix):
  """``(mode, M)``: ``"laplace"`` (``laplace``, the posterior precision at ``theta*``),
  ``"adapt"`` (identity, adapted in warm-up) or ``"fixed"`` (the user's, a ``(d,)``
  diagonal or ``(d, d)``)."""
  d = model.latent_dim
  if isinstance(mass_matrix, str):
    if mass_matrix not in ("laplace", "adapt"):
      raise ValueError(f"mass_matrix must be 'laplace', 'adapt' or an array, got {mass_matrix!r}")
    return mass_matrix, (laplace if mass_matrix == "laplace"
                         else jnp.eye(d, dtype=jnp.float32))
  given = np.asarray(mass_matrix, np.float64)
  if given.shape == (d,):
    given = np.diag(given)
  if given.shape != (d, d) or not np.all(np.isfinite(given)):
    raise ValueError(f"mass_matrix must be finite with shape ({d},) or ({d}, {d}), got "
                     f"shape {given.shape}")
  return "fixed", jnp.asarray(given, jnp.float32)


class _Warmup:
  """The perturbed warm-up of :func:`sample`: dual averaging of the step size with
  ``L = ceil(trajectory_length / eps)``, in windows that end at every reference update
  and every mass update; each update reads the draws since its own previous one."""

  def __init__(self, model, make_scheme, trajectory_length, max_integration_steps,
               target_accept, initial_step_size, proxy_order):
    self.model, self.proxy_order, self.initial_step_size = model, proxy_order, initial_step_size
    self.scheme, self.trajectory_length = make_scheme(model), trajectory_length
    self.max_steps = max_integration_steps

    @jax.jit
    def window(model, state, adapt, proxy, params, keys):
      kernel = build_kernel(model, make_scheme(model))

      def body(carry, k):
        state, adapt = carry
        step = jnp.exp(adapt.log_step)
        params_now = params._replace(step_size=step, num_integration_steps=integration_steps(
            step, trajectory_length, max_integration_steps))
        state, info = kernel(k, state, proxy, params_now)
        adapt = dual_averaging_update(adapt, info.acceptance_rate, target_accept)
        return (state, adapt), (state.position, info.num_evaluations)
      return jax.lax.scan(body, (state, adapt), keys)
    self.window = window

  def run(self, state, proxy, params, key, num_warmup, reference_updates_every, mass_mode,
          mass_window):
    """``(state, proxy, tuned params, data evaluations)`` after ``num_warmup`` iterations."""
    model, evaluations = self.model, 0
    adapt = dual_averaging_init(self.initial_step_size)
    periods = [p for p in (reference_updates_every, mass_window if mass_mode == "adapt" else 0)
               if p]
    window = math.gcd(*periods) if periods else num_warmup
    done, draws = 0, []
    keys = jax.random.split(key, max(num_warmup, 1))
    while done < num_warmup:
      size = min(window, num_warmup - done)
      (state, adapt), (positions, evals) = self.window(model, state, adapt, proxy, params,
                                                       keys[done:done + size])
      draws.append(positions)
      evaluations += int(np.sum(evals))
      done += size
      if done >= num_warmup:
        break
      if reference_updates_every and done % reference_updates_every == 0:
        recent = jnp.concatenate(draws)[-reference_updates_every:]
        proxy = taylor_proxy(model, jnp.mean(recent, 0), order=self.proxy_order)
        evaluations += model.num_data
        if mass_mode == "laplace":
          params = hmc_parameters(self.initial_step_size, 1, laplace_precision(model, proxy))
        state = reset(model, self.scheme, proxy, state.position, state.subsample)
      if mass_mode == "adapt" and done % mass_window == 0:
        recent = jnp.concatenate(draws)[-mass_window:]
        w = recent.shape[0]
        variance = (w / (w + 5.0)) * jnp.var(recent, 0) + 1e-3 * (5.0 / (w + 5.0))
        params = hmc_parameters(self.initial_step_size, 1, jnp.diag(1.0 / variance))
        adapt = dual_averaging_init(jnp.exp(adapt.log_step))
    step_size = float(jnp.exp(adapt.log_step_avg)) if num_warmup else self.initial_step_size
    params = params._replace(step_size=jnp.asarray(step_size, jnp.float32),
                             num_integration_steps=integration_steps(
                                 step_size, self.trajectory_length, self.max_steps))
    return state, proxy, params, evaluations
