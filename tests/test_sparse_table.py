"""joint_saga with sparse-dependence tables (``sparse_linearize``): the same approximation
as ``linearize()``, the dense estimator update for update, unbiased with a stale table,
the exact running-mean invariant, and MovieLens's table at 1/945 of the dense one."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.training.batching import sample_batch
from dsgrad.diagnostics import estimator_samples
from dsgrad.models import (bradley_terry, check_sparse_likelihood, movielens,
                           synthetic_bradley_terry_data, synthetic_movielens_data,
                           with_coordinates)
from test_unbiased import NUM_DRAWS, _assert_unbiased

PLAYERS, MATCHES, BATCH = 6, 60, 6


def _movielens(num_users=5, num_ratings=48):
  users, genres, ratings = synthetic_movielens_data(jax.random.key(0), num_users, 12,
                                                    num_ratings, num_genres=4, num_classes=3)
  return movielens(users, genres, ratings, num_users, num_classes=3)


def _bradley_terry():
  winners, losers, _ = synthetic_bradley_terry_data(jax.random.key(1), PLAYERS, MATCHES)
  return bradley_terry(winners, losers, PLAYERS), (winners, losers)


def _params(model, seed=2):
  return {"loc": 0.3 * jax.random.normal(jax.random.key(seed), (model.latent_dim,)),
          "log_scale": jnp.full((model.latent_dim,), -0.8)}


def _models():
  bt, _ = _bradley_terry()
  generic = with_coordinates(bt._replace(sparse=None), 2, bt.sparse.coordinates)
  return {"movielens": _movielens(), "bradley_terry": bt, "with_coordinates": generic}


@pytest.mark.parametrize("name", ["movielens", "bradley_terry", "with_coordinates"])
def test_declared_coordinates_match_the_full_likelihood(name):
  model = _models()[name]
  z = jax.random.normal(jax.random.key(3), (model.latent_dim,))
  check_sparse_likelihood(model, z, jnp.arange(model.num_data, dtype=jnp.int32))


def test_wrong_declaration_is_caught():
  model = _movielens()
  z = jax.random.normal(jax.random.key(3), (model.latent_dim,))
  idx = jnp.arange(model.num_data, dtype=jnp.int32)
  # The user's weights shifted by one coordinate: the full likelihood reads one
  # coordinate the declaration misses.
  shifted = model._replace(sparse=model.sparse._replace(
      coordinates=lambda i: model.sparse.coordinates(i) - 1))
  with pytest.raises(ValueError, match="differs|does not list"):
    check_sparse_likelihood(shifted, z, idx)
  repeated = model._replace(sparse=model.sparse._replace(
      coordinates=lambda i: jnp.zeros_like(model.sparse.coordinates(i))))
  with pytest.raises(ValueError, match="repeat"):
    check_sparse_likelihood(repeated, z, idx)


@pytest.mark.parametrize("shared_noise", [True, False])
@pytest.mark.parametrize("name", ["movielens", "bradley_terry", "with_coordinates"])
def test_equals_linearize_at_current_params(name, shared_noise):
  model = _models()[name]
  objective = dsgrad.meanfield_gaussian(model, shared_noise=shared_noise)
  params = _params(model)
  indices, noise = sample_batch(jax.random.key(4), objective, BATCH)
  dense, sparse = dsgrad.approx.linearize(), dsgrad.approx.sparse_linearize(model)

  @jax.jit
  def both(params, indices, noise):
    return [(a.grad_and_expected(objective, params, indices, noise),
             a.expected_grad(objective, params, indices)) for a in (dense, sparse)]

  want, got = both(params, indices, noise)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shared_noise", [False])  # per-datum: the harder gather of noise
def test_dense_and_sparse_tables_give_identical_updates(shared_noise):
  """With a flat prior the prior/entropy part has no noise to correct, so the sparse
  table's estimator and the dense table's ``joint_saga(objective, linearize())`` are the
  same estimator: equal outputs at every step of a run with repeated indices."""
  model = _movielens()._replace(log_prior=lambda z: jnp.zeros((), z.dtype))
  objective = dsgrad.meanfield_gaussian(model, shared_noise=shared_noise)
  runs = {}
  for label, approx in [("dense", dsgrad.approx.linearize()),
                        ("sparse", dsgrad.approx.sparse_linearize(model))]:
    # The paper's weight: the adaptive one is estimated per coordinate, and where the
    # control is zero up to rounding (exactly zero in the sparse table) its ratio of
    # moments is rounding too, so the two runs would drift apart for that reason alone.
    opt = optax.chain(dsgrad.joint_saga(objective, approx, warmup_steps=2, control_weight=1.0),
                      optax.sgd(2e-3))
    params = _params(model)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key, opt=opt):
      k1, k2 = jax.random.split(key)
      indices = jax.random.randint(k1, (BATCH,), 0, model.num_data)  # repeats happen
      noise = objective.sample_noise(k2, BATCH)
      grads = objective.grad(params, indices, noise)
      updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
      return optax.apply_updates(params, updates), state, updates

    outs = []
    for key in jax.random.split(jax.random.key(5), 30):
      params, state, updates = step(params, state, key)
      outs.append(updates)
    runs[label] = (params, outs, state[0])
  for t, (a, b) in enumerate(zip(runs["dense"][1], runs["sparse"][1])):
    chex.assert_trees_all_close(a, b, rtol=1e-4, atol=1e-5, custom_message=f"step {t}")
  chex.assert_trees_all_close(runs["dense"][0], runs["sparse"][0], rtol=1e-5, atol=1e-6)
  # The dense running mean also averages the entropy's constant gradient (-1 per
  # log_scale); the sparse one keeps the data part only.
  entropy_grad = {"loc": jnp.zeros(model.latent_dim), "log_scale": -jnp.ones(model.latent_dim)}
  chex.assert_trees_all_close(runs["dense"][2].running_mean,
                              optax.tree.add(runs["sparse"][2].running_mean, entropy_grad),
                              rtol=1e-4, atol=1e-4)
  # Row n of the sparse table is row n of the dense table restricted to n's coordinates.
  everyone = jnp.arange(model.num_data, dtype=jnp.int32)
  coords = model.sparse.coordinates(model.rows(everyone))
  for key in ("loc", "log_scale"):
    np.testing.assert_allclose(runs["sparse"][2].table[key],
                               jnp.take_along_axis(runs["dense"][2].table[key], coords, 1),
                               rtol=1e-5, atol=1e-6)


def _bradley_terry_negative_elbo(winners, losers, num_nodes=60):
  """Exact negative ELBO of mean-field Gaussian Bradley-Terry (prior N(0, 1)).

  ``theta_a - theta_b`` is Gaussian under q, so each likelihood term is a 1-D integral
  (Gauss-Hermite); prior and entropy are closed form. Independent of dsgrad.
  """
  nodes, weights = np.polynomial.hermite_e.hermegauss(num_nodes)
  nodes = jnp.asarray(nodes, jnp.float32)
  weights = jnp.asarray(weights / np.sqrt(2 * np.pi), jnp.float32)
  a, b = jnp.asarray(winners), jnp.asarray(losers)

  def f(params):
    loc, scale = params["loc"], jnp.exp(params["log_scale"])
    m = loc[a] - loc[b]
    sd = jnp.sqrt(scale[a] ** 2 + scale[b] ** 2)
    loglik = jnp.sum(weights * jax.nn.log_sigmoid(m[:, None] + sd[:, None] * nodes), 1)
    d = loc.shape[0]
    logprior = -0.5 * jnp.sum(loc ** 2 + scale ** 2) - 0.5 * d * jnp.log(2 * jnp.pi)
    entropy = jnp.sum(params["log_scale"]) + 0.5 * d * (1 + jnp.log(2 * jnp.pi))
    return -jnp.sum(loglik) - logprior - entropy

  return f


@pytest.mark.parametrize("shared_noise", [True])  # per-datum noise: identical-updates test
def test_unbiased_with_stale_table(shared_noise):
  model, data = _bradley_terry()
  objective = dsgrad.meanfield_gaussian(model, shared_noise=shared_noise)
  tx = dsgrad.joint_saga(objective, dsgrad.approx.sparse_linearize(model))
  params = _params(model)
  state = tx.init(params)

  @jax.jit
  def step(state, params, key):
    indices, noise = sample_batch(key, objective, BATCH, replace=False)
    out, state = tx.update(objective.grad(params, indices, noise), state, params,
                           indices=indices, noise=noise)
    return state, optax.apply_updates(params, optax.tree.scale(-2e-3, out))

  for key in jax.random.split(jax.random.key(6), 25):
    state, params = step(state, params, key)
  stale = state.table["loc"] != dsgrad.approx.sparse_linearize(model).statistics.statistics(
      params, model.rows(jnp.arange(MATCHES, dtype=jnp.int32)))["loc"]
  assert bool(jnp.any(stale)), "the table should hold earlier iterates"
  exact = jax.grad(_bradley_terry_negative_elbo(*data))(params)
  exact_flat = np.asarray(jax.flatten_util.ravel_pytree(exact)[0])
  samples = estimator_samples(tx, state, params, objective, jax.random.key(7), NUM_DRAWS,
                              BATCH)
  _assert_unbiased(samples, exact_flat, f"joint_saga sparse table (shared={shared_noise})")


def test_running_mean_invariant_and_untouched_rows():
  model = _movielens()
  objective = dsgrad.meanfield_gaussian(model, shared_noise=False)
  approx = dsgrad.approx.sparse_linearize(model)
  tx = dsgrad.joint_saga(objective, approx)
  params0 = _params(model)
  params, state = params0, tx.init(params0)
  update = jax.jit(lambda g, s, p, i, e: tx.update(g, s, p, indices=i, noise=e))
  for t, idx in enumerate([[3, 3, 7, 1, 3], [7, 0, 0, 40, 12], [9, 9, 9, 9, 9]]):
    idx = jnp.array(idx, jnp.int32)
    noise = objective.sample_noise(jax.random.key(t), idx.shape[0])
    out, state = update(objective.grad(params, idx, noise), state, params, idx, noise)
    params = optax.apply_updates(params, optax.tree.scale(-3e-2, out))
  everyone = jnp.arange(model.num_data, dtype=jnp.int32)
  want = jax.jit(lambda p, t: approx.statistics.datum_expected(
      objective, p, t, model.rows(everyone), jnp.full((model.num_data,), 1.0 / model.num_data)))(
          params, state.table)
  chex.assert_trees_all_close(state.running_mean, want, rtol=1e-4, atol=1e-4)
  initial = approx.statistics.statistics(params0, model.rows(everyone))
  assert not np.allclose(state.table["loc"][9], initial["loc"][9])
  np.testing.assert_array_equal(state.table["loc"][20], initial["loc"][20])


def test_movielens_table_is_below_one_hundredth_of_dense():
  """At MovieLens 100K's sizes (shapes only, no data in memory)."""
  num_users, num_ratings = 943, 100_000
  users, genres, ratings = synthetic_movielens_data(jax.random.key(0), num_users, 50,
                                                    num_ratings)
  model = movielens(users, genres, ratings, num_users)
  objective = dsgrad.meanfield_gaussian(model)
  params = jax.eval_shape(lambda: dsgrad.meanfield_init(model))
  dense = jax.eval_shape(dsgrad.joint_saga(objective, dsgrad.approx.linearize()).init, params)
  sparse = jax.eval_shape(dsgrad.joint_saga(objective,
                                            dsgrad.approx.sparse_linearize(model)).init, params)
  assert dsgrad.table_bytes(dense) == 2 * num_ratings * model.latent_dim * 4
  assert dsgrad.table_bytes(sparse) == 2 * num_ratings * 18 * 5 * 4
  assert dsgrad.table_bytes(sparse) * 100 <= dsgrad.table_bytes(dense)
  # The mean-field objective of a model that declares its reads keeps the compact table
  # by default (it kept the dense one, 68 GiB here, unless told).
  default = jax.eval_shape(dsgrad.joint_saga(objective).init, params)
  assert dsgrad.table_bytes(default) == dsgrad.table_bytes(sparse)


def test_bad_input():
  model = _movielens()
  with pytest.raises(ValueError, match="model.sparse"):
    dsgrad.approx.sparse_linearize(model._replace(sparse=None))
  objective = dsgrad.meanfield_gaussian(model)
  approx = dsgrad.approx.sparse_linearize(model)
  idx = jnp.arange(4, dtype=jnp.int32)
  with pytest.raises(ValueError, match="expected \\("):
    approx.expected_grad(objective, {"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)}, idx)
  with pytest.raises(ValueError, match="mean-field"):
    approx.expected_grad(objective, {"mean": jnp.zeros(3)}, idx)


def test_with_coordinates_refuses_a_declaration_that_misses_a_coordinate():
  rng = np.random.default_rng(0)
  g = rng.integers(0, 5, 40)
  y = rng.normal(size=40).astype(np.float32)
  model = dsgrad.model_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: -0.5 * (b["y"] - z[0] - z[1 + b["g"]]) ** 2, {"y": y, "g": g}, 6)
  # The intercept z[0] left out: joint_saga trained on the local likelihood without it,
  # without an error (its control variate then removes less variance).
  with pytest.raises(ValueError, match="with_coordinates: .*local likelihood .* differs"):
    with_coordinates(model, 1, lambda rows: (1 + rows["g"])[:, None])
  with_coordinates(model, 2, lambda rows: jnp.stack([0 * rows["g"], 1 + rows["g"]], -1))
