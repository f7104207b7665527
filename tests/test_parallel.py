"""Multi-device training: 1-device and 4-device runs give the same parameters and states.

JAX fixes its device count when it starts, so the check runs in a fresh process with 4
virtual CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``): see
``tests/multidevice_check.py`` for the cases (naive, dense/logit/sparse SAGA tables, SVRG,
SMISO; shared and per-datum noise) and the layout checks (tables split by datum,
everything else replicated; uneven batches and tables refused).
"""

import os
import subprocess
import sys

import jax
import pytest

import dsgrad
from dsgrad import parallel


def test_one_and_four_devices_agree():
  script = os.path.join(os.path.dirname(__file__), "multidevice_check.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env,
                        timeout=900)
  assert done.returncode == 0, done.stdout + done.stderr[-4000:]
  assert done.stdout.count("ok  ") == 7, done.stdout


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
