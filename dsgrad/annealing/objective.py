"""DAIS and SL-DAIS as doubly-stochastic :class:`dsgrad.Objective` s.

    vi = AnnealedVI(model, num_steps=8, surrogate=rand_surrogate(model, 256, key))
    objective, params = vi.objective(), vi.init_params()
    opt = optax.chain(dsgrad.joint_svrg(objective, every=100), optax.adam(1e-2))

One chain draw (``z_0`` and the momenta) is shared by the batch. The per-datum loss is
``f(w; n, eps) = -[N log p(x_n | z_K) + log p(z_K) - log q0(z_0) + kinetic terms]``, so
its mean over a uniform batch is minus an unbiased estimate of the DAIS log weight and
its expectation is minus the DAIS ELBO (Alg. 1's last line). With a surrogate (SL-DAIS)
the chain never touches the data and a step costs ``O(K N_surr + B)``; without one (DAIS)
the dynamics use the full log likelihood, ``O(K N)`` per step.

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML. Sec. 3-5, Alg. 1, Eq. 10-13 (RAND surrogate).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from dsgrad.annealing import dais
from dsgrad.families import FullRankGaussian, MeanFieldGaussian
from dsgrad.models.base import Model
from dsgrad.objective import Objective


class Surrogate(NamedTuple):
  """A surrogate log likelihood ``Psi_hat(z)`` with its own learnable parameters.

  Attributes:
    init_params: ``() -> params``.
    log_likelihood: ``(params, z) -> scalar``.
    latent_dim: ``d`` of the latent it reads.
    name: label.
  """

  init_params: Callable[[], dict]
  log_likelihood: Callable[[dict, jax.Array], jax.Array]
  latent_dim: int
  name: str = "surrogate"


def rand_surrogate(model: Model, num_points: int, key) -> Surrogate:
  """RAND: ``Psi_hat(z) = sum_j omega_j log p(x_{s_j} | z)`` over ``num_points`` data drawn
  without replacement, with learnable positive weights initialized at ``N / num_points``
  (the paper's default surrogate, Sec. 4).

  Raises:
    ValueError: ``num_points`` outside ``[1, N]``.
  """
  if not 1 <= num_points <= model.num_data:
    raise ValueError(f"num_points must lie in [1, N={model.num_data}], got {num_points}")
  points = jax.random.choice(key, model.num_data, (num_points,), replace=False).astype(jnp.int32)
  start = math.log(model.num_data / num_points)

  def init_params():
    return {"log_weights": jnp.full((num_points,), start, jnp.float32)}

  def log_likelihood(params, z):
    return jnp.sum(jnp.exp(params["log_weights"]) * model.log_likelihood(z, points))

  return Surrogate(init_params, log_likelihood, model.latent_dim, f"rand({num_points})")


_FAMILIES = {"meanfield": MeanFieldGaussian, "fullrank": FullRankGaussian}


@dataclasses.dataclass(frozen=True, eq=False)
class AnnealedVI:
  """DAIS (no surrogate) or SL-DAIS (with one) on a :class:`dsgrad.models.Model`.

  Attributes:
    model: the model (log prior, per-datum log likelihood).
    num_steps: ``K >= 0`` annealing steps (``K = 0``: plain BBVI with the base).
    surrogate: a :class:`Surrogate` (SL-DAIS), or ``None`` (DAIS, full-data dynamics).
    base: ``"meanfield"`` or ``"fullrank"`` Gaussian ``q0``
      (:class:`dsgrad.families.MeanFieldGaussian` / :class:`~dsgrad.families.FullRankGaussian`,
      whose parameter dicts ``params["base"]`` holds).
    eta_max: upper bound of the learnable leapfrog step size.
  """

  model: Model
  num_steps: int
  surrogate: Surrogate | None = None
  base: str = "meanfield"
  eta_max: float = 0.25

  def __post_init__(self):
    if self.num_steps < 0:
      raise ValueError(f"the number of annealing steps K must be >= 0, got {self.num_steps}")
    if not self.eta_max > 0:
      raise ValueError(f"eta_max must be positive, got {self.eta_max}")
    if self.base not in ("meanfield", "fullrank"):
      raise ValueError(f"base must be 'meanfield' or 'fullrank', got {self.base!r}")
    if self.surrogate is not None and self.surrogate.latent_dim != self.model.latent_dim:
      raise ValueError(f"the surrogate {self.surrogate.name} reads a latent of dimension "
                       f"{self.surrogate.latent_dim} but the model's is "
                       f"{self.model.latent_dim}")

  @property
  def name(self) -> str:
    """``dais(K=...)`` or ``sl_dais(K=...)``, for tables and messages."""
    return f"{'sl_dais' if self.surrogate is not None else 'dais'}(K={self.num_steps})"

  def init_params(self, *, loc=0.0, log_scale: float = -1.0, step_size: float = 0.01,
                  refresh: float = 0.9) -> dict:
    """``{"base": ..., "chain": ..., "surrogate": ...}`` (the last empty for DAIS)."""
    d = self.model.latent_dim
    base = _FAMILIES[self.base](d, loc=loc, log_scale=log_scale).params()
    chain = dais.init_chain_params(self.num_steps, d, step_size=min(step_size, 0.5 * self.eta_max),
                                   eta_max=self.eta_max, refresh=refresh)
    surrogate = self.surrogate.init_params() if self.surrogate is not None else {}
    return {"base": base, "chain": chain, "surrogate": surrogate}

  def noise_fn(self, key, batch_size: int) -> dict:
    """One shared chain draw: ``eps0 (d,)`` and ``momentum (K, d)``."""
    del batch_size
    k0, k1 = jax.random.split(key)
    d = self.model.latent_dim
    return {"eps0": jax.random.normal(k0, (d,)),
            "momentum": jax.random.normal(k1, (self.num_steps, d))}

  def guide(self, params) -> Callable:
    """``z -> log guide(z)``: prior times surrogate (SL-DAIS) or full likelihood (DAIS)."""
    model = self.model
    if self.surrogate is not None:
      return lambda z: model.log_prior(z) + self.surrogate.log_likelihood(params["surrogate"], z)
    everything = jnp.arange(model.num_data, dtype=jnp.int32)
    return lambda z: model.log_prior(z) + jnp.sum(model.log_likelihood(z, everything))

  def chain(self, params, noise, return_path: bool = False):
    """Runs the chain: ``(z_K, shared terms)`` -- ``shared = log w`` without the log
    likelihood at ``z_K`` -- and optionally the :class:`dsgrad.annealing.DaisPath`."""
    family = _FAMILIES[self.base]
    z0 = family.transform(params["base"], noise["eps0"])
    base_log_prob = lambda z: family.log_prob_at(params["base"], z)  # noqa: E731
    settings = dais.chain_settings(params["chain"], self.eta_max)
    # The target at z_K is the prior here; the likelihood part is added per datum.
    shared, path = dais.dais_log_weight(self.guide(params), self.model.log_prior, z0,
                                        base_log_prob, noise["momentum"], settings,
                                        return_path=True)
    z_k = path.z[-1]
    return (z_k, shared, path) if return_path else (z_k, shared)

  def objective(self) -> Objective:
    """The per-datum objective (shared chain noise; see the module docstring)."""
    n = self.model.num_data

    def loss_fn(params, indices, noise):
      z_k, shared = self.chain(params, noise)
      return -(n * self.model.log_likelihood(z_k, indices) + shared)

    return Objective(loss_fn, self.noise_fn, n, shared_noise=True, name=self.name)

  def log_weight(self, params, noise) -> jax.Array:
    """The full-data ``log w`` of one chain draw (its mean over draws is the ELBO)."""
    z_k, shared = self.chain(params, noise)
    everything = jnp.arange(self.model.num_data, dtype=jnp.int32)
    return shared + jnp.sum(self.model.log_likelihood(z_k, everything))

  def sample_posterior(self, params, key, num: int) -> jax.Array:
    """``num`` draws of ``z_K`` from the approximate posterior, ``(num, d)``.

    For SL-DAIS the chain reads only the surrogate, so sampling needs no data.
    """
    keys = jax.random.split(key, num)
    return jax.vmap(lambda k: self.chain(params, self.noise_fn(k, 1))[0])(keys)
