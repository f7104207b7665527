"""A program compiled beside a run, per way of placing XLA's threads: joint SVRG's fit
program on the scale suite's hierarchical model compiled in a thread (as
``dsgrad.recommend`` compiles its candidates) while naive's fit trains, against the same
compile alone; and naive's and joint SVRG's steps. One setting per process, from the
project root:

    PYTHONPATH=. python docs/scripts/compile_beside_run.py all      # XLA on every core
    PYTHONPATH=. python docs/scripts/compile_beside_run.py pinned   # the process on one core
    PYTHONPATH=. python docs/scripts/compile_beside_run.py client   # JAX started on one core
    PYTHONPATH=. python docs/scripts/compile_beside_run.py pool     # dsgrad.pin_xla_threads(1)

"client" is what ``pin_xla_threads`` did first: every thread JAX's client starts stays on
the one core, only the caller gets both back.
"""
import concurrent.futures
import os
import sys
import time

setting = sys.argv[1]
every_core = os.sched_getaffinity(0)
if setting in ("pinned", "client"):
  os.sched_setaffinity(0, {min(every_core)})
if setting == "pool":
  import dsgrad
  dsgrad.pin_xla_threads(1)

import jax
import optax

jax.devices()
if setting == "client":
  os.sched_setaffinity(0, every_core)

import dsgrad
from benchmarks import scale_models

model = scale_models.hierarchical()
objective = model.objective
params = dsgrad.families.by_name("meanfield", model.dim, log_scale=0.0).params()  # as published
naive = optax.chain(dsgrad.naive(), optax.adam(1e-3))
svrg = optax.chain(dsgrad.joint_svrg(objective, every=10**9), optax.adam(1e-3))
settings = dict(batch_size=100, elbo_samples=0)


def ms_a_step(optimizer, steps, seed):
  result = dsgrad.fit(objective, optimizer, params, jax.random.key(seed), num_steps=steps,
                      progress=False, **settings)
  return result.timing.steps / steps * 1e3


started = time.perf_counter()
dsgrad.compile_fit(objective, svrg, params, jax.random.key(9), num_steps=3000, **settings)
alone = time.perf_counter() - started
ms_a_step(naive, 500, 0)  # compiled and warm
naive_alone = [ms_a_step(naive, 3000, seed) for seed in range(3)]
with concurrent.futures.ThreadPoolExecutor(1) as thread:
  started = time.perf_counter()
  job = thread.submit(dsgrad.compile_fit, objective, svrg, params, jax.random.key(9),
                      num_steps=3001, **settings)  # another length: compiled anew
  naive_beside = []
  while not job.done():
    naive_beside.append(ms_a_step(naive, 1000, 5))
  beside = time.perf_counter() - started
svrg_steps = [ms_a_step(svrg, 3000, seed) for seed in range(3)]
print(f"{setting}: joint SVRG's program compiled alone in {alone:.2f} s, beside naive's "
      f"run in {beside:.2f} s")
print("  naive ms a step alone: " + ", ".join(f"{m:.3f}" for m in naive_alone)
      + "; while it compiled: " + ", ".join(f"{m:.3f}" for m in naive_beside))
print("  joint SVRG ms a step: " + ", ".join(f"{m:.3f}" for m in svrg_steps))
