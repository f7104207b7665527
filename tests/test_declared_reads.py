"""``objective_from_logdensity(..., reads=...)``: a user's model declares which latent rows
each data row reads, and joint SAGA keeps a table of those coordinates only: the local
likelihood equals the user's, the updates equal the dense table's, and a declaration the
likelihood does not keep is refused."""

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.models import check_sparse_likelihood

N, GROUPS, USERS, ITEMS, D = 300, 12, 9, 7, 3


def _data(seed=0):
  rng = np.random.default_rng(seed)
  return {"x": rng.standard_normal((N, D)).astype(np.float32),
          "g": rng.integers(0, GROUPS, N).astype(np.int32),
          "u": rng.integers(0, USERS, N).astype(np.int32),
          "i": rng.integers(0, ITEMS, N).astype(np.int32),
          "v": rng.integers(1, USERS + 1, N).astype(np.int32),  # users numbered from 1
          "m": np.where(rng.random(N) < 0.2, -1, rng.integers(0, USERS, N)).astype(np.int32),
          "y": rng.poisson(1.0, N).astype(np.float32),
          # Group ids as a table with a missing value keeps them: whole-number floats.
          "f": rng.integers(0, GROUPS, N).astype(np.float32)}


def _with_pairs(data):
  """``data`` with ``u`` and ``i`` as one ``(N, 2)`` column, as a pairwise model keeps them."""
  return dict(data, pair=np.stack([data["u"], data["i"] % USERS], 1))


def _gaussian_prior(z):
  return -0.5 * sum(jnp.sum(v ** 2) for v in jax.tree.leaves(z))


def _flat_prior(z):
  return 0.0 * sum(jnp.sum(v) for v in jax.tree.leaves(z))


def _hierarchical_lik(z, rows):
  # Per-group intercept and slope around global means, plus shared fixed effects.
  ab = z["mu"] + jnp.exp(z["log_tau"]) * z["raw"][rows["g"]]
  eta = rows["x"] @ z["beta"] + ab[:, 0] + ab[:, 1] * rows["x"][:, 0]
  return rows["y"] * eta - jnp.exp(eta)


HIERARCHICAL = {"beta": jnp.zeros(D), "mu": jnp.zeros(2), "log_tau": jnp.zeros(2),
                "raw": jnp.zeros((GROUPS, 2))}


def _two_index_lik(z, rows):
  eta = z["bias"] + z["user"][rows["u"]] + z["item"][rows["i"]]
  return rows["y"] * eta - jnp.exp(eta)


TWO_INDEX = {"bias": jnp.zeros(()), "user": jnp.zeros(USERS), "item": jnp.zeros(ITEMS)}


def _pair_lik(z, rows):
  # One leaf read at two rows per datum (a pairwise-comparison model).
  diff = z["skill"][rows["u"]] - z["skill"][rows["i"]]
  return jax.nn.log_sigmoid(jnp.where(rows["y"] > 1, diff, -diff))


def _ids_from_one_lik(z, rows):
  # Ids as a table numbers them, from 1: the column less its base is the leaf's row.
  eta = z["bias"] + z["user"][rows["v"] - 1] + z["item"][rows["i"]]
  return rows["y"] * eta - jnp.exp(eta)


def _masked_lik(z, rows):
  # A fifth of the rows have no user (-1), masked: they read only the bias and the item.
  eta = (z["bias"] + jnp.where(rows["m"] >= 0, z["user"][rows["m"]], 0.0)
         + z["item"][rows["i"]])
  return rows["y"] * eta - jnp.exp(eta)


def _float_ids_lik(z, rows):
  # Float ids, cast in log_lik: found and declared as an integer column is.
  eta = rows["x"] @ z["beta"] + z["raw"][rows["f"].astype(jnp.int32), 0]
  return rows["y"] * eta - jnp.exp(eta)


CASES = {
    "hierarchical": (_hierarchical_lik, HIERARCHICAL, {"raw": "g"}, 2 + D + 2 + 2),
    "two_index": (_two_index_lik, TWO_INDEX, {"user": "u", "item": "i"}, 3),
    "pair": (_pair_lik, {"skill": jnp.zeros(USERS)}, {"skill": ("u", "i")}, 2),
    "ids_from_one": (_ids_from_one_lik, TWO_INDEX, {"user": "v", "item": "i"}, 3),
    "masked": (_masked_lik, TWO_INDEX, {"user": "m", "item": "i"}, 3),
    "float_ids": (_float_ids_lik, {"beta": jnp.zeros(D), "raw": jnp.zeros((GROUPS, 2))},
                  {"raw": "f"}, D + 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_local_likelihood_is_the_users(case):
  log_lik, latent, reads, k = CASES[case]
  model = dsgrad.model_from_logdensity(_gaussian_prior, log_lik, _data(), latent, reads=reads)
  assert model.sparse.num_coordinates == k
  indices = jnp.arange(N, dtype=jnp.int32)
  coords = np.asarray(model.sparse.coordinates(model.rows(indices)))
  assert coords.shape == (N, k) and coords.min() >= 0 and coords.max() < model.latent_dim
  z = jax.random.normal(jax.random.key(1), (model.latent_dim,))
  full, local = jax.jit(lambda z: (  # one program, not one per operation
      model.log_likelihood_at(z, indices),
      model.sparse.log_likelihood_local(z[coords], model.rows(indices))))(z)
  np.testing.assert_allclose(local, full, rtol=1e-5, atol=1e-5)
  if case != "pair":  # a pair may name one player twice, which the full check forbids
    check_sparse_likelihood(model, z, indices)


# The ids-from-one and masked cases are slow (10 s together): their local likelihoods are
# the users' in the default run, and the table's updates are checked on the other two.
@pytest.mark.parametrize("case", ["hierarchical", "two_index"] + [
    pytest.param(case, marks=pytest.mark.slow) for case in ("ids_from_one", "masked")])
def test_joint_saga_updates_equal_the_dense_tables(case):
  """With a flat prior, the declared table's joint SAGA is the dense table's estimator:
  equal updates at every step of a run with repeated indices, at ``k / d`` the memory."""
  log_lik, latent, reads, k = CASES[case]
  data = _data(1)
  declared = dsgrad.objective_from_logdensity(_flat_prior, log_lik, data, latent, reads=reads)
  plain = dsgrad.objective_from_logdensity(_flat_prior, log_lik, data, latent)
  d = jax.flatten_util.ravel_pytree(latent)[0].size
  params = {"loc": 0.2 * jax.random.normal(jax.random.key(2), (d,)),
            "log_scale": jnp.full((d,), -1.0)}
  runs = {}
  for label, objective in [("declared", declared), ("dense", plain)]:
    # The paper's weight: the adaptive one divides moments that are rounding noise where
    # the control is zero, which alone would make the runs drift apart.
    approx = (dsgrad.approx.sparse_linearize(objective) if label == "declared"
              else dsgrad.approx.linearize())
    estimator = dsgrad.joint_saga(objective, approx, control_weight=1.0)
    opt = optax.chain(estimator, optax.sgd(1e-3))
    state = opt.init(params)
    runs[label] = (jax.jit(opt.update), state, dsgrad.table_bytes(state))
  assert runs["declared"][2] * d == runs["dense"][2] * k
  p, states = params, {label: run[1] for label, run in runs.items()}
  grad = jax.jit(lambda o, *args: o.grad(*args))  # one program, where eager ran op by op
  for step in range(6):
    indices = jax.random.randint(jax.random.key(10 + step), (8,), 0, N // 10)  # repeats
    noise = declared.sample_noise(jax.random.key(20 + step), 8)
    grads = grad(declared, p, indices, noise)
    out = {}
    for label, (update, _, _) in runs.items():
      out[label], states[label] = update(grads, states[label], p, indices=indices,
                                         noise=noise)
    for a, b in zip(jax.tree.leaves(out["declared"]), jax.tree.leaves(out["dense"])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    p = optax.apply_updates(p, out["dense"])


# The pair is slow (5 s): the hierarchical case runs the same structured path.
@pytest.mark.parametrize("case", ["hierarchical", pytest.param("pair", marks=pytest.mark.slow)])
def test_params_shaped_like_the_latent_keep_the_compact_table(case):
  """``families.structured`` dropped the model's compact table: joint SAGA on params shaped
  like the latent kept every coordinate per row (an ordinal model of 200,000 rows and
  2,011 latents: 3.2 GB and 15x the compact table's step). Its default table is now the
  declared one, update for update the flat objective's, rearranged."""
  log_lik, latent, reads, k = CASES[case]
  flat = dsgrad.objective_from_logdensity(_gaussian_prior, log_lik, _data(1), latent,
                                          reads=reads)
  shaped = dsgrad.families.structured(flat, latent)
  d = jax.flatten_util.ravel_pytree(latent)[0].size
  params = {"loc": 0.2 * jax.random.normal(jax.random.key(2), (d,)),
            "log_scale": jnp.full((d,), -1.0)}
  as_latent = lambda tree: dsgrad.families.structured_params(tree, latent)  # noqa: E731
  runs = {}
  for label, objective, p in [("flat", flat, params), ("shaped", shaped, as_latent(params))]:
    opt = optax.chain(dsgrad.joint_saga(objective, control_weight=1.0), optax.sgd(1e-3))
    state = opt.init(p)
    runs[label] = [jax.jit(opt.update), state, p]
  assert dsgrad.table_bytes(runs["shaped"][1]) == dsgrad.table_bytes(runs["flat"][1]) == (
      N * 2 * k * 4)
  explicit = dsgrad.joint_saga(shaped, dsgrad.approx.sparse_linearize(shaped))
  assert dsgrad.table_bytes(explicit.init(as_latent(params))) == N * 2 * k * 4
  grad = jax.jit(lambda o, *args: o.grad(*args))  # one program, where eager ran op by op
  for step in range(4):
    indices = jax.random.randint(jax.random.key(10 + step), (8,), 0, N // 10)  # repeats
    noise = flat.sample_noise(jax.random.key(20 + step), 8)
    out = {}
    for label, objective in [("flat", flat), ("shaped", shaped)]:
      update, state, p = runs[label]
      out[label], runs[label][1] = update(grad(objective, p, indices, noise), state, p,
                                          indices=indices, noise=noise)
      runs[label][2] = optax.apply_updates(p, out[label])
    chex.assert_trees_all_close(out["shaped"], as_latent(out["flat"]), rtol=1e-5, atol=1e-6)


def test_a_column_of_several_indices_per_row_is_its_columns_side_by_side():
  """``{"skill": "pair"}`` with ``pair`` of shape ``(N, 2)`` declares what
  ``{"skill": ("u", "i")}`` does for its two columns: the same coordinates, local
  likelihood and joint SAGA updates. Before, an ``(N, 2)`` column was refused."""
  data = _with_pairs(_data(1))
  split = dict(data, i=data["pair"][:, 1])

  def pair_lik(z, rows):
    diff = z["skill"][rows["pair"][:, 0]] - z["skill"][rows["pair"][:, 1]]
    return jax.nn.log_sigmoid(jnp.where(rows["y"] > 1, diff, -diff))

  latent = {"skill": jnp.zeros(USERS)}
  together = dsgrad.objective_from_logdensity(_flat_prior, pair_lik, data, latent,
                                              reads={"skill": "pair"})
  apart = dsgrad.objective_from_logdensity(_flat_prior, _pair_lik, split, latent,
                                           reads={"skill": ("u", "i")})
  indices = jnp.arange(N, dtype=jnp.int32)
  models = [o.source[1] for o in (together, apart)]
  coords = [np.asarray(m.sparse.coordinates(m.rows(indices))) for m in models]
  np.testing.assert_array_equal(coords[0], coords[1])
  z = jax.random.normal(jax.random.key(1), (USERS,))
  local = models[0].sparse.log_likelihood_local(z[coords[0]], models[0].rows(indices))
  np.testing.assert_allclose(local, models[1].log_likelihood_at(z, indices), rtol=1e-5,
                             atol=1e-6)
  params = {"loc": 0.2 * jax.random.normal(jax.random.key(2), (USERS,)),
            "log_scale": jnp.full((USERS,), -1.0)}
  updates = []
  for objective in (together, apart):
    opt = optax.chain(dsgrad.joint_saga(objective, control_weight=1.0), optax.sgd(1e-3))
    noise = objective.sample_noise(jax.random.key(3), 8)
    state, update = opt.init(params), jax.jit(opt.update)
    for _ in range(2):  # the second step reads the table the first wrote
      out, state = update(objective.grad(params, indices[:8], noise), state, params,
                          indices=indices[:8], noise=noise)
    updates.append(out)
  chex.assert_trees_all_close(updates[0], updates[1], rtol=1e-5, atol=1e-7)
  with pytest.raises(TypeError, match=r"one index per data row.*shape \(300, 2, 1\)"):
    dsgrad.model_from_logdensity(
        _flat_prior, lambda z, rows: pair_lik(z, dict(rows, pair=rows["pair"][..., 0])),
        dict(data, pair=data["pair"][..., None]), latent, reads={"skill": "pair"})


def test_too_large_table_names_the_declaration_first():
  log_lik, latent, _, _ = CASES["hierarchical"]
  objective = dsgrad.objective_from_logdensity(_gaussian_prior, log_lik, _data(), latent,
                                               reads=None)
  d = jax.flatten_util.ravel_pytree(latent)[0].size
  params = {"loc": jnp.zeros(d), "log_scale": jnp.zeros(d)}
  with pytest.raises(MemoryError) as error:
    dsgrad.joint_saga(objective, max_table_bytes=1000).init(params)
  message = str(error.value)
  assert message.index("reads=") < message.index("joint_svrg")
  assert "declare them, dsgrad.objective_from_logdensity" in message
  # A model whose likelihood closes over its data has no column to declare: told how a
  # NumPyro model and a Model of one's own declare theirs.
  closed = dsgrad.meanfield_gaussian(dsgrad.models.Model(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, idx: -0.5 * z[idx] ** 2, 50, 50))
  with pytest.raises(MemoryError, match=r"for a model without data columns .*: a NumPyro "
                                        r"model with .*reads=.*, a Model with "
                                        r"dsgrad.models.with_coordinates"):
    dsgrad.joint_saga(closed, max_table_bytes=1000).init(dsgrad.meanfield_init(closed))


@pytest.mark.parametrize("reads, error, match", [
    ({"nope": "g"}, ValueError, "does not have"),
    ({"raw": "nope"}, ValueError, "names the data column"),
    ({"raw": "x"}, TypeError, "integer array of one index per data row"),
    ({"raw": "y"}, TypeError, "integer array of one index per data row"),
    ({"raw": "u"}, ValueError, "differs|does not declare"),  # reads raw by g, declared u
    ({"raw": ("g", 3)}, TypeError, "must name data columns"),
    ([("raw", "g")], TypeError, "non-empty dict"),
])
def test_bad_declarations_are_refused(reads, error, match):
  log_lik, latent, _, _ = CASES["hierarchical"]
  with pytest.raises(error, match=match):
    dsgrad.model_from_logdensity(_gaussian_prior, log_lik, _data(), latent, reads=reads)


def test_out_of_range_column_and_undeclared_rows_are_refused():
  data = _data()
  small = dict(HIERARCHICAL, raw=jnp.zeros((5, 2)))
  # Read out of range, the index check of every integer column refuses it, by row...
  with pytest.raises(ValueError, match=r"column 'g' at row \d+ holds \[11\], which log_lik "
                                       r"uses as an index out of range"):
    dsgrad.model_from_logdensity(_gaussian_prior, _hierarchical_lik, data, small,
                                 reads={"raw": "g"})
  # ... and declared for a leaf it cannot index, the declaration is.
  wrapped = lambda z, rows: _hierarchical_lik(z, dict(rows, g=rows["g"] % 5))  # noqa: E731
  with pytest.raises(ValueError, match="indexes latent 'raw' with 5 rows"):
    dsgrad.model_from_logdensity(_gaussian_prior, wrapped, data, small, reads={"raw": "g"})

  def neighbour_lik(z, rows):  # reads the next group's row too
    return _hierarchical_lik(z, rows) + z["raw"][(rows["g"] + 1) % GROUPS, 0]

  with pytest.raises(ValueError, match="does not declare"):
    dsgrad.model_from_logdensity(_gaussian_prior, neighbour_lik, data, HIERARCHICAL,
                                 reads={"raw": "g"})
  with pytest.raises(ValueError, match="pytree latent"):
    dsgrad.model_from_logdensity(_gaussian_prior, lambda z, rows: rows["y"] * z[0], data,
                                 4, reads={"raw": "g"})


def test_a_leaf_read_whole_but_indexed_by_a_declared_column_is_named_with_the_fix():
  """Two user leaves indexed by one column, one of them declared: the local likelihood
  replaces the column by a position, so the other leaf's read goes wrong and the
  declaration is refused. The message names that leaf and the reads that work."""
  latent = dict(TWO_INDEX, slope=jnp.zeros((USERS, 2)))

  def lik(z, rows):
    return _two_index_lik(z, rows) + 0.1 * z["slope"][rows["u"], 0]

  with pytest.raises(ValueError, match=r"if log_lik indexes \['slope'\] with it, declare "
                                       r"them too: reads=\{'user': 'u', 'item': 'i', "
                                       r"'slope': 'u'\}"):
    dsgrad.model_from_logdensity(_gaussian_prior, lik, _data(), latent,
                                 reads={"user": "u", "item": "i"})
  model = dsgrad.model_from_logdensity(_gaussian_prior, lik, _data(), latent,
                                       reads={"user": "u", "item": "i", "slope": "u"})
  assert model.sparse.num_coordinates == 1 + 1 + 1 + 2


def test_a_column_that_looks_up_another_array_is_refused_with_the_fix():
  """Users within groups, the group looked up from the user through an array of the
  closure: the local likelihood gives ``u`` as a position among a few rows, so the
  lookup reads another user's group. Declared, it is refused with the fix (the looked-up
  groups as a column of their own); found automatically, nothing is kept (the dense
  table, right if large); with that column, both reads are found."""
  group_of_user = jnp.arange(USERS) % GROUPS
  latent = {"user": jnp.zeros(USERS), "group": jnp.zeros(GROUPS)}

  def lik(z, rows):
    eta = z["user"][rows["u"]] + z["group"][group_of_user[rows["u"]]]
    return rows["y"] * eta - jnp.exp(eta)

  data = _data()
  with pytest.raises(ValueError, match="look up another array .* as a data column"):
    dsgrad.model_from_logdensity(_gaussian_prior, lik, data, latent, reads={"user": "u"})
  assert dsgrad.model_from_logdensity(_gaussian_prior, lik, data, latent).sparse is None
  data["g"] = np.asarray(group_of_user)[data["u"]]

  def with_column(z, rows):
    eta = z["user"][rows["u"]] + z["group"][rows["g"]]
    return rows["y"] * eta - jnp.exp(eta)

  found = dsgrad.model_from_logdensity(_gaussian_prior, with_column, data, latent)
  assert found.sparse.num_coordinates == 2


@pytest.mark.parametrize("case", sorted(CASES))
def test_reads_are_found_where_not_declared(case):
  """``reads="auto"`` (the default) finds the declaration a user would write: the same
  coordinates per row (the pair's two columns in the order its kinds list them), so
  joint SAGA's default table is the declared one's. ``reads=None`` finds none."""
  log_lik, latent, reads, k = CASES[case]
  data = _data()
  found = dsgrad.model_from_logdensity(_gaussian_prior, log_lik, data, latent)
  declared = dsgrad.model_from_logdensity(_gaussian_prior, log_lik, data, latent, reads=reads)
  assert found.sparse.num_coordinates == k
  rows = found.rows(jnp.arange(N, dtype=jnp.int32))
  np.testing.assert_array_equal(np.sort(found.sparse.coordinates(rows), axis=1),
                                np.sort(declared.sparse.coordinates(rows), axis=1))
  assert dsgrad.model_from_logdensity(_gaussian_prior, log_lik, data, latent,
                                      reads=None).sparse is None
  with pytest.raises(TypeError, match="reads must be a non-empty dict .*'auto' or None"):
    dsgrad.model_from_logdensity(_gaussian_prior, log_lik, data, latent, reads="yes")


def test_rows_whose_terms_are_not_finite_keep_the_reads_of_the_others():
  """A datum the model deems impossible (a negative count: its term is NaN) is fit's to
  refuse, with its row, at the first evaluation; the reads are found and a declaration is
  kept, where comparing the NaN terms would have found none and refused the declaration as
  reading more than it declares."""
  data = _data()
  data["y"][[5, 140]] = -1.0

  def lik(z, rows):
    return _two_index_lik(z, rows) + jnp.log(rows["y"] + 0.5) - jnp.log(rows["y"] + 0.5)

  with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    found = dsgrad.model_from_logdensity(_gaussian_prior, lik, data, TWO_INDEX)
    declared = dsgrad.model_from_logdensity(_gaussian_prior, lik, data, TWO_INDEX,
                                            reads={"user": "u", "item": "i"})
  assert found.sparse.num_coordinates == declared.sparse.num_coordinates == 3
  assert np.isnan(found.log_likelihood_at(jnp.zeros(1 + USERS + ITEMS), jnp.array([5]))).all()


def test_reads_are_searched_only_for_the_family_they_serve(monkeypatch):
  # The compact table is the mean-field gradient's: a full-rank or path-derivative
  # objective would pay the search (a compile, 0.3-0.6 s at 200,000 rows) for nothing.
  searched = []
  real = dsgrad.latent_reads.found
  monkeypatch.setattr(dsgrad.latent_reads, "found",
                      lambda *args: searched.append(1) or real(*args))
  log_lik, latent, _, _ = CASES["two_index"]
  for options in ({"family": "fullrank"}, {"path_derivative": True}, {}):
    dsgrad.objective_from_logdensity(_gaussian_prior, log_lik, _data(), latent, **options)
  assert len(searched) == 1


def test_found_reads_leave_out_a_leaf_read_otherwise_and_keep_leaves_sharing_a_column():
  data = _data()
  # user is indexed by u and also summed whole: only item's reads are found.
  def summed_lik(z, rows):
    return _two_index_lik(z, rows) + 0.01 * jnp.sum(z["user"])

  model = dsgrad.model_from_logdensity(_gaussian_prior, summed_lik, data, TWO_INDEX)
  assert model.sparse.num_coordinates == 1 + USERS + 1  # bias, user whole, item[i]
  # slope and user indexed by one column: found together (alone, each would fail).
  latent = dict(TWO_INDEX, slope=jnp.zeros((USERS, 2)))

  def slope_lik(z, rows):
    return _two_index_lik(z, rows) + 0.1 * z["slope"][rows["u"], 0]

  model = dsgrad.model_from_logdensity(_gaussian_prior, slope_lik, data, latent)
  assert model.sparse.num_coordinates == 1 + 1 + 1 + 2
  # A row that reads its group's neighbour too has no reads to find.
  def neighbour_lik(z, rows):
    return _hierarchical_lik(z, rows) + z["raw"][(rows["g"] + 1) % GROUPS, 0]

  assert dsgrad.model_from_logdensity(_gaussian_prior, neighbour_lik, data,
                                      HIERARCHICAL).sparse is None


def test_a_model_that_declares_its_reads_keeps_the_compact_table_by_default():
  """joint_saga's default table kept every parameter, also for a declared model: the same
  updates at N x 2d numbers where N x 2k do (on 200,000 rows and 5,806 latents: 8.65 GiB,
  18 s to allocate and 12x naive's step, where the compact table takes 12 MiB). The
  default is now the compact table, step for step the explicit one; a dense table asked
  for where it is large (here 3,000 x 2 x 3,001 floats, 69 MiB) is warned of; an
  undeclared model and a wrapped objective keep the dense default."""
  users = 3000
  rng = np.random.default_rng(0)
  data = {"u": rng.integers(0, users, users).astype(np.int32),
          "y": rng.poisson(1.0, users).astype(np.float32)}
  latent = {"bias": jnp.zeros(()), "user": jnp.zeros(users)}

  def lik(z, rows):
    eta = z["bias"] + z["user"][rows["u"]]
    return rows["y"] * eta - jnp.exp(eta)

  declared = dsgrad.objective_from_logdensity(_gaussian_prior, lik, data, latent,
                                              reads={"user": "u"})
  params = dsgrad.meanfield_init(declared)
  explicit = dsgrad.joint_saga(declared, dsgrad.approx.sparse_linearize(declared))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    default = dsgrad.joint_saga(declared)
    assert dsgrad.table_bytes(default.init(params)) == dsgrad.table_bytes(explicit.init(params))
    plain = dsgrad.objective_from_logdensity(_gaussian_prior, lik, data, latent, reads=None)
    assert dsgrad.table_bytes(dsgrad.joint_saga(plain).init(params)) > 60 * 2**20
  runs = [dsgrad.fit(declared, optax.chain(estimator, optax.adam(1e-2)), params,
                     jax.random.key(1), num_steps=30, batch_size=50, elbo_samples=0,
                     progress=False).params for estimator in (default, explicit)]
  chex.assert_trees_all_close(*runs, rtol=1e-6, atol=1e-6)
  with pytest.warns(UserWarning, match=r"0.07 GiB.*2 of 3001 coordinates each datum reads.*"
                                       r"sparse_linearize\(objective\)"):
    dsgrad.joint_saga(declared, dsgrad.approx.linearize()).init(params)
  wrapped = dsgrad.noise.multi_sample(declared, 2)
  assert wrapped.table_approximation is None


def test_sparse_linearize_takes_the_objective_or_refuses_it():
  log_lik, latent, reads, _ = CASES["two_index"]
  data = _data()
  sticking = dsgrad.objective_from_logdensity(_gaussian_prior, log_lik, data, latent,
                                              reads=reads, path_derivative=True)
  with pytest.raises(ValueError, match="mean-field Gaussian objective"):
    dsgrad.approx.sparse_linearize(sticking)
  with pytest.raises(TypeError, match="takes a dsgrad.models.Model"):
    dsgrad.approx.sparse_linearize(data)
  undeclared = dsgrad.objective_from_logdensity(_gaussian_prior, log_lik, data, latent,
                                                reads=None)
  with pytest.raises(ValueError, match="declares which coordinates"):
    dsgrad.approx.sparse_linearize(undeclared)


def test_the_advice_races_joint_saga_with_the_declared_table():
  from dsgrad.advice import candidates
  log_lik, latent, reads, k = CASES["two_index"]
  objective = dsgrad.objective_from_logdensity(_gaussian_prior, log_lik, _data(), latent,
                                               reads=reads)
  d = jax.flatten_util.ravel_pytree(latent)[0].size
  params = {"loc": jnp.zeros(d), "log_scale": jnp.zeros(d)}
  [contender] = candidates.build(("joint_saga",), objective, params, 10)
  assert dsgrad.table_bytes(contender.estimator.init(params)) == N * 2 * k * 4
  assert contender.candidate.approximation == "sparse_linearize"
  assert not contender.candidate.why_not

