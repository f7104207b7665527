"""Variational families: log_prob and entropy against scipy and Monte Carlo, their BBVI
objectives, and full-rank BBVI recovering an exact Gaussian posterior."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dsgrad
from dsgrad.families import FullRankGaussian, MeanFieldGaussian
from dsgrad.models import Model
from conftest import run_python


def _random_full_rank(dim=4, seed=0):
  fam = FullRankGaussian(dim)
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  fam.set_params({"loc": jax.random.normal(k1, (dim,)),
                  "log_diag": 0.3 * jax.random.normal(k2, (dim,)),
                  "unit_lower": 0.5 * jax.random.normal(k3, (dim, dim))})
  return fam


def _scipy_of(fam):
  p = fam.params()
  if isinstance(fam, FullRankGaussian):
    chol = np.asarray(FullRankGaussian.cholesky(p), np.float64)
    return stats.multivariate_normal(np.asarray(p["loc"], np.float64), chol @ chol.T)
  return stats.multivariate_normal(np.asarray(p["loc"], np.float64),
                                   np.diag(np.exp(2 * np.asarray(p["log_scale"], np.float64))))


@pytest.mark.parametrize("kind", ["meanfield", "fullrank"])
def test_log_prob_and_entropy_match_scipy_and_monte_carlo(kind):
  if kind == "fullrank":
    fam = _random_full_rank()
  else:
    fam = MeanFieldGaussian(4, loc=jnp.array([0.5, -1.0, 2.0, 0.0]),
                            log_scale=jnp.array([-0.5, 0.2, 0.0, 0.7]))
  ref = _scipy_of(fam)
  z = fam.sample_from_key(jax.random.key(1), 20_000)
  np.testing.assert_allclose(fam.log_prob(z[:50]), ref.logpdf(np.asarray(z[:50])),
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(fam.entropy(), ref.entropy(), rtol=1e-5)
  # Samples have the family's moments, and -E log q = H within Monte Carlo error.
  np.testing.assert_allclose(np.cov(np.asarray(z).T), ref.cov, atol=0.1 * np.abs(ref.cov).max())
  neg_logq = -np.asarray(fam.log_prob(z), np.float64)
  se = neg_logq.std() / np.sqrt(neg_logq.size)
  assert abs(neg_logq.mean() - float(fam.entropy())) < 4 * se


def test_params_round_trip_and_upper_triangle_is_ignored():
  fam = _random_full_rank()
  p = fam.params()
  assert set(p) == {"loc", "log_diag", "unit_lower"}
  bumped = dict(p, unit_lower=p["unit_lower"] + jnp.triu(jnp.ones((4, 4))))
  chex.assert_trees_all_close(FullRankGaussian.transform(bumped, jnp.ones(4)),
                              FullRankGaussian.transform(p, jnp.ones(4)))
  fam.set_params(bumped)
  chex.assert_trees_all_close(fam.params(), bumped)


def test_family_objectives(logreg_model, params0):
  mf = MeanFieldGaussian(logreg_model.latent_dim)
  mf.set_params(params0)
  obj = mf.objective(logreg_model)
  ref = dsgrad.meanfield_gaussian(logreg_model)
  idx = jnp.arange(7, dtype=jnp.int32)
  eps = obj.sample_noise(jax.random.key(0), 7)
  np.testing.assert_allclose(obj.loss(params0, idx, eps), ref.loss(params0, idx, eps), rtol=1e-6)
  # A full-rank family with L = diag(scale) gives the same losses.
  fr = FullRankGaussian(logreg_model.latent_dim)
  fr_params = {"loc": params0["loc"], "log_diag": params0["log_scale"],
               "unit_lower": jnp.zeros((logreg_model.latent_dim,) * 2)}
  for shared in (True, False):
    fr_obj = fr.objective(logreg_model, shared_noise=shared)
    mf_obj = mf.objective(logreg_model, shared_noise=shared)
    eps = fr_obj.sample_noise(jax.random.key(1), 7)
    np.testing.assert_allclose(fr_obj.loss(fr_params, idx, eps),
                               mf_obj.loss(params0, idx, eps), rtol=1e-5)
  with pytest.raises(ValueError, match="latent_dim"):
    MeanFieldGaussian(3).objective(logreg_model)


def _linear_gaussian_model(num_data=40, dim=3, seed=0):
  """y_n ~ N(x_n . z, 1), z ~ N(0, I): the posterior is Gaussian with known moments."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(k1, (num_data, dim)) * jnp.array([1.0, 0.5, 2.0])
  x = x.at[:, 2].add(0.8 * x[:, 0])  # correlated features -> correlated posterior
  y = x @ jnp.array([1.0, -1.0, 0.5]) + jax.random.normal(k2, (num_data,))
  model = Model(lambda z: -0.5 * jnp.sum(z ** 2),
                lambda z, idx: -0.5 * (y[idx] - x[idx] @ z) ** 2, num_data, dim, "linreg")
  precision = np.eye(dim) + np.asarray(x, np.float64).T @ np.asarray(x, np.float64)
  cov = np.linalg.inv(precision)
  mean = cov @ np.asarray(x, np.float64).T @ np.asarray(y, np.float64)
  return model, mean, cov


def test_full_rank_bbvi_recovers_exact_gaussian_posterior():
  """For a Gaussian posterior the full-rank family is exact. The gradient is linear in
  the noise, so linearize() is exact (f~ = f) and joint_svrg's variance vanishes at the
  snapshot: Adam then converges to the posterior, correlations included."""
  model, mean, cov = _linear_gaussian_model()
  fam = FullRankGaussian(model.latent_dim, log_scale=-1.0)
  objective = fam.objective(model)
  opt = optax.chain(dsgrad.joint_svrg(objective, every=8), optax.adam(optax.cosine_decay_schedule(3e-2, 2000)))
  params = fam.params()
  state = opt.init(params)

  @jax.jit
  def step(params, state, key):
    k1, k2 = jax.random.split(key)
    idx = jax.random.choice(k1, model.num_data, (5,), replace=False)
    eps = objective.sample_noise(k2, 5)
    g = objective.grad(params, idx, eps)
    updates, state = opt.update(g, state, params, indices=idx, noise=eps)
    return optax.apply_updates(params, updates), state

  for k in jax.random.split(jax.random.key(0), 2000):
    params, state = step(params, state, k)
  fam.set_params(params)
  chol = np.asarray(FullRankGaussian.cholesky(params), np.float64)
  fitted_kl = _gaussian_kl(np.asarray(params["loc"], np.float64), chol @ chol.T, mean, cov)
  # The best mean-field Gaussian (exact mean, variances 1 / diag(precision)) misses the
  # correlations; the full-rank fit must be far closer than that.
  meanfield_kl = _gaussian_kl(mean, np.diag(1.0 / np.diag(np.linalg.inv(cov))), mean, cov)
  assert meanfield_kl > 0.1
  assert fitted_kl < 0.01, (fitted_kl, meanfield_kl)


def _gaussian_kl(m0, s0, m1, s1):
  """KL(N(m0, s0) || N(m1, s1))."""
  s1_inv = np.linalg.inv(s1)
  d = m0.size
  return 0.5 * (np.trace(s1_inv @ s0) + (m1 - m0) @ s1_inv @ (m1 - m0) - d
                + np.linalg.slogdet(s1)[1] - np.linalg.slogdet(s0)[1])


def _network_regression():
  """A one-hidden-layer network's nnx.State as the latent, Gaussian regression."""
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.hidden = nnx.Linear(2, 8, rngs=rngs)
      self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
      return self.out(jnp.tanh(self.hidden(x)))[:, 0]

  net = Net(nnx.Rngs(0))
  graph, state = nnx.split(net, nnx.Param)
  x = jax.random.normal(jax.random.key(1), (300, 2))
  y = jnp.sin(x[:, 0]) + 0.1 * jax.random.normal(jax.random.key(2), (300,))

  def log_prior(z):
    return -0.5 * sum(jnp.sum(v ** 2) for v in jax.tree.leaves(z))

  def log_lik(z, batch):
    pred = nnx.merge(graph, z)(batch["x"])
    return -0.5 * ((pred - batch["y"]) / 0.1) ** 2

  flat = dsgrad.objective_from_logdensity(log_prior, log_lik, {"x": x, "y": y}, state)
  return flat, state


def test_structured_params_take_the_latents_structure_and_give_the_flat_values():
  flat, state = _network_regression()
  objective = dsgrad.families.structured(flat, state)
  params = dsgrad.families.structured_init(state, log_scale=-2.0)
  assert jax.tree.structure(params["loc"]) == jax.tree.structure(state)
  indices = jnp.arange(16)
  noise = objective.sample_noise(jax.random.key(3), 16)
  flat_params = dsgrad.families.flat_params(params)
  chex.assert_trees_all_close(objective.loss(params, indices, noise),
                              flat.loss(flat_params, indices, noise))
  grads = objective.grad(params, indices, noise)
  assert jax.tree.structure(grads) == jax.tree.structure(params)
  chex.assert_trees_all_close(
      grads, dsgrad.families.structured_params(flat.grad(flat_params, indices, noise), state),
      rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="latent has"):
    dsgrad.families.structured_params({"loc": jnp.zeros(3)}, state)
  with pytest.raises(TypeError, match="floating"):
    dsgrad.families.structured(flat, {"w": jnp.zeros(3, jnp.int32)})


def test_a_network_posterior_trains_with_any_estimator_without_flattening():
  flat, state = _network_regression()
  objective = dsgrad.families.structured(flat, state)
  params = dsgrad.families.structured_init(state, log_scale=-3.0)
  optimizer = optax.chain(dsgrad.joint_svrg(objective, every=30), optax.adam(1e-2))
  result = dsgrad.fit(objective, optimizer, params, jax.random.key(4), num_steps=300,
                      batch_size=10, eval_every=150, elbo_samples=64, progress=False)
  assert jax.tree.structure(result.params) == jax.tree.structure(params)
  first, last = result.history.elbo[0], result.history.elbo[-1]
  assert last > first + 10 * result.history.elbo_se[-1], (first, last)
  draws = dsgrad.families.sample_structured(result.params, jax.random.key(5), 7)
  assert jax.tree.map(jnp.shape, draws) == jax.tree.map(lambda v: (7,) + v.shape, state)


def test_structured_draws_refuse_what_would_give_nan_or_a_bare_error():
  """NaN scales drew NaN silently; 0 draws gave empty arrays, -1 an MLIR error; params
  without log_scale a KeyError; an int key a bare JAX error."""
  latent = {"a": jnp.zeros((3, 2)), "b": jnp.zeros(())}
  params = dsgrad.families.structured_init(latent)
  draws = dsgrad.families.sample_structured(params, jax.random.key(0), 4)
  assert jax.tree.map(jnp.shape, draws) == {"a": (4, 3, 2), "b": (4,)}
  who = "dsgrad.families.sample_structured: "
  nan_scale = {**params, "log_scale": {**params["log_scale"], "b": jnp.float32(jnp.nan)}}
  narrow = {**params, "log_scale": {**params["log_scale"], "a": jnp.zeros(3)}}
  for args, match in [
      ((nan_scale, jax.random.key(0), 3), r"params\['log_scale'\]\['b'\] holds NaN"),
      ((params, jax.random.key(0), 0), "num_samples must be an integer >= 1"),
      ((params, 0, 3), "key must be a JAX PRNG key"),
      (({"loc": params["loc"]}, jax.random.key(0), 3), r"must be \{'loc'.*got \['loc'\]"),
      ((narrow, jax.random.key(0), 3), r"\['a'\] has shape \(3,\), expected \(3, 2\)")]:
    with pytest.raises(ValueError, match=who + ".*" + match):
      dsgrad.families.sample_structured(*args)


def test_full_rank_converges_where_mean_field_does_on_a_correlated_50d_posterior():
  """Bayesian linear regression, 50 features with correlation 0.9^|i-j| (posterior scales
  0.01-0.3). At the settings where mean-field climbs steadily (Adam 1e-2, batch 100), the
  full-rank family, which contains every mean-field Gaussian, must climb steadily too and
  end above it, below log Z. With free Cholesky entries it oscillated between -5,000 and
  -22,000 nats while mean-field reached -1,700."""
  n, d, steps = 1000, 50, 4000
  rng = np.random.default_rng(0)
  corr = 0.9 ** np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
  x = (rng.normal(size=(n, d)) @ np.linalg.cholesky(corr).T).astype(np.float32)
  y = (x @ rng.normal(size=d) + rng.normal(size=n)).astype(np.float32)
  data = dsgrad.models.base.model_data(x=x, y=y)
  log_2pi = np.log(2 * np.pi)
  model = Model(lambda z: -0.5 * jnp.sum(z ** 2) - 0.5 * d * log_2pi,
                lambda z, i: -0.5 * (i["y"] - i["x"] @ z) ** 2 - 0.5 * log_2pi,
                n, d, name="correlated regression", data=data)
  x64, y64 = x.astype(np.float64), y.astype(np.float64)
  precision = x64.T @ x64 + np.eye(d)
  mean = np.linalg.solve(precision, x64.T @ y64)
  log_z = (-0.5 * n * log_2pi - 0.5 * np.linalg.slogdet(precision)[1]
           - 0.5 * (y64 @ y64 - mean @ precision @ mean))
  traces = {}
  # From standard deviation 1 both still climb at the end, so each trace must rise.
  for family in (MeanFieldGaussian(d, log_scale=0.0), FullRankGaussian(d, log_scale=0.0)):
    result = dsgrad.fit(family.objective(model), optax.adam(1e-2), family.params(),
                        jax.random.key(0), num_steps=steps, batch_size=100,
                        eval_every=steps // 10, elbo_samples=200, progress=False)
    traces[type(family).__name__] = (np.asarray(result.history.elbo),
                                     np.asarray(result.history.elbo_se))
  elbo, se = traces["FullRankGaussian"]
  meanfield, meanfield_se = traces["MeanFieldGaussian"]
  assert np.all(np.diff(meanfield[1:]) > -3 * meanfield_se[2:]), meanfield
  assert np.all(np.diff(elbo[1:]) > -3 * se[2:]), elbo
  assert elbo[-1] > meanfield[-1] + 3 * (se[-1] + meanfield_se[-1]), (elbo, meanfield)
  assert elbo[-1] < log_z + 3 * se[-1], (elbo, log_z)


def test_params_that_do_not_fit_the_family_are_refused_where_they_enter():
  fam = _random_full_rank(3)
  before = fam.params()
  # set_params wrote any dict into the module: another dimension (every later draw a
  # broadcasting error), a missing field (silently kept), a diverged run's NaN.
  with pytest.raises(ValueError, match=r"set_params: params\['loc'\] has shape \(5,\)"):
    fam.set_params(dict(before, loc=jnp.zeros(5)))
  with pytest.raises(ValueError, match="set_params: params does not have the tree structure"):
    fam.set_params({"loc": before["loc"], "log_diag": before["log_diag"]})
  with pytest.raises(ValueError, match=r"set_params: params\['loc'\] holds NaN"):
    fam.set_params(dict(before, loc=jnp.full(3, jnp.nan)))
  chex.assert_trees_all_equal(fam.params(), before)
  with pytest.raises(ValueError, match=r"z must have shape \(\.\.\., 3\)"):
    fam.log_prob(jnp.zeros(4))
  with pytest.raises(ValueError, match=r"noise must have shape \(\.\.\., 3\)"):
    fam.sample(jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match="sample_from_key: num_samples"):
    fam.sample_from_key(jax.random.key(0), -1)
  # A Cholesky factor with a non-positive diagonal gave a NaN log_diag without an error.
  with pytest.raises(ValueError, match="diagonal of cholesky must be positive"):
    FullRankGaussian.params_from_cholesky(jnp.zeros(2), jnp.array([[-1.0, 0.0], [0.5, 1.0]]))
  with pytest.raises(ValueError, match=r"cholesky \(d, d\)"):
    FullRankGaussian.params_from_cholesky(jnp.zeros(2), jnp.ones((2, 3)))


def test_structured_init_starts_at_the_latent_with_autonormal_s_scale():
  # NumPyro's and Pyro's AutoNormal start at standard deviation 0.1, not the prior's 1.
  _, state = _network_regression()
  params = dsgrad.families.structured_init(state)
  chex.assert_trees_all_close(params["loc"], state)
  for scale in jax.tree.leaves(jax.tree.map(jnp.exp, params["log_scale"])):
    np.testing.assert_allclose(scale, 0.1, rtol=1e-6)


def test_structured_init_and_structured_refuse_another_models_latent():
  flat, state = _network_regression()
  d = sum(leaf.size for leaf in jax.tree.leaves(state))
  other = {"w": jnp.zeros(d - 1)}
  # A latent of another size was accepted and its params trained as the flat objective's;
  # unflattening the result with that latent then mixed up its coordinates.
  with pytest.raises(ValueError, match=f"latent has {d - 1} entries but .* draws {d} noise"):
    dsgrad.families.structured(flat, other)
  with pytest.raises(ValueError, match="loc does not have the tree structure of the latent"):
    dsgrad.families.structured_init(state, loc=other)
  bad = jax.tree.map(lambda v: jnp.full_like(v, jnp.nan), state)
  with pytest.raises(ValueError, match="structured_init: loc.* holds NaN"):
    dsgrad.families.structured_init(state, loc=bad)


def test_a_full_rank_family_whose_factor_is_large_warns_where_the_user_makes_it(monkeypatch):
  """d = 20,001 made a 1.6 GB factor (100 steps: 186 s and 11.9 GB on 2 CPU cores) without
  a word; past FULL_RANK_WARN_BYTES (256 MiB at the default, d > 8,192) it warns, naming d,
  the bytes and the mean-field family, at the user's line (not dsgrad's or Flax's)."""
  import warnings

  from dsgrad.families import gaussian
  assert 4 * 8192 ** 2 <= gaussian.FULL_RANK_WARN_BYTES < 4 * 8193 ** 2
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # below the threshold: no warning
    FullRankGaussian(40)
  monkeypatch.setattr(gaussian, "FULL_RANK_WARN_BYTES", 4 * 40 ** 2 - 1)
  for make in (lambda: FullRankGaussian(40), lambda: dsgrad.families.by_name("fullrank", 40)):
    with pytest.warns(UserWarning, match=r"FullRankGaussian\(40\): its factor is a 40 x 40 "
                      r"matrix, 6.4e-06 GB.*family='meanfield'") as caught:
      make()
    assert caught[0].filename == __file__, caught[0].filename
  with pytest.warns(UserWarning, match="FullRankGaussian") as caught:
    dsgrad.objective_from_logdensity(
        lambda z: -jnp.sum(z ** 2), lambda z, rows: -(rows["y"] - z[0]) ** 2,
        {"y": jnp.ones(10)}, jnp.zeros(40), family="fullrank")
  assert caught[0].filename == __file__, caught[0].filename


def test_an_objective_over_a_full_rank_family_allocates_no_factor():
  """objective_from_logdensity(family="fullrank") made the family module, and with it a
  zero d x d factor the objective never reads: 1 GB (and 0.5 s) at d = 16,000 before a
  single step, and 6.4 GB (9 s) at d = 40,000. The peak resident memory of a fresh
  process that builds one is measured."""
  script = (
      "import resource, warnings, jax.numpy as jnp, numpy as np, dsgrad\n"
      "warnings.simplefilter('ignore')\n"
      "lp, ll = lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: -(b['x'] - z[0]) ** 2\n"
      "data = {'x': np.zeros(10, np.float32)}\n"
      "dsgrad.objective_from_logdensity(lp, ll, data, 64, family='fullrank')\n"
      "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
      "dsgrad.objective_from_logdensity(lp, ll, data, 16000, family='fullrank')\n"
      "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
  grown_kib = int(run_python(script).split()[-1])
  assert grown_kib < 250_000, f"{grown_kib} KiB more resident: the 1 GB factor was made"


def test_a_fit_whose_state_does_not_fit_in_memory_is_refused_before_allocating(monkeypatch):
  """A full-rank family over 40,000 latents (a 6.4 GB factor) ended in XLA's bare
  RESOURCE_EXHAUSTED, or in the process killed, from inside fit. With the free memory
  made small, fit names the need, the largest leaf and the mean-field family before
  anything is allocated, and the same fit trains where the memory is there."""
  from dsgrad.training import host_data
  model = dsgrad.models.logistic_regression(*dsgrad.models.synthetic_logistic_data(
      jax.random.key(0), 50, 300)[:2])
  family = FullRankGaussian(300)  # a 360,000-byte factor
  objective, params = family.objective(model), family.params()
  calls = []
  monkeypatch.setattr(host_data, "free_memory_bytes", lambda: calls.append(1) or 1_200_000)
  train = lambda: dsgrad.fit(objective, optax.adam(1e-2), params, jax.random.key(1),
                             num_steps=2, batch_size=5, elbo_samples=0, progress=False)
  # The copy and the gradient (2 x 0.36 MB) and Adam's two moments (0.72 MB) are
  # 1.4 MiB: more than 1.2 MB.
  with pytest.raises(MemoryError, match=r"dsgrad.fit: training needs about 1.4 MiB more.*"
                     r"params\['unit_lower'\], has shape \(300, 300\).*family='meanfield'"):
    train()
  assert calls
  monkeypatch.setattr(host_data, "free_memory_bytes", lambda: 1_600_000)
  assert train().step == 2


def test_structured_full_rank_draws_are_the_familys_and_keep_its_correlations():
  """sample_structured took mean-field params only: a full-rank fit's draws, shaped like
  the latent, needed hand flattening. They are the flat family's transform of the same
  noise, laid out like the latent, and their covariance is L L^T (a correlation of -0.89
  between leaves, within 4 standard errors of 20,000 draws)."""
  latent = {"w": jnp.zeros(2), "b": jnp.zeros(())}  # ravel order: b, w0, w1
  family = dsgrad.families.by_name("fullrank", 3)
  flat = dict(family.params(), loc=jnp.array([1.0, -2.0, 0.5]),
              log_diag=jnp.log(jnp.array([0.5, 1.0, 0.2])),
              unit_lower=jnp.array([[0.0, 0.0, 0.0], [-4.0, 0.0, 0.0], [0.0, 0.3, 0.0]]))
  params = dsgrad.families.structured_params(flat, latent)
  n = 20_000
  draws = dsgrad.families.sample_structured(params, jax.random.key(3), n)
  assert jax.tree.map(jnp.shape, draws) == {"b": (n,), "w": (n, 2)}
  stacked = np.column_stack([draws["b"], draws["w"]])
  eps = jax.random.normal(jax.random.key(3), (n, 3))
  expected = jax.vmap(lambda e: FullRankGaussian.transform(flat, e))(eps)
  np.testing.assert_allclose(stacked, expected, rtol=1e-6, atol=1e-6)
  factor = np.asarray(FullRankGaussian.cholesky(flat), np.float64)
  covariance = factor @ factor.T
  centred = stacked - np.asarray(flat["loc"])
  products = centred[:, :, None] * centred[:, None, :]
  se = products.std(axis=0, ddof=1) / np.sqrt(n)
  assert np.all(np.abs(products.mean(axis=0) - covariance) < 4 * se + 1e-6)
  assert covariance[0, 1] / np.sqrt(covariance[0, 0] * covariance[1, 1]) < -0.85
  with pytest.raises(ValueError, match=r"unit_lower'\] has shape \(2, 2\), expected \(3, 3\)"):
    dsgrad.families.sample_structured(dict(params, unit_lower=jnp.zeros((2, 2))),
                                      jax.random.key(0), 3)
