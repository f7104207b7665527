"""A user's own model (``objective_from_logdensity``) on memory-mapped data: it trains,
its run equals the in-memory one step for step, and data that do not fit in memory are
refused with the way to keep them on disk."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad

N, GROUPS, D = 1500, 30, 3


def _data():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((N, D)).astype(np.float32)
  g = rng.integers(0, GROUPS, N).astype(np.int32)
  y = (rng.random(N) < 1 / (1 + np.exp(-x[:, 0]))).astype(np.float32)
  return {"x": x, "g": g, "y": y}


def _log_prior(z):
  return -0.5 * (jnp.sum(z["beta"] ** 2) + jnp.sum(z["b"] ** 2))


def _log_lik(z, rows):
  logit = rows["x"] @ z["beta"] + z["b"][rows["g"]]
  return rows["y"] * logit - jax.nn.softplus(logit)


LATENT = {"beta": jnp.zeros(D), "b": jnp.zeros(GROUPS)}


@pytest.mark.parametrize("estimator", ["naive", "joint_svrg"])
def test_memory_mapped_data_train_as_the_same_data_in_memory(tmp_path, estimator):
  data = _data()
  on_disk = {}
  for name, value in data.items():
    np.save(tmp_path / f"{name}.npy", value)
    on_disk[name] = dsgrad.data.open_memmap(tmp_path / f"{name}.npy")
  results = []
  for rows in (data, on_disk):
    # reads= exercises the index column's range check on the memory map too.
    objective = dsgrad.objective_from_logdensity(_log_prior, _log_lik, rows, LATENT,
                                                 reads={"b": "g"})
    transform = (dsgrad.naive() if estimator == "naive"
                 else dsgrad.joint_svrg(objective, every=20))
    params = dsgrad.families.by_name("meanfield", D + GROUPS).params()
    results.append(dsgrad.fit(objective, optax.chain(transform, optax.adam(0.05)), params,
                              jax.random.key(1), num_steps=60, batch_size=25,
                              progress=False, elbo_samples=0))
  memory, disk = results
  start = dsgrad.families.by_name("meanfield", D + GROUPS).params()["loc"]
  assert float(jnp.max(jnp.abs(memory.params["loc"] - start))) > 0.1  # it trained
  for a, b in zip(jax.tree.leaves(memory.params), jax.tree.leaves(disk.params)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_data_larger_than_the_free_memory_name_the_memory_map(monkeypatch):
  monkeypatch.setattr(dsgrad.training.host_data, "free_memory_bytes", lambda: 10_000)  # x: 18,000
  with pytest.raises(MemoryError, match=r"'x'.*dsgrad.data.open_memmap\(path\)"):
    dsgrad.objective_from_logdensity(_log_prior, _log_lik, _data(), LATENT)
