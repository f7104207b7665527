"""Saving and restoring training state mid-run continues bit-identically."""

import os

import chex
import jax.numpy as jnp
import jax
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.training import checkpoint
from dsgrad.training.batching import sample_batch
from conftest import BATCH


def _trainer(objective, opt):
  @jax.jit
  def step(params, state, key):
    indices, noise = sample_batch(key, objective, BATCH, replace=False)
    grads = objective.grad(params, indices, noise)
    updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    return optax.apply_updates(params, updates), state
  return step


@pytest.mark.parametrize("shared_noise", [True, False])
def test_joint_saga_resume_is_bit_identical(logreg_model, params0, tmp_path, shared_noise):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  opt = optax.chain(dsgrad.joint_saga(objective, warmup_steps=3), optax.adam(1e-2))
  step = _trainer(objective, opt)
  keys = jax.random.split(jax.random.key(0), 30)

  params, state = params0, opt.init(params0)
  for i, k in enumerate(keys):
    params, state = step(params, state, k)
    if i == 14:
      dsgrad.training.checkpoint.save(tmp_path / "ckpt.msgpack", (params, state))
  uninterrupted = (params, state)

  like = (params0, opt.init(params0))
  params, state = dsgrad.training.checkpoint.restore(tmp_path / "ckpt.msgpack", like)
  assert isinstance(state[0], dsgrad.JointSagaState)
  for k in keys[15:]:
    params, state = step(params, state, k)
  chex.assert_trees_all_equal((params, state), uninterrupted)


def test_restore_errors(logreg_model, params0, tmp_path):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  state = dsgrad.joint_saga(objective).init(params0)
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    dsgrad.training.checkpoint.restore(tmp_path / "missing", state)
  path = tmp_path / "ckpt"
  dsgrad.training.checkpoint.save(path, state)
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])  # truncated
  with pytest.raises(ValueError, match="corrupt"):
    dsgrad.training.checkpoint.restore(path, state)
  path.write_bytes(b"not a checkpoint at all")
  with pytest.raises(ValueError, match="corrupt"):
    dsgrad.training.checkpoint.restore(path, state)
  dsgrad.training.checkpoint.save(path, state)
  other = state._replace(table=jax.tree.map(lambda t: t[:10], state.table))
  with pytest.raises(ValueError, match="shape"):
    dsgrad.training.checkpoint.restore(path, other)


def test_orbax_round_trip(logreg_model, params0, tmp_path):
  """Estimator states are plain pytrees: orbax (a flax dependency) saves them too."""
  import orbax.checkpoint as ocp
  objective = dsgrad.meanfield_gaussian(logreg_model)
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  state = opt.init(params0)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "orbax", state)
  checkpointer.wait_until_finished()
  restored = checkpointer.restore(tmp_path / "orbax", opt.init(params0))
  chex.assert_trees_all_equal(restored, state)
  assert isinstance(restored[0], dsgrad.JointSagaState)


def test_a_flipped_byte_is_refused_by_the_checksum(tmp_path):
  """a damaged payload used to restore silently with a wrong value."""
  tree = {"w": np.arange(64, dtype=np.float32)}
  path = tmp_path / "ckpt"
  dsgrad.training.checkpoint.save(path, tree)
  data = bytearray(path.read_bytes())
  data[-40] ^= 0x01  # a bit inside the float payload, far from the msgpack framing
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="checksum does not match"):
    dsgrad.training.checkpoint.restore(path, tree)
  with pytest.raises(ValueError, match="checksum does not match"):
    dsgrad.training.checkpoint.restore_raw(path)


def test_a_file_without_checksum_is_refused_unless_asked_for(tmp_path):
  """Checkpoints written before the checksum existed cannot be verified: refused by
  default, restored with a warning when the caller passes allow_unverified=True."""
  from flax import serialization
  tree = {"w": np.arange(4, dtype=np.float32)}
  path = tmp_path / "old"
  path.write_bytes(serialization.to_bytes(tree))
  with pytest.raises(ValueError, match="no dsgrad header and checksum"):
    dsgrad.training.checkpoint.restore(path, tree)
  with pytest.warns(UserWarning, match="no checksum"):
    restored = dsgrad.training.checkpoint.restore(path, tree, allow_unverified=True)
  np.testing.assert_array_equal(restored["w"], tree["w"])


def test_template_dtype_and_keys_must_match(tmp_path):
  """a template of another dtype used to get float32 silently, and a
  template without a saved key silently dropped it."""
  path = tmp_path / "ckpt"
  dsgrad.training.checkpoint.save(path, {"w": np.zeros(3, np.float32), "b": np.zeros((), np.float32)})
  with pytest.raises(ValueError, match=r"entry \['w'\] was saved as float32 where the "
                                       r"template has float64"):
    dsgrad.training.checkpoint.restore(path, {"w": np.zeros(3, np.float64),
                                     "b": np.zeros((), np.float32)})
  with pytest.raises(ValueError, match=r"it holds \['b'\] which the template lacks"):
    dsgrad.training.checkpoint.restore(path, {"w": np.zeros(3, np.float32)})
  with pytest.raises(ValueError, match=r"the template expects \['c'\] which it lacks"):
    dsgrad.training.checkpoint.restore(path, {"w": np.zeros(3, np.float32),
                                     "b": np.zeros((), np.float32),
                                     "c": np.zeros(2, np.float32)})


def test_a_killed_save_leaves_no_orphan_after_the_next_save(tmp_path):
  """``kill -9`` during a save left its temporary file forever. The next
  save to the same path removes temporaries whose writer is dead, and only those."""
  import subprocess
  import sys
  path = tmp_path / "run.ckpt"
  # A real kill -9 mid-write: a child writes a large temporary file and is killed.
  prefix = dsgrad.training.checkpoint.temp_prefix(str(path))
  child = subprocess.Popen([sys.executable, "-c", (
      "import os, sys, tempfile, time\n"
      f"fd, tmp = tempfile.mkstemp(dir={str(tmp_path)!r}, "
      f"prefix={prefix!r} + str(os.getpid()) + '-')\n"
      "os.write(fd, b'x' * 1_000_000); print(tmp, flush=True); time.sleep(60)\n")],
      stdout=subprocess.PIPE, text=True)
  orphan = child.stdout.readline().strip()
  child.kill()
  child.wait(timeout=10)
  # A temporary of a process that still runs (this test's parent) must stay.
  alive = tmp_path / f"{prefix}{os.getppid()}-inprogress"
  alive.write_bytes(b"y")
  # A temporary from another host (same pid space on a shared file system) must stay.
  elsewhere = tmp_path / f".run.ckpt.tmp-00000000-{os.getpid() + 10**6}-x"
  elsewhere.write_bytes(b"z")
  assert os.path.exists(orphan)
  dsgrad.training.checkpoint.save(path, {"w": np.ones(2, np.float32)})
  assert not os.path.exists(orphan)
  assert alive.exists() and elsewhere.exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      [alive.name, elsewhere.name, "run.ckpt"])


def test_a_state_of_the_earlier_adaptive_weight_layout_is_refused_saying_why(
    logreg_model, params0, tmp_path):
  """Before the adaptive weight kept params-shaped moments it kept per-leaf scalar ones;
  such a checkpoint is refused with that reason, not loaded into the wrong layout."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  state = opt.init(params0)
  moments = state[0].control_weight
  scalars = lambda tree: jax.tree.map(lambda p: jnp.zeros([], p.dtype), tree)  # noqa: E731
  old = moments._replace(weight=scalars(params0), cross=scalars(params0),
                         control_sq=scalars(params0))
  path = str(tmp_path / "old")
  checkpoint.save(path, (state[0]._replace(control_weight=old),) + tuple(state[1:]))
  with pytest.raises(ValueError, match="written by an earlier dsgrad"):
    checkpoint.restore(path, state)


@pytest.mark.parametrize("which", ["params", "opt_state"])
def test_a_non_finite_state_is_not_saved_over_a_good_checkpoint(params0, tmp_path, which):
  # Saved periodically to one path, a run whose params became NaN replaced its last good
  # checkpoint with one no run can continue from.
  optimizer = optax.adam(1e-2)
  state = optimizer.init(params0)
  path = tmp_path / "run.ckpt"
  dsgrad.save_fit_checkpoint(path, params0, state, 10)
  bad = {"params": (jax.tree.map(lambda v: v.at[0].set(jnp.nan), params0), state),
         "opt_state": (params0, jax.tree.map(lambda v: v * jnp.inf, state))}[which]
  with pytest.raises(ValueError, match=rf"the {which} to save at .* non-finite"):
    dsgrad.save_fit_checkpoint(path, *bad, 20)
  assert dsgrad.restore_fit_checkpoint(path, params0, state)[2] == 10
