"""Saving and restoring training state mid-run continues bit-identically."""

import chex
import jax
import optax
import pytest

import dsgrad
from dsgrad.diagnostics import sample_batch
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
      dsgrad.checkpoint.save(tmp_path / "ckpt.msgpack", (params, state))
  uninterrupted = (params, state)

  like = (params0, opt.init(params0))
  params, state = dsgrad.checkpoint.restore(tmp_path / "ckpt.msgpack", like)
  assert isinstance(state[0], dsgrad.JointSagaState)
  for k in keys[15:]:
    params, state = step(params, state, k)
  chex.assert_trees_all_equal((params, state), uninterrupted)


def test_restore_errors(logreg_model, params0, tmp_path):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  state = dsgrad.joint_saga(objective).init(params0)
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    dsgrad.checkpoint.restore(tmp_path / "missing", state)
  path = tmp_path / "ckpt"
  dsgrad.checkpoint.save(path, state)
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])  # truncated
  with pytest.raises(ValueError, match="corrupt or does not match"):
    dsgrad.checkpoint.restore(path, state)
  path.write_bytes(b"not a checkpoint at all")
  with pytest.raises(ValueError, match="corrupt or does not match"):
    dsgrad.checkpoint.restore(path, state)
  dsgrad.checkpoint.save(path, state)
  other = state._replace(table=jax.tree.map(lambda t: t[:10], state.table))
  with pytest.raises(ValueError, match="shape"):
    dsgrad.checkpoint.restore(path, other)


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
