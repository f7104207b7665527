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
from conftest import BATCH, run_python


@pytest.fixture(scope="module")
def objective(logreg_model):
  return dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)


def _batch(objective, dtype=jnp.int32, seed=0):
  idx = jax.random.choice(jax.random.key(seed), objective.num_data, (BATCH,), replace=False)
  return idx.astype(dtype), objective.sample_noise(jax.random.key(seed + 1), BATCH)


# ------------------------------------------------------------------ index dtypes
# Every estimator with the narrowest dtype, and every dtype with one estimator: the
# conversion is one step shared by all estimators' updates (_common.transformation).
@pytest.mark.parametrize("name, dtype", [
    *((name, jnp.uint8) for name in ("cv", "inc", "smiso", "joint_saga", "joint_svrg")),
    *(("joint_saga", dtype) for dtype in (jnp.uint32, jnp.int8, jnp.int16))])
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
  opt = dsgrad.checked(optax.chain(first, est), objective)
  idx, noise = _batch(objective)
  grads = objective.grad(params0, idx, noise)
  with pytest.raises(Exception, match="must come first"):
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


def test_fit_refuses_params_that_are_not_parameters(objective, logreg_model):
  # Before, fit said "cannot be evaluated at these params (shapes [])... Were the params
  # made for another model?" for None, and a model passed as params failed inside it.
  for bad in (None, {}, logreg_model, objective):
    with pytest.raises(TypeError, match=r"params must be the variational parameters.*"
                                        + type(bad).__name__):
      dsgrad.fit(objective, optax.adam(1e-2), bad, jax.random.key(0), num_steps=2,
                 batch_size=BATCH, elbo_samples=0, progress=False)


def test_estimator_samples_refuses_a_chain(objective, params0):
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  with pytest.raises(ValueError, match="not an optax.chain"):
    dsgrad.estimator_samples(opt, opt.init(params0), params0, objective, jax.random.key(0),
                             4, BATCH)
  # Another estimator's state: named (before, an AttributeError from inside its update).
  with pytest.raises(ValueError, match="estimator_samples: the state passed to update is not "
                                       "one this optimizer's init makes"):
    dsgrad.estimator_samples(dsgrad.cv(objective), dsgrad.joint_svrg(objective).init(params0),
                             params0, objective, jax.random.key(0), 4, BATCH)


# ------------------------------------------------------------------ resume identity
def _fit(objective, opt, params0, path, steps=4, **kw):
  return dsgrad.fit(objective, opt, params0, jax.random.key(0), num_steps=steps,
                    batch_size=BATCH, eval_every=2, elbo_samples=0, progress=False,
                    checkpoint_path=path, resume=True, **kw)


def test_resume_with_another_approximation_or_estimator_setting_is_refused(
    logreg_model, objective, params0, tmp_path):
  path = str(tmp_path / "run.ckpt")
  _fit(objective, optax.chain(dsgrad.joint_saga(objective), optax.sgd(1e-3)), params0, path)
  other = dsgrad.joint_saga(objective, approx=dsgrad.approx.gaussian_mean_taylor(logreg_model))
  with pytest.raises(ValueError, match="another estimator, other estimator settings, "
                                       "another approximation"):
    _fit(objective, optax.chain(other, optax.sgd(1e-3)), params0, path, steps=6)
  # The rule after the estimator is the run's too: its moments belong to that step size.
  with pytest.raises(ValueError, match="another optax rule or learning rate"):
    _fit(objective, optax.chain(dsgrad.joint_saga(objective), optax.sgd(1e-2)), params0,
         path, steps=6)
  with pytest.raises(ValueError, match="another approximation"):
    _fit(objective, optax.chain(dsgrad.joint_saga(objective, warmup_steps=3),
                                optax.sgd(1e-3)), params0, path, steps=6)
  # The same optimizer, rebuilt, resumes.
  _fit(objective, optax.chain(dsgrad.joint_saga(objective), optax.sgd(1e-3)), params0, path,
       steps=6)


def test_resume_on_other_data_of_the_same_size_is_refused(logreg_data, params0, tmp_path):
  from dsgrad.models import logistic_regression
  x, y = logreg_data
  path = str(tmp_path / "run.ckpt")
  first = dsgrad.meanfield_gaussian(logistic_regression(x, y))
  _fit(first, optax.chain(dsgrad.joint_saga(first), optax.sgd(1e-3)), params0, path)
  flipped = dsgrad.meanfield_gaussian(logistic_regression(x, 1 - np.asarray(y)))
  with pytest.raises(ValueError, match="other data"):
    _fit(flipped, optax.chain(dsgrad.joint_saga(flipped), optax.sgd(1e-3)), params0, path,
         steps=6)


def test_checkpoint_with_a_valid_checksum_but_nan_state_is_refused(objective, params0,
                                                                    tmp_path):
  from dsgrad.training import checkpoint
  path = str(tmp_path / "run.ckpt")
  opt = optax.chain(dsgrad.joint_saga(objective), optax.sgd(1e-3))
  _fit(objective, opt, params0, path)
  raw = checkpoint.restore_raw(path)
  saga_state = raw["opt_state"]["0"]  # JointSagaState: the running mean G
  saga_state["running_mean"] = jax.tree.map(lambda v: np.full_like(v, np.nan),
                                            saga_state["running_mean"])
  checkpoint.save(path, raw)  # a fresh, valid checksum over the poisoned state
  with pytest.raises(ValueError, match="restored from checkpoint_path .* non-finite"):
    _fit(objective, opt, params0, path, steps=6)


def test_checkpoint_without_its_header_is_refused(objective, params0, tmp_path):
  from dsgrad.training import checkpoint
  path = tmp_path / "run.ckpt"
  checkpoint.save(path, {"a": np.arange(3.0)})
  data = path.read_bytes()
  path.write_bytes(data[len(b"DSGRAD-CKPT-1\n") + 32:])  # the bare msgpack payload
  with pytest.raises(ValueError, match="no dsgrad header and checksum"):
    checkpoint.restore(path, {"a": np.zeros(3)})
  with pytest.warns(UserWarning, match="without verification"):
    restored = checkpoint.restore(path, {"a": np.zeros(3)}, allow_unverified=True)
  np.testing.assert_array_equal(restored["a"], np.arange(3.0))


def test_two_writers_of_one_checkpoint_path_are_refused(tmp_path):
  import subprocess
  import sys
  from dsgrad.training import checkpoint
  path = tmp_path / "run.ckpt"
  # Another live process holds the path (as a running fit does for its whole run).
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\nfrom dsgrad import checkpoint\n"
       f"with checkpoint.exclusive({str(path)!r}):\n  print('held', flush=True)\n"
       "  time.sleep(60)"], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RuntimeError, match="being written by another process"):
      checkpoint.save(path, {"a": np.zeros(2)})
  finally:
    holder.kill()
    holder.wait()
  # A lock left by a process that is gone is taken over.
  checkpoint.save(path, {"a": np.zeros(2)})
  assert not os.path.exists(str(path) + ".lock")


def test_a_fresh_fit_does_not_replace_a_folder_a_file_or_an_earlier_checkpoint(
    tmp_path, objective, params0):
  """A fit's saves move what is at checkpoint_path aside, then replace it: a folder (moved
  whole), a user's file or an earlier run's checkpoint would be lost. A fresh run refuses
  them; resume=True continues the earlier run; checkpoint.save refuses a folder."""
  from dsgrad.training import checkpoint
  fit = lambda path, **kw: dsgrad.fit(
      objective, optax.chain(dsgrad.naive(), optax.adam(1e-2)), params0, jax.random.key(0),
      num_steps=20, batch_size=BATCH, eval_every=10, checkpoint_every=1, elbo_samples=0,
      progress=False, checkpoint_path=path, **kw)
  folder = tmp_path / "runs"
  (folder / "notes.txt").parent.mkdir()
  (folder / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="checkpoint_path: .* is a directory, not a regular file"):
    fit(folder)
  with pytest.raises(ValueError, match="checkpoint.save: .* is a directory, not a regular file"):
    checkpoint.save(folder, {"a": np.zeros(2)})
  with pytest.raises(ValueError, match="already holds a file.*resume=True"):
    fit(folder / "notes.txt")
  assert (folder / "notes.txt").read_text() == "mine" and os.listdir(folder) == ["notes.txt"]
  earlier = fit(folder / "run.msgpack")
  with pytest.raises(ValueError, match="already holds a file.*resume=True"):
    fit(folder / "run.msgpack")
  continued = dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.adam(1e-2)), params0,
                         jax.random.key(0), num_steps=30, batch_size=BATCH, eval_every=10,
                         elbo_samples=0, progress=False,
                         checkpoint_path=folder / "run.msgpack", resume=True)
  assert earlier.step == 20 and continued.step == 30


# ------------------------------------------------------------------ file types
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_paths_that_are_not_regular_files_are_refused(tmp_path, kind):
  from dsgrad import data
  from dsgrad.training import checkpoint
  from dsgrad.datasets import mnist
  if kind == "fifo":
    path = tmp_path / "pipe"
    os.mkfifo(path)
  elif kind == "device":
    path = "/dev/zero"
  else:
    path = tmp_path / "folder"
    path.mkdir()
  calls = [lambda: checkpoint.restore(path, {"a": np.zeros(2)}),
           lambda: data.open_memmap(path)]
  done = []

  def run():
    for call in calls:
      with pytest.raises(ValueError, match="not a regular file"):
        call()
      done.append(call)

  worker = threading.Thread(target=run, daemon=True)
  worker.start()
  worker.join(20)
  assert len(done) == len(calls), "a call hung or did not refuse the path"
  if kind == "fifo":  # the loaders look for their files by name inside a folder
    os.rename(path, tmp_path / "t10k-images-idx3-ubyte")
    with pytest.raises(ValueError, match="not a regular file"):
      mnist.load_mnist(tmp_path, "test")


# ------------------------------------------------------------------ settings and data
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0])
def test_non_finite_or_negative_hyperparameters_are_refused_by_name(logreg_data, bad):
  from dsgrad import mcmc
  from dsgrad.models import logistic_regression, ppca
  x, y = logreg_data
  with pytest.raises(ValueError, match="prior_scale"):
    logistic_regression(x, y, prior_scale=bad)
  with pytest.raises(ValueError, match="noise_std"):
    ppca(np.asarray(x), latent_dim=2, noise_std=bad)
  model = logistic_regression(x, y)
  with pytest.raises(ValueError, match="step_size"):
    mcmc.sgld(model, None, subsample_size=5, step_size=bad, control_variates=False)
  d = model.latent_dim
  hmc = mcmc.HMCParameters(jnp.float32(0.01), jnp.int32(3), jnp.eye(d), jnp.eye(d))
  with pytest.raises(ValueError, match="friction"):
    mcmc.sghmc(model, None, hmc, subsample_size=5, friction=bad, control_variates=False)
  with pytest.raises(ValueError, match="control_weight_horizon"):
    dsgrad.cv(dsgrad.meanfield_gaussian(model), control_weight="adaptive",
              control_weight_horizon=bad if bad != 0.0 else float("nan"))


@pytest.mark.parametrize("bad", [3.0, 2.5, True, 2 ** 40])
def test_counts_that_are_not_int32_integers_are_refused(objective, params0, bad):
  with pytest.raises(ValueError, match="num_steps must be an integer"):
    dsgrad.fit(objective, optax.sgd(1e-3), params0, jax.random.key(0), num_steps=bad,
               batch_size=BATCH, elbo_samples=0, progress=False)


def test_run_chain_refuses_a_chunk_size_of_zero():
  import importlib
  sample = importlib.import_module("dsgrad.mcmc.chain")
  with pytest.raises(ValueError, match="chunk_size"):
    sample.run_chain(jax.random.key(0), lambda k, s: (s, {}), jnp.zeros(2), 10, chunk_size=0,
                     progress=False, position=lambda s: s)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e39])
def test_non_finite_data_are_refused_where_they_enter(logreg_data, bad):
  from dsgrad.models import logistic_regression
  x, y = logreg_data
  dirty = np.asarray(x, np.float64).copy()
  dirty[3, 1] = bad
  with pytest.raises(ValueError, match="features"):
    logistic_regression(dirty, y)
  clean = dsgrad.meanfield_gaussian(logistic_regression(x, y))
  with pytest.raises(ValueError, match="non-finite|float32"):
    clean.with_data({k: (dirty.astype(np.float32) if bad != 1e39 else dirty)
                     if np.ndim(v) == 2 else v for k, v in clean.data_tree().items()})
  with pytest.raises(ValueError, match="non-finite|float32"):
    dsgrad.objective_from_logdensity(
        lambda z: -0.5 * jnp.sum(z ** 2),
        lambda z, rows: -0.5 * (rows["x"] @ z) ** 2,
        {"x": dirty if bad == 1e39 else dirty.astype(np.float32)}, jnp.zeros(x.shape[1]))


def test_mnist_of_another_image_size_is_refused(tmp_path):
  from dsgrad.datasets import mnist
  rng = np.random.default_rng(0)
  mnist.write_idx(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 256, (4, 32, 32)))
  mnist.write_idx(tmp_path / "t10k-labels-idx1-ubyte", rng.integers(0, 10, 4))
  with pytest.raises(ValueError, match=r"\(32, 32\), expected \(28, 28\)"):
    mnist.load_mnist(tmp_path, "test")


def test_tennis_csv_with_a_byte_order_mark_keeps_players_apart(tmp_path):
  from dsgrad.datasets import tennis
  path = tmp_path / "matches.csv"
  path.write_bytes("\ufeffwinner_id,loser_id,winner_name,loser_name\n"
                   "1,2,Same Name,Same Name\n2,3,Same Name,Other\n".encode("utf-8"))
  loaded = tennis.load_tennis(path)
  assert len(loaded.player_ids) == 3, loaded.player_ids


def test_errors_inside_fit_reach_the_user_as_the_value_error(objective, params0):
  # A NaN in the data reaches fit's compiled step only through a loss that makes one:
  # the estimator's value check fires inside jit, and fit reports the ValueError itself.
  bad = dsgrad.Objective(lambda p, i, e: jnp.sqrt(-1.0 - jnp.sum(p["loc"] ** 2)) * jnp.ones(i.shape),
                         objective.noise_fn, objective.num_data, name="nan loss")
  with pytest.raises(ValueError, match="non-finite") as info:
    dsgrad.fit(bad, optax.chain(dsgrad.cv(bad), optax.sgd(1e-3)), params0, jax.random.key(0),
               num_steps=2, batch_size=BATCH, elbo_samples=0, progress=False)
  assert "INTERNAL" not in str(info.value) and str(info.value).endswith("(at step 0)")


def test_cifar_figure_marks_every_off_scale_point():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
  import cifar_dropout
  fig, ax = plt.subplots()
  marked = cifar_dropout.mark_off_scale(ax, [1, 2, 3, 4], [0.5, 5e4, np.nan, 2.0], 2.5, "C0")
  plt.close(fig)
  assert marked == [2.0, 3.0]


# --- NumPyro bridge: each way a model can read its data other than `x[idx]` -----------------

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
bridge = pytest.importorskip("dsgrad.contrib.numpyro")


def _bridge_data(n=60, d=3):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 2, n), jnp.float32)
  return x, y


def test_bridge_refuses_rows_read_with_dynamic_slice():
  x, y = _bridge_data()

  def model(x, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=10) as idx:
      rows = jax.lax.dynamic_slice_in_dim(x, idx[0], idx.shape[0])
      labels = jax.lax.dynamic_slice_in_dim(y, idx[0], idx.shape[0])
      numpyro.sample("y", dist.Bernoulli(logits=rows @ w), obs=labels)

  with pytest.raises(ValueError, match="dynamic_slice"):
    bridge.objective(model, x, y)


@pytest.mark.parametrize("plate_size", [50, 80])
def test_bridge_refuses_closed_over_data_of_another_length_than_the_plate(plate_size):
  x, y = _bridge_data()

  def model():
    w = numpyro.sample("w", dist.Normal(0, 1).expand([3]).to_event(1))
    with numpyro.plate("data", plate_size, subsample_size=10) as idx:
      numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

  with pytest.raises(ValueError, match="closes over"):
    bridge.objective(model)


def test_bridge_refuses_a_second_subsampled_plate_and_an_extra_scale():
  y = jnp.asarray(np.random.default_rng(1).normal(size=(8, 60)), jnp.float32)

  def two_plates(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("groups", 8, subsample_size=4, dim=-2) as g:
      with numpyro.plate("data", 60, subsample_size=10, dim=-1) as idx:
        numpyro.sample("y", dist.Normal(mu, 1), obs=y[g][:, idx])

  def scaled(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.handlers.scale(scale=0.5), numpyro.plate("data", 60, subsample_size=10) as i:
      numpyro.sample("y", dist.Normal(mu, 1), obs=y[0, i])

  with pytest.raises(ValueError, match="'groups'.*subsample too"):
    bridge.objective(two_plates, y, data_plate="data")
  with pytest.raises(ValueError, match="scale"):
    bridge.objective(scaled, y)


@pytest.mark.parametrize("data_dim", [-1, -2])
def test_bridge_nested_plates_give_numpyro_own_log_joint(data_dim):
  """A data plate inside (or around) a plate of groups is accepted, and its per-datum terms
  add up to NumPyro's log density of the full model at every latent value."""
  from numpyro import handlers
  from numpyro.infer.util import potential_energy
  n, g = 60, 3
  y = jnp.asarray(np.random.default_rng(2).normal(size=(g, n)), jnp.float32)

  def model(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("groups", g, dim=-3 - data_dim):
      theta = numpyro.sample("theta", dist.Normal(mu, 1))
      with numpyro.plate("data", n, subsample_size=10, dim=data_dim) as idx:
        obs = y[:, idx] if data_dim == -1 else y[:, idx].T
        numpyro.sample("y", dist.Normal(theta, 1), obs=obs)

  found = bridge.to_model(model, y)
  z = jnp.linspace(-0.5, 0.7, found.model.latent_dim)
  ours = found.model.log_prior(z) + jnp.sum(found.model.log_likelihood_at(z, jnp.arange(n)))
  full = handlers.substitute(model, data={"data": jnp.arange(n)})
  with pytest.warns(UserWarning, match="subsample_size"):
    theirs = -potential_energy(full, (y,), {}, found.unravel(z))
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)


# --- files that change under a reader or cannot be written ----------------------------------

@pytest.mark.parametrize("change", ["truncated", "rewritten"])
def test_memory_map_changed_after_opening_is_refused_not_read(tmp_path, change):
  from dsgrad import data
  path = tmp_path / "x.npy"
  np.save(path, np.arange(400, dtype=np.float32).reshape(100, 4))
  host = data.open_memmap(path)
  np.testing.assert_array_equal(host.rows(np.array([99])), [[396, 397, 398, 399]])
  if change == "truncated":
    os.truncate(path, 200)  # reading row 99 now would be past the end: SIGBUS
  else:
    stat = os.stat(path)
    np.save(path, np.zeros((100, 4), np.float32))  # same size, other rows
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
  with pytest.raises(ValueError, match="changed after it was opened"):
    host.rows(np.array([99]))


def test_a_full_disk_names_the_checkpoint_path_and_keeps_the_old_one(tmp_path, monkeypatch):
  import errno
  from dsgrad.training import checkpoint
  path = tmp_path / "run.ckpt"
  checkpoint.save(path, {"a": np.arange(3.0)})

  def no_space(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", no_space)
  with pytest.raises(OSError, match="run.ckpt.*No space left") as caught:
    checkpoint.save(path, {"a": np.arange(5.0)})
  assert caught.value.errno == errno.ENOSPC
  monkeypatch.undo()
  np.testing.assert_array_equal(checkpoint.restore(path, {"a": np.zeros(3)})["a"], np.arange(3.0))
  assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]  # no temporary left behind


# --- mistakes that used to surface as internal errors ---------------------------------------

def test_another_estimators_state_is_refused_by_name(objective, params0):
  saga = optax.chain(dsgrad.joint_saga(objective), optax.sgd(1e-3))
  svrg_state = optax.chain(dsgrad.joint_svrg(objective, every=10), optax.sgd(1e-3)).init(params0)
  indices, noise = _batch(objective)
  grads = objective.grad(params0, indices, noise)
  with pytest.raises(ValueError, match="JointSvrgState.*JointSagaState.*another estimator"):
    dsgrad.checked(saga, objective).update(grads, svrg_state, params0, indices=indices,
                                           noise=noise)
  with pytest.raises(ValueError, match="another estimator"):
    dsgrad.fit(objective, saga, params0, jax.random.key(0), num_steps=2, batch_size=BATCH,
               opt_state=svrg_state, elbo_samples=0, progress=False)


@pytest.mark.parametrize("change", ["renamed", "dropped", "reshaped"])
def test_params_with_a_leaf_renamed_dropped_or_reshaped_are_refused_by_name(
    objective, params0, change):
  bad = {"renamed": {"mean": params0["loc"], "log_scale": params0["log_scale"]},
         "dropped": {"loc": params0["loc"]},
         "reshaped": {"loc": params0["loc"][:-1], "log_scale": params0["log_scale"]}}[change]
  match = {"renamed": r"reads params\['loc'\].*they have \['log_scale', 'mean'\]",
           "dropped": r"reads params\['log_scale'\]", "reshaped": "shapes"}[change]
  for optimizer in (optax.adam(1e-2), optax.chain(dsgrad.cv(objective), optax.adam(1e-2))):
    with pytest.raises(ValueError, match=match):
      dsgrad.fit(objective, optimizer, bad, jax.random.key(0), num_steps=2, batch_size=BATCH,
                 elbo_samples=0, progress=False)


def test_fit_and_mcmc_under_jax_enable_x64():
  # Under x64, random draws and numpy's positions are float64: Laplace draws, HMC momenta,
  # the step size's dual averaging and a given position (or reference point) met the
  # float32 latent in bare dtype errors.
  script = (
      "import jax\njax.config.update('jax_enable_x64', True)\n"
      "import jax.numpy as jnp, numpy as np, optax, dsgrad\n"
      "from dsgrad.models import logistic_regression, synthetic_logistic_data\n"
      "x, y, _ = synthetic_logistic_data(jax.random.key(0), 200, 3)\n"
      "obj = dsgrad.meanfield_gaussian(logistic_regression(np.asarray(x), np.asarray(y)))\n"
      "p = {'loc': jnp.zeros(3), 'log_scale': jnp.full(3, -1.0)}\n"
      "for tx in (optax.adam(1e-2), optax.chain(dsgrad.joint_saga(obj), optax.adam(1e-2))):\n"
      "  r = dsgrad.fit(obj, tx, p, jax.random.key(0), num_steps=40, batch_size=10,\n"
      "                 progress=False)\n"
      "  assert np.all(np.isfinite(r.history.elbo)) and r.history.elbo[-1] > r.history.elbo[0]\n"
      "model = logistic_regression(np.asarray(x), np.asarray(y))\n"
      "s = dsgrad.mcmc.sample(jax.random.key(1), model, num_samples=200, num_warmup=200,\n"
      "                       subsample_size='auto', num_blocks=10, progress=False,\n"
      "                       position=np.zeros(3))\n"
      "sd = np.sqrt(np.diag(np.linalg.inv(dsgrad.mcmc.laplace_precision(model, s.proxy))))\n"
      "assert s.samples.dtype == np.float32 and np.all(np.isfinite(s.samples))\n"
      "assert np.all(np.abs(s.samples.mean(0) - s.proxy.theta_star) < sd), s.samples.mean(0)\n"
      # A user's model on float64 data: its terms came out float64 at the float32 latent
      # and met the sampler's float32 state (L-BFGS's start, the step size) in dtype errors.
      "data = {'x': np.asarray(x, np.float64), 'y': np.asarray(y, np.float64)}\n"
      "own = dsgrad.model_from_logdensity(lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b:\n"
      "    b['y'] * (b['x'] @ z) - jnp.logaddexp(0.0, b['x'] @ z), data, 3)\n"
      "rows = jnp.arange(2)\n"
      "assert own.log_likelihood_at(jnp.zeros(3, jnp.float32), rows).dtype == jnp.float32\n"
      "assert own.log_likelihood_at(jnp.zeros(3, jnp.float64), rows).dtype == jnp.float64\n"
      "s = dsgrad.mcmc.sample(jax.random.key(1), own, num_samples=200, num_warmup=200,\n"
      "                       subsample_size='auto', num_blocks=10, progress=False)\n"
      "sd = np.sqrt(np.diag(np.linalg.inv(dsgrad.mcmc.laplace_precision(own, s.proxy))))\n"
      "assert np.all(np.isfinite(s.samples))\n"
      "assert np.all(np.abs(s.samples.mean(0) - s.proxy.theta_star) < sd), s.samples.mean(0)\n"
      "print('ok')\n")
  assert "ok" in run_python(script)


@pytest.mark.parametrize("genres", ["Action, Comedy", "Action;Comedy", "Acton|Comedy", "nan"])
def test_movielens_genres_in_another_format_are_refused_not_zeroed(genres):
  from dsgrad import datasets
  with pytest.raises(ValueError, match="not a MovieLens genre"):
    datasets.movielens_from_columns([1, 2], ["Drama", genres], [3.0, 4.0])


def test_movielens_columns_without_rows_or_with_a_misspelt_count_are_refused():
  # Empty columns gave a data set of no ratings and no users; expected={"rating": 2}
  # (a typo) was reported as a count mismatch.
  from dsgrad import datasets
  with pytest.raises(ValueError, match="no ratings"):
    datasets.movielens_from_columns(np.zeros(0, int), np.zeros(0, str), np.zeros(0))
  with pytest.raises(ValueError, match=r"expected= takes the counts 'ratings' and 'users', "
                                       r"got \['rating'\]"):
    datasets.movielens_from_columns([1, 2], ["Drama", "Action"], [3.0, 4.0],
                                    expected={"rating": 2})


def test_movielens_genre_names_ignore_case_and_spaces():
  from dsgrad import datasets
  loose = datasets.movielens_from_columns([1, 2], [" action | COMEDY", "(no genres listed)"],
                                          [3.0, 4.0])
  strict = datasets.movielens_from_columns([1, 2], ["Action|Comedy", "IMAX"], [3.0, 4.0])
  np.testing.assert_array_equal(loose.genres, strict.genres)
  assert loose.genres[0].sum() == 2 and loose.genres[1].sum() == 0


@pytest.mark.parametrize("carry_cap", [dsgrad.training.segments.CHECK_AT_END_BYTES, 0],
                         ids=["checked at the segment's end", "checked every step"])
def test_fit_names_the_first_step_whose_gradient_is_not_finite(objective, params0,
                                                               carry_cap, monkeypatch):
  # The datum that poisons the loss first enters a batch at a step fit's orders decide;
  # the error must name that step, not the segment's start or a later one, whether the
  # segment checks every step or checks its end and runs again to find the step.
  monkeypatch.setattr(dsgrad.training.segments, "CHECK_AT_END_BYTES", carry_cap)
  bad_datum = 7
  key = jax.random.key(3)
  run_key = jax.random.split(key)[0]  # fit keeps the other half for its ELBO draws
  batches = np.asarray(dsgrad.training.batching.epoch_batches(jax.random.split(run_key)[0],
                                                     objective.num_data, BATCH, 40))
  first = int(np.argmax(np.any(batches == bad_datum, axis=1)))
  assert first > 0  # otherwise the test could not tell step 0 from the right step

  def loss(p, i, e):
    return jnp.where(i == bad_datum, jnp.nan, 1.0) * jnp.sum(p["loc"] ** 2)

  bad = dsgrad.Objective(loss, objective.noise_fn, objective.num_data, name="nan datum")
  with pytest.raises(ValueError, match="non-finite") as info:
    dsgrad.fit(bad, optax.chain(dsgrad.naive(), optax.sgd(1e-3)), params0, key,
               num_steps=40, batch_size=BATCH, elbo_samples=0, progress=False)
  assert str(info.value).endswith(f"(at step {first})"), (str(info.value), first)


def test_params_made_non_finite_by_the_update_itself_are_an_error(objective, params0):
  """A finite gradient scaled by -1e38: the gradient is finite, the update is not. fit names
  the step whose update it is, in a run of one step or of several, instead of handing
  back NaN params or naming the step after. (A rule that is not finite on any gradient,
  optax.scale(inf), is refused before the run: test_chain_order; this one is finite on
  that probe's +-1 entries and overflows on the model's gradient.)"""
  optimizer = optax.chain(dsgrad.naive(), optax.scale(-1e38))
  for num_steps in (3, 1):
    with pytest.raises(ValueError, match=r"the step's update contains non-finite values .*"
                                         r"\(at step 0\)$") as info:
      dsgrad.fit(objective, optimizer, params0, jax.random.key(0), num_steps=num_steps,
                 batch_size=BATCH, elbo_samples=0, progress=False)
    # Naive has no control variate whose curvature the message should point to.
    assert "a step size too large?" in str(info.value) and "control variate" not in str(
        info.value), str(info.value)


def test_checks_at_the_segment_end_compute_what_checks_per_step_compute(
    objective, params0, monkeypatch):
  """Settling the checks at a segment's end changes no number: the same run with every
  step checked (a carry above the cap) ends at the same params."""
  def run():
    optimizer = optax.chain(dsgrad.cv(objective), optax.adam(1e-2))
    return dsgrad.fit(objective, optimizer, params0, jax.random.key(0), num_steps=30,
                      batch_size=BATCH, eval_every=10, elbo_samples=0, progress=False)
  at_end = run()
  monkeypatch.setattr(dsgrad.training.segments, "CHECK_AT_END_BYTES", 0)
  per_step = run()
  for a, b in zip(jax.tree.leaves(at_end.params), jax.tree.leaves(per_step.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_checks_settled_at_a_segment_end_are_known_by_kind_not_by_wording():
  """Only the index-range and finiteness checks may move to a segment's end: another
  check whose message uses the same words keeps running every step."""
  ours = (dsgrad.checks.finite_checks(jnp.ones(2), "noise")
          + dsgrad.checks.index_checks(jnp.arange(3), 2))
  assert all(dsgrad.checks.is_range_or_finite_check(message) for _, message in ours)
  for _, message in ours:
    assert not dsgrad.checks.is_range_or_finite_check(str(message))


# ------------------------------------------------------------------ estimator and objective
@pytest.mark.parametrize("name", ["cv", "inc", "smiso", "joint_saga", "joint_svrg"])
def test_an_estimator_built_for_other_data_is_refused_by_name(name):
  """An estimator keeps per-datum state sized by the objective it was built from; updated
  with an objective over other data (a gather past a table's end is clamped, not an
  error) it must refuse, naming itself, instead of training on wrong rows."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 60, 3)
  full = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y),
                                   shared_noise=name == "inc")
  part = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x[:20], y[:20]),
                                   shared_noise=name == "inc")
  make = {"cv": dsgrad.cv, "inc": dsgrad.inc, "smiso": lambda o: dsgrad.smiso(o, 0.01),
          "joint_saga": dsgrad.joint_saga, "joint_svrg": dsgrad.joint_svrg}[name]
  estimator = make(part)
  optimizer = estimator if name == "smiso" else optax.chain(estimator, optax.adam(1e-2))
  with pytest.raises(ValueError, match=rf"dsgrad.{name} was built for an objective of 20 "
                                       r"data and is updated with one of 60"):
    dsgrad.fit(full, optimizer, dsgrad.meanfield_init(full), jax.random.key(1), num_steps=4,
               batch_size=5, elbo_samples=0, progress=False)


def test_meanfield_init_takes_a_logdensity_objective_and_refuses_another_family():
  data = {"y": np.linspace(-1.0, 1.0, 8, dtype=np.float32)}
  log_prior = lambda z: -0.5 * jnp.sum(z ** 2)
  log_lik = lambda z, b: -0.5 * (b["y"] - z[0]) ** 2
  objective = dsgrad.objective_from_logdensity(log_prior, log_lik, data, 2)
  params = dsgrad.meanfield_init(objective, 0.5, -1.0)
  assert jax.tree.map(jnp.shape, params) == {"loc": (2,), "log_scale": (2,)}
  assert float(params["loc"][0]) == 0.5 and float(params["log_scale"][1]) == -1.0
  fullrank = dsgrad.objective_from_logdensity(log_prior, log_lik, data, 2, family="fullrank")
  with pytest.raises(TypeError, match="is not a mean-field one.*by_name"):
    dsgrad.meanfield_init(fullrank)
  with pytest.raises(TypeError, match="takes the model or its mean-field objective, got int"):
    dsgrad.meanfield_init(2)


def test_params_given_as_python_lists_or_latent_pytrees_are_named(objective, params0):
  """A list of numbers is a pytree of separate scalars to JAX: the objective failed with
  "exp requires ndarray or scalar arguments" and asked whether the params were made for
  another model."""
  as_lists = {name: np.asarray(leaf).tolist() for name, leaf in params0.items()}
  with pytest.raises(ValueError, match=r"params\['loc'\] is a Python list of numbers.*"
                                       r"jnp.asarray"):
    dsgrad.fit(objective, optax.adam(1e-2), as_lists, jax.random.key(0), num_steps=2,
               batch_size=BATCH, progress=False)
  # Shaped like a pytree latent: the families hold flat (d,) arrays.
  as_latent = {name: {"w": leaf[:1], "b": leaf[1:]} for name, leaf in params0.items()}
  with pytest.raises(ValueError, match=r"params\['loc'\] is itself a pytree.*"
                                       r"ravel_pytree"):
    dsgrad.fit(objective, optax.adam(1e-2), as_latent, jax.random.key(0), num_steps=2,
               batch_size=BATCH, progress=False)
  with pytest.raises(ValueError, match="made for another model"):  # arrays of another shape
    dsgrad.fit(objective, optax.adam(1e-2), {"loc": params0["loc"][:2], "log_scale":
                                             params0["log_scale"]}, jax.random.key(0),
               num_steps=2, batch_size=BATCH, progress=False)
