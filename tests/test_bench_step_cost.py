"""The step-cost benchmark's hand-fused floor computes dsgrad's joint SAGA step (App. F's
logit table, c = 1, Adam) exactly, so the ratio of the two is a ratio of costs alone."""

import jax
import jax.numpy as jnp
import optax
import pytest

import dsgrad
from benchmarks import step_cost


@pytest.mark.parametrize("classes", [1, 3])
def test_hand_fused_floor_is_dsgrads_joint_saga_step(classes):
  model = step_cost._problem(500, 12, classes)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model, 0.0, -2.0)
  floor = step_cost.hand_fused_saga(objective, model)
  ours = optax.chain(dsgrad.joint_saga(objective, dsgrad.approx.glm_mean_taylor(model),
                                       control_weight=1.0), optax.adam(1e-3))
  floor_state, our_state = floor.init(params), ours.init(params)
  floor_params = our_params = params
  floor_step = jax.jit(floor.step)
  our_step = jax.jit(lambda *args: dsgrad.train_step(objective, ours, *args))
  for t in range(12):
    indices = jax.random.randint(jax.random.key(t), (16,), 0, 500).at[5].set(3).at[9].set(3)
    key = jax.random.key(100 + t)
    floor_params, floor_state = floor_step(floor_params, floor_state, indices, key)
    our_params, our_state = our_step(our_params, our_state, indices, key)
  for a, b in zip(jax.tree.leaves(floor_params), jax.tree.leaves(our_params)):
    assert float(jnp.max(jnp.abs(a - b))) < 1e-6
  assert float(jnp.max(jnp.abs(our_params["loc"] - params["loc"]))) > 1e-3  # it moved
  scale = float(jnp.max(jnp.abs(our_state[0].running_mean["loc"])))
  assert float(jnp.max(jnp.abs(floor_state[1]["loc"] - our_state[0].running_mean["loc"]))) \
      < 1e-5 * scale
  assert float(jnp.max(jnp.abs(floor_state[0] - our_state[0].table))) < 1e-5


def test_step_targets_are_read_from_the_table():
  """The targets line reports each row's ratio to its reference row and whether it is
  within the limit: a row just over its limit is "missed", one under it "met"."""
  ms = {"naive": 1.0, step_cost.FLOOR: 1.0, "joint_saga (App. F, logit table)": 1.24,
        step_cost.ADAPTIVE: 1.24 * 1.06, "cv (App. F)": 1.29, "joint_svrg (App. F)": 1.31}
  rows = [dict(estimator=name, ms_per_step=t, ratio_to_naive=t / ms["naive"], table_bytes=0,
               state_bytes=0) for name, t in ms.items()]
  config = dict(num_classes=10, num_data=100, num_features=5, batch_size=10, steps=11,
                rounds=1, every=10)
  text = step_cost.render({"command": "python -m benchmarks step-cost", "environment": "here",
                           "results": {"config": config, "rows": rows}})
  assert "joint_saga (App. F, logit table) 1.24x the hand-fused step (<= 1.25x: met)" in text
  assert (f"{step_cost.ADAPTIVE} 1.06x joint_saga (App. F, logit table) (<= 1.05x: missed)"
          in text)
  assert "cv (App. F) 1.29x naive (<= 1.3x: met)" in text
  assert "joint_svrg (App. F) 1.31x naive (<= 1.3x: missed)" in text
