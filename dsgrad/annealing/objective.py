"""DAIS, NS-DAIS and SL-DAIS as doubly-stochastic :class:`dsgrad.Objective` s.

    vi = AnnealedVI(model, num_steps=8, surrogate=rand_surrogate(model, 256, key))
    objective, params = vi.objective(), vi.init_params()
    opt = optax.chain(dsgrad.joint_svrg(objective, every=100), optax.adam(1e-2))

One chain draw (``z_0`` and the momenta) is shared by the batch. The per-datum loss is
``f(w; n, eps) = -[N log p(x_n | z_K) + log p(z_K) - log q0(z_0) + kinetic terms]``, so
its mean over a uniform batch is minus an unbiased estimate of the DAIS log weight and
its expectation is minus the DAIS ELBO (Alg. 1's last line). With a surrogate (SL-DAIS)
the chain never touches the data and a step costs ``O(K N_surr + B)``; without one (DAIS)
the dynamics use the full log likelihood, ``O(K N)`` per step; NS-DAIS drives them with a
fresh mini-batch estimate of it, ``O(K B_dyn + B)``.

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML. Sec. 3-5, Alg. 1 (SL-DAIS), Alg. 2 (NS-DAIS), Eq. 10-13.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks, elbo_trust
from dsgrad.training import batching
from dsgrad.training import compile_cache
from dsgrad import elbo_estimates
from dsgrad.annealing import dais
from dsgrad.annealing.surrogates import Surrogate, SurrogateLikelihood, as_surrogate
from dsgrad.families import FullRankGaussian, MeanFieldGaussian
from dsgrad.models.base import Model
from dsgrad.objective import Objective, standard_normal


_FAMILIES = {"meanfield": MeanFieldGaussian, "fullrank": FullRankGaussian}


@checks.arguments(num_steps=checks.count(0), eta_max=checks.positive(),
                  dynamics_batch_size=checks.optional(checks.count(1)))
@dataclasses.dataclass(frozen=True, eq=False)
class AnnealedVI:
  """DAIS, NS-DAIS or SL-DAIS on a :class:`dsgrad.models.Model`.

  The three differ only in what drives the chain's dynamics:

  * DAIS (default): the full log likelihood, ``O(K N)`` per step;
  * NS-DAIS (``dynamics_batch_size=B_dyn``): an unbiased mini-batch estimate
    ``(N / B_dyn) sum_{i in I} log p(x_i | z)`` with one batch ``I`` per chain draw
    (uniform with replacement), drawn independently of the objective's batch (Alg. 2's
    ``I`` and ``J``), ``O(K B_dyn)``; the paper's naive baseline;
  * SL-DAIS (``surrogate=...``): a surrogate log likelihood, ``O(K N_surr)`` (Alg. 1).

  In all three the data enter the bound through the per-datum final term, so the
  objective's mean over a batch is an unbiased estimate of the log weight.

  Model learning: pass ``model`` as a function ``theta -> Model`` and the initial
  ``model_params`` ``theta`` (any pytree). ``theta`` then sits in ``params["model"]`` and is
  learned with the rest, through the prior, the dynamics and the final term (a bound on
  ``log p_theta(D)``). A surrogate keeps the likelihood of the model it was built from.

  Attributes:
    model: the model (log prior, per-datum log likelihood), or ``theta -> Model`` with
      ``model_params``.
    num_steps: ``K >= 0`` annealing steps (``K = 0``: plain BBVI with the base).
    surrogate: a :class:`~dsgrad.annealing.SurrogateLikelihood` module (or its
      :class:`Surrogate` functional view) for SL-DAIS, or ``None``.
    base: ``"meanfield"`` or ``"fullrank"`` Gaussian ``q0``
      (:class:`dsgrad.families.MeanFieldGaussian` / :class:`~dsgrad.families.FullRankGaussian`,
      whose parameter dicts ``params["base"]`` holds).
    eta_max: upper bound of the learnable leapfrog step sizes.
    dynamics_batch_size: NS-DAIS's ``B_dyn`` (``None``: not NS-DAIS).
    model_params: initial model parameters ``theta`` when ``model`` is ``theta -> Model``.
    mass: ``"unit"`` -- the learnable diagonal mass ``M = exp(log_mass)`` starts at the
      identity (the paper's App. A.6 and NumPyro's ``AutoDAIS``); ``"base"`` -- the
      learnable diagonal is relative to the base's precision,
      ``M = exp(log_mass) / diag(Cov q0)``, so a leapfrog step moves ``z`` in units of the
      base's current standard deviations. With a concentrated posterior (large ``N``) a
      unit mass lets only tiny step sizes through and the learned chain tends to switch
      itself off; ``"base"`` keeps the step size scale-free. Both give a valid bound (any
      mass does).
    momentum_scale: ``"sqrt_mass"`` -- momenta ``N(0, M)``, Hamiltonian dynamics (the
      paper's Alg. 3); ``"mass"`` -- momenta with standard deviation ``M`` and the same
      leapfrog, NumPyro ``AutoDAIS``'s convention, so that with ``mass="unit"`` the chain
      is NumPyro's step for step. Both give a valid bound.

  Example: SL-DAIS with 16 surrogate points, trained with joint SVRG; ``vi.elbo`` is the
  annealed bound on ``log p(D)``::

    >>> import jax, optax, dsgrad
    >>> from dsgrad.annealing import AnnealedVI, rand_surrogate
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> vi = AnnealedVI(model, 4, surrogate=rand_surrogate(model, 16, jax.random.key(1)))
    >>> params = vi.init_params(step_size=0.1)
    >>> optimizer = optax.chain(dsgrad.joint_svrg(vi.objective(), every=20), optax.adam(1e-2))
    >>> result = dsgrad.fit(vi.objective(), optimizer, params, jax.random.key(2),
    ...                     num_steps=400, batch_size=10, elbo_samples=32, progress=False)
    >>> (before, _), (after, se) = (vi.elbo(p, jax.random.key(3), num_samples=256)
    ...                             for p in (params, result.params))
    >>> bool(after > before + 3 * se)
    True
  """

  model: Model | Callable[..., Model]
  num_steps: int
  surrogate: SurrogateLikelihood | Surrogate | None = None
  base: str = "meanfield"
  eta_max: float = 0.25
  dynamics_batch_size: int | None = None
  model_params: Any = None
  mass: str = "unit"
  momentum_scale: str = "sqrt_mass"

  def __post_init__(self):
    if self.model_params is not None:
      if isinstance(self.model, Model) or not callable(self.model):
        raise ValueError("with model_params, model must be a function theta -> Model")
      template = self.model(self.model_params)
    else:
      template = self.model
    if not isinstance(template, Model):
      raise TypeError(f"model must be a dsgrad.models.Model (or, with model_params, a "
                      f"function returning one), got {type(template).__name__}")
    object.__setattr__(self, "_template", template)
    if self.base not in ("meanfield", "fullrank"):
      raise ValueError(f"base must be 'meanfield' or 'fullrank', got {self.base!r}")
    if self.mass not in ("unit", "base"):
      raise ValueError(f"mass must be 'unit' or 'base', got {self.mass!r}")
    if self.momentum_scale not in ("sqrt_mass", "mass"):
      raise ValueError(f"momentum_scale must be 'sqrt_mass' or 'mass', got "
                       f"{self.momentum_scale!r}")
    object.__setattr__(self, "_surrogate", as_surrogate(self.surrogate))
    if self._surrogate is not None and self._surrogate.latent_dim != template.latent_dim:
      raise ValueError(f"the surrogate {self._surrogate.name} reads a latent of dimension "
                       f"{self._surrogate.latent_dim} but the model's is "
                       f"{template.latent_dim}")
    if self.dynamics_batch_size is not None:
      if self._surrogate is not None:
        raise ValueError("choose a surrogate (SL-DAIS) or dynamics_batch_size (NS-DAIS), "
                         "not both")
      if not 1 <= self.dynamics_batch_size <= template.num_data:
        raise ValueError(f"dynamics_batch_size must lie in [1, N={template.num_data}], "
                         f"got {self.dynamics_batch_size}")

  @property
  def method(self) -> str:
    """``"dais"``, ``"ns_dais"`` or ``"sl_dais"``."""
    if self._surrogate is not None:
      return "sl_dais"
    return "ns_dais" if self.dynamics_batch_size is not None else "dais"

  @property
  def name(self) -> str:
    """``dais(K=...)``, ``ns_dais(K=...)`` or ``sl_dais(K=...)``, for tables and messages."""
    return f"{self.method}(K={self.num_steps})"

  @checks.arguments(loc=checks.finite_values(), log_scale=checks.finite_values(),
                    step_size=checks.positive(), refresh=checks.probability(low_open=True, high_open=True))
  def init_params(self, *, loc=0.0, log_scale: float = -1.0, step_size: float = 0.01,
                  refresh: float = 0.9) -> dict:
    """``{"base": ..., "chain": ..., "surrogate": ..., "model": ...}`` (surrogate and model
    empty when not used).

    Raises:
      ValueError: ``step_size`` outside ``(0, eta_max)`` or ``refresh`` outside ``(0, 1)``.
    """
    d = self._template.latent_dim
    base = _FAMILIES[self.base](d, loc=loc, log_scale=log_scale).params()
    chain = dais.init_chain_params(self.num_steps, d, step_size=step_size,
                                   eta_max=self.eta_max, refresh=refresh)
    surrogate = self._surrogate.init_params() if self._surrogate is not None else {}
    theta = {} if self.model_params is None else jax.tree.map(jnp.asarray, self.model_params)
    return {"base": base, "chain": chain, "surrogate": surrogate, "model": theta}

  def model_at(self, params) -> Model:
    """The model at ``params["model"]`` (the fixed model without model learning)."""
    return self._template if self.model_params is None else self.model(params["model"])

  @checks.arguments(key=checks.prng_key(), batch_size=checks.count(1))
  def noise_fn(self, key, batch_size: int) -> dict:
    """One shared chain draw: ``eps0 (d,)``, ``momentum (K, d)`` and, for NS-DAIS, the
    dynamics' mini-batch ``dynamics_indices (B_dyn,)`` (uniform, with replacement)."""
    del batch_size
    k0, k1, k2 = jax.random.split(key, 3)
    d = self._template.latent_dim
    noise = {"eps0": standard_normal(k0, (d,)),
             "momentum": standard_normal(k1, (self.num_steps, d))}
    if self.dynamics_batch_size is not None:
      # With replacement: O(B_dyn) per draw (without replacement costs a sort of all N).
      noise["dynamics_indices"] = batching.uniform_indices(
          k2, self._template.num_data, (self.dynamics_batch_size,))
    return noise

  def guide(self, params, noise=None) -> Callable:
    """``z -> log guide(z)``: the prior times the full likelihood (DAIS), its mini-batch
    estimate on ``noise["dynamics_indices"]`` (NS-DAIS) or the surrogate (SL-DAIS)."""
    model = self.model_at(params)
    if self._surrogate is not None:
      return lambda z: model.log_prior(z) + self._surrogate.log_likelihood(params["surrogate"], z)
    if self.dynamics_batch_size is not None:
      idx = noise["dynamics_indices"]
      scale = model.num_data / self.dynamics_batch_size
      return lambda z: model.log_prior(z) + scale * jnp.sum(model.log_likelihood_at(z, idx))
    everything = jnp.arange(model.num_data, dtype=jnp.int32)
    return lambda z: model.log_prior(z) + jnp.sum(model.log_likelihood_at(z, everything))

  def chain(self, params, noise, return_path: bool = False):
    """Runs the chain: ``(z_K, shared terms)`` -- ``shared = log w`` without the log
    likelihood at ``z_K`` -- and optionally the :class:`dsgrad.annealing.DaisPath`."""
    family = _FAMILIES[self.base]
    z0 = family.transform(params["base"], noise["eps0"])
    base_log_prob = lambda z: family.log_prob_at(params["base"], z)  # noqa: E731
    settings = dais.chain_settings(params["chain"], self.eta_max)
    if self.mass == "base":
      settings = settings._replace(mass=settings.mass / family.variance_at(params["base"]))
    if self.momentum_scale == "mass":
      settings = settings._replace(momentum_sd=settings.mass)
    # The target at z_K is the prior here; the likelihood part is added per datum.
    shared, path = dais.dais_log_weight(self.guide(params, noise),
                                        self.model_at(params).log_prior, z0,
                                        base_log_prob, noise["momentum"], settings,
                                        return_path=True)
    z_k = path.z[-1]
    return (z_k, shared, path) if return_path else (z_k, shared)

  def objective(self) -> Objective:
    """The per-datum objective (shared chain noise; see the module docstring)."""
    n = self._template.num_data

    def loss_fn(params, indices, noise):
      z_k, shared = self.chain(params, noise)
      return -(n * self.model_at(params).log_likelihood_at(z_k, indices) + shared)

    # The chain's guide reads the whole data set (or its dynamics mini-batch) besides the
    # batch's rows, so the loss reads the model's data itself: constants of its programs.
    # A learned model's evidence changes with its parameters: no fixed bound.
    bound = self._template.log_evidence_bound if self.model_params is None else None
    return Objective(loss_fn, self.noise_fn, n, shared_noise=True, name=self.name,
                     log_evidence_bound=bound)

  def log_weight(self, params, noise) -> jax.Array:
    """The full-data ``log w`` of one chain draw (its mean over draws is the ELBO)."""
    z_k, shared = self.chain(params, noise)
    everything = jnp.arange(self._template.num_data, dtype=jnp.int32)
    return shared + jnp.sum(self.model_at(params).log_likelihood_at(z_k, everything))

  @checks.arguments(params=checks.parameters(), key=checks.prng_key(),
                    num_samples=checks.count(2), chunk_size=checks.count(1))
  def elbo(self, params, key, num_samples: int = 1000, chunk_size: int = 256):
    """The full-data ELBO ``E[log w]`` by Monte Carlo: ``(estimate, standard error)``.

    One chain and two full likelihoods per sample (at the chain's end, and at its start
    for the base's own ELBO on the same draw, the check below), ``chunk_size`` samples at
    a time (vectorized), so memory is ``O(chunk_size (N + K d))``.

    Raises:
      ValueError: draws that are not finite (named as the chain's where the base's are).

    Warns:
      dsgrad.elbo_trust.ELBOWarning: a bound more than 10 nats (and four paired standard
        errors) below the base's own ELBO: a chain that loses more than annealing gains,
        as leapfrog steps past their stability limit do (the bound stays valid).
    """
    # Params of another objective (a mean-field start) are named, not a KeyError.
    checks.check_objective_evaluates(self.objective(), params, "annealing.AnnealedVI.elbo")
    values, base = _elbo_runner(self, num_samples, min(chunk_size, num_samples))(params, key)
    return elbo_estimates.mean_and_standard_error(_against_base(values, base))

  @checks.arguments(params=checks.parameters(), key=checks.prng_key(), num=checks.count(1))
  def sample_posterior(self, params, key, num: int) -> jax.Array:
    """``num`` draws of ``z_K`` from the approximate posterior, ``(num, d)``.

    For SL-DAIS the chain reads only the surrogate, so sampling needs no data.
    """
    checks.check_objective_evaluates(self.objective(), params,
                                     "annealing.AnnealedVI.sample_posterior")
    keys = jax.random.split(key, num)
    return jax.vmap(lambda k: self.chain(params, self.noise_fn(k, 1))[0])(keys)


BELOW_BASE_NATS = 10.0  # a chain that costs its bound more than this is not annealing
UNSTABLE = ("leapfrog steps above their stability limit (step sizes too large for the mass "
            "on this posterior); a smaller step_size in init_params, or mass='base', keeps "
            "the steps within it")


def _against_base(values, base):
  """The annealed bound's draws ``values``, checked against the base's own log weights on
  the same draws ``base`` (equal where the chain has no steps). Not finite where the base
  is: refused, as the chain's. More than :data:`BELOW_BASE_NATS` (and four paired standard
  errors) below it: an :class:`~dsgrad.elbo_trust.ELBOWarning`. A stable chain at small
  steps moves the bound little; steps past the leapfrog's stability limit sent it to -1e11,
  a bound that is valid and useless, without a word."""
  values, base = np.asarray(values, np.float64), np.asarray(base, np.float64)
  who = "annealing.AnnealedVI.elbo"
  if not np.isfinite(values).all() and np.isfinite(base).all():
    raise elbo_estimates.NonFiniteELBO(who, (
        f"the annealed bound is not finite in {np.sum(~np.isfinite(values))} of {values.size} "
        f"draws where the base distribution's own ELBO is finite: its chain diverges, as "
        f"{UNSTABLE}."))
  values = elbo_estimates.finite_elbo_draws(values, who)
  gap, se = elbo_estimates.mean_and_standard_error(values - base)
  if gap < -max(BELOW_BASE_NATS, 4 * se):
    checks.warn_at_caller(
        f"{who}: the annealed bound is {-gap:.4g} nats (se {se:.2g}) below the base "
        f"distribution's own ELBO {base.mean():.6g} on the same draws: its chain loses more "
        f"than annealing gains, as {UNSTABLE}", elbo_trust.ELBOWarning)
  return values


@compile_cache.cached
def _elbo_runner(vi: AnnealedVI, num_samples: int, chunk_size: int):
  """``(params, key) -> (log w, the base's log weight at the chain's start)`` per draw."""
  everything = jnp.arange(vi._template.num_data, dtype=jnp.int32)

  @compile_cache.jit_by_text
  def run(params, key):
    keys = jax.random.split(key, num_samples)

    def one(k):
      noise = vi.noise_fn(k, 1)
      family, model = _FAMILIES[vi.base], vi.model_at(params)
      z0 = family.transform(params["base"], noise["eps0"])
      base = (model.log_prior(z0) + jnp.sum(model.log_likelihood_at(z0, everything))
              - family.log_prob_at(params["base"], z0))
      return vi.log_weight(params, noise), base

    return jax.lax.map(one, keys, batch_size=chunk_size)

  return run
