"""The hierarchical MovieLens rating model of the joint control variate paper."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.models.base import Model, SparseLikelihood, model_data

_LOG_2PI = float(np.log(2 * np.pi))


class MovieLensLatent(NamedTuple):
  """The latent of :func:`movielens`, unflattened.

  Attributes:
    mu: ``(G, C)`` population mean of the user weights.
    sigma: ``(G, C)`` log standard deviation of the user weights.
    user_weights: ``(U, G, C)`` the weights ``Z_m`` of each user.
  """

  mu: jax.Array
  sigma: jax.Array
  user_weights: jax.Array


@checks.arguments(num_users=checks.count(1), num_genres=checks.count(1),
                  num_classes=checks.count(2))
def movielens_latent(z, num_users: int, num_genres: int = 18, num_classes: int = 5
                     ) -> MovieLensLatent:
  """Splits the flat latent of :func:`movielens` (layout ``[mu, sigma, Z]``, row-major)."""
  gc = num_genres * num_classes
  return MovieLensLatent(z[:gc].reshape(num_genres, num_classes),
                         z[gc:2 * gc].reshape(num_genres, num_classes),
                         z[2 * gc:].reshape(num_users, num_genres, num_classes))


@checks.arguments(num_users=checks.count(1), num_classes=checks.count(2))
def movielens(users, genres, ratings, num_users: int, num_classes: int = 5,
              name: str = "movielens") -> Model:
  """Hierarchical multinomial regression of ratings on a movie's genres, per user.

  ``mu_ij, sigma_ij ~ N(0, 1)``; ``Z_m ~ N(mu, exp(sigma)^2)`` elementwise for each user
  ``m`` (``exp(sigma)`` is a standard deviation); ``y_n ~ Categorical(softmax(x_n^T Z_m))``
  with ``x_n`` the rated movie's genre flags and ``m`` the rating's user. The flat
  latent is ``[mu, sigma, Z]`` (see :func:`movielens_latent`): ``(U + 2) G C`` numbers,
  85,050 for MovieLens 100K (``U = 943``, ``G = 18``, ``C = 5``). Each likelihood term
  touches one user's ``G C`` weights (declared as ``model.sparse``, so
  :func:`dsgrad.approx.sparse_linearize` keeps ``G C`` numbers per rating in a SAGA
  table); the prior ties users together through ``mu`` and ``sigma``.

  Args:
    users: ``(N,)`` integer user index of each rating, in ``[0, num_users)``.
    genres: ``(N, G)`` genre flags (0/1) of the rated movie.
    ratings: ``(N,)`` integer rating class in ``[0, num_classes)``.
    num_users: ``U``.
    num_classes: ``C`` (5 rating levels).
    name: label.

  Returns:
    A :class:`dsgrad.models.Model` with ``latent_dim = (U + 2) G C``.

  Raises:
    ValueError: on shape mismatches, out-of-range users or ratings, non-binary genres.

  References:
    Wang, Geffner, Domke (2024), Sec. 7.1 (MovieLens100K, D = 85,050).
  """
  u = np.asarray(users)
  x = np.asarray(genres)
  y = np.asarray(ratings)
  if u.ndim != 1 or not np.issubdtype(u.dtype, np.integer):
    raise ValueError(f"users must be a 1-D integer array, got shape {u.shape}, dtype {u.dtype}")
  if x.ndim != 2 or x.shape[0] != u.shape[0]:
    raise ValueError(f"genres must have shape ({u.shape[0]}, G), got {x.shape}")
  if y.shape != u.shape or not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"ratings must be an integer array of shape {u.shape}, got {y.shape}, {y.dtype}")
  if u.size and (u.min() < 0 or u.max() >= num_users):
    raise ValueError(f"users must lie in [0, num_users={num_users}), got [{u.min()}, {u.max()}]")
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(f"ratings must lie in [0, {num_classes}), got [{y.min()}, {y.max()}]")
  if not np.all((x == 0) | (x == 1)):
    raise ValueError("genres must be 0/1 flags")
  n, g = x.shape
  c = int(num_classes)
  gc = g * c
  data = model_data(user=jnp.asarray(u, jnp.int32), genres=jnp.asarray(x, jnp.float32),
                    rating=jnp.asarray(y, jnp.int32))

  def normal_logpdf_sum(v, mean, log_std):
    return jnp.sum(-0.5 * ((v - mean) * jnp.exp(-log_std)) ** 2 - log_std - 0.5 * _LOG_2PI)

  def log_prior(z):
    mu, sigma, weights = movielens_latent(z, num_users, g, c)
    return (normal_logpdf_sum(mu, 0.0, 0.0) + normal_logpdf_sum(sigma, 0.0, 0.0)
            + normal_logpdf_sum(weights, mu[None], sigma[None]))

  def log_likelihood_local(weights, rows):
    logits = jnp.einsum("bg,bgc->bc", rows["genres"], weights.reshape(-1, g, c))
    return jnp.take_along_axis(jax.nn.log_softmax(logits), rows["rating"][:, None],
                               axis=1)[:, 0]

  def log_likelihood(z, rows):
    weights = z[2 * gc:].reshape(num_users, g, c)[rows["user"]]  # (B, G, C)
    return log_likelihood_local(weights, rows)

  def coordinates(rows):
    return 2 * gc + rows["user"][:, None] * gc + jnp.arange(gc, dtype=jnp.int32)[None, :]

  return Model(log_prior, log_likelihood, n, (num_users + 2) * gc, name,
               sparse=SparseLikelihood(gc, coordinates, log_likelihood_local), data=data,
               log_evidence_bound=0.0,  # ratings are discrete: p(x) <= 1
               kinds=(("user", ("index", int(num_users))), ("rating", ("index", c))))


@checks.arguments(key=checks.prng_key(), num_users=checks.count(1),
                  num_movies=checks.count(1), num_ratings=checks.count(1),
                  num_genres=checks.count(1), num_classes=checks.count(2))
def synthetic_movielens_data(key, num_users: int, num_movies: int, num_ratings: int,
                             num_genres: int = 18, num_classes: int = 5):
  """Seeded ratings with MovieLens's shapes, drawn from the model itself.

  Returns:
    ``(users (N,), genres (N, G), ratings (N,))`` as numpy arrays, with every user
    present when ``num_ratings >= num_users``.
  """
  k1, k2, k3, k4, k5 = jax.random.split(key, 5)
  movie_genres = jax.random.bernoulli(k1, 0.2, (num_movies, num_genres))
  movie_genres = movie_genres.at[:, 0].set(movie_genres[:, 0] | ~movie_genres.any(1))
  mu = jax.random.normal(k2, (num_genres, num_classes))
  weights = mu + 0.5 * jax.random.normal(k3, (num_users, num_genres, num_classes))
  users = jnp.concatenate([jnp.arange(min(num_users, num_ratings)),
                           jax.random.randint(k4, (max(0, num_ratings - num_users),), 0,
                                              num_users)])
  movies = jax.random.randint(jax.random.fold_in(k4, 1), (num_ratings,), 0, num_movies)
  x = movie_genres[movies].astype(jnp.float32)
  logits = jnp.einsum("ng,ngc->nc", x, weights[users])
  ratings = jax.random.categorical(k5, logits)
  return (np.asarray(users, np.int32), np.asarray(x, np.int32), np.asarray(ratings, np.int32))
