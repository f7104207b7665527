"""Hostile inputs by kind: each is refused with a message that names the argument, file
or value, or gives the result of the clean computation. One test per kind of mistake
(dtype, order in a chain, resume identity, non-finite values and settings, file types,
loader formats), each failing on code that lets the kind through."""

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from conftest import BATCH


@pytest.fixture(scope="module")
def objective(logreg_model):
  return dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)


def _batch(objective, dtype=jnp.int32, seed=0):
  idx = jax.random.choice(jax.random.key(seed), objective.num_data, (BATCH,), replace=False)
  return idx.astype(dtype), objective.sample_noise(jax.random.key(seed + 1), BATCH)


# ------------------------------------------------------------------ index dtypes
@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint32, jnp.int8, jnp.int16])
@pytest.mark.parametrize("name", ["cv", "inc", "smiso", "joint_saga", "joint_svrg"])
def test_any_integer_index_dtype_gives_the_int32_result(logreg_model, params0, name, dtype):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=name == "inc")
  make = {"cv": lambda: dsgrad.cv(objective), "inc": lambda: dsgrad.inc(objective),
          "smiso": lambda: dsgrad.smiso(objective, 0.01),
          "joint_saga": lambda: dsgrad.joint_saga(objective),
          "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=2)}[name]
  tx = make()
  step = jax.jit(lambda s, p, i, e: tx.update(objective.grad(p, i, e), s, p, indices=i,
                                               noise=e))
  outs = {}
  for kind in (jnp.int32, dtype):
    state, params = tx.init(params0), params0
    for seed in range(3):
      idx, noise = _batch(objective, kind, seed)
      update, state = step(state, params, idx, noise)
      # SMISO's output is the step itself; the others are gradients.
      params = optax.apply_updates(
          params, update if name == "smiso" else optax.tree.scale(-1e-3, update))
    outs[kind] = (params, state)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), *outs.values())


def test_unsigned_indices_above_the_int32_range_are_refused(objective, params0):
  tx = dsgrad.joint_saga(objective)
  idx, noise = _batch(objective)
  big = np.asarray(idx, np.uint64) + np.uint64(2 ** 32)  # would wrap onto valid rows
  with pytest.raises(ValueError, match="indices out of range"):
    tx.update(objective.grad(params0, idx, noise), tx.init(params0), params0,
              indices=big, noise=noise)


# ------------------------------------------------------------------ chain order
@pytest.mark.parametrize("name", ["joint_saga", "joint_svrg"])
@pytest.mark.parametrize("before", ["adam", "scale"])
def test_estimator_after_a_rescaling_transform_is_refused(objective, params0, name, before):
  est = {"joint_saga": lambda: dsgrad.joint_saga(objective),
         "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=5)}[name]()
  first = {"adam": optax.adam(1e-2), "scale": optax.scale(-0.1)}[before]
  opt = optax.chain(first, est)
  idx, noise = _batch(objective)
  grads = objective.grad(params0, idx, noise)
  with pytest.raises(Exception, match="must come first in an optax.chain"):
    jax.block_until_ready(jax.jit(
        lambda s: opt.update(grads, s, params0, indices=idx, noise=noise))(opt.init(params0)))
  # In the right order the same call is accepted.
  good = optax.chain(est, first)
  jax.block_until_ready(good.update(grads, good.init(params0), params0, indices=idx,
                                    noise=noise))


def test_fit_refuses_an_estimator_after_a_stateful_transform(objective, params0):
  opt = optax.chain(optax.adam(1e-2), dsgrad.cv(objective, control_weight="adaptive"))
  with pytest.raises(ValueError, match="must come first"):
    dsgrad.fit(objective, opt, params0, jax.random.key(0), num_steps=2, batch_size=BATCH,
               elbo_samples=0, progress=False)


def test_estimator_samples_refuses_a_chain(objective, params0):
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  with pytest.raises(ValueError, match="not an optax.chain"):
    dsgrad.estimator_samples(opt, opt.init(params0), params0, objective, jax.random.key(0),
                             4, BATCH)
