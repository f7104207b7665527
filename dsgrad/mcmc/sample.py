"""Running chains: the reference point (:mod:`dsgrad.mcmc.reference`), warm-up (dual
averaging, periodic ``theta*`` and mass-matrix updates) and sampling with a progress bar.

References:
  Dang et al. (2019), Sec. 6.3 (tuning: ``M`` from the Hessian at ``theta*``, updated
  every 200 burn-in iterations; dual averaging to acceptance 0.8 with a fixed
  trajectory length ``epsilon L = 1.2``).
  Hoffman, Gelman (2014). The No-U-Turn sampler. JMLR 15 (dual averaging, Alg. 5).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.mcmc import estimator_noise
from dsgrad.mcmc.chain import Diverged, key_windows, run_chain, run_chunk, split_keys
from dsgrad.mcmc.dual_averaging import (dual_averaging_init, dual_averaging_update,
                                        integration_steps)
from dsgrad.training.progress import Interrupted
from dsgrad.mcmc.diagnostics import effective_sample_size
from dsgrad.mcmc.hmcecs import HMCParameters, build_kernel, hmc_parameters, reset
from dsgrad.mcmc import subsample as subsample_lib
from dsgrad.mcmc.proxy import TaylorProxy, check_theta, taylor_proxy
from dsgrad.mcmc.reference import (REFERENCE_STEPS, check_dense_matrices_fit,
                                   default_subset_size, find_reference_point, laplace_draws,
                                   laplace_precision, refine_reference_point)
from dsgrad.models.base import Model
from dsgrad.training import batching, compile_cache, host_data

# The warning of a result whose estimator check an interrupt stopped (the draws are whole).
DIAGNOSIS_INTERRUPTED = ("the estimator variance at the draws was not checked: an interrupt "
                         "stopped the check")


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
                  subsample_size=checks.optional(checks.or_word(checks.count(1), "auto")),
                  num_warmup=checks.count(0),
                  num_blocks=checks.count(1), proxy_order=checks.count(1),
                  trajectory_length=checks.positive(),
                  target_accept=checks.probability(low_open=True, high_open=True),
                  initial_step_size=checks.positive(),
                  max_integration_steps=checks.count(1),
                  reference_updates_every=checks.count(0),
                  signed_blocks_per_update=checks.count(1), mass_window=checks.count(1))
@host_data.interruptible  # a Ctrl-C during the setup's reads from disk: KeyboardInterrupt
def sample(key, model: Model, *, num_samples: int, subsample_size: int | str | None = None,
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
      2,048 data, counted in ``setup_evaluations``). Default: ``"auto"`` for the
      subsampling estimators; unused by ``"full"``.
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
      A diagonal ``M`` (adapted, or given as its diagonal) is kept as its diagonal: a
      leapfrog step then costs ``O(d)`` in it, where a dense one costs ``O(d^2)``.
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
    dsgrad.Interrupted: on Ctrl-C while sampling (or while the draws' estimator variance
      is checked), with the draws so far as its ``result``; a plain ``KeyboardInterrupt``
      before the first draw.

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
  if subsample_size is None and estimator != "full":
    subsample_size = "auto"
  _check_scheme(model, estimator, subsample_size, num_blocks)
  check_dense_matrices_fit(model)
  start_time = time.perf_counter()
  k_ref, k_init, k_warm, k_tune, k_sample, k_signed = split_keys(key, 6)
  proxy, laplace, mode, evaluations = _setup(
      model, k_ref, reference_point, proxy_order, progress,
      subsample_size == "auto" or (isinstance(mass_matrix, str) and mass_matrix == "laplace"))
  mass_mode, precision = _initial_precision(model, laplace, mass_matrix)
  if estimator == "full":
    subsample_size, make_scheme = None, _Scheme(subsample_lib.full_data, ())
  else:
    if subsample_size == "auto":
      k_auto = batching.fold_in(key, 7)  # the other keys stay those of a given m
      draws = laplace_draws(proxy, laplace, k_auto, 50)
      subsample_size, _ = estimator_noise.choose_subsample_size(
          model, proxy, draws, k_auto, num_blocks=num_blocks)
      evaluations += 50 * min(model.num_data, 2048)
    make_scheme = _Scheme(subsample_lib.perturbed, (("subsample_size", subsample_size),
                                                    ("num_blocks", num_blocks)))
  # Compiled programs take the model as an argument (its data are their inputs) and build
  # the scheme from it; ``scheme`` serves the eager calls. The default start is theta*.
  scheme = make_scheme(model)
  position = proxy.theta_star if position is None else check_theta(model, position, "position")
  warmup = _Warmup(model, make_scheme, trajectory_length, max_integration_steps, target_accept,
                   initial_step_size, proxy_order)
  state = _first_state(model, proxy, position, k_init, make_scheme=make_scheme)
  state, adapt, proxy, params, warm_evaluations = warmup.run(
      state, proxy, hmc_parameters(initial_step_size, 1, precision), k_warm, num_warmup,
      reference_updates_every, mass_mode, mass_window)
  evaluations += warm_evaluations
  if estimator == "signed":
    make_scheme = _signed_scheme(model, proxy, k_tune, subsample_size, signed_blocks_per_update)
    scheme = make_scheme(model)
    state = _first_state(model, proxy, state.position, k_signed, make_scheme=make_scheme)
  warmup_seconds = time.perf_counter() - start_time

  def result(samples, signs, info, carry, seconds):
    state = carry[0]  # the chain's state, without the (unused) step-size adaptation
    ess, missing = _effective_sample_size(samples)
    estimator_variance, warnings = _diagnosis(model, proxy, samples, info,
                                              batching.fold_in(key, 8), subsample_size,
                                              estimator == "perturbed", mode)
    warnings = tuple(warnings) + missing
    for message in warnings if progress else ():
      print("warning: " + message, flush=True)
    return MCMCResult(samples, signs, info, state, proxy, params, scheme, warmup_seconds,
                      seconds, evaluations, subsample_size, ess, warnings, estimator_variance)

  try:
    drawn = run_chain(k_sample, warmup.transition(make_scheme), (state, adapt), num_samples,
                      progress=progress, model=(model, proxy, params, np.False_),
                      position=_chain_position, sign=_chain_sign)
  except (Interrupted, Diverged) as stop:
    # Interrupted keeps the draws as sample returns them; Diverged, run_chain's tuple.
    stop.result = (result(*stop.result) if isinstance(stop, Interrupted)
                   else stop.result[:3] + (stop.result[3][0],) + stop.result[4:])
    raise
  return _unless_interrupted(result(*drawn))


def _setup(model: Model, key, reference_point, proxy_order: int, progress: bool,
           needs_precision: bool):
  """``(proxy, Laplace precision or None, (mode, precision) or None, data evaluations)``:
  the reference point (found and refined to the full-data mode where not given), the
  control variates' sums there, and the posterior precision at it, computed once for all
  that use it (the mass matrix, the Laplace draws that choose ``m``, the drift check)."""
  started, evaluations, refine = time.perf_counter(), 0, reference_point is None
  if progress:  # minutes at many thousand latents: say what the wait is
    print(f"dsgrad.mcmc.sample: the reference point and the control variates' sums over "
          f"{model.num_data:,} data (d = {model.latent_dim:,})", flush=True)
  if refine:
    reference_point = find_reference_point(model, key)
    # Line searches not counted.
    evaluations += REFERENCE_STEPS * default_subset_size(model.num_data)
  reference_point = check_theta(model, reference_point, "reference_point")
  proxy = taylor_proxy(model, reference_point, order=proxy_order)
  evaluations += model.num_data
  if refine:
    proxy, passes = refine_reference_point(model, proxy, order=proxy_order)
    evaluations += passes * model.num_data
  laplace = laplace_precision(model, proxy) if refine or needs_precision else None
  if progress:
    print(f"dsgrad.mcmc.sample: set up in {time.perf_counter() - started:.1f} s "
          f"({evaluations:,} data evaluations); warming up", flush=True)
  return proxy, laplace, (proxy.theta_star, laplace) if refine else None, evaluations


def _diagnosis(model, proxy, samples, info, key, subsample_size, perturbed: bool, mode):
  """:func:`estimator_noise.diagnose`'s ``(variance, warnings)``; on an interrupt during
  its reads of the data (afresh, on this thread), ``(None, (DIAGNOSIS_INTERRUPTED,))``:
  the draws are kept, unchecked."""
  try:
    with host_data.reads_interruptible():
      return estimator_noise.diagnose(model, proxy, samples, info, key, subsample_size,
                                      perturbed, mode)
  except KeyboardInterrupt:
    return None, (DIAGNOSIS_INTERRUPTED,)


def _unless_interrupted(result: MCMCResult) -> MCMCResult:
  """``result``, or :class:`Interrupted` holding it where an interrupt stopped its check."""
  if DIAGNOSIS_INTERRUPTED in result.warnings:
    drawn = len(result.samples)
    raise Interrupted(f"sampling interrupted after its {drawn} draws, while their "
                      "estimator variance was checked; the draws are kept: catch "
                      "dsgrad.Interrupted and take its .result", result, drawn, drawn)
  return result


def _check_scheme(model: Model, estimator: str, subsample_size, num_blocks: int) -> None:
  """Refuses an unknown estimator and subsample settings the perturbed scheme (of the
  warm-up, and of sampling) would refuse: now, not after the seconds of finding theta*."""
  if estimator not in ("perturbed", "signed", "full"):
    raise ValueError(f"estimator must be 'perturbed', 'signed' or 'full', got {estimator!r}")
  if estimator == "full":
    return
  if subsample_size == "auto":
    estimator_noise.check_num_blocks(model.num_data, num_blocks)
  else:
    subsample_lib.perturbed(model, subsample_size, num_blocks)


def _signed_scheme(model, proxy, key, subsample_size: int, blocks_per_update: int):
  """``model -> scheme``: block-Poisson with ``(lambda, a)`` suggested at Laplace draws."""
  draws = laplace_draws(proxy, laplace_precision(model, proxy), key, 50)
  lam, a = subsample_lib.suggest_block_poisson(model, proxy, draws, key, subsample_size)
  return _Scheme(subsample_lib.block_poisson, (
      ("subsample_size", subsample_size), ("num_blocks", int(lam)), ("lower_bound", float(a)),
      ("blocks_per_update", min(blocks_per_update, int(lam)))))


@dataclasses.dataclass(frozen=True)
class _Scheme:
  """``model -> scheme``: ``factory(model, **settings)``. Equal settings make equal
  objects, so that compiled programs keyed by it (static arguments, the chain's compile
  cache) serve every run with the same settings."""

  factory: Callable
  settings: tuple

  def __call__(self, model: Model) -> subsample_lib.SubsampleScheme:
    return self.factory(model, **dict(self.settings))


@dataclasses.dataclass(frozen=True)
class _Transition:
  """One iteration of either phase, ``step((model, proxy, params, adapting), key,
  (state, adapt))``: warming up (``adapting``), the step size is dual averaging's and
  ``L = ceil(trajectory_length / eps)``, and dual averaging moves; sampling, both are
  ``params``' and it stays. One compiled chunk serves both phases (each compiled the
  kernel, a second or two on a first chain); the tuned proxy and parameters are its
  arguments, not its constants."""

  make_scheme: _Scheme
  trajectory_length: float
  max_integration_steps: int
  target_accept: float

  def __call__(self, arguments, key, carry):
    model, proxy, params, adapting = arguments
    state, adapt = carry
    step = jnp.where(adapting, jnp.exp(adapt.log_step), params.step_size)
    num_steps = jnp.where(adapting, integration_steps(
        step, self.trajectory_length, self.max_integration_steps), params.num_integration_steps)
    state, info = build_kernel(model, self.make_scheme(model))(
        key, state, proxy, params._replace(step_size=step, num_integration_steps=num_steps))
    moved = dual_averaging_update(adapt, info.acceptance_rate, self.target_accept)
    adapt = jax.tree.map(lambda new, old: jnp.where(adapting, new, old), moved, adapt)
    return (state, adapt), info


def _chain_position(carry):
  return carry[0].position


def _chain_sign(carry):
  return carry[0].sign


def _initial_precision(model: Model, laplace, mass_matrix):
  """``(mode, M)``: ``"laplace"`` (``laplace``, the posterior precision at ``theta*``),
  ``"adapt"`` (identity, adapted in warm-up) or ``"fixed"`` (the user's, a ``(d,)``
  diagonal or ``(d, d)``)."""
  d = model.latent_dim
  if isinstance(mass_matrix, str):
    if mass_matrix not in ("laplace", "adapt"):
      raise ValueError(f"mass_matrix must be 'laplace', 'adapt' or an array, got {mass_matrix!r}")
    # Adapted, M is diagonal: kept as its diagonal, O(d) a leapfrog step.
    return mass_matrix, (laplace if mass_matrix == "laplace"
                         else jnp.ones(d, dtype=jnp.float32))
  given = np.asarray(mass_matrix, np.float64)
  if given.shape not in ((d,), (d, d)) or not np.all(np.isfinite(given)):
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
    self.trajectory_length = trajectory_length
    self.max_steps, self.target_accept = max_integration_steps, target_accept
    self.make_scheme = make_scheme

  def transition(self, make_scheme) -> _Transition:
    return _Transition(make_scheme, self.trajectory_length, self.max_steps,
                       self.target_accept)

  def run(self, state, proxy, params, key, num_warmup, reference_updates_every, mass_mode,
          mass_window):
    """``(state, dual averaging, proxy, tuned params, data evaluations)`` after
    ``num_warmup`` iterations."""
    model, evaluations = self.model, 0
    transition = self.transition(self.make_scheme)
    adapt = dual_averaging_init(self.initial_step_size)
    periods = [p for p in (reference_updates_every, mass_window if mass_mode == "adapt" else 0)
               if p]
    window = min(math.gcd(*periods) if periods else num_warmup, num_warmup)
    done, draws = 0, []
    # The draws are read on the host: each eager slice, sum or concatenation of device
    # arrays was a small program compiled on a first call.
    for size, keys in key_windows(key, num_warmup, window):
      (state, adapt), (positions, _, info) = run_chunk(
          (model, proxy, params, np.True_), (state, adapt), keys, np.int32(size),
          step=transition, position=_chain_position, sign=_chain_sign)
      draws.append(np.asarray(positions)[:size])
      evaluations += int(np.sum(np.asarray(info.num_evaluations)[:size]))
      done += size
      if done >= num_warmup:
        break
      if reference_updates_every and done % reference_updates_every == 0:
        recent = np.concatenate(draws)[-reference_updates_every:]
        proxy = taylor_proxy(model, jnp.mean(recent, 0), order=self.proxy_order)
        evaluations += model.num_data
        if mass_mode == "laplace":
          params = hmc_parameters(self.initial_step_size, 1, laplace_precision(model, proxy))
        state = _state_at(model, proxy, state.position, state.subsample,
                          make_scheme=self.make_scheme)
      if mass_mode == "adapt" and done % mass_window == 0:
        recent = np.concatenate(draws)[-mass_window:]
        w = recent.shape[0]
        variance = (w / (w + 5.0)) * jnp.var(recent, 0) + 1e-3 * (5.0 / (w + 5.0))
        params = hmc_parameters(self.initial_step_size, 1, 1.0 / variance)
        adapt = dual_averaging_init(jnp.exp(adapt.log_step))
    step_size = float(jnp.exp(adapt.log_step_avg)) if num_warmup else self.initial_step_size
    # integration_steps' arithmetic on the host, as its eager call on a Python float did:
    # the quotient rounded to float32, its ceiling clipped.
    steps = np.clip(np.ceil(np.float32(self.trajectory_length / step_size)), 1, self.max_steps)
    params = params._replace(step_size=jnp.asarray(step_size, jnp.float32),
                             num_integration_steps=jnp.asarray(int(steps), jnp.int32))
    return state, adapt, proxy, params, evaluations


# The chain's state in one program each (computed eagerly, its potential and gradient
# were some fifty small programs compiled one by one on a first call).
def _first_state(model, proxy, position, key, *, make_scheme):
  """The state at ``position`` with a fresh subsample drawn with ``key`` (by
  :func:`_state_at`'s program, which the warm-up's reference updates run too)."""
  subsample = _fresh_subsample(model, key, make_scheme=make_scheme)
  return _state_at(model, proxy, position, subsample, make_scheme=make_scheme)


@compile_cache.jit_by_text(static_argnames="make_scheme")
def _fresh_subsample(model, key, *, make_scheme):
  return make_scheme(model).init(key)


@compile_cache.jit_by_text(static_argnames="make_scheme")
def _state_at(model, proxy, position, subsample, *, make_scheme):
  """The state at ``(position, subsample)`` recomputed (after the proxy moved)."""
  return reset(model, make_scheme(model), proxy, position, subsample)
