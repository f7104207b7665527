"""``python -m benchmarks bridge-cost`` compares ways of writing one log density: every
row must be that density, or its ratios compare different work."""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bridge_cost


def test_every_row_is_the_same_log_density_and_the_table_has_each_row():
  objectives, dim = bridge_cost.objectives(400, 16)
  params = {"loc": 0.3 * jax.random.normal(jax.random.key(0), (dim,)),
            "log_scale": jnp.full(dim, -1.0)}
  indices = jnp.arange(16, dtype=jnp.int32)
  values = {}
  for name, objective in objectives.items():
    noise = objective.sample_noise(jax.random.key(1), 16)
    with objective.bound():
      values[name] = float(jnp.sum(objective.loss(params, indices, noise)))
  reference = values[bridge_cost.HAND]
  for name, value in values.items():
    np.testing.assert_allclose(value, reference, rtol=1e-4, err_msg=name)
  seconds = bridge_cost.run(num_data=400, batch_size=16, steps=3, rounds=1, log=False)
  table = bridge_cost.format_table(seconds, dict(num_data=400, batch_size=16, steps=3,
                                                 rounds=1))
  assert set(seconds) == set(objectives) and all(s > 0 for s in seconds.values())
  assert "| hand-written log density |" in table and "| 1.00x |" in table
