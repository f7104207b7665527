"""Where the two-thread gradient's time goes: the plain-JAX mini-batch gradient of the
hierarchical model (the program of ``python -m benchmarks two-threads``) traced with JAX's
profiler, its compiled loops' time summed by name, and which of them XLA split over
threads. Run it twice from the project root, each in a fresh process, to compare:

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
import jax.numpy as jnp
import numpy as np
from jax._src.lib import _profile_data  # JAX's reader of its own trace files
from jax.flatten_util import ravel_pytree

num_data, groups, batch, calls = 200_000, 20_000, 1000, 10
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((num_data, 8), dtype=np.float32))
g = jnp.asarray(rng.integers(0, groups, num_data).astype(np.int32))
y = jnp.asarray((rng.random(num_data) < 0.5).astype(np.float32))
latent = {"beta": jnp.zeros(8), "mu": jnp.zeros(3), "log_tau": jnp.zeros(3),
          "raw": jnp.zeros((groups, 3))}
flat, unravel = ravel_pytree(latent)
d = flat.size


def loss(params, idx, eps):
  zf = params["loc"] + jnp.exp(params["log_scale"]) * eps
  z = unravel(zf)
  ab = z["mu"] + jnp.exp(z["log_tau"]) * z["raw"][g[idx]]
  xr = x[idx]
  logit = xr @ z["beta"] + ab[:, 0] + ab[:, 1] * xr[:, 0] + ab[:, 2] * xr[:, 1]
  return (-num_data * jnp.mean(y[idx] * logit - jax.nn.softplus(logit))
          + 0.5 * jnp.sum(zf ** 2) - jnp.sum(params["log_scale"]))


gradient = jax.jit(lambda params, idx, key: jax.grad(loss)(params, idx,
                                                           jax.random.normal(key, (d,))))
params = {"loc": jnp.zeros(d), "log_scale": jnp.full(d, -2.0)}
idx = jnp.arange(batch)
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
