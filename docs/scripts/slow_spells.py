"""Slow spells of the machine, counted: the wide GLM's hand-written step (plain JAX, no
dsgrad) in calls of 10,000 steps for a few minutes, each call timed with the kernel's
counters around it (page faults, transparent huge pages, page migration, and the CPU's
user, system, idle and steal time from /proc/stat).

Run from the repository root (two cores; the 4 GB design first, then ``seconds``):

    PYTHONPATH=. python docs/scripts/slow_spells.py [seconds]

It prints the median call, the six slowest with their counters, and three typical ones.
"""

import sys
import time

import dsgrad

dsgrad.pin_xla_threads(1)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import scale_models, scale_suite  # noqa: E402


def counters() -> dict:
  """The kernel's counters (/proc/vmstat), this process's page faults, the CPUs' time."""
  d = {}
  for line in open('/proc/vmstat'):
    k, v = line.split()
    d[k] = int(v)
  st = open('/proc/self/stat').read().split(')')[1].split()
  d['self_minflt'], d['self_majflt'] = int(st[7]), int(st[9])
  cpu = open('/proc/stat').readline().split()[1:]  # jiffies, all CPUs together
  d['cpu_user'], d['cpu_sys'], d['cpu_idle'], d['cpu_steal'] = (
      int(cpu[0]), int(cpu[2]), int(cpu[3]), int(cpu[7]))
  return d


NAMES = ("self_minflt", "self_majflt", "thp_collapse_alloc", "thp_fault_alloc",
         "pgmigrate_success", "compact_stall", "pgfault", "cpu_user", "cpu_sys", "cpu_idle",
         "cpu_steal", "pgscan_kswapd", "pgsteal_kswapd", "nr_anon_transparent_hugepages")
STEPS = 10_000


def show(seconds: float, deltas: dict) -> str:
  return f"{seconds:.3f} s " + " ".join(f"{k}={deltas[k]}" for k in NAMES if deltas.get(k))


def main():
  total = float(sys.argv[1]) if len(sys.argv) > 1 else 240.0
  model = scale_models.BUILDERS["wide_glm"]()
  gradient = scale_suite._hand_gradient(model, 100)
  adam = optax.adam(1e-3)

  @jax.jit
  def run(data, params, state, keys):
    def step(carry, key):
      params, state = carry
      updates, state = adam.update(gradient(data, params, key), state, params)
      return (optax.apply_updates(params, updates), state), None
    return jax.lax.scan(step, (params, state), keys)[0]

  params = scale_suite._initial_params(model.dim)
  state = adam.init(params)
  keys = jax.random.split(jax.random.key(0), STEPS)
  params, state = jax.block_until_ready(run(model.data, params, state, keys))  # compiles
  calls, started = [], time.perf_counter()
  while time.perf_counter() - started < total:
    keys = jax.random.split(jax.random.key(len(calls) + 1), STEPS)
    before, entered = counters(), time.perf_counter()
    params, state = jax.block_until_ready(run(model.data, params, state, keys))
    seconds, after = time.perf_counter() - entered, counters()
    calls.append((seconds, {k: after[k] - before[k] for k in after}))
  times = np.array([seconds for seconds, _ in calls])
  print(f"{len(times)} calls of {STEPS:,} steps: median {np.median(times):.3f} s, "
        f"min {times.min():.3f}, max {times.max():.3f}")
  order = np.argsort(-times)
  print("slowest:")
  for j in order[:6]:
    print(" ", j, show(*calls[j]))
  print("typical:")
  for j in order[len(order) // 2:len(order) // 2 + 3]:
    print(" ", j, show(*calls[j]))


if __name__ == "__main__":
  main()
