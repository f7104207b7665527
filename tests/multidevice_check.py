"""Run by tests/test_parallel.py in a fresh process with 4 virtual CPU devices.

For each case it trains with ``dsgrad.fit`` on no mesh, on a 1-device mesh and on a
4-device mesh, checks that the parameters and estimator states agree to float
tolerance, that tables are split by datum (a quarter of the rows per device) and that
the rest of the state is replicated. Prints one line per case; exits non-zero on the
first failure (the assertion message says which case and what differed).
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import chex  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import dsgrad  # noqa: E402
from dsgrad.training import parallel  # noqa: E402
from dsgrad.models import (logistic_regression, movielens, synthetic_logistic_data,  # noqa: E402
                           synthetic_movielens_data)

N, BATCH, STEPS = 64, 8, 40


def cases():
  x, y, _ = synthetic_logistic_data(jax.random.key(0), N, 4)
  logreg = logistic_regression(x, y)
  users, genres, ratings = synthetic_movielens_data(jax.random.key(1), 6, 20, N, num_genres=4,
                                                    num_classes=3)
  ml = movielens(users, genres, ratings, 6, num_classes=3)
  out = {}
  obj = dsgrad.meanfield_gaussian(logreg)
  out["naive (shared noise)"] = (obj, dsgrad.naive(), logreg)
  out["joint_saga dense (shared noise)"] = (obj, dsgrad.joint_saga(obj), logreg)
  per_datum = dsgrad.meanfield_gaussian(logreg, shared_noise=False)
  out["joint_svrg (per-datum noise)"] = (per_datum, dsgrad.joint_svrg(
      per_datum, every=N // BATCH), logreg)
  out["joint_saga logit table"] = (obj, dsgrad.joint_saga(
      obj, dsgrad.approx.glm_mean_taylor(logreg)), logreg)
  out["smiso"] = (obj, None, logreg)
  obj = dsgrad.meanfield_gaussian(ml, shared_noise=False)
  out["joint_saga sparse table (movielens)"] = (obj, dsgrad.joint_saga(
      obj, dsgrad.approx.sparse_linearize(ml), warmup_steps=4), ml)
  return out


def train(objective, estimator, model, mesh):
  if estimator is None:
    opt = dsgrad.smiso(objective, 1e-3)
  else:
    opt = optax.chain(estimator, optax.adam(1e-2))
  params = dsgrad.meanfield_init(model, 0.1, -1.0)
  return dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=STEPS,
                    batch_size=BATCH, eval_every=STEPS, elbo_samples=0, progress=False,
                    mesh=mesh)


def check_layout(state, mesh, name):
  devices = len(mesh.devices.ravel())
  tables = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    is_table = any(isinstance(k, jax.tree_util.GetAttrKey) and k.name == "table"
                   for k in path)
    if not isinstance(leaf, jax.Array) or leaf.ndim == 0 and is_table:
      continue
    shapes = {s.data.shape for s in leaf.addressable_shards}
    assert len(leaf.addressable_shards) == devices, name
    if is_table and leaf.ndim >= 1 and leaf.shape[0] > 0:
      tables += 1
      assert shapes == {(leaf.shape[0] // devices,) + leaf.shape[1:]}, (name, path, shapes)
    else:
      assert shapes == {leaf.shape}, (name, path, shapes, "should be replicated")
  if tables:
    per_device = parallel.bytes_per_device(
        [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
         if any(isinstance(k, jax.tree_util.GetAttrKey) and k.name == "table" for k in path)])
    assert len(per_device) == devices
    assert all(b * devices == dsgrad.table_bytes(state) for b in per_device.values()), (
        name, per_device, dsgrad.table_bytes(state))
  return tables


# Run by default: a replicated state, a dense table and a sparse one. The rest (a snapshot
# with per-datum noise, the logit table, SMISO) with the argument "rest" (-m slow).
DEFAULT = ("naive (shared noise)", "joint_saga dense (shared noise)",
           "joint_saga sparse table (movielens)")


def main(which: str = "default"):
  assert jax.device_count() == 4, jax.devices()
  one = parallel.data_mesh(jax.devices()[:1])
  four = parallel.data_mesh()
  for name, (objective, estimator, model) in cases().items():
    if (name in DEFAULT) != (which == "default"):
      continue
    single = train(objective, estimator, model, one)
    multi = train(objective, estimator, model, four)
    host = lambda tree: jax.tree.map(np.asarray, tree)  # noqa: E731
    if name == "naive (shared noise)":  # a mesh of one device changes nothing
      plain = train(objective, estimator, model, None)
      chex.assert_trees_all_close(host(single.params), host(plain.params), rtol=1e-6,
                                  atol=1e-6, custom_message=f"{name}: 1-device mesh vs no mesh")
    chex.assert_trees_all_close(host(multi.params), host(single.params), rtol=1e-4, atol=1e-5,
                                custom_message=f"{name}: 4 devices vs 1 device (params)")
    chex.assert_trees_all_close(host(multi.opt_state), host(single.opt_state), rtol=1e-4,
                                atol=1e-4,
                                custom_message=f"{name}: 4 devices vs 1 device (state)")
    moved = float(jnp.max(jnp.abs(jax.flatten_util.ravel_pytree(host(multi.params))[0]
                                  - jax.flatten_util.ravel_pytree(
                                      host(dsgrad.meanfield_init(model, 0.1, -1.0)))[0])))
    assert moved > 1e-3, f"{name}: training did not move the parameters"
    tables = check_layout(multi.opt_state, four, name)
    print(f"ok  {name}: {tables} table(s) split 4 ways, max |params diff| "
          f"{max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(host(multi.params)), jax.tree.leaves(host(single.params)))):.2e}",
          flush=True)

  if which != "default":
    return 0
  # Bad input: a batch or a table that does not split evenly.
  objective, estimator, model = cases()["joint_saga dense (shared noise)"]
  opt = optax.chain(estimator, optax.adam(1e-2))
  params = dsgrad.meanfield_init(model)
  try:
    dsgrad.fit(objective, opt, params, jax.random.key(0), num_steps=2, batch_size=6,
               elbo_samples=0, progress=False, mesh=four)
    raise AssertionError("batch_size 6 on 4 devices should be refused")
  except ValueError as err:
    assert "multiple of 4" in str(err), err
  x, y, _ = synthetic_logistic_data(jax.random.key(0), 50, 4)
  odd = dsgrad.meanfield_gaussian(logistic_regression(x, y))
  try:
    parallel.init_sharded(dsgrad.joint_saga(odd), dsgrad.meanfield_init(odd_model(x, y)), four)
    raise AssertionError("a 50-row table on 4 devices should be refused")
  except ValueError as err:
    assert "50 rows" in str(err), err
  print("ok  uneven batch and table refused")
  return 0


def odd_model(x, y):
  return logistic_regression(x, y)


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:]))
