"""Property-based bad-input suite (issue 21): random bad indices, shapes, dtypes and
non-finite values fed to every estimator's ``update`` and to ``fit``.

Each example either raises a ``ValueError``/``TypeError`` whose message names the
argument that was damaged, or returns finite output that equals the output for the same
(valid) input computed another way; the returned state never holds a NaN.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dsgrad
from conftest import BATCH, N_DATA

ESTIMATORS = {
    "naive": lambda o: dsgrad.naive(),
    "cv": lambda o: dsgrad.cv(o),
    "inc": lambda o: dsgrad.inc(o),
    "smiso": lambda o: dsgrad.smiso(o, 0.01),
    "joint_saga": lambda o: dsgrad.joint_saga(o),
    "joint_svrg": lambda o: dsgrad.joint_svrg(o, every=5),
}

# What each damaged argument may be called in the error message.
NAMES = {
    "indices": ("indices",),
    "noise": ("noise",),
    "updates": ("updates", "gradient"),
    "params": ("params",),
    "batch": ("indices", "noise"),  # indices and noise of different batch sizes
}

PROPERTY_SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                    HealthCheck.too_slow])


@pytest.fixture(scope="module")
def setups(logreg_model, params0):
  """Per estimator: the objective, the transformation and its initial state (``inc``
  needs shared noise: its table stores one noise draw per datum)."""
  out = {}
  for name, make in ESTIMATORS.items():
    objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=name == "inc")
    tx = make(objective)
    out[name] = (objective, tx, tx.init(params0))
  return out


def _poison(tree, position: int, value: float):
  """``tree`` with one float entry (counted over all leaves) set to ``value``."""
  leaves, treedef = jax.tree.flatten(tree)
  sizes = [int(np.size(x)) for x in leaves]
  position %= sum(sizes)
  out = []
  for leaf, size in zip(leaves, sizes):
    flat = np.array(leaf, copy=True).reshape(-1)
    if 0 <= position < size and np.issubdtype(flat.dtype, np.floating):
      flat[position] = value
    position -= size
    out.append(jnp.asarray(flat.reshape(np.shape(leaf))))
  return jax.tree.unflatten(treedef, out)


KINDS = ("valid", "index_range", "index_dtype", "index_rank", "batch_size", "nonfinite_noise",
         "noise_shape", "nonfinite_updates", "updates_shape", "nonfinite_params")


@st.composite
def damaged_batches(draw, kind):
  """``(target, description, make)`` for one kind of damage, its details drawn:
  ``make(objective, params, grads, indices, noise)`` returns the damaged ``(params,
  grads, indices, noise)``; ``target`` is the argument that was damaged (``None`` when
  the kind leaves everything valid)."""
  position = draw(st.integers(0, 10_000))
  bad_value = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
  if kind == "valid":
    return None, kind, lambda o, p, g, i, n: (p, g, i, n)
  if kind == "index_range":
    index = draw(st.one_of(st.integers(-10 ** 6, -1), st.integers(N_DATA, 10 ** 6)))
    slot = draw(st.integers(0, BATCH - 1))
    return "indices", f"{kind} {index} at {slot}", (
        lambda o, p, g, i, n: (p, g, i.at[slot].set(index), n))
  if kind == "index_dtype":
    dtype = draw(st.sampled_from([jnp.float32, jnp.bool_, jnp.complex64]))
    return "indices", f"{kind} {jnp.dtype(dtype).name}", (
        lambda o, p, g, i, n: (p, g, i.astype(dtype), n))
  if kind == "index_rank":
    shape = draw(st.sampled_from([(), (BATCH, 1), (1, BATCH), (0,)]))
    return "indices", f"{kind} {shape}", (
        lambda o, p, g, i, n: (p, g, jnp.zeros(shape, jnp.int32), n))
  if kind == "batch_size":
    size = draw(st.integers(1, 2 * BATCH).filter(lambda b: b != BATCH))
    # indices of another length than the noise's batch (see the test for shared noise)
    return "batch", f"{kind} {size}", (
        lambda o, p, g, i, n: (p, g, jnp.arange(size, dtype=jnp.int32) % N_DATA, n))
  if kind == "nonfinite_noise":
    return "noise", f"{kind} {bad_value} at {position}", (
        lambda o, p, g, i, n: (p, g, i, _poison(n, position, bad_value)))
  if kind == "noise_shape":
    extra = draw(st.integers(1, 3))
    return "noise", f"{kind} +{extra}", (
        lambda o, p, g, i, n: (p, g, i, jax.tree.map(
            lambda x: jnp.concatenate([x, x[..., :extra]], axis=-1), n)))
  if kind == "nonfinite_updates":
    return "updates", f"{kind} {bad_value} at {position}", (
        lambda o, p, g, i, n: (p, _poison(g, position, bad_value), i, n))
  if kind == "updates_shape":
    return "updates", kind, (
        lambda o, p, g, i, n: (p, jax.tree.map(lambda x: x[:-1], g), i, n))
  return "params", f"{kind} {bad_value} at {position}", (
      lambda o, p, g, i, n: (_poison(p, position, bad_value), g, i, n))


def _all_finite(tree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree)
             if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(ESTIMATORS))
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2 ** 16))
def test_update_names_the_damaged_argument_or_returns_finite_output(setups, params0, name,
                                                                    kind, data, seed):
  """Every kind of damage for every estimator (details and the batch drawn at random)."""
  batch = data.draw(damaged_batches(kind))
  objective, tx, state = setups[name]
  target, description, damage = batch
  key = jax.random.key(seed)
  indices = jax.random.choice(key, N_DATA, (BATCH,), replace=False).astype(jnp.int32)
  noise = objective.sample_noise(jax.random.fold_in(key, 1), BATCH)
  grads = objective.grad(params0, indices, noise)
  bad_params, bad_grads, bad_indices, bad_noise = damage(objective, params0, grads, indices,
                                                         noise)
  if name == "naive" and target in ("indices", "noise", "params"):
    target = None  # naive reads only the gradient: nothing else can hurt it
  if target == "batch" and (objective.shared_noise or name == "naive"):
    target = None  # shared noise has no batch axis: any batch size is valid input
  try:
    out, new_state = tx.update(bad_grads, state, bad_params, indices=bad_indices,
                               noise=bad_noise)
  except (ValueError, TypeError) as error:
    assert target is not None, f"{name} refused valid input ({description}): {error}"
    message = str(error)
    assert any(word in message for word in NAMES[target]), (
        f"{name}, {description}: the error does not name {target}: {message}")
    return
  assert target is None, f"{name} accepted {description} silently"
  assert _all_finite(out), f"{name}: non-finite update for valid input ({description})"
  assert _all_finite(new_state), f"{name}: non-finite state for valid input ({description})"
  # Correct output: the same valid step, compiled, gives the same update.
  jitted, _ = jax.jit(lambda g, s, p, i, n: tx.update(g, s, p, indices=i, noise=n))(
      bad_grads, state, bad_params, bad_indices, bad_noise)
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


@st.composite
def fit_arguments(draw):
  """``(target, kwargs)``: one of fit's counts replaced by a random value, good or bad."""
  counts = {"num_steps": 0, "batch_size": 1, "eval_every": 1, "checkpoint_every": 1}
  target = draw(st.sampled_from(sorted(counts) + ["params"]))
  kwargs = dict(num_steps=4, batch_size=BATCH, eval_every=2, checkpoint_every=1)
  if target == "params":
    value = draw(st.sampled_from([np.nan, np.inf, 0.5]))
    return ("params" if not np.isfinite(value) else None), {"params_value": value}
  value = draw(st.one_of(st.integers(-5, N_DATA + 5), st.floats(-3, 60), st.just(float("nan")),
                         st.booleans(), st.none(), st.text(max_size=2)))
  kwargs[target] = value
  low = counts[target]
  ok = (isinstance(value, int) and not isinstance(value, bool) and value >= low
        and not (target == "batch_size" and value > N_DATA)
        and not (target == "num_steps" and value > 12))
  if target == "eval_every" and value is None:
    ok = True  # None means one epoch, as documented
  if ok and target == "num_steps" and value > 12:
    kwargs[target] = 12
  return (None if ok else target), kwargs


@PROPERTY_SETTINGS
@given(case=fit_arguments())
def test_fit_names_the_bad_argument_or_trains_to_finite_params(logreg_model, params0, case):
  target, kwargs = case
  objective = dsgrad.meanfield_gaussian(logreg_model)
  params = params0
  if "params_value" in kwargs:
    params = _poison(params0, 2, kwargs.pop("params_value"))
    kwargs.update(num_steps=4, batch_size=BATCH, eval_every=2, checkpoint_every=1)
  optimizer = optax.chain(dsgrad.cv(objective), optax.adam(1e-2))
  try:
    result = dsgrad.fit(objective, optimizer, params, jax.random.key(0), elbo_samples=4,
                        progress=False, **kwargs)
  except (ValueError, TypeError) as error:
    assert target is not None, f"fit refused valid {kwargs}: {error}"
    assert target in str(error), f"the error does not name {target}: {error}"
    return
  assert target is None, f"fit accepted a bad {target}: {kwargs}"
  assert _all_finite((result.params, result.opt_state))
  assert np.all(np.isfinite(result.history.elbo))
