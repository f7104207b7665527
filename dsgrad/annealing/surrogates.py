"""Surrogate log likelihoods ``Psi_hat(z)`` for SL-DAIS, as Flax NNX modules.

A surrogate is a cheap stand-in for the full log likelihood ``sum_n log p(x_n | z)``
that guides SL-DAIS's HMC dynamics; the data enter only through the final mini-batch
term, so the surrogate's quality moves the bound, never its validity. The paper's
ablation (Table 1, App. A.6.1) compares:

* **RAND** (:func:`rand_surrogate`): ``N_surr`` data drawn uniformly, each with a
  learnable positive weight initialized at ``N / N_surr`` (the paper's default);
* **CS-INIT** / **CS-FIX** (:func:`coreset_surrogate`): points and weights from a coreset
  construction (sensitivity sampling); the weights are then learned (INIT) or kept (FIX);
* **NN** (:class:`NeuralSurrogate`): a small network ``z -> Psi_hat(z)`` (two hidden ELU
  layers of 100 units).

Each is an ``nnx.Module`` whose ``nnx.Param`` s are learned with the rest of the
variational parameters (:class:`dsgrad.annealing.AnnealedVI` keeps them as a plain dict
under ``params["surrogate"]``); data indices and fixed weights are ``nnx.Variable`` s
that are not ``Param`` s, so no optimizer touches them. Cost per evaluation:
``O(N_surr)`` likelihood terms (weighted-data surrogates) or one small MLP pass (NN).

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML. Sec. 4 (Eq. 13, RAND), Sec. 7.1 and App. A.6.1 (ablation).
  Huggins, Campbell, Broderick (2016). Coresets for scalable Bayesian logistic
  regression. NeurIPS. Feldman, Langberg (2011) (sensitivity sampling).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dsgrad import checks
from dsgrad.models.base import Model


class SurrogateData(nnx.Variable):
  """Fixed (not learned) arrays of a surrogate: data indices, coreset weights."""


class Surrogate(NamedTuple):
  """The functional view of a surrogate, as :class:`AnnealedVI` uses it.

  Attributes:
    init_params: ``() -> params`` (a plain nested dict).
    log_likelihood: ``(params, z) -> scalar`` ``Psi_hat(z)``.
    latent_dim: ``d`` of the latent it reads.
    name: label.
  """

  init_params: Callable[[], dict]
  log_likelihood: Callable[[dict, jax.Array], jax.Array]
  latent_dim: int
  name: str = "surrogate"


class SurrogateLikelihood(nnx.Module):
  """Base class: ``module(z) -> Psi_hat(z)`` for ``z`` of shape ``(latent_dim,)``."""

  latent_dim: int
  name: str

  def params(self) -> dict:
    """The learnable parameters as a plain nested dict."""
    return nnx.to_pure_dict(nnx.state(self, nnx.Param))

  def functional(self) -> Surrogate:
    """The pure ``(params, z) -> Psi_hat(z)`` view (safe under ``jit`` and ``grad``)."""
    graphdef, learned, fixed = nnx.split(self, nnx.Param, ...)

    def log_likelihood(values, z):
      state = jax.tree.map(lambda v: v, learned)  # a fresh State to fill
      nnx.replace_by_pure_dict(state, values)
      return nnx.merge(graphdef, state, fixed)(z)

    return Surrogate(self.params, log_likelihood, self.latent_dim, self.name)


class WeightedDataSurrogate(SurrogateLikelihood):
  """``Psi_hat(z) = sum_j omega_j log p(x_{s_j} | z)`` over fixed data ``s_j``.

  Args:
    model: the model whose per-datum log likelihood is reweighted.
    points: ``(N_surr,)`` datum indices in ``[0, N)`` (repeats allowed).
    weights: ``(N_surr,)`` positive initial weights ``omega``.
    learn_weights: learn ``log omega`` (RAND, CS-INIT) or keep ``omega`` fixed (CS-FIX).
    name: label.

  Raises:
    ValueError: indices outside ``[0, N)``, weights that are not positive and finite,
      or shapes that disagree.
  """

  def __init__(self, model: Model, points, weights, *, learn_weights: bool = True,
               name: str = "weighted_data"):
    points = jnp.asarray(points)
    weights = jnp.asarray(weights, jnp.float32)
    if points.ndim != 1 or points.shape[0] < 1 or not jnp.issubdtype(points.dtype, jnp.integer):
      raise ValueError(f"points must be a non-empty 1-D integer array, got {points.dtype} "
                       f"{points.shape}")
    if weights.shape != points.shape:
      raise ValueError(f"weights {weights.shape} must match points {points.shape}")
    if int(points.min()) < 0 or int(points.max()) >= model.num_data:
      raise ValueError(f"surrogate points must lie in [0, N={model.num_data}), got "
                       f"[{int(points.min())}, {int(points.max())}]")
    if not bool(jnp.all(jnp.isfinite(weights) & (weights > 0))):
      raise ValueError("surrogate weights must be positive and finite")
    self.latent_dim, self.name = model.latent_dim, name
    self._datum_log_likelihood = model.log_likelihood_at
    self.points = SurrogateData(points.astype(jnp.int32))
    kind = nnx.Param if learn_weights else SurrogateData
    self.log_weights = kind(jnp.log(weights))

  @property
  def num_points(self) -> int:
    """``N_surr``."""
    return int(self.points[...].shape[0])

  def __call__(self, z):
    return jnp.sum(jnp.exp(self.log_weights[...])
                   * self._datum_log_likelihood(z, self.points[...]))


@checks.arguments(num_points=checks.count(1), key=checks.prng_key())
def rand_surrogate(model: Model, num_points: int, key) -> WeightedDataSurrogate:
  """RAND: ``num_points`` data drawn uniformly without replacement, learnable weights
  initialized at ``N / num_points`` (so the initial total weight is ``N``; Sec. 4).

  Raises:
    ValueError: ``num_points`` outside ``[1, N]``.
  """
  n = model.num_data
  if not 1 <= num_points <= n:
    raise ValueError(f"num_points must lie in [1, N={n}], got {num_points}")
  points = jax.random.choice(key, n, (num_points,), replace=False)
  return WeightedDataSurrogate(model, points, jnp.full((num_points,), n / num_points),
                               name=f"rand({num_points})")


@checks.arguments(num_points=checks.count(1), key=checks.prng_key(),
                  pilot_latents=checks.optional(checks.finite_values()),
                  chunk_size=checks.count(1), uniform_mix=checks.probability())
def coreset_surrogate(model: Model, num_points: int, key, *, pilot_latents=None,
                      learn_weights: bool = True, chunk_size: int = 8192,
                      uniform_mix: float = 0.5) -> WeightedDataSurrogate:
  """CS-INIT (``learn_weights=True``) or CS-FIX: a coreset by sensitivity sampling.

  Each datum's sensitivity is bounded by ``s_n = max_z |log p(x_n | z)|`` over a few
  pilot latents (its largest share of the log likelihood there); ``num_points`` data are
  drawn with replacement with probabilities ``p_n = uniform_mix / N + (1 - uniform_mix)
  s_n / sum s``, and each draw gets weight ``1 / (num_points p_n)``, so ``Psi_hat(z)`` is
  an unbiased estimate of the full log likelihood at every ``z`` before any learning.
  Model-agnostic (only ``log_likelihood`` is read); one pass over the data per pilot
  latent, in chunks.

  Args:
    model: the model.
    num_points: ``N_surr`` draws.
    key: PRNG key (pilot latents and the draws).
    pilot_latents: ``(S, d)`` latents where sensitivities are measured, e.g. draws from a
      fitted mean-field posterior; default: 8 standard normal draws (prior-like).
    learn_weights: CS-INIT (learned weights, initialized at the coreset's) or CS-FIX.
    chunk_size: data per likelihood evaluation when scanning the data.
    uniform_mix: share of the uniform distribution in ``p_n``, in ``(0, 1]`` (keeps
      every weight bounded by ``N / (num_points uniform_mix)``).

  Raises:
    ValueError: ``num_points < 1``, ``uniform_mix`` outside ``(0, 1]``, pilot latents of
      the wrong shape or not finite, or non-finite log likelihoods at the pilot latents.

  References:
    Huggins, Campbell, Broderick (2016), Alg. 1 (importance sampling by sensitivity);
    Jankowiak, Phan (2022), App. A.6.1 (CS-INIT, CS-FIX).
  """
  n, d = model.num_data, model.latent_dim
  if num_points < 1:
    raise ValueError(f"num_points must be >= 1, got {num_points}")
  if not 0 < uniform_mix <= 1:
    raise ValueError(f"uniform_mix must lie in (0, 1], got {uniform_mix}")
  k_pilot, k_draw = jax.random.split(key)
  if pilot_latents is None:
    pilot_latents = jax.random.normal(k_pilot, (8, d))
  pilot_latents = jnp.asarray(pilot_latents, jnp.float32)
  if pilot_latents.ndim != 2 or pilot_latents.shape[1] != d:
    raise ValueError(f"pilot_latents must have shape (S, {d}): S flat latents of model "
                     f"{model.name!r}, got {pilot_latents.shape}")

  def datum_sensitivity(index):  # lax.map vmaps this over chunks of chunk_size data
    values = jax.vmap(lambda z: model.log_likelihood_at(z, index[None])[0])(pilot_latents)
    return jnp.max(jnp.abs(values))

  sensitivity = jax.lax.map(datum_sensitivity, jnp.arange(n, dtype=jnp.int32),
                            batch_size=min(chunk_size, n))
  if not bool(jnp.all(jnp.isfinite(sensitivity))):
    raise ValueError("the log likelihood is not finite at the pilot latents")
  total = jnp.sum(sensitivity)
  share = sensitivity / total if total > 0 else jnp.full((n,), 1.0 / n)
  probs = uniform_mix / n + (1 - uniform_mix) * share
  points = jax.random.choice(k_draw, n, (num_points,), replace=True, p=probs)
  weights = 1.0 / (num_points * probs[points])
  kind = "init" if learn_weights else "fix"
  return WeightedDataSurrogate(model, points, weights, learn_weights=learn_weights,
                               name=f"coreset_{kind}({num_points})")


@checks.arguments(latent_dim=checks.count(1), hidden=checks.sizes(1))
class NeuralSurrogate(SurrogateLikelihood):
  """NN: ``Psi_hat(z)`` is a small MLP of ``z`` (ELU hidden layers, scalar output).

  The output layer starts at zero, so before training the dynamics anneal towards the
  prior; the network learns a log-likelihood surface from the bound's gradient alone.

  Args:
    latent_dim: ``d``.
    rngs: ``nnx.Rngs`` for the weights.
    hidden: hidden widths (the paper: two layers of 100).
    name: label.

  References:
    Jankowiak, Phan (2022), App. A.6.1, item 8.
  """

  def __init__(self, latent_dim: int, *, rngs: nnx.Rngs, hidden: Sequence[int] = (100, 100),
               name: str = "nn"):
    if latent_dim < 1:
      raise ValueError(f"latent_dim must be >= 1, got {latent_dim}")
    widths = [latent_dim, *map(int, hidden)]
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths, widths[1:])])
    self.head = nnx.Linear(widths[-1], 1, kernel_init=nnx.initializers.zeros, rngs=rngs)
    self.latent_dim, self.name = latent_dim, name

  def __call__(self, z):
    if z.shape != (self.latent_dim,):
      raise ValueError(f"{self.name} expects a latent of shape ({self.latent_dim},), got "
                       f"{z.shape}")
    h = z
    for layer in self.layers:
      h = jax.nn.elu(layer(h))
    return self.head(h)[0]


def as_surrogate(surrogate) -> Surrogate | None:
  """A :class:`Surrogate` from a :class:`SurrogateLikelihood` module (or one as is)."""
  if surrogate is None or isinstance(surrogate, Surrogate):
    return surrogate
  if isinstance(surrogate, SurrogateLikelihood):
    return surrogate.functional()
  raise TypeError(f"surrogate must be a SurrogateLikelihood module or a Surrogate, got "
                  f"{type(surrogate).__name__}")

