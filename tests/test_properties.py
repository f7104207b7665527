"""Property-based bad-input suite: random bad indices, shapes, dtypes and
non-finite values fed to every estimator's ``update`` under ``dsgrad.checked`` and to
``fit``.

Each example either raises a ``ValueError``/``TypeError`` whose message names the
argument that was damaged, or returns finite output that equals the output for the same
(valid) input computed another way; the returned state never holds a NaN.
"""

import os

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
    tx = dsgrad.checked(make(objective), objective)  # the checks of a loop of one's own
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
    # Shared noise has no batch axis: any batch size fits the noise, but the gradient
    # passed is the one of the other batch, which checked's gradient comparison names.
    target = None if name == "naive" else "updates"
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
  # (checkpoint_every needs a checkpoint_path; its kind is drawn in test_argument_kinds.)
  counts = {"num_steps": 0, "batch_size": 1, "eval_every": 1}
  target = draw(st.sampled_from(sorted(counts) + ["params"]))
  kwargs = dict(num_steps=4, batch_size=BATCH, eval_every=2)
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
    kwargs.update(num_steps=4, batch_size=BATCH, eval_every=2)
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


# --- Generated hostile values of each kind, at the other entry points ----------------------
# Each example either raises ValueError/TypeError naming the argument (or file), or returns
# what the clean computation returns.

KIND_SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                HealthCheck.too_slow])


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dtype=st.sampled_from(["uint8", "uint16", "uint32", "uint64", "int8", "int16",
                              "int64"]),
       seed=st.integers(0, 2 ** 16), name=st.sampled_from(["cv", "joint_saga", "joint_svrg"]))
def test_any_integer_index_dtype_gives_the_int32_update(setups, params0, dtype, seed, name):
  objective, tx, state = setups[name]
  key = jax.random.key(seed)
  indices = jax.random.choice(key, N_DATA, (BATCH,), replace=False).astype(jnp.int32)
  noise = objective.sample_noise(jax.random.fold_in(key, 1), BATCH)
  grads = objective.grad(params0, indices, noise)
  want, want_state = tx.update(grads, state, params0, indices=indices, noise=noise)
  got, got_state = tx.update(grads, state, params0, indices=np.asarray(indices).astype(dtype),
                             noise=noise)
  for a, b in zip(jax.tree.leaves((got, got_state)), jax.tree.leaves((want, want_state))):
    np.testing.assert_array_equal(a, b)


def _setting_entry_points(x, y):
  from dsgrad import mcmc
  from dsgrad.models import logistic_regression, ppca, softmax_regression
  model = logistic_regression(x, y)
  d = model.latent_dim
  hmc = lambda s: mcmc.HMCParameters(jnp.float32(s), jnp.int32(3), jnp.eye(d), jnp.eye(d))
  labels3 = np.asarray(y, np.int32) + np.arange(len(y)) % 2
  return {
      "prior_scale": lambda v: logistic_regression(x, y, prior_scale=v),
      "prior_scale ": lambda v: softmax_regression(x, labels3, 3, prior_scale=v),
      "noise_std": lambda v: ppca(np.asarray(x), latent_dim=2, noise_std=v),
      "step_size": lambda v: mcmc.sgld(model, None, subsample_size=5, step_size=v,
                                       control_variates=False),
      "friction": lambda v: mcmc.sghmc(model, None, hmc(0.01), subsample_size=5, friction=v,
                                       control_variates=False),
      "step_size  ": lambda v: dsgrad.smiso(dsgrad.meanfield_gaussian(model), v),
  }


@KIND_SETTINGS
@given(which=st.integers(0, 5),
       value=st.one_of(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, 1e-300]),
                       st.floats(-1e6, -1e-30), st.floats(1e-3, 10.0)))
def test_positive_settings_are_refused_by_name_or_accepted_when_valid(logreg_data, which,
                                                                       value):
  x, y = logreg_data
  entries = _setting_entry_points(x, y)
  label = sorted(entries)[which]
  info = np.finfo(np.float32)
  valid = np.isfinite(value) and float(info.tiny) <= value <= float(info.max)
  try:
    entries[label](value)
  except (ValueError, TypeError) as error:
    assert not valid, f"{label.strip()}={value} refused: {error}"
    assert label.strip() in str(error), f"the error does not name {label.strip()}: {error}"
    return
  assert valid, f"{label.strip()}={value} accepted silently"


@KIND_SETTINGS
@given(kind=st.sampled_from(["nan", "inf", "-inf", "beyond_float32", "valid"]),
       row=st.integers(0, 49), column=st.integers(0, 4),
       entry=st.sampled_from(["logistic_regression", "with_data", "from_logdensity"]))
def test_non_finite_data_are_refused_where_they_enter(logreg_data, kind, row, column, entry):
  from dsgrad.models import logistic_regression
  x, y = (np.asarray(a, np.float64) for a in logreg_data)
  bad = x.copy()
  bad[row, column % x.shape[1]] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf,
                                   "beyond_float32": 1e39, "valid": 0.25}[kind]
  clean = dsgrad.meanfield_gaussian(logistic_regression(x.astype(np.float32), y))
  try:
    if entry == "logistic_regression":
      logistic_regression(bad, y)
    elif entry == "with_data":
      clean.with_data({k: (bad.astype(np.asarray(v).dtype) if kind != "beyond_float32" else bad)
                       if np.ndim(v) == 2 else v for k, v in clean.data_tree().items()})
    else:
      dsgrad.objective_from_logdensity(
          lambda z: -0.5 * jnp.sum(z ** 2), lambda z, batch: batch["x"] @ z, {"x": bad},
          x.shape[1])
  except (ValueError, TypeError) as error:
    assert kind != "valid", f"{entry} refused valid data: {error}"
    assert any(w in str(error) for w in ("non-finite", "finite", "float32")), str(error)
    return
  assert kind == "valid", f"{entry} accepted {kind} data silently"


FILE_KINDS = ("valid", "missing", "folder", "fifo", "empty", "truncated", "text", "devnull")


def _make_file(kind: str, path, valid_bytes: bytes) -> str:
  import os
  if kind == "valid":
    path.write_bytes(valid_bytes)
  elif kind == "folder":
    path.mkdir()
  elif kind == "fifo":
    os.mkfifo(path)
  elif kind == "empty":
    path.write_bytes(b"")
  elif kind == "truncated":
    path.write_bytes(valid_bytes[:len(valid_bytes) // 2])
  elif kind == "text":
    path.write_text("these are not the bytes you are looking for\n" * 3)
  elif kind == "devnull":
    return "/dev/null"
  return str(path)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(FILE_KINDS),
       entry=st.sampled_from(["open_memmap", "checkpoint", "australian"]))
def test_files_of_every_kind_are_read_or_refused_by_name_never_hung(tmp_path_factory, kind,
                                                                    entry):
  import io
  import threading
  from dsgrad import data
  from dsgrad.training import checkpoint
  from dsgrad.datasets import uci
  folder = tmp_path_factory.mktemp("files")
  good = np.arange(12, dtype=np.float32).reshape(4, 3)
  if entry == "open_memmap":
    buffer = io.BytesIO()
    np.save(buffer, good)
    read = lambda p: data.open_memmap(p).rows(np.arange(4))  # noqa: E731
  elif entry == "checkpoint":
    checkpoint.save(folder / "reference", {"a": good})
    buffer = io.BytesIO((folder / "reference").read_bytes())
    read = lambda p: checkpoint.restore(p, {"a": np.zeros_like(good)})["a"]  # noqa: E731
  else:
    shipped = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                           "australian.dat")
    if not os.path.exists(shipped):
      return  # the shipped copy is the only valid australian file
    with open(shipped, "rb") as f:
      buffer = io.BytesIO(f.read())
    read = lambda p: uci.load_australian(p)[0]  # noqa: E731
  path = _make_file(kind, folder / "input.bin", buffer.getvalue())
  outcome = []

  def run():
    try:
      outcome.append(("value", read(path)))
    except (ValueError, TypeError, OSError) as error:
      outcome.append(("error", error))

  worker = threading.Thread(target=run, daemon=True)
  worker.start()
  worker.join(20)
  assert outcome, f"{entry} hung on a {kind} path"
  what, result = outcome[0]
  if kind == "valid":
    assert what == "value", f"{entry} refused a valid file: {result}"
    if entry != "australian":
      np.testing.assert_array_equal(result, good)
    return
  assert what == "error", f"{entry} read a {kind} path silently: {result}"
  shown = os.path.basename(path)
  assert shown in str(result) or path in str(result), (
      f"{entry}: the error for a {kind} path does not name it: {result}")
