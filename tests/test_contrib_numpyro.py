"""dsgrad.contrib.numpyro: a NumPyro model's dsgrad objective is NumPyro's own ELBO
(compared with Trace_ELBO + AutoNormal at the same parameters and the same draw), its
naive gradient is NumPyro's, constrained sites carry the right Jacobian, and models
dsgrad cannot handle are refused with a message naming the problem."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

numpyro = pytest.importorskip("numpyro")
import numpyro.distributions as dist  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.infer import Predictive, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoNormal  # noqa: E402

import dsgrad  # noqa: E402
from dsgrad.contrib import numpyro as dsgrad_numpyro  # noqa: E402

# The tests themselves evaluate NumPyro on full data, other than the models' batch size.
pytestmark = pytest.mark.filterwarnings("ignore:subsample_size does not match")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

N, D, BATCH = 40, 3, 10


@pytest.fixture(scope="module")
def logreg_data():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), N, D)
  return jnp.asarray(x), jnp.asarray(y, jnp.float32)


def logreg_model(x, y):
  w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
  temperature = numpyro.sample("temperature", dist.LogNormal(0.0, 0.5))  # a positive site
  with numpyro.plate("data", N, subsample_size=BATCH) as idx:
    numpyro.sample("y", dist.Bernoulli(logits=(x[idx] @ w) / temperature),
                   obs=None if y is None else y[idx])


def factor_model(x, y):
  """logreg_model with its likelihood written as a numpyro.factor in the data plate."""
  w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
  temperature = numpyro.sample("temperature", dist.LogNormal(0.0, 0.5))
  with numpyro.plate("data", N, subsample_size=BATCH) as idx:
    logits = (x[idx] @ w) / temperature
    numpyro.factor("y", y[idx] * logits - jnp.logaddexp(0.0, logits))


def test_a_factor_in_the_data_plate_is_a_per_datum_likelihood_term(logreg_data):
  # It was refused: "no observed site sits inside the data plate 'data'".
  x, y = logreg_data
  observed = dsgrad_numpyro.objective(logreg_model, x, y)
  factored = dsgrad_numpyro.objective(factor_model, x, y)
  assert factored.numpyro_model.observed_sites == ("y",)
  params = _random_params(observed, jax.random.key(1))
  everything = jnp.arange(N, dtype=jnp.int32)
  eps = observed.sample_noise(jax.random.key(2), N)
  np.testing.assert_allclose(factored.loss(params, everything, eps),
                             observed.loss(params, everything, eps), rtol=1e-5, atol=1e-4)


def _with_draws(guide, autonormal_params, eps_by_site):
  """AutoNormal with its parameters and its standard-normal draws fixed."""

  def draw(site):
    if site["type"] != "sample" or site["name"] not in eps_by_site:
      return None
    fn, transforms = site["fn"], []
    if isinstance(fn, dist.TransformedDistribution):
      fn, transforms = fn.base_dist, fn.transforms
    if isinstance(fn, dist.Independent):
      fn = fn.base_dist
    value = fn.loc + fn.scale * eps_by_site[site["name"]]
    for t in transforms:
      value = t(value)
    return value

  return handlers.substitute(handlers.substitute(guide, data=autonormal_params),
                             substitute_fn=draw)


def _random_params(objective, key):
  params = objective.init_params()
  return jax.tree.map(lambda p: p + 0.4 * jax.random.normal(key, p.shape), params)


def _numpyro_loss(objective, x, y, indices, autonormal_params, eps):
  model = handlers.substitute(logreg_model, data={"data": indices})
  guide = _with_draws(AutoNormal(logreg_model), autonormal_params,
                      objective.numpyro_model.unravel(eps))
  return Trace_ELBO().loss(jax.random.key(9), {}, model, guide, x, y)


def test_full_data_elbo_equals_trace_elbo_with_the_same_draw(logreg_data):
  x, y = logreg_data
  objective = dsgrad_numpyro.objective(logreg_model, x, y)
  assert objective.numpyro_model.data_plate == "data"
  assert objective.numpyro_model.latent_sites == ("temperature", "w")
  assert objective.num_data == N and objective.numpyro_model.model.latent_dim == D + 1
  params = _random_params(objective, jax.random.key(1))
  eps = objective.sample_noise(jax.random.key(2), N)
  everything = jnp.arange(N, dtype=jnp.int32)
  ours, theirs = map(float, jax.jit(lambda params: (  # one program, not one per operation
      jnp.mean(objective.loss(params, everything, eps)),
      _numpyro_loss(objective, x, y, everything, objective.autonormal_params(params),
                    eps)))(params))
  # Trace_ELBO uses the sampled -log q(z); dsgrad the closed-form entropy. With the draw
  # fixed they differ by log q(z) + H(q) = -|eps|^2 / 2 + d / 2 exactly.
  d = objective.numpyro_model.model.latent_dim
  np.testing.assert_allclose(ours - 0.5 * float(jnp.sum(eps ** 2)) + 0.5 * d, theirs,
                             rtol=1e-5)


def test_naive_gradient_equals_numpyro_gradient(logreg_data):
  x, y = logreg_data
  objective = dsgrad_numpyro.objective(logreg_model, x, y)
  params = _random_params(objective, jax.random.key(3))
  eps = objective.sample_noise(jax.random.key(4), BATCH)
  indices = jnp.array([5, 17, 0, 39, 22, 8, 31, 2, 11, 26], jnp.int32)
  ours = objective.grad(params, indices, eps)
  # Each site's gradient is summed whole before the sites are concatenated (a GPU fusion).
  assert "optimization_barrier" in str(jax.make_jaxpr(objective.grad)(params, indices, eps))
  theirs = jax.grad(lambda p: _numpyro_loss(objective, x, y, indices, p, eps))(
      objective.autonormal_params(params))
  unravel = objective.numpyro_model.unravel
  loc, log_scale = unravel(ours["loc"]), unravel(ours["log_scale"])
  scales = unravel(jnp.exp(params["log_scale"]))
  for site in objective.numpyro_model.latent_sites:
    np.testing.assert_allclose(loc[site], theirs[f"{site}_auto_loc"], rtol=1e-4, atol=1e-5)
    # dsgrad differentiates log(scale), AutoNormal the scale itself.
    np.testing.assert_allclose(log_scale[site], theirs[f"{site}_auto_scale"] * scales[site],
                               rtol=1e-4, atol=1e-5)


def test_autonormal_params_round_trip(logreg_data):
  x, y = logreg_data
  objective = dsgrad_numpyro.objective(logreg_model, x, y)
  with pytest.raises(ValueError, match="unknown variational family"):
    dsgrad_numpyro.objective(logreg_model, x, y, family="flow")
  fullrank = dsgrad_numpyro.objective(logreg_model, x, y, family="fullrank")
  with pytest.raises(ValueError, match="AutoNormal is mean-field"):
    fullrank.autonormal_params(fullrank.init_params())
  # Params of another dimension are named (before: a broadcasting error from inside).
  other = {"loc": jnp.zeros(D + 5), "log_scale": jnp.zeros(D + 5)}
  for call in (lambda: objective.autonormal_params(other),
               lambda: objective.sample_posterior(jax.random.key(0), other, 2)):
    with pytest.raises(ValueError, match="cannot be evaluated at these params"):
      call()
  params = _random_params(objective, jax.random.key(5))
  back = objective.params_from_autonormal(objective.autonormal_params(params))
  np.testing.assert_allclose(back["loc"], params["loc"], rtol=1e-6)
  np.testing.assert_allclose(back["log_scale"], params["log_scale"], rtol=1e-5, atol=1e-6)


def constrained_model(y, labels):
  # A positive scale, a simplex and an unconstrained mean, each observed per datum.
  mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
  sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
  probs = numpyro.sample("probs", dist.Dirichlet(jnp.array([1.5, 2.0, 3.0])))
  with numpyro.plate("data", y.shape[0], subsample_size=4) as idx:
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y[idx])
    numpyro.sample("label", dist.Categorical(probs), obs=labels[idx])


def test_constrained_sites_carry_the_jacobian():
  y = jnp.linspace(-1.0, 2.0, 12)
  labels = jnp.array([0, 1, 2, 2, 1, 0, 2, 2, 1, 2, 0, 2])
  found = dsgrad_numpyro.to_model(constrained_model, y, labels)
  assert found.model.latent_dim == 1 + 1 + 2  # the 3-simplex has 2 free coordinates
  z = jnp.array([0.3, -0.4, 0.2, -0.7])
  values = found.constrain(z)
  assert float(values["sigma"]) > 0
  np.testing.assert_allclose(float(jnp.sum(values["probs"])), 1.0, rtol=1e-6)
  assert bool(jnp.all(values["probs"] > 0))
  # Independent reference: NumPyro's log density at the constrained values plus the log
  # |det| of the map from z to (mu, sigma, probs[:2]), differentiated by JAX.
  everything = jnp.arange(12, dtype=jnp.int32)
  full = handlers.substitute(constrained_model, data={"data": everything})

  def free_coordinates(z):
    v = found.constrain(z)
    return jnp.concatenate([v["mu"][None], v["probs"][:2], v["sigma"][None]])

  @jax.jit  # one program, not one per operation
  def both(z):
    log_joint, _ = numpyro.infer.util.log_density(full, (y, labels), {}, found.constrain(z))
    _, log_det = jnp.linalg.slogdet(jax.jacobian(free_coordinates)(z))
    ours = found.model.log_prior(z) + jnp.sum(found.model.log_likelihood_at(z, everything))
    return ours, log_joint + log_det

  ours, theirs = both(z)
  np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-5)


def test_sample_posterior_feeds_predictive(logreg_data):
  x, y = logreg_data
  objective = dsgrad_numpyro.objective(logreg_model, x, y)
  params = _random_params(objective, jax.random.key(6))
  samples = objective.sample_posterior(jax.random.key(7), params, 2000)
  assert samples["w"].shape == (2000, D) and samples["temperature"].shape == (2000,)
  assert bool(jnp.all(samples["temperature"] > 0))
  # The constrained draws follow q: log(temperature) ~ N(loc, scale).
  loc = objective.numpyro_model.unravel(params["loc"])["temperature"]
  scale = objective.numpyro_model.unravel(jnp.exp(params["log_scale"]))["temperature"]
  log_t = jnp.log(samples["temperature"])
  assert abs(float(jnp.mean(log_t) - loc)) < 4 * float(scale) / np.sqrt(2000)
  predictive = Predictive(handlers.substitute(logreg_model, data={"data": jnp.arange(N)}),
                          posterior_samples=samples)
  draws = predictive(jax.random.key(8), x, None)
  assert draws["y"].shape == (2000, N)
  assert set(np.unique(np.asarray(draws["y"]))) <= {0, 1}


def local_latent_model(y):
  mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
  with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
    offset = numpyro.sample("offset", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu + offset, 1.0), obs=y[idx])


def two_plates_model(y, v):
  mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
  with numpyro.plate("first", y.shape[0], subsample_size=5) as idx:
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
  with numpyro.plate("second", v.shape[0], subsample_size=3) as jdx:
    numpyro.sample("v", dist.Normal(mu, 1.0), obs=v[jdx])


def unindexed_model(y):
  mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
  with numpyro.plate("data", y.shape[0], subsample_size=5):
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_unsupported_models_are_refused():
  y = jnp.arange(20.0)
  with pytest.raises(ValueError, match="latent site 'offset' sits inside the data plate"):
    dsgrad_numpyro.objective(local_latent_model, y)
  with pytest.raises(ValueError, match="two subsampled data plates"):
    dsgrad_numpyro.objective(two_plates_model, y, jnp.arange(9.0))
  with pytest.raises(ValueError, match="must index its data with them"):
    dsgrad_numpyro.objective(unindexed_model, y)

  def param_model(y):  # a param stayed at its initial value, untrained, without a word
    loc = numpyro.param("loc", jnp.zeros(()))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", 20, subsample_size=5) as idx:
      numpyro.sample("y", dist.Normal(loc, scale), obs=y[idx])

  with pytest.raises(ValueError, match=r"numpyro.param site\(s\) \['loc'\].*untrained"):
    dsgrad_numpyro.objective(param_model, y)


def plate_model(plate_size):
  def model(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", plate_size, subsample_size=BATCH) as idx:
      numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])
  return model


@pytest.mark.parametrize("plate_size, consequence", [
    (N + 20, f"indices {N}-{N + 19} would silently read row {N - 1} again"),
    (N - 20, f"rows {N - 20}-{N - 1} would never be used")])
def test_plate_size_other_than_the_data_length_is_refused(logreg_data, plate_size,
                                                          consequence):
  """JAX clamps out-of-range gathers, so a plate longer than the data
  rereads the last row and a shorter one never uses the tail; both are refused, naming the
  argument, both sizes and the consequence."""
  x, y = logreg_data
  with pytest.raises(ValueError, match=(rf"plate 'data' has size {plate_size} but the model "
                                        rf"reads argument 'x' \(shape \({N}, {D}\)\)")) as err:
    dsgrad_numpyro.objective(plate_model(plate_size), x, y)
  assert consequence in str(err.value)


def test_plate_size_check_reads_keyword_arguments_and_ignores_lookup_tables():
  """A keyword argument read at the plate's indices is checked too; a table indexed by a
  per-datum id (``scale[group[idx]]``, another length) is not a per-datum array."""
  group = jnp.arange(30) % 4
  scale = jnp.linspace(1.0, 2.0, 4)

  def model(y, group, *, scale):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", 30, subsample_size=5) as idx:
      numpyro.sample("y", dist.Normal(mu, scale[group[idx]]), obs=y[idx])

  objective = dsgrad_numpyro.objective(model, jnp.arange(30.0), group, scale=scale)
  assert objective.num_data == 30
  with pytest.raises(ValueError, match="reads argument 'y' \\(shape \\(36,\\)\\)"):
    dsgrad_numpyro.objective(model, jnp.arange(36.0), group, scale=scale)


@pytest.mark.parametrize("bad", [9, -1], ids=["past_the_end", "negative"])
def test_an_index_argument_out_of_range_is_refused(bad):
  """``b[g[idx]]`` with a group id past the end read the last group's value (JAX clamps)
  and a negative one wrapped, without an error."""
  groups = 6
  g = np.random.default_rng(0).integers(0, groups, 40).astype(np.int32)
  y = np.linspace(-1.0, 1.0, 40).astype(np.float32)

  def model(y, g):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([groups]).to_event(1))
    with numpyro.plate("data", 40, subsample_size=8) as idx:
      numpyro.sample("y", dist.Normal(b[g[idx]], 1.0), obs=y[idx])

  assert dsgrad_numpyro.objective(model, y, g).num_data == 40
  with pytest.raises(ValueError, match=rf"argument 'g' at row 17 holds \[{bad}\], which the "
                                       r"model uses as an index out of range"):
    dsgrad_numpyro.objective(model, y, np.where(np.arange(40) == 17, bad, g).astype(np.int32))


def test_an_lkj_prior_beside_categorical_data_is_not_an_index_out_of_range():
  """LKJCholesky's transform reads one past an array's end whatever the data hold: the
  model was refused, its categorical observations blamed for an index 3 of 3. It builds,
  with a warning that the argument's range cannot be checked, and its log density is
  NumPyro's."""
  rng = np.random.default_rng(0)
  n, k, dim = 60, 3, 3
  c = rng.integers(0, k, n).astype(np.int32)
  y = rng.normal(size=(n, dim)).astype(np.float32)

  def model(c, y, subsample=10):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(k)))
    factor = numpyro.sample("L", dist.LKJCholesky(dim, 2.0))
    with numpyro.plate("data", n, subsample_size=subsample) as idx:
      numpyro.sample("c", dist.Categorical(w), obs=c[idx])
      numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(dim), scale_tril=factor),
                     obs=y[idx])

  with pytest.warns(dsgrad.data_kinds.IndexChecksBlind, match="argument 'c'"):
    found = dsgrad_numpyro.to_model(model, c, y)
  z = 0.5 * jax.random.normal(jax.random.key(1), (found.model.latent_dim,))
  # Compiled: each operation run eagerly compiled a program of its own (170 in all).
  ours = jax.jit(lambda z: found.model.log_prior(z)
                 + jnp.sum(found.model.log_likelihood_at(z, jnp.arange(n))))(z)
  theirs = jax.jit(lambda z: -numpyro.infer.util.potential_energy(
      model, (jnp.asarray(c), jnp.asarray(y)), {"subsample": None}, found.unravel(z)))(z)
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_a_minus_one_that_the_model_masks_is_not_an_index_out_of_range():
  groups = 6
  g = np.random.default_rng(0).integers(0, groups, 40).astype(np.int32)
  g[::5] = -1  # "no group"
  y = np.linspace(-1.0, 1.0, 40).astype(np.float32)

  def model(y, g):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([groups]).to_event(1))
    with numpyro.plate("data", 40, subsample_size=8) as idx:
      effect = jnp.where(g[idx] >= 0, b[jnp.maximum(g[idx], 0)], 0.0)
      numpyro.sample("y", dist.Normal(effect, 1.0), obs=y[idx])

  # Read as unsigned by the index check, the masked -1 looked like an index past the end.
  assert dsgrad_numpyro.objective(model, y, g).num_data == 40


def test_a_nan_in_the_data_is_refused_by_name_unless_the_model_masks_it(logreg_data):
  x, y = (np.asarray(a) for a in logreg_data)

  def masked_model(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", N, subsample_size=BATCH) as idx:
      with handlers.mask(mask=~jnp.isnan(y[idx])):
        numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

  x_nan = x.copy()
  x_nan[13, 1] = np.nan  # a NaN logit: BernoulliLogits' log-probability is 0, its gradient NaN
  with pytest.raises(ValueError, match=r"argument 'x' holds NaN at row 13, .*gradient NaN"):
    dsgrad_numpyro.objective(masked_model, x_nan, y)
  y_nan = y.copy()
  y_nan[[4, 21]] = np.nan  # missing observations, kept out of the density by the mask
  objective = dsgrad_numpyro.objective(masked_model, x, y_nan)
  result = dsgrad.fit(objective, optax.adam(1e-2), objective.init_params(), jax.random.key(0),
                      num_steps=40, batch_size=BATCH, elbo_samples=10, progress=False)
  assert np.all(np.isfinite(result.history.elbo))

  def censored_model(t, censored_at):  # an infinite argument is not a missing value
    rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", N, subsample_size=BATCH) as idx:
      seen = t[idx] <= censored_at[idx]
      numpyro.factor("t", jnp.where(seen, jnp.log(rate), 0.0)
                     - rate * jnp.minimum(t[idx], censored_at[idx]))

  t = np.linspace(0.1, 3.0, N, dtype=np.float32)
  never = np.where(np.arange(N) % 3 == 0, 1.0, np.inf).astype(np.float32)
  assert dsgrad_numpyro.objective(censored_model, t, never).num_data == N


def test_a_pandas_column_is_read_as_its_array_and_64_bit_ids_beyond_32_bits_are_refused():
  pd = pytest.importorskip("pandas")
  rng = np.random.default_rng(0)
  frame = pd.DataFrame({"x": rng.normal(size=40), "y": rng.normal(size=40)})

  def model(x, y, ids):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", 40, subsample_size=8) as idx:
      numpyro.sample("y", dist.Normal(w * x[idx] + 0.0 * ids[idx], 1.0), obs=y[idx])

  ids = np.arange(40, dtype=np.int64)
  # A Series failed when the model indexed it with a traced batch.
  from_frame = dsgrad_numpyro.objective(model, frame["x"], frame["y"], ids)
  from_arrays = dsgrad_numpyro.objective(model, frame["x"].to_numpy(), frame["y"].to_numpy(), ids)
  z = jnp.array([0.7])
  np.testing.assert_allclose(from_frame.numpyro_model.model.log_likelihood(z, jnp.arange(5)),
                             from_arrays.numpyro_model.model.log_likelihood(z, jnp.arange(5)))
  # JAX stored them in 32 bits: an id of 3e11 wrapped onto another value without an error.
  with pytest.raises(ValueError, match="argument 'ids' holds int64 values from 0 to "
                                       "390000000000, beyond int32's range"):
    dsgrad_numpyro.objective(model, frame["x"], frame["y"], ids * 10 ** 10)


def test_observation_not_indexed_by_a_subsampled_plate_is_explained():
  """``obs=y`` (all rows) in a subsampled plate used to surface as
  NumPyro's raw broadcasting error."""
  def model(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", N, subsample_size=BATCH):
      numpyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)

  x, y = jnp.ones((N, D)), jnp.ones(N)
  with pytest.raises(ValueError, match="obs=y\\[idx\\]"):
    dsgrad_numpyro.objective(model, x, y)


# naive and joint SAGA (whose table reads the bridge's per-datum terms) by default; cv and
# joint SVRG, which read the bridge as joint SAGA does, with -m slow (6 s).
@pytest.mark.parametrize("estimators", ["naive_and_table", pytest.param(
    "snapshot_and_cv", marks=pytest.mark.slow)])
def test_every_estimator_trains_a_numpyro_model(logreg_data, estimators):
  x, y = logreg_data
  objective = dsgrad_numpyro.objective(logreg_model, x, y)
  params = objective.init_params()
  start = float(dsgrad.elbo(objective, params, jax.random.key(0), 2000)[0])
  chosen = ((dsgrad.naive(), dsgrad.joint_saga(objective, warmup_steps=4))
            if estimators == "naive_and_table"
            else (dsgrad.cv(objective), dsgrad.joint_svrg(objective, every=4)))
  for estimator in chosen:
    result = dsgrad.fit(objective, optax.chain(estimator, optax.adam(5e-2)), params,
                        jax.random.key(1), num_steps=200, batch_size=BATCH,
                        elbo_samples=0, progress=False)
    value, se = dsgrad.elbo(objective, result.params, jax.random.key(0), 2000)
    assert float(value) > start + 5 * float(se), type(estimator)


def test_a_table_too_large_for_a_numpyro_model_names_the_way_to_a_compact_one(logreg_data):
  """A NumPyro model indexes arrays of its own: the refusal names the bridge's reads=,
  which takes its arguments, not data columns it does not have."""
  objective = dsgrad_numpyro.objective(logreg_model, *logreg_data)
  with pytest.raises(MemoryError, match=r"declare them, for a model without data columns "
                                        r"\(its likelihood indexes arrays of its own\): a "
                                        r"NumPyro model with dsgrad.contrib.numpyro.objective"
                                        r"\(model, \.\.\., reads="):
    dsgrad.joint_saga(objective, max_table_bytes=100).init(objective.init_params())


def test_found_reads_leave_out_counts_and_sites_whose_rows_mix():
  """Counts observed as integers within a site's rows are not an index of it, and data
  the model masks (whose terms move nothing) do not hide the index; a site whose
  unconstrained rows mix (a cumulative sum) keeps the dense table, without an error."""
  groups, n = 12, 120
  rng = np.random.default_rng(4)
  g = rng.integers(0, groups, n).astype(np.int32)
  x = rng.normal(size=n).astype(np.float32)
  counts = rng.poisson(2.0, n).astype(np.int32)
  seen = np.arange(n) % 3 > 0  # a third of the data masked, among them the first

  def poisson(g, x, y, seen, subsample=10):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", groups):
      b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", n, subsample_size=subsample) as idx:
      with numpyro.handlers.mask(mask=seen[idx]):
        numpyro.sample("y", dist.Poisson(jnp.exp(b[g[idx]] + w * x[idx])), obs=y[idx])

  found = dsgrad_numpyro.to_model(poisson, g, x, counts, seen).model.sparse
  # As reads={"b": "g"} declares: b[g[n]], then w.
  np.testing.assert_array_equal(found.coordinates(jnp.arange(n)),
                                np.stack([g, np.full(n, groups)], 1))

  def mixed(g, x, y, subsample=10):
    with numpyro.plate("groups", groups):
      raw = numpyro.sample("raw", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", n, subsample_size=subsample) as idx:
      numpyro.sample("y", dist.Normal(jnp.cumsum(raw)[g[idx]] + x[idx], 1.0), obs=y[idx])

  assert dsgrad_numpyro.to_model(mixed, g, x, x).model.sparse is None
  with pytest.raises(TypeError, match=r"reads must be a non-empty dict \{latent site: "
                                      r"argument\}, 'auto' or None, got 'Auto'"):
    dsgrad_numpyro.to_model(mixed, g, x, x, reads="Auto")


def _largest_array(jaxpr, skip: int) -> int:
  """The most elements of a floating value computed in ``jaxpr`` (nested programs
  included), other than the model's own per-datum arrays of ``skip`` rows that it slices
  (a plate's integer indices are not counted)."""
  sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars
           if jnp.issubdtype(getattr(v.aval, "dtype", jnp.int32), jnp.floating)
           and (not v.aval.shape or v.aval.shape[0] != skip)]
  for eqn in jaxpr.eqns:
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", value)
      if hasattr(inner, "eqns"):
        sizes.append(_largest_array(inner, skip))
  return max(sizes, default=0)


def _grouped_model(groups, n):
  def model(g, x, y, subsample=10, g2=None):  # g2: a second column, to be declared alike
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", groups):
      b = numpyro.sample("b", dist.Normal(0.0, tau))
    with numpyro.plate("data", n, subsample_size=subsample) as idx:
      numpyro.sample("y", dist.StudentT(4.0, b[g[idx]] + w * x[idx], 1.0), obs=y[idx])
  return model


def test_a_numpyro_model_whose_reads_are_known_keeps_a_table_of_them_with_equal_updates():
  """A per-group NumPyro model had only the table of every parameter (8 GB on 200,000
  rows and 5,000 groups). With its reads (found, or declared as reads={"b": "g"}) a
  datum's row holds b[g[n]], tau and w:
  joint SAGA's default table is of those 3 of 42 coordinates, and its updates, from the
  same state, indices and noise, are the dense table's."""
  groups, n = 40, 300
  rng = np.random.default_rng(0)
  g = rng.integers(0, groups, n).astype(np.int32)
  x = rng.normal(size=n).astype(np.float32)
  y = (0.5 * x + rng.normal(size=groups)[g] + 0.3 * rng.normal(size=n)).astype(np.float32)
  model = _grouped_model(groups, n)
  dense = dsgrad_numpyro.objective(model, g, x, y, reads=None)
  # Found by default: b[g[n]], then tau and w (the flat latent's order: by site name).
  compact = dsgrad_numpyro.objective(model, g, x, y)
  sparse = compact.numpyro_model.model.sparse
  np.testing.assert_array_equal(sparse.coordinates(jnp.arange(n)),
                                np.stack([g, np.full(n, groups), np.full(n, groups + 1)], 1))
  # O(k) a datum: no array of the local likelihood's program holds the 40 group effects
  # (the model's own plate of groups gives it integer indices only).
  assert _largest_array(jax.make_jaxpr(sparse.log_likelihood_local)(
      jnp.zeros((2, 3)), jnp.arange(2, dtype=jnp.int32)).jaxpr, n) < groups
  params = _random_params(dense, jax.random.key(1))
  states = [dsgrad.joint_saga(o).init(params) for o in (dense, compact)]
  assert dsgrad.table_bytes(states[1]) * 42 == dsgrad.table_bytes(states[0]) * 3
  # One program a table (op by op, NumPyro's per-datum terms took 16 s to compile).
  steps = [jax.jit(lambda state, indices, noise, o=o: dsgrad.joint_saga(o).update(
      o.grad(params, indices, noise), state, params, indices=indices, noise=noise,
      objective=o)) for o in (dense, compact)]
  for step in range(3):  # a table filled, then updated from its stored terms
    indices = jax.random.choice(jax.random.key(step), n, (10,), replace=False)
    noise = dense.sample_noise(jax.random.key(10 + step), 10)
    updates = []
    for i, run in enumerate(steps):
      update, states[i] = run(states[i], indices, noise)
      updates.append(update)
    for a, b in zip(jax.tree.leaves(updates[0]), jax.tree.leaves(updates[1])):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4 * float(jnp.abs(a).max()))
  # Refused before anything compiles, as the names below.
  with pytest.raises(ValueError, match=r"argument 'g' holds values in \[0, 40\], but the "
                                       r"site has 40 rows"):
    dsgrad_numpyro.objective(model, np.where(np.arange(n) == 5, groups, g).astype(np.int32),
                             x, y, reads={"b": "g"})
  with pytest.raises(ValueError, match=r"names latent sites \['beta'\]; the model's are "
                                       r"\['b', 'tau', 'w'\]"):
    dsgrad_numpyro.objective(model, g, x, y, reads={"beta": "g"})
  for reads, match in [({"b": 3}, r"\['b'\] must name the model's argument .* got 3"),
                       ({}, "got an empty dict"), ({"b": "x"}, "argument 'x' must be integers")]:
    with pytest.raises(TypeError, match=match):
      dsgrad_numpyro.objective(model, g, x, y, reads=reads)
  with pytest.raises(ValueError, match=r"reads=\{'b': 'g'\}: the likelihood reads latent "
                                       r"values reads does not declare"):
    # The plate reads b[g] and b[g + 1]: more than declared.
    def reads_two(g, x, y, subsample=10):
      b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([groups + 1]).to_event(1))
      with numpyro.plate("data", n, subsample_size=subsample) as idx:
        numpyro.sample("y", dist.Normal(b[g[idx]] + b[g[idx] + 1], 1.0), obs=y[idx])
    dsgrad_numpyro.objective(reads_two, g, x, y, reads={"b": "g"})
  with pytest.raises(ValueError, match=r"\['b'\]: datum 0 reads row \d+ of 'b' twice "
                                       r"\(300 data do\)"):
    dsgrad_numpyro.objective(model, g, x, y, g2=g, reads={"b": ("g", "g2")})


# Slow (12 s): the bridge's per-datum terms and ELBO equal NumPyro's own by default (above);
# this checks the example's model against the built-in one.
@pytest.mark.slow
def test_numpyro_movielens_model_equals_the_builtin_one():
  import numpyro_model as example
  users, genres, ratings = dsgrad.models.synthetic_movielens_data(jax.random.key(0), 6, 20, 50)
  objective = dsgrad_numpyro.objective(example.movielens_model, users, genres, ratings, 6,
                                       batch_size=8)
  builtin = dsgrad.meanfield_gaussian(dsgrad.models.movielens(users, genres, ratings, 6))
  assert objective.numpyro_model.model.latent_dim == 8 * 18 * 5
  params = _random_params(objective, jax.random.key(1))
  indices = jnp.array([0, 7, 49, 13, 21, 3, 30, 44], jnp.int32)
  noise = objective.sample_noise(jax.random.key(2), 8)
  np.testing.assert_allclose(objective.loss(params, indices, noise),
                             builtin.loss(params, indices, noise), rtol=2e-5)


@pytest.mark.slow
def test_example_runs_end_to_end(tmp_path):
  import json
  import math

  import numpyro_model as example
  rows = example.main(["--synthetic", "--users", "6", "--steps", "10", "--eval-every", "10",
                       "--elbo-samples", "10", "--estimators", "naive", "--all-cores",
                       "--out", str(tmp_path)])
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert set(saved["results"]) == {"numpyro SVI", "dsgrad naive"}
  for name, row in saved["results"].items():
    assert math.isfinite(row["final_elbo"]) and row["ms_per_step"] > 0, name
    assert rows[name]["final_elbo"] == row["final_elbo"]


def test_a_numpyro_model_traced_on_two_threads_at_once_keeps_its_sites_apart(logreg_data):
  """recommend compiles candidates on a thread while naive's fit checks and compiles on
  the calling one; a NumPyro model traced on both at once (the effect handlers' stack is
  global) raised "all sites must have unique names" in recommend's first call."""
  import concurrent.futures
  import threading
  import time
  x, y = logreg_data
  inside, hold = threading.Event(), threading.local()

  def slow_model(x, y):  # one thread stays inside the model while the other traces it
    if getattr(hold, "on", False):
      inside.set()
      time.sleep(0.3)
    logreg_model(x, y)

  objective = dsgrad_numpyro.objective(slow_model, x, y)
  params = objective.init_params()

  def loss(size):  # a batch size not traced before: traces are cached
    noise = objective.sample_noise(jax.random.key(0), size)
    return jax.eval_shape(objective.loss_fn, params, jnp.arange(size), noise)

  def held():
    hold.on = True
    return loss(3)

  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    first = pool.submit(held)
    assert inside.wait(60)
    loss(4)
    first.result()


def test_segments_of_a_numpyro_model_compile_on_several_threads(logreg_data):
  """recommend compiles its candidates' segments on several threads; a NumPyro model's
  effect handlers share one global stack, so two traced at once mixed their sites
  ("all sites must have unique names"). Tracing is serialized; the compiles overlap."""
  import concurrent.futures
  x, y = logreg_data
  objective = dsgrad_numpyro.objective(logreg_model, x, y)
  params = objective.init_params()
  optimizers = [optax.chain(dsgrad.naive(), optax.adam(1e-2)),
                optax.chain(dsgrad.cv(objective), optax.adam(1e-2)),
                optax.chain(dsgrad.joint_svrg(objective, every=4), optax.adam(1e-2))]
  runners = [dsgrad.training.segments.SegmentRunner(objective, optax.with_extra_args_support(o), BATCH,
                                           jax.random.key(0)) for o in optimizers]
  states = [o.init(params) for o in optimizers]
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    futures = [pool.submit(r.prepare, params, s, 0, 2 + i)
               for i, (r, s) in enumerate(zip(runners, states))]
    for future in futures:
      future.result()
  assert all(len(r.executables) == 1 for r in runners)


def test_reads_of_an_argument_shared_by_two_sites_and_of_pairs_keep_the_model_to_its_rows():
  """A user's effects and noise scale read by one argument, an item's by another, and two
  rows of a third site per datum (an (N, 2) argument): each datum's term runs on its own
  rows (no array of any site's length) and equals the model's on every datum."""
  n, users, items = 200, 30, 20
  rng = np.random.default_rng(3)
  user = rng.integers(0, users, n).astype(np.int32)
  item = rng.integers(0, items, n).astype(np.int32)
  pair = np.stack([user % 10, 10 + item % 10], axis=1).astype(np.int32)
  y = rng.normal(size=n).astype(np.float32)

  def model(user, item, pair, y, subsample=10):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("users", users):
      u = numpyro.sample("u", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
      scale = numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("items", items):
      v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("pairs", 20):
      p = numpyro.sample("p", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", n, subsample_size=subsample) as i:
      mean = mu + jnp.sum(u[user[i]] * v[item[i]], -1) + p[pair[i]].sum(-1)
      numpyro.sample("y", dist.Normal(mean, scale[user[i]]), obs=y[i])

  # Found by default, as reads={"u": "user", "scale": "user", "v": "item", "p": "pair"}
  # declares them: item's values also lie in u's rows, but its rows of u do not move
  # user's datum; pair's two rows of p are one declaration.
  found = dsgrad_numpyro.to_model(model, user, item, pair, y).model
  sparse = found.sparse
  # The flat latent by site name: mu (1), p (20), scale (30), u (30 x 2), v (20 x 2).
  expected = np.concatenate([np.zeros((n, 1)), 1 + pair, 21 + user[:, None],
                             51 + 2 * user[:, None] + [0, 1], 111 + 2 * item[:, None] + [0, 1]],
                            axis=1)
  np.testing.assert_array_equal(sparse.coordinates(jnp.arange(n)), expected)
  assert _largest_array(jax.make_jaxpr(sparse.log_likelihood_local)(
      jnp.zeros((2, 8)), jnp.arange(2, dtype=jnp.int32)).jaxpr, n) < 20
  z = 0.5 * jax.random.normal(jax.random.key(1), (found.latent_dim,))
  local, full = dsgrad.models.base.local_and_full(found, sparse, z, jnp.arange(n))
  np.testing.assert_allclose(local, full, rtol=1e-5, atol=1e-5)
