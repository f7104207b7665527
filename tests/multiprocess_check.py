"""Run by tests/test_parallel.py as 2 processes on one machine (CPU, loopback only).

``python multiprocess_check.py PROCESS_ID NUM_PROCESSES PORT FOLDER``: joins
``jax.distributed`` at 127.0.0.1:PORT, opens the memory-mapped features in FOLDER, splits
the data by datum across the processes (each reads only its rows from disk), trains each
case with ``dsgrad.fit`` on the global mesh and, in process 0, writes the parameters to
``FOLDER/params_<NUM_PROCESSES>.npz``. The test compares them with a one-process run.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "").replace(
    "--xla_force_host_platform_device_count", "--ignored")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import dsgrad  # noqa: E402

N, BATCH, STEPS, DIM = 64, 8, 40, 4


def cases(objective, model):
  """``{name: optimizer}``: the estimators the issue names."""
  taylor = dsgrad.approx.gaussian_mean_taylor(model)
  return {
      "naive": optax.chain(dsgrad.naive(), optax.adam(1e-2)),
      "cv": optax.chain(dsgrad.cv(objective, taylor), optax.adam(1e-2)),
      "joint_saga": optax.chain(dsgrad.joint_saga(
          objective, dsgrad.approx.logistic_probit(model)), optax.adam(1e-2)),
      "joint_svrg": optax.chain(dsgrad.joint_svrg(objective, taylor, every=N // BATCH),
                                optax.adam(1e-2)),
  }


def problem(folder):
  features = dsgrad.data.open_memmap(os.path.join(folder, "x.npy"), dtype=np.float32)
  labels = np.load(os.path.join(folder, "y.npy"))
  model = dsgrad.models.logistic_regression(features, labels)
  return model, dsgrad.meanfield_gaussian(model)


def train(objective, model, mesh):
  out = {}
  for name, optimizer in cases(objective, model).items():
    result = dsgrad.fit(objective, optimizer, dsgrad.meanfield_init(model, 0.1, -1.0),
                        jax.random.key(3), num_steps=STEPS, batch_size=BATCH,
                        eval_every=STEPS // 2, elbo_samples=0, progress=False, mesh=mesh)
    for key, value in result.params.items():
      out[f"{name}/{key}"] = np.asarray(value)  # replicated: every process has it all
    if mesh is not None and name == "joint_saga":  # the table is split by datum too
      table = jax.tree.leaves(result.opt_state[0].table)
      assert table and all(len(t.addressable_shards) == 1 and
                           t.addressable_shards[0].data.shape[0] * jax.process_count() == N
                           for t in table), [t.sharding for t in table]
  return out


def main():
  process_id, num_processes, port, folder = (int(sys.argv[1]), int(sys.argv[2]),
                                             int(sys.argv[3]), sys.argv[4])
  if num_processes > 1:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=60)
  assert jax.process_count() == num_processes, jax.process_count()
  model, objective = problem(folder)
  mesh = dsgrad.training.parallel.data_mesh() if num_processes > 1 else None
  if mesh is not None:
    objective = dsgrad.training.parallel.shard_data(objective, mesh)
    x = objective.data_tree()["x"]
    assert len(x.addressable_shards) == 1 and not x.is_fully_addressable, x.sharding
    local = x.addressable_shards[0].index[0]
    assert (local.stop - local.start) * num_processes == N, local  # only its own rows
    expected = np.load(os.path.join(folder, "x.npy"))[local]
    np.testing.assert_array_equal(np.asarray(x.addressable_shards[0].data), expected)
    # Bad input: 2 processes cannot split an odd number of data.
    odd_x = np.asarray(np.load(os.path.join(folder, "x.npy")))[:N - 1]
    odd_model = dsgrad.models.logistic_regression(odd_x, np.load(os.path.join(folder,
                                                                               "y.npy"))[:N - 1])
    try:
      dsgrad.training.parallel.shard_data(dsgrad.meanfield_gaussian(odd_model), mesh)
    except ValueError as error:
      assert "do not split evenly across 2 devices (2 processes)" in str(error), error
    else:
      raise AssertionError("63 data were split across 2 processes")
  params = train(objective, model, mesh)
  if process_id == 0:
    np.savez(os.path.join(folder, f"params_{num_processes}.npz"), **params)
  print(f"ok process {process_id} of {num_processes}", flush=True)
  if num_processes > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main()
