"""A user's own model (``objective_from_logdensity``) on memory-mapped data: it trains,
its run equals the in-memory one step for step, and data that do not fit in memory are
refused with the way to keep them on disk."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from conftest import ctrl_c_at

N, GROUPS, D = 1500, 30, 3


def _data():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((N, D)).astype(np.float32)
  g = rng.integers(0, GROUPS, N).astype(np.int32)
  y = (rng.random(N) < 1 / (1 + np.exp(-x[:, 0]))).astype(np.float32)
  return {"x": x, "g": g, "y": y}


def _log_prior(z):
  return -0.5 * (jnp.sum(z["beta"] ** 2) + jnp.sum(z["b"] ** 2))


def _log_lik(z, rows):
  logit = rows["x"] @ z["beta"] + z["b"][rows["g"]]
  return rows["y"] * logit - jax.nn.softplus(logit)


LATENT = {"beta": jnp.zeros(D), "b": jnp.zeros(GROUPS)}


def _saved(data, directory):
  """``data`` written as ``.npy`` files in ``directory`` and opened memory-mapped."""
  on_disk = {}
  for name, value in data.items():
    np.save(directory / f"{name}.npy", value)
    on_disk[name] = dsgrad.data.open_memmap(directory / f"{name}.npy")
  return on_disk


@pytest.mark.parametrize("estimator, wide", [("naive", False), ("joint_svrg", False),
                                             ("naive", True)])
def test_memory_mapped_data_train_as_the_same_data_in_memory(tmp_path, estimator, wide):
  """With ``wide``, the files are as ``np.save`` writes NumPy's defaults (int64 indices,
  float64 features): the rows are read in JAX's 32-bit dtypes, as the same arrays in
  memory are cast."""
  data = _data()
  if wide:
    data = {k: v.astype(np.int64 if k == "g" else np.float64) for k, v in data.items()}
  on_disk = _saved(data, tmp_path)
  assert on_disk["g"].dtype == np.int32 and on_disk["x"].dtype == np.float32
  results = []
  for rows in (data, on_disk):
    # reads= exercises the index column's range check on the memory map too.
    objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, rows, LATENT,
                                                 reads={"b": "g"})
    transform = (dsgrad.naive() if estimator == "naive"
                 else dsgrad.joint_svrg(objective, every=20))
    params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
    results.append(dsgrad.fit(objective, optax.chain(transform, optax.adam(0.05)), params,
                              jax.random.key(1), num_steps=60, batch_size=25,
                              progress=False, elbo_samples=0))
  memory, disk = results
  start = dsgrad.families.by_name("meanfield", D + GROUPS).params()["loc"]
  assert float(jnp.max(jnp.abs(memory.params["loc"] - start))) > 0.1  # it trained
  for a, b in zip(jax.tree.leaves(memory.params), jax.tree.leaves(disk.params)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_group_ids_stored_as_floats_on_disk_are_checked_and_read_as_in_memory(tmp_path):
  """Ids made float by a missing value in the table they came from, saved to disk and cast
  in log_lik: the memory map is checked as an index as the same column in memory is (an id
  past the groups read the last one without an error), and its reads are found."""
  data = _data()
  data["g"] = data["g"].astype(np.float32)
  log_lik = lambda z, rows: _log_lik(z, dict(rows, g=rows["g"].astype(jnp.int32)))  # noqa: E731
  for rows in (data, _saved(data, tmp_path)):
    objective = dsgrad.objective_from_logdensity(_log_prior, log_lik, rows, LATENT)
    assert dict(objective.kinds)["g"] == ("index", GROUPS)
    assert objective.table_approximation is not None  # a table of the coordinates read
  for bad in (float(GROUPS), -1.0):
    data["g"][N // 2] = bad
    with pytest.raises(ValueError, match="data column 'g'"):
      dsgrad.objective_from_logdensity(_log_prior, log_lik, _saved(data, tmp_path), LATENT)


def test_compile_fit_on_memory_mapped_data_compiles_what_fit_then_runs(tmp_path):
  """The rows a block reads from disk are an argument of the program, stood in for by
  their shapes: compiled ahead (as recommend does in a thread, beside another run), the
  fit that follows starts at once instead of compiling on its first block."""
  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, _saved(_data(), tmp_path),
                                               LATENT)
  optimizer = optax.adam(0.05)
  params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
  settings = dict(num_steps=40, batch_size=7, elbo_samples=0)  # shapes no other test runs
  assert dsgrad.compile_fit(objective, optimizer, params, jax.random.key(1), **settings) > 0
  result = dsgrad.fit(objective, optimizer, params, jax.random.key(1), progress=False,
                      **settings)
  assert result.compile_seconds == 0.0 and result.step == 40


@pytest.mark.parametrize("noise_kept", [True, False])
def test_an_elbo_on_memory_mapped_data_reads_each_row_once_for_all_its_draws(
    tmp_path, monkeypatch, noise_kept):
  """Each chunk of a full pass is read from the file once and evaluated for every draw;
  one draw at a time, 100 draws of 200,000 rows read the file 100 times (3.3 s against
  0.2 s in memory). The estimate is the one from the same data in memory, whether the
  draws' noise is drawn once for the pass (``noise_kept``) or, too large to keep, in
  every chunk."""
  if not noise_kept:
    monkeypatch.setattr(dsgrad.elbo_estimates, "SHARED_NOISE_AT_ONCE", 0)
  data = _data()
  reads = []
  real_rows = dsgrad.data.HostArray.rows

  def counted(self, indices):
    reads.append(np.size(indices))
    return real_rows(self, indices)

  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, data, LATENT)
  on_disk = dsgrad.objective_from_logdensity(_log_prior, _log_lik, _saved(data, tmp_path),
                                             LATENT)
  params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
  monkeypatch.setattr(dsgrad.data.HostArray, "rows", counted)
  disk = dsgrad.elbo(on_disk, params, jax.random.key(2), num_samples=50, chunk_size=500)
  assert sum(reads) == 3 * N  # three files, each row once
  memory = dsgrad.elbo(objective, params, jax.random.key(2), num_samples=50, chunk_size=500)
  np.testing.assert_allclose(disk, memory, rtol=1e-6)


@pytest.mark.parametrize("value", [np.float64(1e39), np.int64(2**31)])
def test_64_bit_values_the_cast_would_change_are_refused_when_read(tmp_path, value):
  """A float64 beyond float32's range would become inf, an int64 index beyond int32's
  would wrap to another row's: the read that meets one says so and names the file."""
  column = np.zeros(10, value.dtype)
  column[7] = value
  np.save(tmp_path / "c.npy", column)
  host = dsgrad.data.open_memmap(tmp_path / "c.npy")
  assert float(host[np.arange(5)].sum()) == 0.0  # rows within range read as usual
  with pytest.raises(ValueError, match=r"c\.npy holds (float|int)64 values"):
    host[np.arange(10)]


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_rows_of_a_file_are_refused_when_read_naming_the_row(tmp_path, value):
  """Data in memory are refused where they enter; a file's NaN, read in training, ended
  in an error that blamed the gradient or the update rule. The failed step's rows are
  checked (every block's, as read, would cost as much as reading them)."""
  column = np.zeros((10, 2), np.float32)
  column[7, 1] = value
  np.save(tmp_path / "c.npy", column)
  host = dsgrad.data.open_memmap(tmp_path / "c.npy")
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: -0.5 * jnp.sum((b - z) ** 2, -1),
      host, latent=2)
  with pytest.raises(ValueError, match=r"c\.npy: row 7 holds NaN or inf"):
    dsgrad.fit(objective, optax.adam(1e-2), dsgrad.meanfield_init(objective),
               jax.random.key(0), num_steps=20, batch_size=5, elbo_samples=0, progress=False)


def test_data_larger_than_the_free_memory_name_the_memory_map(monkeypatch):
  monkeypatch.setattr(dsgrad.training.host_data, "free_memory_bytes", lambda: 10_000)  # x: 18,000
  with pytest.raises(MemoryError, match=r"'x'.*dsgrad.data.open_memmap\(path\)"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, _data(), LATENT)


def test_a_step_whose_update_overflows_is_named_on_memory_mapped_data_as_in_memory(
    tmp_path, monkeypatch):
  """The finiteness checks settle at a block's end on data read from disk too (the
  block's rows are kept, so that it runs again with every step checked): an update made
  infinite at step 7 is named with its step, as in memory."""
  data = _data()
  on_disk = _saved(data, tmp_path)
  blow_up = optax.scale_by_schedule(lambda t: jnp.where(t == 7, jnp.inf, 1.0))
  compiled, real = [], dsgrad.training.segments.compiled_segment
  monkeypatch.setattr(dsgrad.training.segments, "compiled_segment", lambda *a, **k: (
      compiled.append(k["finite_at_end"]) or real(*a, **k)))
  messages = []
  for rows in (data, on_disk):
    compiled.clear()
    objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, rows, LATENT)
    params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
    with pytest.raises(ValueError, match=r"non-finite") as info:
      dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.sgd(0.01), blow_up), params,
                 jax.random.key(1), num_steps=20, batch_size=25, progress=False,
                 elbo_samples=0)
    messages.append(str(info.value))
    assert compiled == [True, False]  # checked at the end, then again at every step
  assert messages[0] == messages[1] and messages[1].endswith("(at step 7)"), messages


def test_the_next_blocks_rows_are_requested_before_this_blocks_steps_are_queued(
    tmp_path, monkeypatch):
  """A block's batch indices come from the device: asked for after the current block's
  steps were queued, they would wait for those steps, and the next rows would be read
  after them instead of beside them."""
  on_disk = _saved(_data(), tmp_path)
  events = []
  real_submit = dsgrad.data.RowReader.submit
  real_executable = dsgrad.training.segments.SegmentRunner._executable

  def executable(runner, steps, args, checked=False):
    program = real_executable(runner, steps, args, checked)
    return lambda *a: events.append("steps") or program(*a)

  monkeypatch.setattr(dsgrad.training.segments, "HOST_BLOCK_STEPS", 10)
  monkeypatch.setattr(dsgrad.data.RowReader, "submit",
                      lambda reader, *a: events.append("rows") or real_submit(reader, *a))
  monkeypatch.setattr(dsgrad.training.segments.SegmentRunner, "_executable", executable)
  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, on_disk, LATENT)
  params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
  dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.adam(0.05)), params,
             jax.random.key(1), num_steps=40, batch_size=25, eval_every=40, progress=False,
             elbo_samples=0)
  assert events == ["rows", "rows", "steps", "rows", "steps", "rows", "steps", "steps"], events


def test_an_interrupted_fit_on_memory_mapped_data_keeps_the_steps_it_ran(tmp_path,
                                                                          monkeypatch):
  """Ctrl-C as the second block of rows read from disk ends: the run comes back at that
  block's end, its checks settled on the rows it read, equal to a run of that length."""
  on_disk = _saved(_data(), tmp_path)
  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, on_disk, LATENT)
  params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
  optimizer = optax.chain(dsgrad.naive(), optax.adam(0.05))
  kw = dict(batch_size=25, eval_every=40, progress=False, elbo_samples=0)
  monkeypatch.setattr(dsgrad.training.segments, "HOST_BLOCK_STEPS", 10)
  with monkeypatch.context() as interrupt:
    ctrl_c_at(interrupt, 2)
    with pytest.raises(dsgrad.Interrupted) as stop:
      dsgrad.fit(objective, optimizer, params, jax.random.key(1), num_steps=40, **kw)
  assert stop.value.step == 20
  part = dsgrad.fit(objective, optimizer, params, jax.random.key(1), num_steps=20, **kw)
  for a, b in zip(jax.tree.leaves(stop.value.result.params), jax.tree.leaves(part.params)):
    np.testing.assert_array_equal(a, b)


def test_an_interrupt_while_a_program_reads_rows_from_disk_keeps_the_run(tmp_path,
                                                                         monkeypatch):
  """Ctrl-C that strikes while a compiled program reads rows from disk (an ELBO
  evaluation's, in a host callback on this thread) left XLA as a JaxRuntimeError
  ("CpuCallback error"): fit lost its run, recommend naive's (in its race's estimates),
  and dsgrad.elbo named no interrupt. Each now takes it as the interrupt it is: fit keeps
  the steps before the evaluation, recommend naive's run, elbo raises KeyboardInterrupt.
  (A chain's programs read on XLA's threads: Ctrl-C comes after the chunk, as in memory.)"""
  import threading
  on_disk = _saved(_data(), tmp_path)
  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, on_disk, LATENT)
  params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
  reads, real_rows = [], dsgrad.data.HostArray.rows

  def rows(self, indices):  # training's reads run in a thread; a program's, in this one
    if threading.current_thread() is threading.main_thread():
      reads.append(None)
      if len(reads) == interrupt_at:
        raise KeyboardInterrupt
    return real_rows(self, indices)

  monkeypatch.setattr(dsgrad.data.HostArray, "rows", rows)
  interrupt_at = 1 + len(on_disk)  # the second evaluation's reads (each column once)
  with pytest.raises(dsgrad.Interrupted) as stop:
    dsgrad.fit(objective, optax.adam(0.05), params, jax.random.key(1), num_steps=60,
               batch_size=25, eval_every=20, elbo_samples=4, progress=False)
  assert stop.value.step == 40 and list(stop.value.result.history.step) == [20]
  reads.clear()
  interrupt_at = 1
  with pytest.raises(KeyboardInterrupt):
    dsgrad.elbo(objective, stop.value.result.params, jax.random.key(2), num_samples=4)
  reads.clear()  # recommend's first read on this thread: its race's ELBO estimates
  with pytest.raises(dsgrad.Interrupted, match="^dsgrad.recommend interrupted") as advice:
    dsgrad.recommend(objective, lambda steps: optax.adam(0.05), params, jax.random.key(3),
                     batch_size=25, budget=2.0, share=0.5, candidates=("naive", "cv"),
                     progress=False)
  assert advice.value.result.runs["naive"].step > 0


# Slow (13 s): fit's interrupt in a read from disk (above) and the sampler's interrupted
# chain in memory (test_mcmc) run by default.
@pytest.mark.slow
def test_an_interrupt_while_a_sampler_reads_rows_from_disk_keeps_its_draws(tmp_path,
                                                                            monkeypatch):
  """The same for dsgrad.mcmc.sample: Ctrl-C in a read from disk came back as XLA's
  JaxRuntimeError, in its setup (full-data passes), in a chunk of the chain (whose draws
  were lost) and in the estimator check after the last draw (all draws lost). Now: a
  plain KeyboardInterrupt before the first draw, dsgrad.Interrupted with the draws after."""
  rows_300 = {name: column[:300] for name, column in _data().items()}
  model = dsgrad.model_from_logdensity(_log_prior, _log_lik, _saved(rows_300, tmp_path), LATENT)
  armed, real_rows = [True], dsgrad.data.HostArray.rows

  def rows(self, indices):  # Ctrl-C as the first read after the trap is armed
    if armed[0]:
      armed[0] = False
      raise KeyboardInterrupt
    return real_rows(self, indices)

  def windows(*args, real=dsgrad.mcmc.chain.key_windows):  # armed for the second chunk
    for i, window in enumerate(real(*args)):
      armed[0] = i == 1
      yield window

  def diagnose(*args, real=dsgrad.mcmc.estimator_noise.diagnose):  # armed for the check
    armed[0] = True
    return real(*args)

  monkeypatch.setattr(dsgrad.data.HostArray, "rows", rows)
  # Chunks of 200 draws: the second holds one.
  kw = dict(num_samples=201, num_warmup=10, subsample_size=20, num_blocks=4, progress=False)
  with pytest.raises(KeyboardInterrupt) as setup:
    dsgrad.mcmc.sample(jax.random.key(0), model, **kw)
  assert type(setup.value) is KeyboardInterrupt
  with monkeypatch.context() as chunk:
    chunk.setattr(dsgrad.mcmc.chain, "key_windows", windows)
    # (A bare KeyboardInterrupt escaping a test would stop pytest: caught, then checked.)
    with pytest.raises(KeyboardInterrupt, match="after 200 of 201 draws") as stop:
      dsgrad.mcmc.sample(jax.random.key(0), model, **kw)
  assert stop.value.result.samples.shape == (200, D + GROUPS)
  monkeypatch.setattr(dsgrad.mcmc.estimator_noise, "diagnose", diagnose)
  with pytest.raises(KeyboardInterrupt, match="after its 201 draws") as check:
    dsgrad.mcmc.sample(jax.random.key(0), model, **kw)
  assert check.value.result.samples.shape == (201, D + GROUPS)
  np.testing.assert_array_equal(check.value.result.samples[:200], stop.value.result.samples)
  assert "not checked" in check.value.result.warnings[0]


def test_a_model_on_memory_maps_reads_their_columns_whole_not_a_row_at_a_time(tmp_path,
                                                                              monkeypatch):
  """np.asarray of a host array read it as a sequence, one __getitem__ per row: the range
  of an index column of 2,000,000 rows took 410 s of objective_from_logdensity."""
  on_disk = _saved(_data(), tmp_path)
  host_array = type(on_disk["g"])
  np.testing.assert_array_equal(np.asarray(on_disk["g"]), _data()["g"])
  reads, real = [], host_array.__getitem__
  monkeypatch.setattr(host_array, "__getitem__",
                      lambda self, index: reads.append(index) or real(self, index))
  objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, on_disk, LATENT)
  assert objective.table_approximation is not None  # the reads of "g" were found
  assert len(reads) < N // 10, len(reads)  # a few batches of rows, no row per call
