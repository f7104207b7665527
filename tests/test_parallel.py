"""Multi-device training: 1-device and 4-device runs give the same parameters and states.

JAX fixes its device count when it starts, so the check runs in a fresh process with 4
virtual CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``): see
``tests/multidevice_check.py`` for the cases (naive, dense/logit/sparse SAGA tables, SVRG,
SMISO; shared and per-datum noise) and the layout checks (tables split by datum,
everything else replicated; uneven batches and tables refused).
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import dsgrad
from dsgrad.training import parallel


# The other three cases (a snapshot with per-datum noise, the logit table, SMISO) shard
# as the default's states do: -m slow (15 s).
@pytest.mark.parametrize("which, lines", [
    ("default", 4), pytest.param("rest", 3, marks=pytest.mark.slow)])
def test_one_and_four_devices_agree(which, lines):
  script = os.path.join(os.path.dirname(__file__), "multidevice_check.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, script, which], capture_output=True, text=True,
                        env=env, timeout=900)
  assert done.returncode == 0, done.stdout + done.stderr[-4000:]
  assert done.stdout.count("ok  ") == lines, done.stdout


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


# Slow (27 s): the four-device test checks the same sharded program in one process.
@pytest.mark.slow
def test_two_processes_compute_what_one_process_does(tmp_path):
  """``jax.distributed`` with 2 CPU processes over loopback: the data split by datum across
  the processes (each reads only its rows of a memory-mapped file), the batch and the
  tables too; naive, cv, joint SAGA and joint SVRG end at one process's parameters."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 64, 4)
  np.save(tmp_path / "x.npy", x.astype(np.float32))
  np.save(tmp_path / "y.npy", y)
  script = os.path.join(os.path.dirname(__file__), "multiprocess_check.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu")  # one device per process: no device count
  env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in flag)
  port = _free_port()
  workers = [subprocess.Popen([sys.executable, script, str(i), "2", str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for i in range(2)]
  try:
    outputs = [w.communicate(timeout=400) for w in workers]
  finally:
    for w in workers:  # bounded in time: never leave a process behind
      if w.poll() is None:
        w.kill()
        w.wait()
  for w, (out, err) in zip(workers, outputs):
    assert w.returncode == 0, out + err[-4000:]
  one = subprocess.run([sys.executable, script, "0", "1", "0", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=400)
  assert one.returncode == 0, one.stdout + one.stderr[-4000:]
  two, single = np.load(tmp_path / "params_2.npz"), np.load(tmp_path / "params_1.npz")
  assert sorted(two.files) == sorted(single.files) and len(two.files) == 8, two.files
  for name in single.files:
    np.testing.assert_allclose(two[name], single[name], rtol=1e-4, atol=1e-5, err_msg=name)
  start = dsgrad.meanfield_init(dsgrad.models.logistic_regression(x, y), 0.1, -1.0)
  for estimator in ("naive", "cv", "joint_saga", "joint_svrg"):
    assert np.max(np.abs(single[f"{estimator}/loc"] - start["loc"])) > 1e-2, estimator


def test_state_shardings_on_one_device(logreg_model, params0):
  """In-process (one device): tables get the datum-split spec, the rest replication."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  mesh = parallel.data_mesh(jax.devices()[:1])
  state = dsgrad.joint_saga(objective).init(params0)
  shardings = parallel.state_shardings(mesh, state)
  assert shardings.table["loc"].spec == jax.sharding.PartitionSpec("data")
  assert shardings.running_mean["loc"].spec == jax.sharding.PartitionSpec()
  assert shardings.count.spec == jax.sharding.PartitionSpec()


def test_not_a_data_mesh_is_refused(logreg_model, params0):
  mesh = jax.sharding.Mesh(jax.devices()[:1], ("batch",))
  with pytest.raises(ValueError, match="data_mesh"):
    parallel.state_shardings(mesh, dsgrad.naive().init(params0))
