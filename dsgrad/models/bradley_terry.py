"""The Bradley-Terry model of pairwise comparisons (e.g. tennis matches)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.models.base import Model, SparseLikelihood, model_data


def _check_players(name, values, num_players):
  v = np.asarray(values)
  if v.ndim != 1:
    raise ValueError(f"{name} must be a 1-D array of player indices, got shape {v.shape}")
  if not np.issubdtype(v.dtype, np.integer):
    raise ValueError(f"{name} must hold integer player indices, got dtype {v.dtype}")
  if v.size and (v.min() < 0 or v.max() >= num_players):
    raise ValueError(f"{name} must lie in [0, num_players={num_players}), "
                     f"got values in [{v.min()}, {v.max()}]")
  return v


@checks.arguments(num_players=checks.count(2), prior_scale=checks.positive())
def bradley_terry(player_a, player_b, num_players: int, outcomes=None,
                  prior_scale: float = 1.0, name: str = "bradley_terry") -> Model:
  """Bradley-Terry: ``theta_m ~ N(0, s^2)``, ``y_n ~ Bern(sigmoid(theta_a_n - theta_b_n))``.

  Datum ``n`` is a comparison between players ``a_n`` and ``b_n`` with outcome ``y_n = 1``
  when ``a_n`` won. With winner/loser data pass winners as ``player_a`` and leave
  ``outcomes`` at its default (all ones). Each likelihood term touches two coordinates
  of ``theta`` (declared as ``model.sparse``).

  Args:
    player_a: ``(N,)`` integer player indices.
    player_b: ``(N,)`` integer player indices, different from ``player_a``.
    num_players: ``M``, the latent dimension.
    outcomes: ``(N,)`` in ``{0, 1}``; default all ones.
    prior_scale: prior standard deviation.
    name: label.

  Returns:
    A :class:`dsgrad.models.Model` with ``latent_dim = M``.

  Raises:
    ValueError: on shapes, non-integer or out-of-range indices, self-comparisons or
      outcomes outside ``{0, 1}``.

  References:
    Wang, Geffner, Domke (2024), Sec. 7.1 (tennis, Bradley-Terry).
    Bradley, Terry (1952). Rank analysis of incomplete block designs. Biometrika.

  Example::

    >>> import numpy as np, dsgrad
    >>> winners, losers = np.array([0, 1, 2, 0]), np.array([1, 2, 0, 2])
    >>> model = dsgrad.models.bradley_terry(winners, losers, num_players=3)
    >>> model.num_data, model.latent_dim
    (4, 3)
  """
  a = _check_players("player_a", player_a, num_players)
  b = _check_players("player_b", player_b, num_players)
  if a.shape != b.shape:
    raise ValueError(f"player_a and player_b must have the same shape, got {a.shape} and {b.shape}")
  if np.any(a == b):
    raise ValueError(f"a player cannot be compared with itself (first at datum "
                     f"{int(np.argmax(a == b))})")
  y = np.ones(a.shape) if outcomes is None else np.asarray(outcomes)
  if y.shape != a.shape or not set(np.unique(y).tolist()) <= {0, 1}:
    raise ValueError(f"outcomes must be a ({a.size},) array of 0/1")
  data = model_data(a=jnp.asarray(a, jnp.int32), b=jnp.asarray(b, jnp.int32),
                    signs=jnp.asarray(2.0 * y - 1.0, jnp.float32))
  m = int(num_players)

  def log_prior(z):
    return (-0.5 * jnp.sum((z / prior_scale) ** 2)
            - m * (jnp.log(prior_scale) + 0.5 * jnp.log(2 * jnp.pi)))

  def log_likelihood(z, rows):
    return jax.nn.log_sigmoid(rows["signs"] * (z[rows["a"]] - z[rows["b"]]))

  def coordinates(rows):
    return jnp.stack([rows["a"], rows["b"]], axis=1)

  def log_likelihood_local(pair, rows):
    return jax.nn.log_sigmoid(rows["signs"] * (pair[:, 0] - pair[:, 1]))

  return Model(log_prior, log_likelihood, int(a.shape[0]), m, name,
               sparse=SparseLikelihood(2, coordinates, log_likelihood_local), data=data,
               log_evidence_bound=0.0,  # outcomes are discrete: p(x) <= 1
               kinds=(("a", ("index", m)), ("b", ("index", m)), ("signs", "signs")))


@checks.arguments(key=checks.prng_key(), num_players=checks.count(2),
                  num_matches=checks.count(1))
def synthetic_bradley_terry_data(key, num_players: int, num_matches: int):
  """Seeded matches ``(winners (N,), losers (N,), true theta (M,))`` as numpy arrays.

  Pairs are drawn uniformly among distinct players and the winner from the model with
  ``theta ~ N(0, 1)``.
  """
  k1, k2, k3, k4 = jax.random.split(key, 4)
  theta = jax.random.normal(k1, (num_players,))
  a = jax.random.randint(k2, (num_matches,), 0, num_players)
  b = (a + jax.random.randint(k3, (num_matches,), 1, num_players)) % num_players
  a_wins = jax.random.bernoulli(k4, jax.nn.sigmoid(theta[a] - theta[b]))
  winners = jnp.where(a_wins, a, b)
  losers = jnp.where(a_wins, b, a)
  return np.asarray(winners), np.asarray(losers), np.asarray(theta)
