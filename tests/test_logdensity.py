"""dsgrad.objective_from_logdensity: plain log-density functions give the same objective
as the built-in models, for flat and pytree latents, and bad functions are refused."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad import models


@pytest.fixture(scope="module")
def logreg():
  x, y, _ = models.synthetic_logistic_data(jax.random.key(0), 50, 4)
  return np.asarray(x, np.float32), np.asarray(y, np.float32)


def _log_prior(z):
  return jnp.sum(jax.scipy.stats.norm.logpdf(z))


def _log_lik(z, batch):
  logits = batch["x"] @ z
  return batch["y"] * jax.nn.log_sigmoid(logits) + (1 - batch["y"]) * jax.nn.log_sigmoid(-logits)


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
@pytest.mark.parametrize("shared_noise", [True, False])
def test_flat_latent_matches_builtin_model(logreg, family, shared_noise):
  x, y = logreg
  mine = dsgrad.objective_from_logdensity(_log_prior, _log_lik, {"x": x, "y": y}, 4,
                                          family=family, shared_noise=shared_noise)
  builtin = dsgrad.families.by_name(family, 4).objective(
      models.logistic_regression(x, y), shared_noise=shared_noise)
  params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.key(1), p.shape),
                        dsgrad.families.by_name(family, 4).params())
  idx = jnp.array([3, 0, 49, 7], jnp.int32)
  noise = mine.sample_noise(jax.random.key(2), 4)
  np.testing.assert_allclose(mine.loss(params, idx, noise), builtin.loss(params, idx, noise),
                             rtol=1e-5)
  g_mine, g_builtin = mine.grad(params, idx, noise), builtin.grad(params, idx, noise)
  for a, b in zip(jax.tree.leaves(g_mine), jax.tree.leaves(g_builtin)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_pytree_latent_is_unravelled(logreg):
  x, y = logreg
  latent = {"w": jnp.zeros(3), "b": jnp.zeros(())}

  def log_lik(z, batch):
    logits = batch["x"][:, :3] @ z["w"] + z["b"] * batch["x"][:, 3]
    return batch["y"] * jax.nn.log_sigmoid(logits) + (1 - batch["y"]) * jax.nn.log_sigmoid(-logits)

  prior = lambda z: _log_prior(z["w"]) + _log_prior(z["b"])
  model = dsgrad.model_from_logdensity(prior, log_lik, {"x": x, "y": y}, latent)
  assert model.latent_dim == 4 and model.num_data == 50
  # ravel_pytree orders dict keys: b first, then w.
  z_tree = {"w": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array(0.7)}
  z_flat = jax.flatten_util.ravel_pytree(z_tree)[0]
  np.testing.assert_allclose(z_flat, [0.7, 0.5, -1.0, 2.0])
  flat_model = models.logistic_regression(x, y)
  idx = jnp.arange(50, dtype=jnp.int32)
  np.testing.assert_allclose(model.log_likelihood_at(z_flat, idx),
                             flat_model.log_likelihood_at(jnp.array([0.5, -1.0, 2.0, 0.7]), idx),
                             rtol=1e-5)
  np.testing.assert_allclose(model.log_prior(z_flat), flat_model.log_prior(z_flat), rtol=1e-6)


def test_bad_functions_and_data_are_refused(logreg):
  x, y = logreg
  data = {"x": x, "y": y}
  with pytest.raises(ValueError, match=r"one log likelihood per datum.*not their sum"):
    dsgrad.objective_from_logdensity(_log_prior, lambda z, b: jnp.sum(_log_lik(z, b)), data, 4)
  # A label column of shape (N, 1) broadcasts the batch's terms to (B, B): named, with the
  # fix (before, "not their sum", which it was not).
  with pytest.raises(ValueError, match=r"got \(2, 2\) \(data \['y'\] of shape \(N, 1\): give "
                                       r"them as \(N,\)"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, {"x": x, "y": y[:, None]}, 4)
  with pytest.raises(ValueError, match=r"got \(2, 1\) \(one value per datum, without trailing"):
    dsgrad.objective_from_logdensity(_log_prior, lambda z, b: _log_lik(z, b)[:, None], data, 4)
  with pytest.raises(ValueError, match="log_prior must return a scalar"):
    dsgrad.objective_from_logdensity(lambda z: z, _log_lik, data, 4)
  with pytest.raises(ValueError, match="disagree on the number of data"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, {"x": x, "y": y[:-1]}, 4)
  # A constant that is not per datum belongs in the function that reads it.
  with pytest.raises(ValueError, match=r"K: 3.*close over arrays that are not per datum"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, dict(data, K=np.eye(3)), 4)
  # A Python branch on a traced value (it was JAX's bare ConcretizationTypeError).
  with pytest.raises(TypeError, match=r"log_lik\(z, batch\) cannot be traced by JAX.*"
                                      r"jnp.where"):
    dsgrad.objective_from_logdensity(
        _log_prior, lambda z, b: _log_lik(z, b) if float(b["y"][0]) > 0 else b["y"], data, 4)
  # A loop with a traced trip count has no reverse mode: it was JAX's bare error from
  # inside fit's first compiled step (and "Was it built from another model?" in joint_svrg).
  def halved(z):
    return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, 0.5 * c[1]),
                              (0, jnp.sum(z)))[1]
  with pytest.raises(ValueError, match=r"log_lik\(z, batch\) cannot be differentiated in z"):
    dsgrad.objective_from_logdensity(_log_prior, lambda z, b: _log_lik(z, b) + halved(z),
                                     data, 4)
  with pytest.raises(ValueError, match=r"log_prior\(z\) cannot be differentiated in z"):
    dsgrad.model_from_logdensity(lambda z: halved(z), _log_lik, data, 4)
  with pytest.raises(ValueError, match="unknown variational family"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, data, 4, family="flow")
  with pytest.raises(TypeError, match="floating"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, data, jnp.zeros(4, jnp.int32))
  # An integer log likelihood has no gradient in z: training would never move.
  labels = jnp.asarray(y, jnp.int32)
  with pytest.raises(TypeError, match="log_lik must return floating values"):
    dsgrad.objective_from_logdensity(_log_prior, lambda z, b: b["y"], {"x": x, "y": labels}, 4)
  # Not an array at all (it was an AttributeError: no attribute 'shape').
  with pytest.raises(TypeError, match="log_lik must return an array .* got tuple"):
    dsgrad.objective_from_logdensity(_log_prior, lambda z, b: (_log_lik(z, b),), data, 4)
  with pytest.raises(TypeError, match="log_prior must return an array .* got NoneType"):
    dsgrad.objective_from_logdensity(lambda z: None, _log_lik, data, 4)
  # A column given as a Python list is a pytree of one scalar per row to JAX.
  for column in (np.asarray(x).tolist(), list(np.asarray(y).tolist())):
    with pytest.raises(TypeError, match=r"data\['x'\] is a Python list of numbers"):
      dsgrad.objective_from_logdensity(_log_prior, _log_lik, {"x": column, "y": y}, 4)
  # with_data too (before: "expected the keys ['x', 'y'], got ['x/0/0', 'x/0/1', ...").
  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, data, 4)
  with pytest.raises(TypeError, match=r"with_data\['x'\] is a Python list of numbers"):
    objective.with_data({"x": np.asarray(x).tolist(), "y": y})


def test_half_precision_terms_are_summed_in_float32():
  """Terms a log_lik returns in bfloat16 or float16 were summed in their own dtype: over
  100,000 data the ELBO was 188 nats off in bfloat16 and -inf in float16 (past 65,504)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(100_000, 4)).astype(np.float32)
  data = {"x": x, "y": (rng.random(100_000) < 0.5).astype(np.float32)}
  params = dsgrad.families.by_name("meanfield", 4).params()
  elbos = {}
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    objective = dsgrad.objective_from_logdensity(
        lambda z: _log_prior(z).astype(dtype), lambda z, b: _log_lik(z, b).astype(dtype),
        data, 4, reads=None)
    elbos[dtype] = dsgrad.elbo(objective, params, jax.random.key(0), num_samples=4)[0]
  # Same draws: only the terms' rounding differs (0.1 nats here in bfloat16).
  assert abs(elbos[jnp.bfloat16] - elbos[jnp.float32]) < 3.0, elbos
  assert abs(elbos[jnp.float16] - elbos[jnp.float32]) < 3.0, elbos


@pytest.mark.parametrize("reads", ["batch_mean", "batch_size", "softmax", "first_row"])
def test_a_log_lik_whose_terms_read_other_rows_is_refused(logreg, reads):
  """A datum's term that depends on the batch (centred by its mean, divided by its size,
  a softmax over it, the first row's features) trained to a wrong answer without an
  error: the estimators subsample and reweight per-datum terms."""
  x, y = logreg
  per_datum = {
      "batch_mean": lambda z, b: _log_lik(z, {"x": b["x"] - jnp.mean(b["x"], 0), "y": b["y"]}),
      "batch_size": lambda z, b: _log_lik(z, b) / b["y"].shape[0],
      "softmax": lambda z, b: jax.nn.log_softmax(b["x"] @ z),
      "first_row": lambda z, b: _log_lik(z, {"x": b["x"][:1] + 0 * b["x"], "y": b["y"]}),
  }[reads]
  with pytest.raises(ValueError, match=r"log_lik\(z, batch\) changes when 5 data are given "
                                       r"one at a time.*own row of batch alone"):
    dsgrad.objective_from_logdensity(_log_prior, per_datum, {"x": x, "y": y}, 4)
  dsgrad.objective_from_logdensity(_log_prior, _log_lik, {"x": x, "y": y}, 4)  # per datum


@pytest.mark.parametrize("shift", [5, -3], ids=["past_the_end", "negative"])
@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "memmap"])
def test_an_index_column_out_of_the_range_it_indexes_is_refused(tmp_path, shift, on_disk):
  """JAX clamps a read past the end and wraps a negative index: before, such a model
  trained on other groups' values without an error (reads= checked only declared
  columns)."""
  rng = np.random.default_rng(0)
  groups, n = 20, 200
  g = rng.integers(0, groups, n).astype(np.int32)
  bad = g + shift * (g == (groups - 1 if shift > 0 else 0))  # one end moved out
  if on_disk:
    np.save(tmp_path / "g.npy", bad)
    bad = dsgrad.data.open_memmap(tmp_path / "g.npy")
  y = rng.normal(size=n).astype(np.float32)
  # y is an integer-valued column too, negative, used as a value: not an index.
  counts = rng.integers(-2, 3, n).astype(np.int32)
  log_lik = lambda z, b: -0.5 * (b["y"] - z[b["g"]] - 0.1 * b["c"]) ** 2
  with pytest.raises(ValueError, match=r"data column 'g' at row \d+ holds \[(24|-3)\], which "
                                       r"log_lik uses as an index out of range"):
    dsgrad.objective_from_logdensity(_log_prior, log_lik, {"g": bad, "y": y, "c": counts},
                                     groups)
  objective = dsgrad.objective_from_logdensity(_log_prior, log_lik,
                                               {"g": g, "y": y, "c": counts}, groups)
  # g is found to index 20 rows (c, a value, indexes nothing): data handed in later are
  # checked on every row.
  assert objective.kinds == (("g", ("index", groups)),)
  with pytest.raises(ValueError, match=r"with_data\['g'\] holds values outside the integers "
                                       r"0 \.\. 19"):
    objective.with_data({"g": g + shift, "y": y, "c": counts})


def test_a_log_lik_that_reads_out_of_bounds_whatever_the_data_does_not_blame_its_index_column():
  """NumPyro's CorrCholeskyTransform (an LKJ-style correlation, in a user's log_lik) reads
  one past an array's end and drops it. JAX's index check failed on every row, and the
  model was refused for its group column holding 0. It builds, warns that the column's
  range cannot be checked this way, and a declared read checks it against its leaf."""
  transforms = pytest.importorskip("numpyro.distributions.transforms")
  rng = np.random.default_rng(0)
  groups, n, dim = 20, 200, 3
  g = rng.integers(0, groups, n).astype(np.int32)
  y = rng.normal(size=(n, dim)).astype(np.float32)
  latent = {"raw": jnp.zeros(dim * (dim - 1) // 2), "mu": jnp.zeros((groups, dim))}

  def log_lik(z, b):
    factor = transforms.CorrCholeskyTransform()(z["raw"])
    white = jax.scipy.linalg.solve_triangular(factor, (b["y"] - z["mu"][b["g"]]).T, lower=True)
    return -0.5 * jnp.sum(white ** 2, axis=0)

  log_prior = lambda z: -0.5 * sum(jnp.sum(v ** 2) for v in jax.tree.leaves(z))
  with pytest.warns(dsgrad.data_kinds.IndexChecksBlind, match=r"column 'g'.*whatever the "
                    r"index data hold.*reads=\{leaf: 'g'\}"):
    model = dsgrad.model_from_logdensity(log_prior, log_lik, {"g": g, "y": y}, latent)
  z = jax.random.normal(jax.random.key(0), (model.latent_dim,))
  tree = model.unravel(z)
  np.testing.assert_allclose(model.log_likelihood_at(z, jnp.arange(3)),
                             log_lik(tree, {"g": g[:3], "y": y[:3]}), rtol=1e-5)
  bad = np.where(np.arange(n) == 7, groups, g).astype(np.int32)
  with pytest.raises(ValueError, match=r"column 'g' holds values in \[0, 20\], but it indexes "
                                       r"latent 'mu' with 20 rows"), pytest.warns(
                                           dsgrad.data_kinds.IndexChecksBlind):
    dsgrad.model_from_logdensity(log_prior, log_lik, {"g": bad, "y": y}, latent,
                                 reads={"mu": "g"})
  # Without such a read, a column out of range in every row, all alike, is still its own
  # fault (it fails at its typical value, not at 0).
  plain = lambda z, b: -0.5 * jnp.sum((b["y"] - z["mu"][b["g"]]) ** 2, axis=1)
  with pytest.raises(ValueError, match=r"column 'g' at row 0 holds \[20\], which log_lik "
                                       r"uses as an index out of range"):
    dsgrad.model_from_logdensity(log_prior, plain, {"g": np.full(n, groups, np.int32),
                                                    "y": y}, latent)


def test_group_ids_stored_as_floats_and_cast_in_log_lik_are_checked_as_an_index():
  """Ids read from a table where a missing value made the column float, cast in log_lik:
  only integer columns were checked, so 20.0 (one past 20 groups) read group 19's value
  and -1.0 group 19's too, without an error."""
  rng = np.random.default_rng(4)
  groups, n = 20, 200
  g = rng.integers(0, groups, n).astype(np.float32)
  y = rng.normal(size=n).astype(np.float32)
  scores = rng.integers(-3, 4, n).astype(np.float32)  # whole numbers, used as a value
  log_lik = lambda z, b: -0.5 * (b["y"] - z[b["g"].astype(jnp.int32)] - 0.1 * b["s"]) ** 2
  data = {"g": g, "y": y, "s": scores}
  objective = dsgrad.objective_from_logdensity(_log_prior, log_lik, data, groups)
  assert objective.kinds == (("g", ("index", groups)),)
  for bad, found in ((groups, r"at row 7 holds \[20.0\], which log_lik uses as an index"),
                     (-1, r"outside the integers 0 .. 19 \(found -1.0")):
    with pytest.raises(ValueError, match=found):
      dsgrad.objective_from_logdensity(_log_prior, log_lik,
                                       dict(data, g=np.where(np.arange(n) == 7, bad, g)), groups)
  with pytest.raises(ValueError, match=r"with_data\['g'\] holds values outside"):
    objective.with_data(dict(data, g=g + 1))
  # Numbered from 1 (z[g - 1]): a 0 reads z[-1], the last group, without an error; the
  # base is found from what 0 reads, so data or new data holding a 0 are refused.
  from_one = lambda z, b: -0.5 * (b["y"] - z[b["g"].astype(jnp.int32) - 1]) ** 2
  shifted = dsgrad.objective_from_logdensity(_log_prior, from_one, dict(data, g=g + 1), groups)
  assert shifted.kinds == (("g", ("index", groups + 1, 1)),)
  with pytest.raises(ValueError, match=r"outside the integers 1 .. 20 \(found 0.0"):
    dsgrad.objective_from_logdensity(_log_prior, from_one, dict(data, g=np.maximum(g, 0)),
                                     groups)
  with pytest.raises(ValueError, match=r"with_data\['g'\] holds values outside"):
    shifted.with_data(dict(data, g=g))
  # Without the cast, JAX's "Indexer must have integer or boolean type" gets a note.
  with pytest.raises(TypeError) as raised:
    dsgrad.objective_from_logdensity(_log_prior, lambda z, b: -0.5 * (b["y"] - z[b["g"]]) ** 2,
                                     data, groups)
  assert "['g', 's'] hold whole numbers as floats" in raised.value.__notes__[-1]


def test_a_column_of_pairs_is_declared_with_the_size_each_position_indexes():
  # A (N, 2) column whose positions index arrays of one size (a pair of players) gets that
  # bound for with_data; one whose positions index two sizes gets one bound per position
  # (one bound for both would refuse good data or pass bad).
  rng = np.random.default_rng(1)
  pairs = rng.integers(0, 10, (300, 2)).astype(np.int32)
  objective = dsgrad.objective_from_logdensity(
      _log_prior, lambda z, b: jax.nn.log_sigmoid(z[b["pair"][:, 0]] - z[b["pair"][:, 1]]),
      {"pair": pairs}, 10)
  assert objective.kinds == (("pair", ("index", 10)),)
  with pytest.raises(ValueError, match=r"with_data\['pair'\] holds values outside"):
    objective.with_data({"pair": pairs + np.array([0, 3], np.int32)})
  both = np.stack([rng.integers(0, 5, 300), rng.integers(0, 7, 300)], 1).astype(np.int32)
  log_lik = lambda z, b: z["u"][b["ui"][:, 0]] + z["v"][b["ui"][:, 1]]
  latent = {"u": jnp.zeros(5), "v": jnp.zeros(7)}
  prior = lambda z: -0.5 * jnp.sum(z["u"] ** 2) - 0.5 * jnp.sum(z["v"] ** 2)
  objective = dsgrad.objective_from_logdensity(prior, log_lik, {"ui": both}, latent)
  assert objective.kinds == (("ui", ("index", (5, 7))),)
  objective.with_data({"ui": both[::-1]})  # in range at each position: accepted
  with pytest.raises(ValueError, match=r"with_data\['ui'\] holds values outside the integers "
                                       r"0 \.\. 4 at position 0 of a row \(found 0 \.\. 6\)"):
    objective.with_data({"ui": both[:, ::-1]})  # the 7-sized position's values in the 5's
  with pytest.raises(ValueError, match=r"data column 'ui' at row \d+ holds \[\d, 7\]"):
    dsgrad.objective_from_logdensity(prior, log_lik, {"ui": both + np.array([0, 1])}, latent)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.int64])
def test_index_columns_of_small_integer_dtypes_are_checked(dtype):
  # The search for the size a column indexes probed 2^30, which an int16 column cannot
  # hold: building the model raised OverflowError.
  rng = np.random.default_rng(3)
  g = rng.integers(0, 12, 100).astype(dtype)
  y = rng.normal(size=100).astype(np.float32)
  log_lik = lambda z, b: -0.5 * (b["y"] - z[b["g"]]) ** 2
  objective = dsgrad.objective_from_logdensity(_log_prior, log_lik, {"g": g, "y": y}, 12)
  assert objective.kinds == (("g", ("index", 12)),)
  with pytest.raises(ValueError, match=r"column 'g' at row 9 holds \[12\]"):
    dsgrad.objective_from_logdensity(_log_prior, log_lik,
                                     {"g": np.where(np.arange(100) == 9, 12, g).astype(dtype),
                                      "y": y}, 12)


def test_a_column_that_log_lik_shifts_below_zero_is_refused():
  """Groups numbered from 1 and read as ``z[g - 1]``: a 0 among them read ``z[-1]``, the
  last group's value, without an error (JAX wraps the index; ``checkify`` does not see a
  wrap), and ``with_data`` allowed 0 as in range."""
  rng = np.random.default_rng(2)
  groups, n = 10, 200
  g = rng.integers(1, groups + 1, n).astype(np.int32)
  g[:2] = 1, groups
  y = rng.normal(size=n).astype(np.float32)
  log_lik = lambda z, b: -0.5 * (b["y"] - z[b["g"] - 1]) ** 2
  objective = dsgrad.objective_from_logdensity(_log_prior, log_lik, {"g": g, "y": y}, groups)
  assert objective.kinds == (("g", ("index", groups + 1, 1)),)
  zero = np.where(np.arange(n) == 7, 0, g).astype(np.int32)
  with pytest.raises(ValueError, match=r"column 'g' at row 7 holds \[0\], .* index -1 is out "
                                       r"of bounds .* takes it below zero"):
    dsgrad.objective_from_logdensity(_log_prior, log_lik, {"g": zero, "y": y}, groups)
  with pytest.raises(ValueError, match=r"with_data\['g'\] holds values outside the integers "
                                       r"1 \.\. 10 \(found 0 \.\. 10\)"):
    objective.with_data({"g": zero, "y": y})


def test_data_are_arguments_of_compiled_programs():
  """The data reach compiled programs as arguments: ``with_data`` moves the objective to
  other rows with no rebuild (the ELBO equals that of an objective built on those rows),
  and the ELBO's program holds no copy of the rows as a constant."""
  def make(seed):
    r = np.random.default_rng(seed)
    x = r.standard_normal((300, 3)).astype(np.float32)
    return {"x": x, "y": (x @ np.array([1.0, -1.0, 0.5]) > 0).astype(np.float32)}

  def log_lik(z, rows):
    logit = rows["x"] @ z
    return rows["y"] * logit - jax.nn.softplus(logit)

  prior = lambda z: -0.5 * jnp.sum(z ** 2)
  first = make(1)
  second = {"x": first["x"], "y": 1.0 - first["y"]}  # the opposite labels
  objective = dsgrad.objective_from_logdensity(prior, log_lik, first, 3)
  assert sorted(objective.data) == ["x", "y"]
  params = {"loc": jnp.array([0.3, -0.2, 0.1]), "log_scale": jnp.full(3, -1.0)}
  key = jax.random.key(0)
  moved = dsgrad.elbo(objective.with_data(second), params, key, 20)[0]
  fresh = dsgrad.elbo(dsgrad.objective_from_logdensity(prior, log_lik, second, 3), params,
                      key, 20)[0]
  original = dsgrad.elbo(objective, params, key, 20)[0]
  np.testing.assert_allclose(moved, fresh, rtol=1e-5)
  assert abs(moved - original) > 1.0  # other rows, another ELBO
  program = dsgrad.diagnostics.elbo_draws(objective, 4)
  text = program.func.lower(*program.args, params, key, **program.keywords).as_text()
  assert "tensor<300x3xf32>" in text  # the design is an input of the program ...
  constants = [line for line in text.splitlines() if "constant" in line and "300x3" in line]
  assert not constants  # ... and not a constant folded into it


def test_an_error_in_the_users_log_density_names_the_shapes_it_was_given():
  x, y = np.ones((10, 3), np.float32), np.ones(10, np.float32)
  # A latent of 4 for a model of 3 coefficients failed inside the user's product with
  # nothing that said which latent or rows dsgrad had handed it.
  with pytest.raises(TypeError, match="dot_general") as raised:
    dsgrad.objective_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2),
                                     lambda z, b: -0.5 * (b["y"] - b["x"] @ z) ** 2,
                                     {"x": x, "y": y}, 4)
  assert raised.value.__notes__[-1] == (
      "(raised in log_lik(z, batch), which dsgrad.model_from_logdensity evaluated with a "
      "flat z of shape (4,), and a batch of 2 rows of each data column: x (2, 3) float32, y (2,) float32)")
  with pytest.raises(TypeError) as raised:
    dsgrad.objective_from_logdensity(lambda z: z["v"] @ jnp.ones(3), lambda z, b: b["y"],
                                     {"x": x, "y": y}, {"v": jnp.zeros(4)})
  assert "raised in log_prior(z)" in raised.value.__notes__[-1]
  assert "{'v': (4,)}" in raised.value.__notes__[-1]


@pytest.mark.parametrize("masked", ["where", "maximum"])
def test_a_minus_one_that_log_lik_masks_is_the_datas_own_not_an_error(masked):
  rng = np.random.default_rng(0)
  g = rng.integers(0, 20, 200)
  g[::7] = -1  # "no group", a common marker
  y = rng.normal(size=200).astype(np.float32)

  def log_lik(z, b):
    index = 1 + b["g"] if masked == "where" else 1 + jnp.maximum(b["g"], 0)
    return -0.5 * (b["y"] - z[0] - jnp.where(b["g"] >= 0, z[index], 0.0)) ** 2

  # Both read in bounds at -1 and mask it; the range declared from the values >= 0
  # refused the data's own -1 ("holds values outside the integers 0 .. 19").
  objective = dsgrad.objective_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2), log_lik,
                                               {"y": y, "g": g}, 21)
  assert dict(objective.kinds)["g"] == ("index", 20, -1)
  objective.with_data({"y": y, "g": np.where(g == 3, -1, g)})  # the same convention
  with pytest.raises(ValueError, match="outside the integers -1 .. 19"):
    objective.with_data({"y": y, "g": np.where(g == 3, -2, g)})


def test_each_latent_leafs_gradient_is_whole_before_it_is_concatenated():
  """log_lik receives the latent's leaves through an optimization barrier, so each leaf's
  gradient (a batch sum for a leaf every row reads) is computed whole before the leaves'
  gradients are concatenated into z's: fused into that concatenation, XLA on a GPU summed
  the batch serially in the leaf's few threads (``benchmarks leaves-apart``). The gradient
  itself is unchanged."""
  r = np.random.default_rng(0)
  g = r.integers(0, 5, 40).astype(np.int32)
  y = r.standard_normal(40).astype(np.float32)

  def log_lik(z, rows):
    return -0.5 * (rows["y"] - z["mu"] - z["raw"][rows["g"]]) ** 2

  model = dsgrad.model_from_logdensity(lambda z: 0.0 * z["mu"], log_lik, {"g": g, "y": y},
                                       {"mu": jnp.zeros(()), "raw": jnp.zeros(5)})
  idx = jnp.arange(40, dtype=jnp.int32)
  z = jnp.asarray(r.standard_normal(6), jnp.float32)
  grad = jax.grad(lambda z: jnp.sum(model.log_likelihood_at(z, idx)))
  assert "optimization_barrier" in str(jax.make_jaxpr(grad)(z))
  residual = y - z[0] - z[1:][g]
  expected = np.concatenate([[residual.sum()], np.bincount(g, residual, minlength=5)])
  np.testing.assert_allclose(grad(z), expected, rtol=1e-5)
