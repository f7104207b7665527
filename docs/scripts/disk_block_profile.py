"""Where a step on memory-mapped rows spends its time: the scale suite's MLP (10^6 rows)
under ``dsgrad.fit``, naive with Adam, 30,000 steps a call (30 blocks of 1,000 steps read
ahead), in memory and from ``.npy`` files, with the time of each host-side part of a
block summed per call: asking for the next block's rows (``RowReader.submit``), waiting
for them (``take``), reading them on the reader's thread (``read_rows``), the epoch
orders (``window``) and the checks (``_settle``). Run from the project root, pinned to one
core as ``benchmarks disk-step`` is:

    PYTHONPATH=. taskset -c 0 python docs/scripts/disk_block_profile.py [DIR]

``DIR`` (default ``/tmp/dsgrad-disk-step``) holds the ``.npy`` files; they are written if
missing.
"""
import collections
import sys
import time

import jax
import optax

import dsgrad
from benchmarks import scale_models, scale_suite
from dsgrad.training import batching, host_data, segments

seconds, calls = collections.defaultdict(float), collections.Counter()


def timed(owner, name, label):
  real = getattr(owner, name)

  def wrapper(*args, **kwargs):
    started = time.perf_counter()
    try:
      return real(*args, **kwargs)
    finally:
      seconds[label] += time.perf_counter() - started
      calls[label] += 1

  setattr(owner, name, wrapper)


timed(host_data.RowReader, "submit", "submit")
timed(host_data.RowReader, "take_pending", "take")
timed(host_data, "read_rows", "read_rows (reader's thread)")
timed(batching.EpochOrders, "window", "window")
timed(segments.SegmentRunner, "_settle", "_settle")

model = scale_models.BUILDERS["mlp"](num_data=1_000_000)
disk = scale_models.on_disk(model, sys.argv[1] if len(sys.argv) > 1 else "/tmp/dsgrad-disk-step")
params = scale_suite._initial_params(model.dim)
STEPS, REPEATS = 30_000, 3
for where, objective in (("memory", model.objective), ("disk", disk.objective)):
  optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-3))
  state = optimizer.init(params)
  scale_suite._timed_fit(objective, optimizer, params, jax.random.key(0), 3000, 100, state)
  seconds.clear()
  calls.clear()
  for _ in range(REPEATS):
    elapsed = scale_suite._timed_fit(objective, optimizer, params, jax.random.key(0), STEPS,
                                     100, state)[1]
    print(f"{where}: {elapsed / STEPS * 1e6:.1f} us a step", flush=True)
  for label, total in seconds.items():
    print(f"  {label}: {total / REPEATS * 1e3:.1f} ms per call of {STEPS:,} steps "
          f"({calls[label] // REPEATS} times)")
