"""Where the two-thread gradient's time goes: the plain-JAX mini-batch gradient of the
hierarchical model (``benchmarks/_plain_hierarchical.py``, the program ``python -m
benchmarks two-threads`` times) traced with JAX's profiler, its compiled loops' time
summed by name, and which of them XLA split over threads. Run it twice from the project root, each in a fresh process, to compare:

    PYTHONPATH=. python docs/scripts/split_loop_profile.py          # XLA on every core
    PYTHONPATH=. python docs/scripts/split_loop_profile.py pool     # dsgrad.pin_xla_threads(1)
"""
import collections
import glob
import re
import sys
import tempfile

if sys.argv[1:] == ["pool"]:
  import dsgrad
  dsgrad.pin_xla_threads(1)

import jax
from jax._src.lib import _profile_data  # JAX's reader of its own trace files

from benchmarks import _plain_hierarchical as plain

calls = 10
model = plain.build(num_data=200_000, groups=20_000, batch=1000)
gradient, params, idx = plain.gradient(model), model.params, model.idx
text = gradient.lower(params, idx, jax.random.key(0)).compile().as_text()
split = set(re.findall(r"%([\w.-]+) = [^\n]*outer_dimension_partitions", text))
jax.block_until_ready(gradient(params, idx, jax.random.key(0)))
with tempfile.TemporaryDirectory() as folder:
  with jax.profiler.trace(folder):
    for i in range(calls):
      result = gradient(params, idx, jax.random.key(i))
    jax.block_until_ready(result)
  trace = _profile_data.ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb",
                                                         recursive=True)[0])
total = collections.Counter()
for plane in trace.planes:
  for line in plane.lines:
    if "XLAEigen" in line.name or "PjRtCpuClient" in line.name:
      for event in line.events:
        if "ThunkExecutor" not in event.name:
          total[event.name] += event.duration_ns
print(f"{len(split)} loops split over threads; ms a call in each compiled loop (top 5):")
for name, ns in total.most_common(5):
  print(f"  {ns / calls / 1e6:8.3f}  {name}{'  (split)' if name in split else ''}")
