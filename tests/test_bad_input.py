"""Bad input gets a clear error naming what is wrong, never a silent wrong answer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.models import logistic_regression
from conftest import BATCH


@pytest.fixture(scope="module")
def objective(logreg_model):
  return dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)


def _batch(objective, size=BATCH):
  return (jnp.arange(size, dtype=jnp.int32),
          objective.sample_noise(jax.random.key(0), size))


# The estimators' updates hold their maths only; a loop of one's own gets the checks
# from dsgrad.checked(optimizer, objective).
ESTIMATORS = {
    "cv": lambda o: dsgrad.checked(dsgrad.cv(o), o),
    "joint_saga": lambda o: dsgrad.checked(dsgrad.joint_saga(o), o),
    "joint_svrg": lambda o: dsgrad.checked(dsgrad.joint_svrg(o, every=5), o),
    "smiso": lambda o: dsgrad.checked(dsgrad.smiso(o, 0.01), o),
}


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("jit", [False, True])
def test_indices_out_of_range(objective, params0, name, jit):
  tx = ESTIMATORS[name](objective)
  state = tx.init(params0)
  _, noise = _batch(objective)
  grads = objective.grad(params0, jnp.arange(BATCH, dtype=jnp.int32), noise)
  update = lambda i: tx.update(grads, state, params0, indices=i, noise=noise)[0]
  if jit:
    update = jax.jit(update)
  for bad in ([0, 1, 2, 3, 50], [0, -1, 2, 3, 4]):
    with pytest.raises(Exception, match=r"indices out of range: every index must lie in \[0, 50\)"):
      jax.block_until_ready(update(jnp.array(bad, jnp.int32)))


def test_index_dtype_and_rank(objective, params0):
  _, noise = _batch(objective)
  with pytest.raises(TypeError, match="indices must have an integer dtype"):
    objective.grad(params0, jnp.arange(BATCH, dtype=jnp.float32), noise)
  with pytest.raises(ValueError, match="indices must be a 1-D array"):
    objective.grad(params0, jnp.zeros((BATCH, 1), jnp.int32), noise)


def test_noise_shape_and_batch_size_mismatch(objective, params0):
  idx, noise = _batch(objective)
  tx = ESTIMATORS["joint_saga"](objective)
  state = tx.init(params0)
  grads = objective.grad(params0, idx, noise)
  with pytest.raises(ValueError, match=r"noise has shape \(4, 5\), expected \(5, 5\)"):
    tx.update(grads, state, params0, indices=idx, noise=noise[:4])
  with pytest.raises(ValueError, match=r"noise has shape \(5, 6\), expected \(5, 5\)"):
    objective.grad(params0, idx, jnp.zeros((BATCH, 6)))
  with pytest.raises(ValueError, match="noise does not have the tree structure"):
    objective.grad(params0, idx, {"eps": noise})


def test_table_of_wrong_size(logreg_data, params0):
  """A state made for one data set, used with another: the table size must match."""
  x, y = logreg_data
  big = dsgrad.meanfield_gaussian(logistic_regression(x, y))
  small = dsgrad.meanfield_gaussian(logistic_regression(x[:40], y[:40]))
  state = dsgrad.joint_saga(big).init(params0)
  idx, noise = _batch(small)
  grads = small.grad(params0, idx, noise)
  with pytest.raises(ValueError, match=r"not one this optimizer's init makes for these params "
                                       r"\(.*table.*\(50, \d+\) float32, expected \(40, \d+\)"):
    dsgrad.checked(dsgrad.joint_saga(small), small).update(grads, state, params0, indices=idx,
                                                           noise=noise)


@pytest.mark.parametrize("jit", [False, True])
def test_nan_gradient(objective, params0, jit):
  idx, noise = _batch(objective)
  grads = jax.tree.map(lambda p: p.at[0].set(jnp.nan), params0)
  for tx in [dsgrad.checked(e, objective) for e in (dsgrad.naive(), dsgrad.cv(objective),
                                                    dsgrad.joint_saga(objective))]:
    state = tx.init(params0)
    update = lambda g: tx.update(g, state, params0, indices=idx, noise=noise)[0]
    if jit:
      update = jax.jit(update)
    with pytest.raises(Exception, match=r"non-finite values \(NaN or inf\)"):
      jax.block_until_ready(update(grads))


def test_nan_noise_and_gradient_from_objective(objective, params0):
  idx, noise = _batch(objective)
  with pytest.raises(ValueError, match="noise contains non-finite values"):
    objective.grad(params0, idx, noise.at[0, 0].set(jnp.inf))


def test_missing_arguments(objective, params0):
  idx, noise = _batch(objective)
  grads = objective.grad(params0, idx, noise)
  tx = ESTIMATORS["joint_saga"](objective)
  state = tx.init(params0)
  with pytest.raises(ValueError, match="needs the current params"):
    tx.update(grads, state, None, indices=idx, noise=noise)
  with pytest.raises(ValueError, match="pass indices=... and noise=..."):
    tx.update(grads, state, params0, indices=idx)
  with pytest.raises(ValueError, match="updates \\(gradient\\) does not have the tree structure"):
    tx.update({"loc": grads["loc"]}, state, params0, indices=idx, noise=noise)


def test_smiso_refuses_to_be_chained(objective, params0):
  idx, noise = _batch(objective)
  grads = objective.grad(params0, idx, noise)
  # After: adam would rescale SMISO's step; refused from the state's structure, in a loop
  # of one's own (checked) as in fit, where it trained to an ELBO of -1e6 without a word.
  after = optax.chain(dsgrad.smiso(objective, 0.01), optax.adam(0.1))
  with pytest.raises(ValueError, match="smiso is chained with 1 other.*optimizer in its own"):
    dsgrad.checked(after, objective).init(params0)
  with pytest.raises(ValueError, match="smiso is chained with 1 other"):
    dsgrad.fit(objective, after, params0, jax.random.key(0), num_steps=2, batch_size=5,
               progress=False)
  # Params moved outside SMISO (here, by a step of another rule) are not its iterate.
  opt = dsgrad.checked(dsgrad.smiso(objective, 0.01), objective)
  state = opt.init(params0)
  updates, state = opt.update(grads, state, params0, indices=idx, noise=noise)
  params = jax.tree.map(lambda p, u: p + 3 * u, params0, updates)
  grads = objective.grad(params, idx, noise)
  with pytest.raises(ValueError, match="optimizer in its own right.*transform after it"):
    opt.update(grads, state, params, indices=idx, noise=noise)
  # Before: a scaling transform changes the gradient SMISO receives.
  opt = dsgrad.checked(optax.chain(optax.scale(0.5), dsgrad.smiso(objective, 0.01)), objective)
  with pytest.raises(ValueError, match="chains a transformation .* before the dsgrad estimator"):
    opt.update(grads, opt.init(params), params, indices=idx, noise=noise)


def test_constructor_arguments(objective, logreg_data):
  with pytest.raises(ValueError, match="inc needs one noise draw shared"):
    dsgrad.inc(objective)
  with pytest.raises(ValueError, match="every must be an integer >= 1"):
    dsgrad.joint_svrg(objective, every=0)
  with pytest.raises(ValueError, match="step_size must be positive"):
    dsgrad.smiso(objective, 0.0)
  with pytest.raises(ValueError, match=r"alpha must be a probability in \(0, 1\]"):
    dsgrad.smiso(objective, 0.1, alpha=1.5)
  x, y = logreg_data
  with pytest.raises(ValueError, match="labels must be in"):
    logistic_regression(x, np.arange(len(y)) % 3)
  with pytest.raises(ValueError, match="labels must have shape"):
    logistic_regression(x, y[:-1])
  with pytest.raises(ValueError, match="num_data must be an integer >= 1"):
    dsgrad.Objective(lambda p, i, e: i, lambda k, b: None, 0)


def test_noise_fn_whose_draw_does_not_match_shared_noise_is_refused():
  """Per-datum noise declared shared (or shared declared per datum) would be one draw
  for every chunk of a full pass, or the batch's first row's for all."""
  loss = lambda p, rows, e: jnp.zeros(jnp.shape(rows)[:1])
  with pytest.raises(ValueError, match=r"shared_noise=True but noise_fn.*\(2, 5\).*"
                                       r"\(3, 5\).*no batch axis"):
    dsgrad.Objective(loss, dsgrad.gaussian_noise((5,)), 10, shared_noise=True)
  with pytest.raises(ValueError, match="shared_noise=False but noise_fn"):
    dsgrad.Objective(loss, dsgrad.gaussian_noise((5,), shared=True), 10)
  dsgrad.Objective(loss, dsgrad.gaussian_noise((5,), shared=True), 10, shared_noise=True)


def test_loss_fn_returning_wrong_shape(params0):
  bad = dsgrad.Objective(lambda p, i, e: jnp.sum(p["loc"]), dsgrad.gaussian_noise((5,)), 10)
  idx = jnp.arange(3, dtype=jnp.int32)
  with pytest.raises(ValueError, match="must return one value per datum"):
    bad.grad(params0, idx, bad.sample_noise(jax.random.key(0), 3))


@pytest.mark.parametrize("name", ["inc", "smiso"])
def test_table_estimators_refuse_a_table_that_does_not_fit(logreg_model, params0, name):
  """inc and smiso check the table's size before allocating, like
  joint_saga, and say how large it would be."""
  shared = dsgrad.meanfield_gaussian(logreg_model, shared_noise=True)
  make = {"inc": lambda **kw: dsgrad.inc(shared, **kw),
          "smiso": lambda **kw: dsgrad.smiso(shared, 0.01, **kw)}[name]
  size = sum(int(np.size(p)) for p in jax.tree.leaves(params0))
  with pytest.raises(MemoryError, match=f"dsgrad.{name}: .*{logreg_model.num_data:,} copies "
                                        f"of {size:,}"):
    make(max_table_bytes=1000).init(params0)
  state = make().init(params0)  # fits: the automatic limit
  assert dsgrad.table_bytes(state) == logreg_model.num_data * size * 4


@pytest.mark.parametrize("name", ["cv", "inc", "joint_saga", "joint_svrg"])
@pytest.mark.parametrize("bad", ["params", "noise"])
def test_nan_params_or_noise_never_enter_the_state(logreg_model, params0, name, bad):
  """a NaN in params or noise is refused by name (eagerly and under
  jit), instead of being written into the table or running mean with a finite output."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=name == "inc")
  tx = dsgrad.checked({"cv": lambda: dsgrad.cv(objective), "inc": lambda: dsgrad.inc(objective),
                      "joint_saga": lambda: dsgrad.joint_saga(objective),
                      "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=5)}[name](),
                     objective)
  idx, noise = _batch(objective)
  state = tx.init(params0)
  grads = objective.grad(params0, idx, noise)
  params = jax.tree.map(lambda p: p.at[0].set(jnp.nan), params0) if bad == "params" else params0
  noise = noise.at[0].set(jnp.nan) if bad == "noise" else noise
  for update in (tx.update, jax.jit(tx.update)):
    with pytest.raises(Exception, match=f"{bad} passed to dsgrad.checked contains non-finite"):
      jax.block_until_ready(update(grads, state, params, indices=idx, noise=noise))


@pytest.mark.parametrize("name", ["cv", "inc", "smiso", "joint_saga", "joint_svrg"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_params_are_refused_at_init(logreg_model, params0, name, dtype):
  """half-precision params get a clear error at init naming their dtype
  (before: an internal jax.jvp dtype error at the first update, and joint_saga first
  built a half-precision table silently); naive keeps working."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=name == "inc")
  tx = {"cv": lambda: dsgrad.cv(objective), "inc": lambda: dsgrad.inc(objective),
        "smiso": lambda: dsgrad.smiso(objective, 0.01),
        "joint_saga": lambda: dsgrad.joint_saga(objective),
        "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=5)}[name]()
  low = jax.tree.map(lambda p: p.astype(dtype), params0)
  with pytest.raises(ValueError, match=f"dsgrad.{name}: params of dtype {jnp.dtype(dtype).name}"):
    tx.init(low)
  naive = dsgrad.naive()
  out, _ = naive.update(low, naive.init(low), low)
  assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(out))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_fit_and_recommend_refuse_low_precision_params(logreg_model, params0, dtype):
  """fit trained float16 params with naive (and a plain optax rule) to a poor answer without
  a word: a logistic regression of 5,000 data ended at an ELBO of -5,670 where float32
  reached -1,847. recommend ruled its control variates out and picked naive, whose fit
  then trained in float16."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  low = jax.tree.map(lambda p: p.astype(dtype), params0)
  name = jnp.dtype(dtype).name
  for optimizer in (optax.adam(1e-2), optax.chain(dsgrad.naive(), optax.adam(1e-2))):
    with pytest.raises(ValueError, match=rf"dsgrad.fit: params of dtype {name} .*\['loc'\]"):
      dsgrad.fit(objective, optimizer, low, jax.random.key(0), num_steps=5, batch_size=5,
                 progress=False)
  with pytest.raises(ValueError, match=f"dsgrad.recommend: params of dtype {name}"):
    dsgrad.recommend(objective, optax.adam(1e-2), low, jax.random.key(0), batch_size=5,
                     budget=1.0, progress=False)


def _wider_model(model):
  """The logistic regression of the shared fixture with one more (constant) feature."""
  from conftest import DIM, N_DATA
  from dsgrad.models import synthetic_logistic_data
  x, y, _ = synthetic_logistic_data(jax.random.key(0), N_DATA, DIM)
  return logistic_regression(jnp.concatenate([x, jnp.ones((N_DATA, 1))], axis=1), y)


@pytest.mark.parametrize("name,field", [("joint_svrg", "snapshot"), ("joint_saga", "running_mean"),
                                        ("smiso", "running_mean"), ("inc", "table rows")])
def test_state_from_another_model_is_refused_by_name(logreg_model, params0, name, field):
  """a state built for params of another dimension names the state's
  field and both shapes (before: an internal broadcasting or dot_general error)."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=name == "inc")
  tx = {"inc": lambda: dsgrad.inc(objective), "smiso": lambda: dsgrad.smiso(objective, 0.01),
        "joint_saga": lambda: dsgrad.joint_saga(objective),
        "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=5)}[name]()
  other = jax.tree.map(lambda p: jnp.concatenate([p, p[:1]]), params0)  # one more dimension
  # Every init checks its params against the objective: build the state for a model of
  # one more dimension.
  wider = dsgrad.meanfield_gaussian(_wider_model(logreg_model), shared_noise=name == "inc")
  tx_other = {"inc": lambda: dsgrad.inc(wider), "smiso": lambda: dsgrad.smiso(wider, 0.01),
              "joint_saga": lambda: dsgrad.joint_saga(wider),
              "joint_svrg": lambda: dsgrad.joint_svrg(wider, every=5)}[name]()
  state = tx_other.init(other)
  idx, noise = _batch(objective)
  d = params0["loc"].shape[0]
  with pytest.raises(ValueError, match=rf"dsgrad.checked: the state passed to update is not "
                                       rf"one .*: \((\d+, )?{d + 1},?\) float32, expected \((\d+, )?{d},?\)"):
    dsgrad.checked(tx, objective).update(params0, state, params0, indices=idx, noise=noise)


@pytest.mark.parametrize("name", ["cv", "inc", "smiso", "joint_saga", "joint_svrg"])
def test_params_of_another_model_are_refused_at_init(logreg_model, params0, name):
  """params of another dimension used to fail inside init's full pass
  (joint_saga, joint_svrg) or at the first update with an internal broadcasting error."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=name == "inc")
  tx = {"cv": lambda: dsgrad.cv(objective), "inc": lambda: dsgrad.inc(objective),
        "smiso": lambda: dsgrad.smiso(objective, 0.01),
        "joint_saga": lambda: dsgrad.joint_saga(objective),
        "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=5)}[name]()
  other = jax.tree.map(lambda p: jnp.concatenate([p, p[:1]]), params0)
  d = params0["loc"].shape[0]
  with pytest.raises(ValueError, match=rf"dsgrad.{name}: objective .* cannot be evaluated at "
                                       rf"these params \(shapes \[\({d + 1},\), \({d + 1},\)\]\)"):
    tx.init(other)


def test_a_model_that_cannot_be_traced_is_refused_as_such_not_as_params(params0):
  """A likelihood indexing a NumPy array with the traced batch indices was refused as
  "params made for another model"; the message now names the tracing and the remedy."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 50, 5)
  x, y = np.asarray(x), np.asarray(y)
  model = dsgrad.models.Model(
      log_prior=lambda z: -0.5 * jnp.sum(z ** 2),
      log_likelihood=lambda z, idx: -jnp.logaddexp(0.0, -(2 * y[idx] - 1) * (x[idx] @ z)),
      num_data=50, latent_dim=5)
  objective = dsgrad.meanfield_gaussian(model)
  with pytest.raises(ValueError, match=r"dsgrad.fit: objective .* cannot be traced by JAX: "
                                       r".*jnp.asarray\(x\)"):
    dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.adam(1e-2)), params0,
               jax.random.key(0), num_steps=2, batch_size=5, progress=False)


@pytest.mark.parametrize("approx_name", ["gaussian_mean_taylor", "gaussian_taylor",
                                         "glm_mean_taylor"])
@pytest.mark.parametrize("name", ["cv", "joint_saga", "joint_svrg"])
def test_approximation_of_another_model_is_refused_at_init(logreg_model, params0, name,
                                                           approx_name):
  """an approximation built from a model of another dimension used to
  give an internal dot_general error in the first full pass or update."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  approx = getattr(dsgrad.approx, approx_name)(_wider_model(logreg_model))
  tx = {"cv": dsgrad.cv, "joint_saga": dsgrad.joint_saga,
        "joint_svrg": lambda o, a: dsgrad.joint_svrg(o, a, every=5)}[name](objective, approx)
  with pytest.raises(ValueError, match=rf"dsgrad.{name}: approximation '{approx_name}' cannot "
                                       "be evaluated at these params .*another model"):
    tx.init(params0)


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
@pytest.mark.parametrize("argument", ["loc", "log_scale"])
def test_family_and_dais_initial_values_of_the_wrong_shape_are_named(logreg_model, family,
                                                                     argument):
  """a ``loc`` of the wrong shape (families, DAIS's ``init_params``) used
  to be a raw broadcasting error."""
  d = logreg_model.latent_dim
  with pytest.raises(ValueError, match=rf"{argument} has shape \({d + 2},\) but the family's "
                                       rf"dimension is {d}"):
    dsgrad.families.by_name(family, d, **{argument: jnp.zeros(d + 2)})
  vi = dsgrad.annealing.AnnealedVI(logreg_model, 2, base=family)
  with pytest.raises(ValueError, match=rf"{argument} has shape \({d + 2},\)"):
    vi.init_params(**{argument: jnp.zeros(d + 2)})
  assert vi.init_params(**{argument: jnp.zeros(d)})["base"]["loc"].shape == (d,)


@pytest.mark.parametrize("name", ["cv", "joint_saga", "joint_svrg"])
def test_deferred_checks_raise_the_same_error_naming_the_step(objective, params0, name):
  # As fit runs its segments: the value checks leave the compiled scan with its results
  # (no host round trip per step) and are raised afterwards, naming the first bad step.
  from jax.experimental import checkify
  tx = ESTIMATORS[name](objective)
  state = tx.init(params0)
  idx, noise = _batch(objective)
  grads = objective.grad(params0, idx, noise)
  good = jnp.tile(idx, (5, 1))

  def run(state, batches):
    def body(state, xs):
      t, indices = xs
      with dsgrad.checks.deferred(t):
        return tx.update(grads, state, params0, indices=indices, noise=noise)[1], None
    return jax.lax.scan(body, state, (jnp.arange(5), batches))[0]

  program = jax.jit(checkify.checkify(run))
  dsgrad.checks.raise_deferred(program(state, good)[0])  # nothing failed: no error
  bad = good.at[3, 4].set(50).at[4, 0].set(-1)
  with pytest.raises(ValueError, match=r"^indices out of range: every index must lie in "
                                       r"\[0, 50\) \(at step 3\)$"):
    dsgrad.checks.raise_deferred(program(state, bad)[0])


def test_fit_segments_hold_no_host_callback(objective, params0):
  # A conditional host callback per step synchronizes a GPU with its host on every step.
  optimizer = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  segment, _ = dsgrad.training.segments.segment_program(objective, optimizer, BATCH, 3)
  orders = dsgrad.training.batching.EpochOrders(jax.random.key(1), objective.num_data, BATCH).window(0, 3)
  text = segment.lower((params0, optimizer.init(params0)), jax.random.key(0), jnp.int32(0),
                       jnp.int32(3), objective, orders, {}).as_text()
  assert "callback" not in text


def test_the_estimators_hold_no_checks_and_checked_adds_them():
  """An estimator's update is its maths: a NaN gradient passes through it (as under
  optax.apply_if_finite); dsgrad.checked(optimizer, objective) refuses it by name."""
  params = {"w": jnp.zeros(3)}
  nan = {"w": jnp.full(3, jnp.nan)}
  updates, _ = dsgrad.naive().update(nan, (), params, indices=jnp.arange(2))
  assert bool(jnp.all(jnp.isnan(updates["w"])))
  with pytest.raises(ValueError, match="non-finite|NaN"):
    dsgrad.checked(dsgrad.naive()).update(nan, optax.EmptyState(), params)
  for make in (lambda: dsgrad.naive(value_checks=False),
               lambda: dsgrad.cv(dsgrad.meanfield_gaussian(
                   logistic_regression(np.eye(3, dtype=np.float32), np.array([0, 1, 1]))),
                   value_checks=False)):
    with pytest.raises(TypeError, match=r"dsgrad\.(naive|cv)\(.*\): got an unexpected keyword "
                                        r"argument 'value_checks'.*dsgrad\.checked"):
      make()


def test_a_missing_argument_names_the_function_and_its_signature(objective, params0):
  # Python's own "fit() missing 1 required keyword-only argument" named neither dsgrad nor
  # the other arguments.
  with pytest.raises(TypeError, match=r"^dsgrad\.fit\(objective.*batch_size.*max_seconds.*\): "
                                      r"missing a required argument: 'batch_size'"):
    dsgrad.fit(objective, optax.adam(1e-2), params0, jax.random.key(0), max_seconds=5.0)


def test_a_wrong_keyword_names_the_function_and_its_signature(objective, params0):
  with pytest.raises(TypeError, match=r"^dsgrad\.recommend\(objective.*budget.*\): got an "
                                      r"unexpected keyword argument 'update_rule'"):
    dsgrad.recommend(objective, lambda n: optax.adam(1e-2), params0, jax.random.key(0),
                     batch_size=5, budget=1.0, update_rule=optax.adam)
