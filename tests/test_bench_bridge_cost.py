"""``python -m benchmarks bridge-cost`` compares ways of writing one log density: every
row must be that density, or its ratios compare different work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import bridge_cost


# Slow (9 s): each bridge's objective is checked against dsgrad's own in
# test_contrib_numpyro and test_bench_peers; this one checks the benchmark's rows.
@pytest.mark.slow
def test_every_row_is_the_same_log_density_and_the_table_states_each_ratio():
  objectives, dim = bridge_cost.objectives(400, 16)
  params = {"loc": 0.3 * jax.random.normal(jax.random.key(0), (dim,)),
            "log_scale": jnp.full(dim, -1.0)}
  indices = jnp.arange(16, dtype=jnp.int32)
  values = {}
  for name, objective in objectives.items():
    noise = objective.sample_noise(jax.random.key(1), 16)
    values[name] = float(jnp.sum(objective.loss(params, indices, noise)))
  reference = values[bridge_cost.HAND]
  for name, value in values.items():
    np.testing.assert_allclose(value, reference, rtol=1e-4, err_msg=name)
  # The table (timings are the benchmark's own business; running it compiles five scans).
  seconds = {name: 1e-4 * (i + 1) for i, name in enumerate(objectives)}
  table = bridge_cost.format_table(seconds, dict(num_data=400, batch_size=16, steps=3,
                                                 rounds=1))
  assert "| hand-written log density | 0.1000 | 1.00x |" in table
  assert "| bridge, five sites (as in `peers bnn`) | 0.2000 | 2.00x |" in table
