"""Joint SVRG on a model with per-group latents, at the step size naive is run at.

With per-user effects, a user's rows arrive every few hundred steps, while the snapshot's
full-data gradient enters every step: between refreshes (an epoch, 2,500 steps here) the
control on an absent user's effect is a constant, stale push, which Adam turns into a
full-size step each step. With the paper's fixed weight the run collapses; with one
adaptive weight per parameter leaf (set by the shared coordinates) it ended 959 nats
below naive after three epochs (-4,216 against -3,257, se 6-8); with one weight per
coordinate it ends above naive (-3,114, se 5).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad


def _per_user_counts(num_data=10_000, users=1_000, seed=0):
  rng = np.random.default_rng(seed)
  u = rng.integers(0, users, num_data).astype(np.int32)
  x = rng.standard_normal((num_data, 2)).astype(np.float32)
  effect = 0.5 * rng.standard_normal(users)
  y = rng.poisson(np.exp(0.5 + effect[u] + x @ np.array([0.3, -0.2]))).astype(np.float32)

  def log_prior(z):
    return -0.5 * (jnp.sum(z["user"] ** 2) + jnp.sum(z["beta"] ** 2) + z["bias"] ** 2 / 4)

  def log_lik(z, rows):
    eta = z["bias"] + rows["x"] @ z["beta"] + z["user"][rows["u"]]
    return rows["y"] * eta - jnp.exp(eta)

  latent = {"bias": jnp.zeros(()), "beta": jnp.zeros(2), "user": jnp.zeros(users)}
  return dsgrad.objective_from_logdensity(log_prior, log_lik, {"u": u, "x": x, "y": y},
                                          latent), users + 3


def test_joint_svrg_with_per_group_latents_keeps_up_with_naive():
  objective, d = _per_user_counts()
  params = {"loc": jnp.zeros(d), "log_scale": jnp.full(d, -2.0)}
  batch = 4
  steps = 3 * objective.num_data // batch  # three epochs: two refreshes

  def final(estimator):
    result = dsgrad.fit(objective, optax.chain(estimator, optax.adam(1e-2)), params,
                        jax.random.key(0), num_steps=steps, batch_size=batch,
                        eval_every=steps, elbo_samples=200, progress=False)
    return float(result.history.elbo[-1]), float(result.history.elbo_se[-1])

  naive, naive_se = final(dsgrad.naive())
  paper, _ = final(dsgrad.joint_svrg(objective, control_weight=1.0))
  adaptive, adaptive_se = final(dsgrad.joint_svrg(objective))
  # The failure reproduced: the fixed weight ends far below naive (measured: -19,008).
  assert paper < naive - 10_000, (paper, naive)
  # Measured: adaptive -3,114 (se 5), naive -3,257 (se 6); per-leaf weights: -4,216.
  assert adaptive > naive - 3 * np.hypot(naive_se, adaptive_se), (adaptive, naive)
