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
import warnings, jax, optax
x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  dsgrad.fit(objective, optax.adam(1e-2), dsgrad.meanfield_init(objective), jax.random.key(1),
             num_steps=4, batch_size=10, elbo_samples=0, progress=False)
warned = [str(w.message) for w in caught]
again = sorted(dsgrad.pin_xla_threads(1))  # as pinned: nothing to change
try:
  dsgrad.pin_xla_threads(2)
  other = None
except (RuntimeError, ValueError) as error:  # ValueError: a machine of one core
  other = str(error)
print(json.dumps(dict(before=before, chosen=chosen, after=sorted(os.sched_getaffinity(0)),
                      total=total, threads=threads, again=again, other=other,
                      warned=warned)))
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
  # A second call as the first returns its cores; another cannot resize a pool that has
  # started, and says so.
  assert out["again"] == out["chosen"]
  if len(out["before"]) > 1:
    assert "already started" in out["other"] and "pin_xla_threads(1)" in out["other"]
  assert out["warned"] == []                    # a pool sized by the caller is not warned of


UNPINNED = r"""
import json, os, warnings
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])  # a 2-core machine
import jax, optax, dsgrad
x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  for _ in range(2):
    dsgrad.fit(objective, optax.adam(1e-2), dsgrad.meanfield_init(objective),
               jax.random.key(1), num_steps=4, batch_size=10, elbo_samples=0, progress=False)
print(json.dumps([(w.category.__name__, str(w.message), os.path.basename(w.filename))
                  for w in caught]))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: no pool to split")
def test_a_pool_split_over_a_small_machine_is_warned_of_once_naming_the_remedy():
  """A real split: XLA's pool, counted by its threads' names, in a fresh process
  narrowed to 2 cores."""
  warned = _run(UNPINNED)
  warned = [w for w in warned if w[0] == "SplitPoolWarning" or "Split" in w[1]]
  assert len(warned) == 1, warned               # several fits, one warning a process
  category, message, where = warned[0]
  assert category == "SplitPoolWarning"
  assert "2 threads on this 2-core machine" in message
  assert "dsgrad.pin_xla_threads(1)" in message
  assert where == "<string>"                    # the caller's line, not dsgrad's


@pytest.mark.parametrize("entry", ["recommend", "run_chain", "sample"])
def test_every_entry_warns_once_at_the_users_line_through_any_depth_of_dsgrad(
    entry, monkeypatch):
  """recommend (whose race and fit call fit again), an SGLD chain and HMC-ECS's sampler
  (through run_chain and the argument checks) warn of a split pool once, at the line that
  called them (sample's pointed inside dsgrad/mcmc/sample.py). The pool's detection is
  the subprocess test's; here it is stood in for."""
  import warnings
  import jax
  import optax
  threads = dsgrad.training.cpu_threads
  monkeypatch.setattr(threads, "_warned", False)
  monkeypatch.setattr(threads, "split_pool_message", lambda *args: "split pool")
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 2)
  model = dsgrad.models.logistic_regression(x, y)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if entry == "recommend":
      objective = dsgrad.meanfield_gaussian(model)
      dsgrad.recommend(objective, lambda n: optax.adam(1e-2), dsgrad.meanfield_init(objective),
                       jax.random.key(1), batch_size=10, budget=1.0, progress=False).fit(
                           progress=False)
    elif entry == "run_chain":
      theta = jax.numpy.zeros(2)
      algorithm = dsgrad.mcmc.sgld(model, dsgrad.mcmc.taylor_proxy(model, theta),
                                   step_size=1e-3, subsample_size=10)
      for _ in range(2):
        dsgrad.mcmc.run_chain(jax.random.key(2), algorithm.step, algorithm.init(theta, None),
                              4, progress=False)
    else:
      dsgrad.mcmc.sample(jax.random.key(1), model, num_samples=2, num_warmup=2,
                         subsample_size=20, num_blocks=2, reference_updates_every=0,
                         progress=False)
  split = [w for w in caught if w.category is threads.SplitPoolWarning]
  assert len(split) == 1 and split[0].filename == __file__, [
      (w.category.__name__, w.filename) for w in caught]


def test_only_a_cpu_pool_of_several_threads_on_a_small_machine_is_warned_of():
  message = dsgrad.training.cpu_threads.split_pool_message
  assert "pin_xla_threads(1)" in message(2, 2, "cpu")
  assert message(1, 2, "cpu") is None           # narrowed: nothing to split
  assert message(16, 16, "cpu") is None         # a larger machine: not measured here
  assert message(2, 2, "gpu") is None           # the GPU's steps do not run on the pool


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
