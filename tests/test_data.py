"""Data as arguments of compiled programs (dsgrad.data, Objective.with_data)."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad import data as data_lib
from dsgrad.training import compile_cache
from conftest import ctrl_c_at

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_EVENTS = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: _EVENTS.append(event))


def _compiles(fn):
  """Runs ``fn()``; returns ``(result, number of XLA compilations it triggered)``."""
  start = len(_EVENTS)
  out = fn()
  return out, _EVENTS[start:].count(COMPILE_EVENT)


def _problem(seed, n=1000, d=8):
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(seed), n, d)
  return x, y


def _joint_saga(objective, model):
  return optax.chain(dsgrad.joint_saga(objective, dsgrad.approx.logistic_probit(model)),
                     optax.adam(1e-2))


def _fit(objective, optimizer, params, steps=60):
  return dsgrad.fit(objective, optimizer, params, jax.random.key(3), num_steps=steps,
                    batch_size=50, eval_every=20, elbo_samples=4, progress=False)


def test_one_compilation_serves_two_data_sets_of_equal_shape():
  x, y = _problem(0)
  x2, y2 = _problem(1)
  model = dsgrad.models.logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  optimizer = _joint_saga(objective, model)
  params = dsgrad.meanfield_init(model, 0.0, -2.0)
  first, compiled_first = _compiles(lambda: _fit(objective, optimizer, params))
  other = objective.with_data({"x": x2, "signs": 2.0 * y2 - 1.0})
  second, compiled_second = _compiles(lambda: _fit(other, optimizer, params))
  assert compiled_first > 0  # the listener sees compilations at all
  assert compiled_second == 0, "the second data set recompiled"
  assert second.compile_seconds == 0.0
  # ... and it trained on the second data set: the same as a model built on it directly.
  model2 = dsgrad.models.logistic_regression(x2, y2)
  objective2 = dsgrad.meanfield_gaussian(model2)
  # Built anew: new functions, whose programs' text finds the executables compiled above.
  direct, compiled_direct = _compiles(
      lambda: _fit(objective2, _joint_saga(objective2, model2), params))
  assert compiled_direct == 0, compiled_direct
  np.testing.assert_allclose(second.params["loc"], direct.params["loc"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(second.history.elbo, direct.history.elbo, rtol=1e-5)
  assert not np.allclose(first.params["loc"], second.params["loc"], atol=1e-2)
  # The original objective still computes with its own data.
  np.testing.assert_allclose(
      dsgrad.elbo(objective, first.params, jax.random.key(0), 8)[0],
      dsgrad.elbo(dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y)),
                  first.params, jax.random.key(0), 8)[0], rtol=1e-6)


def test_an_optimizer_made_again_with_the_same_settings_compiles_nothing():
  """fit's segment and its descent check keep their executables under the program's
  text: a joint SVRG and an Adam made again for the same objective compile nothing and
  train the same; another learning rate compiles its own and trains otherwise."""
  x, y = _problem(0)
  model = dsgrad.models.logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model, 0.0, -2.0)

  def made(rate):
    return optax.chain(dsgrad.joint_svrg(objective, dsgrad.approx.logistic_probit(model)),
                       optax.adam(rate))
  first, compiled_first = _compiles(lambda: _fit(objective, made(1e-2), params))
  again, compiled_again = _compiles(lambda: _fit(objective, made(1e-2), params))
  assert compiled_first > 0 and compiled_again == 0, (compiled_first, compiled_again)
  np.testing.assert_array_equal(again.params["loc"], first.params["loc"])
  other, compiled_other = _compiles(lambda: _fit(objective, made(3e-2), params))
  assert compiled_other > 0 and not np.allclose(other.params["loc"], first.params["loc"])


def test_programs_share_an_executable_only_where_their_text_is_the_same():
  """Two functions that trace to the same program share one executable; another constant
  is another program; a program that calls back into Python is never shared (its text
  need not say which function it calls)."""
  scale = np.arange(300, dtype=np.float32)
  args = (jnp.ones(300),)
  compiled = compile_cache.compiled_as_text
  first, n_first = _compiles(lambda: compiled(lambda v: {"y": v * scale}, args))
  same, n_same = _compiles(lambda: compiled(lambda v: {"y": v * scale.copy()}, args))
  other, n_other = _compiles(lambda: compiled(lambda v: {"y": v * (scale + 1)}, args))
  assert (n_first, n_same) == (1, 0) and n_other == 1
  np.testing.assert_array_equal(same(*args)["y"], scale)
  np.testing.assert_array_equal(other(*args)["y"], scale + 1)
  # An argument one function leaves unused is still its own: each reads its own.
  pair = (jnp.ones(3), 5 * jnp.ones(3))
  np.testing.assert_array_equal(compiled(lambda a, b: 2 * b, pair)(*pair), 10 * np.ones(3))
  np.testing.assert_array_equal(compiled(lambda a, b: 2 * a, pair)(*pair), 2 * np.ones(3))

  def calling(value):
    return lambda v: jax.pure_callback(lambda: np.float32(value),
                                       jax.ShapeDtypeStruct((), jnp.float32)) + v
  assert float(compiled(calling(1.0), (jnp.zeros(()),))(jnp.zeros(()))) == 1.0
  assert float(compiled(calling(2.0), (jnp.zeros(()),))(jnp.zeros(()))) == 2.0


def test_a_chain_on_a_models_copy_with_other_data_compiles_nothing():
  """Model.with_data keeps the model's functions: the reference point, the proxy's pass,
  the warm-up and the chain compiled for the first data serve the second, and the draws
  are those of a model built on the second data, which (new functions, the same
  programs' text) compiles nothing either."""
  x, y = _problem(0, n=600, d=3)
  x2, y2 = _problem(1, n=600, d=3)
  model = dsgrad.models.logistic_regression(x, y)

  def chain(m):
    return dsgrad.mcmc.sample(jax.random.key(5), m, num_samples=40, num_warmup=40,
                              subsample_size=60, num_blocks=10, progress=False)
  first, compiled_first = _compiles(lambda: chain(model))
  other = model.with_data({"x": x2, "signs": 2.0 * y2 - 1.0})
  second, compiled_second = _compiles(lambda: chain(other))
  assert compiled_first > 0 and compiled_second == 0, (compiled_first, compiled_second)
  built = dsgrad.models.logistic_regression(x2, y2)  # new functions, the same programs' text
  direct, compiled_direct = _compiles(lambda: chain(built))
  assert compiled_direct == 0, compiled_direct
  np.testing.assert_allclose(second.samples, direct.samples, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(second.proxy.theta_star, direct.proxy.theta_star, rtol=1e-5,
                             atol=1e-5)
  assert not np.allclose(first.proxy.theta_star, second.proxy.theta_star, atol=1e-2)
  with pytest.raises(ValueError, match="expected the keys"):
    model.with_data({"x": x2})
  with pytest.raises(ValueError, match="shape"):
    model.with_data({"x": x2[:10], "signs": 2.0 * y2[:10] - 1.0})
  with pytest.raises(ValueError, match="signs"):
    model.with_data({"x": x2, "signs": y2.astype(np.float32)})
  closed = dsgrad.models.Model(model.log_prior, lambda z, i: model.log_likelihood_at(z, i),
                               model.num_data, model.latent_dim)
  with pytest.raises(ValueError, match="declares no data"):
    closed.with_data({"x": x2, "signs": 2.0 * y2 - 1.0})


def test_compiled_segment_holds_no_copy_of_the_data():
  """The executable's size does not grow with N: the data are arguments, not constants
  (which XLA would also constant-fold gathers over: the N = 10^6 warning)."""
  sizes = []
  for n in (1_000, 100_000):
    x, y = _problem(0, n=n, d=20)
    model = dsgrad.models.logistic_regression(x, y)
    objective = dsgrad.meanfield_gaussian(model)
    optimizer = optax.chain(dsgrad.cv(objective, dsgrad.approx.glm_mean_taylor(model)),
                            optax.adam(1e-2))
    params = dsgrad.meanfield_init(model)
    state = optimizer.init(params)
    segment, _ = dsgrad.training.segments.segment_program(objective, optimizer, 50, 5)
    orders = dsgrad.training.batching.EpochOrders(jax.random.key(1), n, 50).window(0, 5)
    lowered = segment.lower((params, state), jax.random.key(0), jnp.int32(0), jnp.int32(5),
                            objective, orders, {})
    sizes.append(len(lowered.as_text()))  # StableHLO: constants are printed in full
  # As constants, the features alone would print as 0.08 MB and 8 MB.
  assert sizes[1] < sizes[0] + 10_000, sizes


# Joint SVRG's refresh from disk is also checked on a user's log density by default
# (test_logdensity_on_disk): -m slow here.
@pytest.mark.parametrize("estimators", ["naive_saga_inc", pytest.param(
    "svrg", marks=pytest.mark.slow)])
def test_memory_mapped_data_train_like_device_data(tmp_path, monkeypatch, estimators):
  # Blocks of 10 steps read ahead: 2 blocks per 20-step segment, the next segment's first
  # block read while the last one runs; the last segment's 5 steps run on the 10-step
  # program, their block padded.
  monkeypatch.setattr(dsgrad.training.segments, "HOST_BLOCK_STEPS", 10)
  x, y = _problem(2, n=600, d=6)
  model = dsgrad.models.logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model, 0.0, -2.0)
  path = tmp_path / "x.npy"
  np.save(path, x.astype(np.float32))
  host = data_lib.open_memmap(path, dtype=np.float32, shape=(None, 6))
  on_host = objective.with_data({"x": host, "signs": 2.0 * y - 1.0})
  # inc's full pass every step and SVRG's refresh read the memory map in chunks.
  makes = {
      "naive_saga_inc": (lambda o: optax.chain(dsgrad.naive(), optax.adam(1e-2)),
                         lambda o: _joint_saga(o, model),
                         lambda o: optax.chain(dsgrad.inc(o, chunk_size=128),
                                               optax.adam(1e-2))),
      "svrg": (lambda o: optax.chain(dsgrad.joint_svrg(o, dsgrad.approx.glm_mean_taylor(model),
                                                       every=7), optax.adam(1e-2)),)}
  for make in makes[estimators]:
    device_run = _fit(objective, make(objective), params, steps=45)
    host_run = _fit(on_host, make(objective), params, steps=45)
    np.testing.assert_allclose(host_run.params["loc"], device_run.params["loc"],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host_run.history.elbo, device_run.history.elbo, rtol=1e-5)


def test_an_interrupt_between_blocks_of_host_data_keeps_the_run(tmp_path, monkeypatch):
  """With host data a segment runs in blocks, each donating the state to the next: an
  interrupt after a block, in the middle of a segment, keeps that block's state, and the
  run continues from it to the uninterrupted one."""
  monkeypatch.setattr(dsgrad.training.segments, "HOST_BLOCK_STEPS", 10)
  x, y = _problem(2, n=600, d=6)
  model = dsgrad.models.logistic_regression(x, y)
  params = dsgrad.meanfield_init(model, 0.0, -2.0)
  np.save(tmp_path / "x.npy", x.astype(np.float32))
  host = data_lib.open_memmap(tmp_path / "x.npy", dtype=np.float32, shape=(None, 6))
  on_host = dsgrad.meanfield_gaussian(model).with_data({"x": host, "signs": 2.0 * y - 1.0})
  optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-2))
  whole = _fit(on_host, optimizer, params, steps=60)
  with monkeypatch.context() as patch:
    ctrl_c_at(patch, 3)  # as the third block ends (step 30 of 60)
    with pytest.raises(dsgrad.Interrupted) as stop:
      _fit(on_host, optimizer, params, steps=60)
  assert stop.value.step == 30 and stop.value.result.history.step.tolist() == [20]
  continued = stop.value.resume()
  np.testing.assert_array_equal(continued.history.step, whole.history.step)
  chex.assert_trees_all_equal(continued.params, whole.params)
  np.testing.assert_array_equal(continued.history.elbo, whole.history.elbo)


def test_row_reader_reads_blocks_of_rows_on_a_thread(tmp_path):
  path = tmp_path / "a.npy"
  full = np.arange(40, dtype=np.float32).reshape(20, 2)
  np.save(path, full)
  host = data_lib.open_memmap(path)
  device = jax.devices()[-1]
  reader = data_lib.RowReader({"a": host}, placement=device)
  reader.submit(np.array([[3, 1], [19, 3]]))
  rows = reader.take()["a"]
  # Copied to the device on the thread: the compiled call gets a device array, not NumPy.
  assert isinstance(rows, jax.Array) and rows.devices() == {device}
  np.testing.assert_array_equal(rows, full[[[3, 1], [19, 3]]])
  # Host rows start at a 64-byte boundary (what a CPU device_put needs to skip its copy),
  # also for blocks large enough to get memory of their own from the allocator.
  for shape in [(2, 3), (600, 500)]:
    block = host.rows(np.arange(np.prod(shape)).reshape(shape) % 20)
    assert block.ctypes.data % 64 == 0 and block.flags.c_contiguous
    np.testing.assert_array_equal(block, full[np.arange(np.prod(shape)).reshape(shape) % 20])
  reader.submit(np.array([[20]]))  # out of range: the thread's error reaches take()
  with pytest.raises(IndexError, match="outside"):
    reader.take()
  with pytest.raises(RuntimeError, match="without a submitted block"):
    reader.take()


# ------------------------------------------------------------------ bad input
def test_with_data_refuses_other_shapes_dtypes_keys_and_disagreeing_leaves():
  x, y = _problem(0, n=100, d=4)
  objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
  signs = 2.0 * y - 1.0
  with pytest.raises(ValueError, match=r"disagree on the number of data N \(signs: 99, x: 100\)"):
    objective.with_data({"x": x, "signs": signs[:99]})
  with pytest.raises(ValueError, match=r"data 'x' has shape \(100, 5\), expected \(100, 4\)"):
    objective.with_data({"x": np.ones((100, 5)), "signs": signs})
  with pytest.raises(ValueError, match=r"data 'x' has shape \(90, 4\)"):
    objective.with_data({"x": x[:90], "signs": signs[:90]})
  with pytest.raises(TypeError, match="data 'signs' has dtype int32, expected float32"):
    objective.with_data({"x": x, "signs": y.astype(np.int32)})
  with pytest.raises(ValueError, match=r"expected the keys \['signs', 'x'\]"):
    objective.with_data({"x": x})


def test_objective_refuses_data_of_another_size_than_num_data():
  x, y = _problem(0, n=100, d=4)
  model = dsgrad.models.logistic_regression(x, y)
  with pytest.raises(ValueError, match="has 100 rows per leaf but num_data is 99"):
    dsgrad.Objective(lambda p, i, e: i * 0.0, lambda k, b: jnp.zeros(()), 99,
                     shared_noise=True, data=model.data)


def test_open_memmap_refuses_truncated_wrong_dtype_and_other_files(tmp_path):
  good = tmp_path / "x.npy"
  np.save(good, np.ones((50, 3), np.float32))
  with pytest.raises(ValueError, match="holds float32, expected float64"):
    data_lib.open_memmap(good, dtype=np.float64)
  with pytest.raises(ValueError, match=r"has shape \(50, 3\), expected \(None, 4\)"):
    data_lib.open_memmap(good, shape=(None, 4))
  truncated = tmp_path / "t.npy"
  truncated.write_bytes(good.read_bytes()[:-10])
  with pytest.raises(ValueError, match="is truncated: its header declares shape \\(50, 3\\)"):
    data_lib.open_memmap(truncated)
  raw = tmp_path / "r.bin"
  raw.write_bytes(b"\x00" * 64)
  with pytest.raises(ValueError, match="is not a .npy file"):
    data_lib.open_memmap(raw)
  with pytest.raises(FileNotFoundError, match="no such file"):
    data_lib.open_memmap(tmp_path / "missing.npy")
  # A table's columns saved as they come (pandas' to_numpy() of float columns is column-
  # major): refused with the line that saves it in row order, which is then read.
  table = np.asfortranarray(np.stack([np.arange(50.0), np.ones(50), np.zeros(50)], axis=1))
  columns = tmp_path / "columns.npy"
  np.save(columns, table)
  with pytest.raises(ValueError, match=r"Fortran \(column-major\) order.*np.ascontiguousarray"):
    data_lib.open_memmap(columns)
  with pytest.raises(ValueError, match=r"Fortran \(column-major\) order"):  # as np.load opens it
    data_lib.placed({"x": np.load(columns, mmap_mode="r")})
  np.save(columns, np.ascontiguousarray(table))
  assert data_lib.open_memmap(columns).rows(np.array([7]))[0].tolist() == [7.0, 1.0, 0.0]
  # Columns sliced from a row-order file keep each row's values together: accepted.
  sliced = data_lib.placed({"x": np.load(columns, mmap_mode="r")[:, 1:]})["x"]
  assert sliced.rows(np.array([7]))[0].tolist() == [1.0, 0.0]
  with pytest.raises(TypeError, match="not numeric"):
    data_lib.HostArray(np.array(["a", "b"]))


@functools.lru_cache(maxsize=1)
def _model_objectives():
  key = jax.random.key(0)
  x, y = _problem(0, n=60, d=4)
  winners, losers, _ = dsgrad.models.synthetic_bradley_terry_data(key, 8, 60)
  users, genres, ratings = dsgrad.models.synthetic_movielens_data(key, 5, 12, 60, num_genres=3,
                                                                  num_classes=3)
  ppca_x, _ = dsgrad.models.synthetic_ppca_data(key, 60, 5, 2)
  models = {
      "logistic": dsgrad.models.logistic_regression(x, y),
      "softmax": dsgrad.models.softmax_regression(x, y, 2),
      "bradley_terry": dsgrad.models.bradley_terry(winners, losers, 8),
      "movielens": dsgrad.models.movielens(users, genres, ratings, 5, num_classes=3),
      "ppca": dsgrad.models.ppca(ppca_x, 2),
  }
  out = {name: (dsgrad.meanfield_gaussian(m), dsgrad.meanfield_init(m, 0.1, -1.0))
         for name, m in models.items()}
  glm = dsgrad.models.dropout_glm(x, y, 2)
  out["dropout_glm"] = (glm.objective(), glm.init_params(key, 0.1))
  numpyro_objective = _numpyro_objective(x, y)
  out["numpyro"] = (numpyro_objective, numpyro_objective.init_params(loc=0.1))
  return out


def _numpyro_objective(x, y):
  import numpyro
  import numpyro.distributions as dist
  from dsgrad.contrib import numpyro as bridge

  def model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=10) as idx:
      numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

  return bridge.objective(model, x=x, y=y)


# A NumPyro model indexes its own arrays with the plate's indices: its objective has no
# data of its own (the arrays are constants of its programs).
@pytest.mark.parametrize("name", ["logistic", "softmax", "bradley_terry", "movielens", "ppca",
                                  "dropout_glm"])
def test_every_model_reads_its_data_through_the_objective(name, counting_jit):
  """``with_data`` on the rows permuted: datum ``i`` of the new data is datum ``perm[i]``
  of the old, so the loss at indices ``idx`` equals the old loss at ``perm[idx]`` --
  jitted, with the data as arguments."""
  objective, params = _model_objectives()[name]
  assert objective.data, f"{name} declares no data handles"
  perm = np.random.default_rng(0).permutation(objective.num_data)
  permuted = objective.with_data({k: np.asarray(v)[perm]
                                  for k, v in objective.data_tree().items()})
  idx = jnp.arange(10, dtype=jnp.int32)
  noise = objective.sample_noise(jax.random.key(1), 10)
  loss, traces = counting_jit(lambda o, p, i, e: o.loss(p, i, e, validate=False))
  new = loss(permuted, params, idx, noise)
  old = loss(objective, params, jnp.asarray(perm[:10], jnp.int32), noise)
  unpermuted = loss(objective, params, idx, noise)
  assert len(traces) == 1, "a copy on other data of the same shapes retraced"
  np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)
  assert not np.allclose(new, unpermuted), "the permuted data were not read"


def test_host_blocks_hold_at_most_the_byte_budget(tmp_path, monkeypatch):
  np.save(tmp_path / "x.npy", np.zeros((50, 30), np.float32))  # 120 bytes a row
  host = {"x": data_lib.open_memmap(tmp_path / "x.npy")}
  assert dsgrad.training.segments.host_block_steps(host, 10) == dsgrad.training.segments.HOST_BLOCK_STEPS
  monkeypatch.setattr(dsgrad.training.segments, "HOST_BLOCK_BYTES", 120 * 10 * 7 + 5)
  assert dsgrad.training.segments.host_block_steps(host, 10) == 7
  monkeypatch.setattr(dsgrad.training.segments, "HOST_BLOCK_BYTES", 10)
  assert dsgrad.training.segments.host_block_steps(host, 10) == 1


def test_no_module_state_holds_data():
  """Programs get their data from what they are handed: no module of dsgrad keeps a
  binding in global or thread-local state (the thread-local left is the stack of
  deferred value checks, which holds check results, not data)."""
  import importlib
  import pkgutil
  import threading
  found = []
  for info in pkgutil.walk_packages(dsgrad.__path__, "dsgrad."):
    if info.name.startswith("dsgrad.contrib"):
      continue
    module = importlib.import_module(info.name)
    found += [f"{info.name}.{k}" for k, v in vars(module).items()
              if isinstance(v, threading.local)]
  assert found == ["dsgrad.checks._DEFERRED"], found


def _input_shapes(closed):
  return [tuple(v.aval.shape) for v in closed.jaxpr.invars]


def test_a_fit_step_takes_the_data_and_the_batch_rows_as_inputs(tmp_path):
  """``jax.make_jaxpr`` of fit's compiled steps: the data arrays are inputs of the
  program (none is a constant); with the data on the host, the batches' rows read ahead
  are its inputs and no whole data array is."""
  n, d, b, steps = 300, 5, 10, 3
  x, y = _problem(0, n=n, d=d)
  model = dsgrad.models.logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  optimizer = optax.chain(dsgrad.cv(objective, dsgrad.approx.glm_mean_taylor(model)),
                          optax.adam(1e-2))
  params = dsgrad.meanfield_init(model)
  state = optimizer.init(params)
  orders = dsgrad.training.batching.EpochOrders(jax.random.key(1), n, b).window(0, steps)
  segment, _ = dsgrad.training.segments.segment_program(objective, optimizer, b, steps)
  closed = jax.make_jaxpr(segment)((params, state), jax.random.key(0), jnp.int32(0),
                                   jnp.int32(steps), objective, orders, {})
  assert (n, d) in _input_shapes(closed) and (n,) in _input_shapes(closed)
  assert not [c for c in closed.consts if jnp.ndim(c) and jnp.shape(c)[0] == n]
  np.save(tmp_path / "x.npy", x.astype(np.float32))
  on_host = objective.with_data({"x": data_lib.open_memmap(tmp_path / "x.npy"),
                                 "signs": 2.0 * y - 1.0})
  (path,) = data_lib.host_leaves(on_host)
  rows = {path: jnp.zeros((steps, b, d), jnp.float32)}
  closed = jax.make_jaxpr(segment)((params, state), jax.random.key(0), jnp.int32(0),
                                   jnp.int32(steps), on_host, orders, rows)
  assert (steps, b, d) in _input_shapes(closed) and (n, d) not in _input_shapes(closed)


def test_a_non_finite_value_is_named_by_its_row_where_the_data_are_checked_in_blocks():
  # logistic_regression checks its features in blocks of 2^18 rows: the row is the
  # array's, not the block's.
  x = np.ones((300_000, 2), np.float32)
  x[270_001, 1] = np.nan
  with pytest.raises(ValueError, match=r"features contains non-finite values \(1 NaN or inf, "
                                      r"the first in row 270,001\)"):
    dsgrad.models.logistic_regression(x, np.zeros(300_000, np.int32))
  x = np.ones((300_000, 2), np.float64)
  x[270_001, 0] = -1e39  # finite in float64, inf once cast
  with pytest.raises(ValueError, match=r"features holds values up to 1e\+39 \(row 270,001\), "
                                      r"beyond float32's range"):
    dsgrad.models.logistic_regression(x, np.zeros(300_000, np.int32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["numpy", "device"])
def test_non_finite_data_are_refused_in_memory_and_on_the_device(bad, where):
  # The checks are reductions without temporaries (a sum of x * 0 on the device, min and
  # max in NumPy): each of NaN, inf and -inf must still reach them.
  x = np.random.default_rng(0).standard_normal((500, 7)).astype(np.float32)
  x[[3, 250], [1, 6]] = bad
  data = {"x": jnp.asarray(x) if where == "device" else x}
  with pytest.raises(ValueError, match=r"data\['x'\] contains non-finite values \(2 NaN or "
                                      r"inf, the first in row 3\)\. Where they mark missing "
                                      r"values, .* a 0/1 column of which values are observed"):
    data_lib.check_data(data)


def test_a_device_array_is_scanned_for_non_finite_values_once(monkeypatch):
  """A model, its objective and each copy (``_replace``, ``with_data`` of the same
  arrays) check their data; on 10^6 x 1,000 floats each pass cost 0.7-4 s, six passes for
  one ``objective_from_logdensity``. An immutable array checked once stays checked."""
  scans = []
  real = data_lib._all_finite
  monkeypatch.setattr(data_lib, "_all_finite", lambda v: scans.append(v.shape) or real(v))
  x = jnp.asarray(np.random.default_rng(1).standard_normal((400, 3)), jnp.float32)
  y = jnp.zeros(400, jnp.float32)
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: -0.5 * (b["y"] - b["x"] @ z) ** 2,
      {"x": x, "y": y}, 3)
  dataclasses.replace(objective.with_data({"x": x, "y": y}), name="copy")
  assert sorted(scans) == [(400,), (400, 3)]
  fresh = x + 1.0  # a new array: scanned
  objective.with_data({"x": fresh, "y": y})
  assert sorted(scans) == [(400,), (400, 3), (400, 3)]
  with pytest.raises(ValueError, match="non-finite"):
    objective.with_data({"x": x.at[0, 0].set(jnp.nan), "y": y})


def _regression_columns(n=64):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 3)).astype(np.float32)
  return x, (x @ np.array([1.0, -1.0, 0.5]) + rng.normal(size=n)).astype(np.float32)


def _regression(data):
  return dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: -0.5 * (b["y"] - b["x"] @ z + 0.0 * b.get("id", 0)) ** 2, data, 3)


def test_64_bit_integers_that_32_bits_would_wrap_are_refused():
  x, y = _regression_columns()
  ids = np.arange(64, dtype=np.int64) * 10 ** 9  # past 2**31 from the third row
  # Stored as int32, 9e10 became -194,313,216 without an error.
  with pytest.raises(ValueError, match=r"data\['id'\] holds int64 values from 0 to "
                                       r"63000000000, beyond int32's range"):
    _regression({"x": x, "y": y, "id": ids})
  with pytest.raises(ValueError, match="beyond uint32's range"):
    _regression({"x": x, "y": y, "id": ids.astype(np.uint64)})
  small = _regression({"x": x, "y": y, "id": ids // 10 ** 9})
  np.testing.assert_array_equal(small.data["id"], np.arange(64))


def test_a_pandas_data_frame_given_as_the_data_is_read_by_its_column_names():
  pd = pytest.importorskip("pandas")
  rng = np.random.default_rng(1)
  x, y = _regression_columns()
  groups = rng.integers(0, 4, x.shape[0])
  frame = pd.DataFrame({"x": x[:, 0], "y": y, "g": groups})
  # It was read as one (N, 3) float matrix: batch["y"] failed with "JAX does not support
  # string indexing", and the group index would have become a float.
  model = dsgrad.model_from_logdensity(
      lambda z: -0.5 * jnp.sum(z["w"] ** 2) - 0.5 * jnp.sum(z["b"] ** 2),
      lambda z, b: -0.5 * (b["y"] - z["w"] * b["x"] - z["b"][b["g"]]) ** 2,
      frame, latent={"w": jnp.zeros(()), "b": jnp.zeros(4)})
  assert sorted(model.data) == ["g", "x", "y"]
  assert np.issubdtype(model.data["g"].dtype, np.integer)
  np.testing.assert_array_equal(model.data["g"], groups)
  z = {"w": jnp.asarray(0.5), "b": jnp.arange(4.0)}
  flat = jax.flatten_util.ravel_pytree(z)[0]
  want = -0.5 * (y - 0.5 * x[:, 0] - np.arange(4.0)[groups]) ** 2
  np.testing.assert_allclose(model.log_likelihood_at(flat, jnp.arange(x.shape[0])), want,
                             rtol=1e-5)
  objective = dsgrad.meanfield_gaussian(model)
  swapped = objective.with_data(frame.assign(y=-frame["y"]))
  np.testing.assert_allclose(swapped.data["y"], -y)
  with pytest.raises(ValueError, match="repeated column names"):
    _regression(pd.DataFrame(np.ones((4, 2)), columns=["x", "x"]))
  # A column of names beside them: "data['name'] has dtype object" said to convert it.
  with pytest.raises(ValueError, match=r"columns \['name'\] are not numbers; select the "
                                       r"columns the model reads \(frame\[\['x', 'y', 'g'\]\]\)"):
    objective.with_data(frame.assign(name=[f"p{i}" for i in range(len(frame))]))
  # The group column moved to the index (set_index before a join) left only a KeyError.
  with pytest.raises(KeyError) as caught:
    dsgrad.model_from_logdensity(
        lambda z: -0.5 * jnp.sum(z["w"] ** 2) - 0.5 * jnp.sum(z["b"] ** 2),
        lambda z, b: -0.5 * (b["y"] - z["w"] * b["x"] - z["b"][b["g"]]) ** 2,
        frame.set_index("g"), latent={"w": jnp.zeros(()), "b": jnp.zeros(4)})
  assert "'g' is the table's index, not one of its columns: pass frame.reset_index()" in \
      caught.value.__notes__[-1]


def test_a_column_of_labels_is_refused_with_the_codes_that_replace_it():
  """Categories or names (a pandas categorical, strings) given as a data leaf are refused
  with a way to turn them into the integer codes a model indexes with, which then work."""
  pd = pytest.importorskip("pandas")
  groups = np.random.default_rng(0).choice(["north", "south", "west"], 300)
  y = np.random.default_rng(1).normal(size=300).astype(np.float32)
  log_prior = lambda z: -0.5 * jnp.sum(z ** 2)
  log_lik = lambda z, b: -0.5 * (b["y"] - z[b["g"]]) ** 2
  for labels in (pd.Series(pd.Categorical(groups)), groups):
    with pytest.raises(TypeError, match=r"data\['g'\] has dtype (object|<U5).*labels "
                       r"\(names, categories\) become integer codes, e.g. pd.Categorical"):
      dsgrad.objective_from_logdensity(log_prior, log_lik, {"g": labels, "y": y},
                                       jnp.zeros(3))
  codes = pd.Categorical(groups).codes
  objective = dsgrad.objective_from_logdensity(log_prior, log_lik, {"g": codes, "y": y},
                                               jnp.zeros(3))
  np.testing.assert_array_equal(objective.data["g"], codes)
  # Complex numbers are no labels: told to convert only.
  with pytest.raises(TypeError, match=r"np.float32\)$"):
    dsgrad.objective_from_logdensity(log_prior, log_lik,
                                     {"g": codes, "y": y.astype(np.complex64)}, jnp.zeros(3))


def test_a_pandas_data_frame_column_is_read_as_its_array():
  pd = pytest.importorskip("pandas")
  x, y = _regression_columns()
  frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2]})
  # A DataFrame has no dtype: it failed with "Cannot interpret ... as a data type".
  objective = _regression({"x": frame, "y": pd.Series(y)})
  np.testing.assert_array_equal(objective.data["x"], x)
  frame.iloc[5, 1] = np.nan
  with pytest.raises(ValueError, match=r"data\['x'\] contains non-finite values"):
    _regression({"x": frame, "y": y})


def test_few_rows_read_outside_a_program_are_the_rows_read_inside_one(tmp_path):
  """``few_rows`` (one compiled gather, host leaves read on the host) gives the rows that
  ``rows_of`` gives inside a program, for device data, memory-mapped data and none."""
  x, y = _problem(3, n=50, d=4)
  indices = np.array([49, 0, 7, 7], np.int32)  # unordered, with a repeat
  device = {"x": jnp.asarray(x, jnp.float32), "y": jnp.asarray(y)}
  want = jax.jit(data_lib.rows_of)(device, jnp.asarray(indices))
  chex.assert_trees_all_equal(data_lib.few_rows(device, indices), want)
  np.save(tmp_path / "x.npy", x.astype(np.float32))
  host = dict(device, x=data_lib.open_memmap(tmp_path / "x.npy", dtype=np.float32,
                                             shape=(None, 4)))
  got = data_lib.few_rows(host, indices)
  np.testing.assert_array_equal(np.asarray(got["x"]), np.asarray(want["x"]))
  np.testing.assert_array_equal(np.asarray(got["y"]), np.asarray(want["y"]))
  assert data_lib.few_rows(None, indices) is indices


def test_a_chains_shorter_last_chunk_runs_the_program_of_the_others():
  """run_chain compiles one program for all its chunks: a last chunk shorter than the
  others runs it for fewer iterations, and the draws are those of one whole chunk."""
  x, y = _problem(0, n=400, d=3)
  model = dsgrad.models.logistic_regression(x, y)
  algorithm = dsgrad.mcmc.sgld(model, dsgrad.mcmc.taylor_proxy(model, np.zeros(3, np.float32)),
                               step_size=1e-3, subsample_size=20)
  start = algorithm.init(np.zeros(3, np.float32), None)

  def chain(num, chunk):
    return dsgrad.mcmc.run_chain(jax.random.key(2), algorithm.step, start, num,
                                 chunk_size=chunk, progress=False)
  whole, *_ = chain(23, 23)
  chain(20, 10)  # two whole chunks of 10: their program
  programs = compile_cache.size()
  chunked, _, _, final, _ = chain(23, 10)  # 10, 10 and 3 with the same program
  assert compile_cache.size() == programs, "the last, shorter chunk compiled a program"
  np.testing.assert_array_equal(chunked, whole)
  np.testing.assert_array_equal(final.position, whole[-1])


def test_a_fit_after_compile_fit_with_its_arguments_compiles_nothing():
  """compile_fit compiles fit's start too (the params' finiteness check, the rule's
  descent check): they were compiled by the fit, inside a time-limited fit's budget."""
  x, y = _problem(5, n=37, d=13)  # shapes no other test compiles
  model = dsgrad.models.logistic_regression(x, y)
  objective, params = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)
  optimizer = optax.adam(1e-2)
  settings = dict(num_steps=30, batch_size=4, elbo_samples=0)
  assert dsgrad.compile_fit(objective, optimizer, params, jax.random.key(1), **settings) > 0
  result, compiles = _compiles(lambda: dsgrad.fit(objective, optimizer, params,
                                                  jax.random.key(1), progress=False, **settings))
  assert (compiles, result.compile_seconds) == (0, 0.0)
  assert np.all(np.isfinite(result.params["loc"]))


def test_an_update_outside_jit_is_one_program_with_the_data_as_its_arguments():
  """Called outside jit, an estimator's update runs one compiled program (it ran one
  small program per operation): the user's likelihood runs in Python only while traced,
  not at every call; the objective on other data of the same shapes reuses the program
  (its data are arguments, not constants); the update equals the jitted one."""
  x, y = _problem(0, n=200, d=3)
  x2, y2 = _problem(1, n=200, d=3)
  traced = []

  def log_likelihood(z, rows):
    traced.append(1)
    return jax.nn.log_sigmoid(rows["signs"] * (rows["x"] @ z))

  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), log_likelihood, {"x": x, "signs": 2.0 * y - 1.0},
      latent=3)
  other = objective.with_data({"x": x2, "signs": 2.0 * y2 - 1.0})
  params = dsgrad.families.by_name("meanfield", 3).params()
  optimizer = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))

  def step(state, on, seed):
    indices = jnp.arange(10) + 10 * seed
    noise = on.sample_noise(jax.random.key(seed), 10)
    grads = on.grad(params, indices, noise, validate=False)
    return optimizer.update(grads, state, params, indices=indices, noise=noise, objective=on)

  state = step(optimizer.init(params), objective, 0)[1]
  before = len(traced)
  (updates, _), compiled = _compiles(lambda: step(state, other, 1))
  assert len(traced) == before and compiled == 0, (len(traced) - before, compiled)
  jitted, _ = jax.jit(step, static_argnums=2)(state, other, 1)
  for got, want in zip(jax.tree.leaves(updates), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_step_looks_up_only_a_few_batches_of_indices_among_its_rows_read_ahead(tmp_path):
  """Inside a step a host array holds the batch's rows: indices made from the batch's are
  looked up among them (no host read), comparing every index with every batch row. A full
  pass's chunk of 16,384 rows found none among a batch of 500 and paid that comparison:
  1.3 s of a joint SVRG refresh over 10^7 rows. More than a few batches' worth of indices
  is read from the host at once."""
  x = np.arange(600, dtype=np.float32).reshape(200, 3)
  np.save(tmp_path / "x.npy", x)
  host = data_lib.open_memmap(tmp_path / "x.npy")
  batch = jnp.array([3, 17, 42, 99, 150], jnp.int32)

  def read(handle, batch, rows, make_index):
    view = dsgrad.training.host_data.HostArray.view(host.spec, handle, (batch, rows))
    return view[make_index(batch)]

  twice = lambda b: jnp.concatenate([b, b])  # noqa: E731
  chunk = lambda b: jnp.arange(100, dtype=jnp.int32)  # noqa: E731
  for make_index, expected, looked_up in ((twice, x[np.r_[batch, batch]], True),
                                          (chunk, x[:100], False)):
    args = (host.handle, batch, jnp.asarray(x[np.asarray(batch)]))
    np.testing.assert_array_equal(jax.jit(read, static_argnums=3)(*args, make_index), expected)
    assert ("cond" in str(jax.make_jaxpr(read, static_argnums=3)(*args, make_index))) \
        == looked_up


def test_the_columns_of_data_on_disk_are_read_in_one_callback(tmp_path):
  """A pass over data on disk reads each chunk's rows of every column: one host callback
  per column cost about 0.16 ms each (an ELBO of 10^7 rows of four columns: 2.4 s against
  1.6 s in one callback a chunk)."""
  x = np.arange(600, dtype=np.float32).reshape(200, 3)
  g = (np.arange(200) % 7).astype(np.int32)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "g.npy", g)
  data = {"x": data_lib.open_memmap(tmp_path / "x.npy"),
          "g": data_lib.open_memmap(tmp_path / "g.npy"), "w": jnp.ones(200)}
  indices = jnp.arange(40, 90, dtype=jnp.int32)
  read = lambda data, idx: data_lib.rows_of(data, idx, contiguous=True)  # noqa: E731
  rows = jax.jit(read)(data, indices)
  np.testing.assert_array_equal(rows["x"], x[40:90])
  np.testing.assert_array_equal(rows["g"], g[40:90])
  assert str(jax.make_jaxpr(read)(data, indices)).count("pure_callback") == 1
  # Under vmap too (a chunk's draws), each column's rows where they belong.
  twice = jax.jit(jax.vmap(read, in_axes=(None, 0)))(data, jnp.stack([indices, indices + 100]))
  np.testing.assert_array_equal(twice["x"][1], x[140:190])
  np.testing.assert_array_equal(twice["g"][1], g[140:190])
