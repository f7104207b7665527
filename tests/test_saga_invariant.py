"""joint_saga keeps G = mean_n E grad f~(w^n; n) exactly, also with repeated indices."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.tables import full_pass_mean


def _recomputed_mean(approx, objective, table, like):
  def one(row, index):
    return approx.expected_grad(objective, row, index[None])

  @jax.jit  # one program, not one per operation
  def mean(table):
    rows = jax.tree.map(lambda t, p: t.astype(p.dtype), table, like)
    per = jax.vmap(one)(rows, jnp.arange(objective.num_data, dtype=jnp.int32))
    return jax.tree.map(lambda x: jnp.mean(x, 0), per)

  return mean(table)


@pytest.mark.parametrize("approx_name,table_dtype", [
    ("linearize", None), ("gaussian_mean_taylor", None), ("linearize", jnp.bfloat16)])
def test_running_mean_invariant_with_duplicates(logreg_model, params0, approx_name, table_dtype):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)
  approx = (dsgrad.approx.linearize() if approx_name == "linearize"
            else dsgrad.approx.gaussian_mean_taylor(logreg_model))
  tx = dsgrad.joint_saga(objective, approx, table_dtype=table_dtype)
  state, params = tx.init(params0), params0

  @jax.jit  # one program for the steps, not one per operation
  def step(state, params, idx, key):
    noise = objective.sample_noise(key, idx.shape[0])
    grads = objective.grad(params, idx, noise, validate=False)
    out, state = tx.update(grads, state, params, indices=idx, noise=noise)
    return state, optax.apply_updates(params, jax.tree.map(lambda g: -3e-3 * g, out))

  batches = [[3, 3, 7, 1, 3], [7, 0, 0, 49, 12], [1, 2, 3, 4, 5], [9, 9, 9, 9, 9]]
  for t, idx in enumerate(batches):
    state, params = step(state, params, jnp.array(idx, jnp.int32), jax.random.key(t))
  want = _recomputed_mean(approx, objective, state.table, params0)
  chex.assert_trees_all_close(state.running_mean, want, rtol=2e-4, atol=2e-3)
  # The table rows of the visited data hold the parameters of their last visit.
  assert not jnp.allclose(state.table["loc"][9], state.table["loc"][20])


def test_full_pass_mean_handles_remainders():
  values = jnp.arange(10.0)
  for chunk in [1, 3, 4, 10, 64]:
    got = full_pass_mean(lambda idx: jnp.mean(values[idx]), 10, chunk)
    assert jnp.allclose(got, 4.5), chunk


def test_a_full_pass_chunk_reads_64_mib_of_rows_between_1024_and_16384_of_them():
  """Wider rows, fewer of them to a chunk: a full pass in chunks of 1,024 rows ran 10-20x
  slower on a GPU than in chunks of 16,384 (kernel launches per chunk), and a chunk of wide
  rows stays within the memory a chunk of 1,024 narrow rows took."""
  chunk = dsgrad.tables.full_pass_chunk
  narrow = {"x": jax.ShapeDtypeStruct((10**6, 8), jnp.float32),
            "g": jax.ShapeDtypeStruct((10**6,), jnp.int32)}
  assert chunk(narrow) == 16_384  # 36 bytes a row: capped
  images = {"x": jax.ShapeDtypeStruct((50_000, 3_072), jnp.float32)}
  assert chunk(images) == 64 * 2**20 // (4 * 3_072) == 5_461
  assert chunk({"x": jax.ShapeDtypeStruct((100, 10**5), jnp.float32)}) == 1_024  # at least
  assert chunk(None) == 1_024  # no rows to size by
  assert chunk(images, 300) == 300  # the caller's chunk


def test_a_full_pass_over_data_on_disk_reads_the_chunk_of_the_same_data_in_memory(tmp_path):
  """An array on the host is a pytree whose leaf is its handle: sized by that, a pass over
  10^7 rows on disk read 1,024 rows a callback, and joint SVRG's refresh took 11 s
  (1.7 s in chunks of 16,384)."""
  x = np.zeros((3_000, 8), np.float32)
  np.save(tmp_path / "x.npy", x)
  wide = np.zeros((3_000, 4_096), np.float32)
  np.save(tmp_path / "wide.npy", wide)
  chunk = dsgrad.tables.full_pass_chunk
  assert chunk({"x": dsgrad.data.open_memmap(tmp_path / "x.npy")}) == chunk({"x": x}) == 16_384
  assert chunk({"x": dsgrad.data.open_memmap(tmp_path / "wide.npy")}) == chunk({"x": wide}) \
      == 64 * 2**20 // (4 * 4_096)


def test_joint_svrg_refresh_is_the_same_mean_in_any_chunks(logreg_model):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  params = dsgrad.meanfield_init(logreg_model, 0.1, -1.0)
  idx = jnp.arange(5, dtype=jnp.int32)
  noise = objective.sample_noise(jax.random.key(0), 5)
  grads = objective.grad(params, idx, noise)
  means = []
  for chunk in (None, 7, 1024):
    tx = dsgrad.joint_svrg(objective, chunk_size=chunk)
    state = tx.update(grads, tx.init(params), params, indices=idx, noise=noise,
                      objective=objective)[1]
    means.append(state.snapshot_mean)
  chex.assert_trees_all_close(means[0], means[1], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(means[0], means[2], rtol=1e-5, atol=1e-6)


def test_joint_svrg_refreshes_once_an_epoch_by_default(logreg_model):
  """Without ``every``, the snapshot moves at update ``N // B`` (the paper's one refresh an
  epoch) and not before; a given ``every`` still sets the period."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  batch = 7
  period = objective.num_data // batch
  params = dsgrad.meanfield_init(logreg_model, 0.0, -1.0)

  def snapshots(estimator, steps):
    opt = optax.chain(estimator, optax.sgd(1e-3))
    state, p, moved = opt.init(params), params, []
    for t in range(steps):
      indices = jax.random.randint(jax.random.key(t), (batch,), 0, objective.num_data)
      noise = objective.sample_noise(jax.random.key(1000 + t), batch)
      grads = objective.grad(p, indices, noise)
      before = state[0].snapshot
      updates, state = opt.update(grads, state, p, indices=indices, noise=noise)
      p = optax.apply_updates(p, updates)
      moved.append(bool(jnp.any(state[0].snapshot["loc"] != before["loc"])))
    return [t for t, m in enumerate(moved) if m]

  assert snapshots(dsgrad.joint_svrg(objective), period + 2) == [period]
  assert snapshots(dsgrad.joint_svrg(objective, every=5), 11) == [5, 10]
