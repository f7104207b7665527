"""One-off: gradient variance split by parameter block (loc / log_scale) at each estimator's
endpoint on Sonar and Australian (step size 5e-4, seed 0, 10,000 iterations, 4,000 draws),
with V_eps split the same way at joint_taylor2's endpoint, and joint_taylor2 once more with
a *fresh* table (every row equal to the endpoint's params: no staleness, only the
approximation's error). Run from the project root: ``python docs/scripts/variance_blocks.py``.
Results are quoted in docs/benchmarks.md."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from benchmarks import _grid, paper
from dsgrad.diagnostics import estimator_samples

for ds in ("sonar", "australian"):
  model, obj = paper._uci_problem(ds, "../shared/data")
  p0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  d = model.latent_dim
  out = {}
  for name in ("naive", "cv", "inc", "joint", "joint_taylor2"):
    est = paper._estimator(name, obj, model, model.num_data // 5)
    train = _grid.trainer(lambda lr, est=est: optax.chain(est, optax.sgd(lr)), obj, p0, 5, 10000, 1, keep_states=True)
    (params, states), _ = jax.jit(train)(5e-4, jax.random.key(0))
    p = jax.tree.map(lambda a: a[0], params); s = jax.tree.map(lambda a: a[0], states)

    def blocks(state, key=10):
      x = np.asarray(estimator_samples(est, state, p, obj, jax.random.key(key), 4000, 5), np.float64)
      v = x.var(0, ddof=1)
      return v[:d].sum(), v[d:].sum()   # ravel order: loc, log_scale

    out[name] = blocks(s[0])
    if name == "joint_taylor2":
      fresh = est.init(p)._replace(count=jnp.asarray(10**6, jnp.int32))  # past warm-up
      out["joint_taylor2 (fresh table)"] = blocks(fresh)
      # V_eps split at joint_taylor2's params: full-data gradient over noise
      idx = jnp.arange(obj.num_data)
      g = jax.vmap(lambda k: jax.flatten_util.ravel_pytree(obj.grad(p, idx, obj.sample_noise(k, obj.num_data), validate=False))[0])(jax.random.split(jax.random.key(5), 500))
      ve = np.asarray(g, np.float64).var(0, ddof=1)
      out["V_eps"] = (ve[:d].sum(), ve[d:].sum())
  print(ds, {k: (f"{a:.3g}", f"{b:.3g}") for k, (a, b) in out.items()}, flush=True)
