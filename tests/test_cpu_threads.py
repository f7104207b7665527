"""dsgrad.pin_xla_threads: XLA's threads on the chosen cores, the caller on all of them.

Each case runs in a fresh process: the helper acts only before JAX's backends start."""

import json
import os
import subprocess
import sys

import pytest

import dsgrad

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="thread affinity is Linux's")

CHILD = r"""
import glob, json, os
before = sorted(os.sched_getaffinity(0))
import dsgrad
chosen = sorted(dsgrad.pin_xla_threads(1))
import jax.numpy as jnp
total = float(jnp.arange(4.0).sum())
threads = {}
for task in glob.glob("/proc/self/task/*"):
  with open(task + "/comm") as f:
    name = f.read().strip()
  threads.setdefault(name, []).append(sorted(os.sched_getaffinity(int(os.path.basename(task)))))
try:
  dsgrad.pin_xla_threads(1)
  again = None
except RuntimeError as error:
  again = str(error)
print(json.dumps(dict(before=before, chosen=chosen, after=sorted(os.sched_getaffinity(0)),
                      total=total, threads=threads, again=again)))
"""


def _run(code):
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, env=dict(os.environ, XLA_FLAGS=""))
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_xla_threads_run_on_the_chosen_core_and_every_other_thread_on_all():
  out = _run(CHILD)
  assert out["chosen"] == out["before"][:1]
  assert out["after"] == out["before"]          # the caller's own mask is given back
  assert out["total"] == 6.0                    # the backend computes
  pools = out["threads"].get("tf_XLAEigen")     # XLA's intra-op pool, named by TSL
  assert pools, f"no XLA pool thread found among {sorted(out['threads'])}"
  assert all(mask == out["chosen"] for mask in pools)
  if len(out["before"]) > 1:                    # one core: nothing to narrow
    assert len(pools) == 1                      # the pool is sized by the narrowed mask
  # The client's other threads (dispatch, compiles) are given every core back.
  others = [mask for name, masks in out["threads"].items() if name != "tf_XLAEigen"
            for mask in masks]
  assert others and all(mask == out["before"] for mask in others)
  # A second call cannot resize a pool that has started, and says so.
  assert "already started" in out["again"]


@pytest.mark.parametrize("cores", [0, -1, 1.0, True, "1", 10**6])
def test_cores_outside_the_process_mask_are_refused(cores):
  with pytest.raises(ValueError, match="cores must be an integer"):
    dsgrad.pin_xla_threads(cores)


def test_after_jax_has_started_the_call_is_refused():
  # This test process has run JAX already (other tests, or the array below).
  import jax.numpy as jnp
  jnp.zeros(1).block_until_ready()
  with pytest.raises(RuntimeError, match="call it first in the program"):
    dsgrad.pin_xla_threads(1)
