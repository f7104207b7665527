"""MonteCarloVAE: the four bounds as per-datum objectives that dsgrad's estimators and
fit loop accept, AIS evaluation, convolutional networks, and clear errors on bad input."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import dsgrad
from dsgrad import mcvae

Z = 4.0
D_IMG, D_LAT = 16, 3


def _images(n=40, seed=0):
  return np.random.default_rng(seed).uniform(size=(n, 4, 4)).astype(np.float32)


def _vae(method="vae", seed=0, **kw):
  rngs = nnx.Rngs(seed)
  return mcvae.MonteCarloVAE(mcvae.MLPEncoder(D_IMG, D_LAT, (16,), rngs=rngs),
                             mcvae.MLPDecoder(D_LAT, D_IMG, (16,), rngs=rngs),
                             method=method, **kw)


CONFIGS = {"vae": {}, "iwae": {"num_particles": 4}, "lmcvae": {"num_steps": 3},
           "amcvae": {"num_steps": 3, "num_particles": 2}}


def test_joint_control_variate_is_unbiased_on_a_vae():
  """joint SVRG on the A-MCVAE objective (the hardest case: MALA accept/reject and the
  REINFORCE surrogate inside the linearization), with its snapshot away from the params:
  estimate - naive has mean zero over batches and noise (the control variate is centred).
  cv is the same control variate with the snapshot at the params."""
  vae = _vae("amcvae", num_steps=2, num_particles=2)
  objective = vae.objective(_images())
  params = vae.init_params()
  snapshot = jax.tree.map(lambda p: p + 0.05 * jnp.sign(p), params)
  estimator = dsgrad.joint_svrg(objective, every=10**6)
  state = estimator.init(snapshot)

  @jax.jit
  def deviation(key):
    indices, noise = dsgrad.training.batching.sample_batch(key, objective, 8)
    g = objective.grad(params, indices, noise, validate=False)
    upd, _ = estimator.update(g, state, params, indices=indices, noise=noise)
    return jax.flatten_util.ravel_pytree(optax.tree.sub(upd, g))[0]

  d = np.stack([np.asarray(deviation(k), np.float64)
                for k in jax.random.split(jax.random.key(1), 250)])
  mean, se = d.mean(0), d.std(0, ddof=1) / np.sqrt(len(d))
  informative = se > 1e-6
  assert informative.sum() > 100  # the control variate is not identically zero
  z = np.abs(mean[informative]) / se[informative]
  # Over many coordinates a few |z| > 4 happen by chance; a bias would show in all.
  assert np.mean(z > Z) < 0.01, np.sort(z)[-5:]
  assert np.mean(z) < 1.0, np.mean(z)


def test_fit_learns_the_step_sizes_and_schedule():
  vae = _vae("lmcvae", **CONFIGS["lmcvae"])
  objective = vae.objective(_images(32))
  optimizer = optax.chain(dsgrad.cv(objective), optax.adam(3e-3))  # cv on L-MCVAE
  result = dsgrad.fit(objective, optimizer, vae.init_params(), jax.random.key(0),
                      num_steps=16, batch_size=8, eval_every=8, elbo_samples=2,
                      progress=False)
  assert np.all(np.isfinite(result.history.elbo))
  start = vae.init_params()["sampler"]
  for name in ("log_step_size", "schedule_logits"):
    assert np.all(np.asarray(result.params["sampler"][name] - start[name]) != 0), name
  eta, betas = vae.sampler(result.params)
  assert np.all(np.diff(np.asarray(betas)) > 0) and float(betas[-1]) == 1.0


def test_checkpointed_training_resumes_exactly(tmp_path):
  vae = _vae("iwae", num_particles=2)
  objective = vae.objective(_images(32))
  opt = optax.adam(3e-3)
  kw = dict(num_steps=16, batch_size=8, eval_every=8, elbo_samples=2, progress=False)
  full = dsgrad.fit(objective, opt, vae.init_params(), jax.random.key(0), **kw)
  path = tmp_path / "vae.ckpt"
  dsgrad.fit(objective, opt, vae.init_params(), jax.random.key(0), checkpoint_path=path,
             **{**kw, "num_steps": 8})
  resumed = dsgrad.fit(objective, opt, vae.init_params(), jax.random.key(0),
                       checkpoint_path=path, resume=True, **kw)
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(full.history.elbo, resumed.history.elbo)


@pytest.mark.slow
def test_training_improves_the_elbo():
  from sklearn.datasets import load_digits
  images = load_digits().data[:300] / 16.0
  rngs = nnx.Rngs(0)
  vae = mcvae.MonteCarloVAE(mcvae.MLPEncoder(64, 4, (64,), rngs=rngs),
                            mcvae.MLPDecoder(4, 64, (64,), rngs=rngs))
  objective = vae.objective(images)
  params = vae.init_params()
  before = dsgrad.elbo(objective, params, jax.random.key(1), 20)
  result = dsgrad.fit(objective, optax.adam(3e-3), params, jax.random.key(0), num_steps=150,
                      batch_size=30, elbo_samples=0, progress=False)
  after = dsgrad.elbo(objective, result.params, jax.random.key(1), 20)
  assert after[0] > before[0] + 5.0, (before, after)  # nats per image
  # Held-out AIS: a stochastic lower bound of log p(x) that tightens with more steps, so
  # its NLL sits below the negative ELBO and falls with the number of steps.
  nll5, se5, _ = vae.ais_nll(result.params, images[:100], jax.random.key(2), num_steps=5)
  nll50, se50, _ = vae.ais_nll(result.params, images[:100], jax.random.key(2), num_steps=30)
  assert nll50 < nll5 + Z * 0.1 * np.hypot(se5, se50)
  neg_elbo = -dsgrad.elbo(vae.objective(images[:100]), result.params, jax.random.key(3),
                          20)[0]
  assert nll50 < neg_elbo, (nll50, neg_elbo)


def test_dynamic_binarization():
  vae = _vae()
  x = jnp.asarray(_images(1)[0].reshape(-1))
  noise = vae.noise_fn(jax.random.key(0), 4000)["binarize"]
  xb = jax.vmap(lambda u: vae.binarized(x, u))(noise)
  assert set(np.unique(np.asarray(xb))) <= {0.0, 1.0}
  np.testing.assert_allclose(np.mean(np.asarray(xb), 0), x, atol=Z * 0.5 / np.sqrt(4000))
  # On binary images dynamic binarization is the identity.
  binary = (_images(10) > 0.5).astype(np.float32)
  dyn, fixed = _vae(), _vae(binarize="none")
  idx = jnp.arange(10)
  noise = dyn.noise_fn(jax.random.key(1), 10)
  fixed_noise = {k: v for k, v in noise.items() if k != "binarize"}  # none to draw
  np.testing.assert_allclose(dyn.objective(binary).loss(dyn.init_params(), idx, noise),
                             fixed.objective(binary).loss(dyn.init_params(), idx, fixed_noise),
                             rtol=1e-6)


def test_conv_networks():
  rngs = nnx.Rngs(0)
  encoder = mcvae.ConvEncoder((8, 8, 1), 4, (8,), rngs=rngs)
  decoder = mcvae.ConvDecoder(4, (8, 8, 1), (8,), rngs=rngs)
  vae = mcvae.MonteCarloVAE(encoder, decoder)
  objective = vae.objective(np.random.default_rng(0).uniform(size=(6, 8, 8)))
  params = vae.init_params()
  indices, noise = dsgrad.training.batching.sample_batch(jax.random.key(0), objective, 3)
  objective.validate(indices, noise)
  grads = jax.jit(lambda p: objective.grad(p, indices, noise, validate=False))(params)
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(g)) for g in leaves) and any(np.any(g != 0) for g in leaves)
  assert jax.jit(lambda p: vae.sample_images(p, jax.random.key(1), 5))(params).shape == (5, 64)
  colour = mcvae.ConvDecoder(4, (8, 8, 3), (8,), output="gaussian", rngs=rngs)
  means = jax.jit(lambda z: colour(z))(jnp.zeros((2, 4)))
  assert means.shape == (2, 192) and np.all((means > 0) & (means < 1))
  rgb = mcvae.MonteCarloVAE(mcvae.ConvEncoder((8, 8, 3), 4, (8,), rngs=rngs), colour,
                            binarize="none")
  rgb_obj = rgb.objective(np.full((4, 8, 8, 3), 0.5))
  value = jax.jit(lambda p, e: rgb_obj.value(p, jnp.arange(4), e, validate=False))(
      rgb.init_params(), rgb_obj.sample_noise(jax.random.key(0), 4))
  assert np.isfinite(float(value))


def test_bad_input():
  vae = _vae()
  with pytest.raises(ValueError, match="\\[0, 1\\]"):
    vae.objective(np.full((3, 4, 4), 2.0))
  with pytest.raises(ValueError, match="pixels"):
    vae.objective(np.zeros((3, 5, 5)))
  with pytest.raises(ValueError, match="pixels"):
    vae.reconstruct(vae.init_params(), np.zeros((3, 3, 3)))
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match="image size"):
    mcvae.MonteCarloVAE(mcvae.MLPEncoder(16, 3, rngs=rngs), mcvae.MLPDecoder(3, 25, rngs=rngs))
  with pytest.raises(ValueError, match="method"):
    _vae("hmc")
  with pytest.raises(ValueError, match="num_steps"):
    _vae("lmcvae")
  # One particle leaves none out: the control variate asked for would be silently off.
  with pytest.raises(ValueError, match=r"leave-one-out control variate needs num_particles "
                                       r">= 2, got 1"):
    _vae("amcvae", num_steps=2)
  assert _vae("amcvae", num_steps=2, control_variate=False).num_particles == 1
  abstract = lambda make: nnx.eval_shape(lambda: make(nnx.Rngs(0)))  # noqa: E731 no init cost
  encoder = abstract(lambda r: mcvae.ConvEncoder((8, 8, 3), 4, (8,), rngs=r))
  with pytest.raises(ValueError, match="binarize='none'"):
    mcvae.MonteCarloVAE(encoder, abstract(
        lambda r: mcvae.ConvDecoder(4, (8, 8, 3), (8,), output="gaussian", rngs=r)))
  with pytest.raises(ValueError, match="multiples"):
    mcvae.ConvEncoder((6, 6, 1), 4, (8, 8), rngs=rngs)
  with pytest.raises(ValueError, match="last axis 192"):
    jax.eval_shape(encoder, jnp.zeros((2, 63)))


def test_joint_saga_refuses_a_table_that_does_not_fit():
  vae = _vae()
  objective = vae.objective(_images())
  params = vae.init_params()
  size = sum(p.size for p in jax.tree.leaves(params))
  with pytest.raises(MemoryError, match=f"{objective.num_data:,} copies of {size:,}"):
    dsgrad.joint_saga(objective, max_table_bytes=1000).init(params)
  state = dsgrad.joint_saga(objective).init(params)  # fits: auto limit
  assert dsgrad.table_bytes(state) == objective.num_data * size * 4


def test_ais_nll_matches_quadrature_on_a_two_dimensional_latent():
  """The held-out NLL the example reports, against the exact ``-log p(x)`` by quadrature
  over a 2-D latent. The trained encoder's scales are well below 1, so a lost Jacobian of
  the whitening (``sum log s``, a few nats here) would show."""
  from sklearn.datasets import load_digits
  images = (load_digits().data[:200] / 16.0 > 0.5).astype(np.float32)
  rngs = nnx.Rngs(0)
  vae = mcvae.MonteCarloVAE(mcvae.MLPEncoder(64, 2, (32,), rngs=rngs),
                            mcvae.MLPDecoder(2, 64, (32,), rngs=rngs), binarize="none")
  result = dsgrad.fit(vae.objective(images), optax.adam(3e-3), vae.init_params(),
                      jax.random.key(0), num_steps=300, batch_size=40, elbo_samples=0,
                      progress=False)
  test = images[:12]
  _, decoder = vae.modules(result.params)
  grid = jnp.linspace(-7.0, 7.0, 281)
  zs = jnp.stack(jnp.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
  cell = float(grid[1] - grid[0]) ** 2
  exact = np.asarray([
      -(jax.scipy.special.logsumexp(jax.vmap(vae.log_joint_fn(decoder, x))(zs))
        + np.log(cell)) for x in test], np.float64)
  encoder, _ = vae.modules(result.params)
  log_scales = np.asarray(encoder(jnp.asarray(test))[1])
  assert log_scales.sum(-1).mean() < -1.0, log_scales  # the case the test is about
  nll, _, per_image = vae.ais_nll(result.params, test, jax.random.key(1), num_steps=100,
                                  num_particles=8)
  diff = per_image - exact
  se = diff.std(ddof=1) / np.sqrt(diff.size)
  # AIS's NLL is an upper bound in expectation that 100 transitions make tight.
  assert abs(diff.mean()) < Z * se + 0.05, (diff, exact)


class _Encoder(nnx.Module):
  """A user's encoder of 16 pixels into a latent of 2, with an optional BatchNorm or
  Dropout, returning ``(mean, log_scale)`` or (``pair=False``) one array."""

  def __init__(self, extra=None, pair=True):
    rngs = nnx.Rngs(0)
    self.data_dim, self.pair = 16, pair
    self.linear = nnx.Linear(16, 4, rngs=rngs)
    self.extra = {"batchnorm": lambda: nnx.BatchNorm(4, rngs=rngs),
                  "dropout": lambda: nnx.Dropout(0.5, rngs=rngs)}.get(extra, lambda: None)()

  def __call__(self, x):
    h = self.linear(x)
    h = h if self.extra is None else self.extra(h)
    return (h[..., :2], h[..., 2:]) if self.pair else h


def test_a_users_modules_that_the_bound_cannot_train_are_named():
  decoder = nnx.Linear(2, 16, rngs=nnx.Rngs(1))
  assert mcvae.MonteCarloVAE(_Encoder(), decoder).latent_dim == 2
  # Each failed with Flax's or JAX's bare words: "Cannot mutate BatchStat from a different
  # trace level", "... RngCount ...", "cannot unpack non-iterable ShapeDtypeStruct".
  with pytest.raises(ValueError, match=r"encoder holds state besides its parameters "
                                       r"\(BatchStat\).*LayerNorm"):
    mcvae.MonteCarloVAE(_Encoder("batchnorm"), decoder)
  with pytest.raises(ValueError, match=r"encoder holds state besides its parameters \(Rng"):
    mcvae.MonteCarloVAE(_Encoder("dropout"), decoder)
  with pytest.raises(ValueError, match=r"must return \(mean, log_scale\), got an array of "
                                       r"shape \(1, 4\)"):
    mcvae.MonteCarloVAE(_Encoder(pair=False), decoder)
  with pytest.raises(TypeError) as caught:
    mcvae.MonteCarloVAE(_Encoder(), nnx.Linear(3, 16, rngs=nnx.Rngs(1)))
  assert any("given a latent of size 2" in note for note in caught.value.__notes__)
  with pytest.raises(ValueError, match=r"set self.data_dim = D"):
    mcvae.MonteCarloVAE(nnx.Linear(16, 4, rngs=nnx.Rngs(0)), decoder)


class _LinearGaussianDecoder(nnx.Module):
  """A user's decoder of real-valued data: Gaussian means ``A z + b`` with no squashing."""

  def __init__(self):
    self.linear = nnx.Linear(2, 5, rngs=nnx.Rngs(3))
    self.output, self.data_dim = "gaussian", 5

  def __call__(self, z):
    return self.linear(z)


class _LinearEncoder(nnx.Module):
  def __init__(self, data_dim=5):
    self.linear = nnx.Linear(data_dim, 4, rngs=nnx.Rngs(4))
    self.data_dim = data_dim

  def __call__(self, x):
    h = self.linear(x)
    return h[..., :2], h[..., 2:] - 3.0


def test_a_gaussian_decoder_reads_real_valued_data_and_its_elbo_is_exact():
  """Standardized (negative, unbounded) data were refused as "outside [0, 1] for a
  Bernoulli decoder"; a Gaussian likelihood is defined on any real value. Its ELBO on
  such data, against the closed form of a linear-Gaussian decoder."""
  sigma = 2.0
  vae = mcvae.MonteCarloVAE(_LinearEncoder(), _LinearGaussianDecoder(), binarize="none",
                            observation_scale=sigma)
  x = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32) * 1.5 - 0.5
  assert x.min() < 0 and x.max() > 1
  params = vae.init_params()
  kernel, bias = (np.asarray(params["decoder"]["linear"][k], np.float64)
                  for k in ("kernel", "bias"))
  encoder, _ = vae.modules(params)
  mean, log_scale = (np.asarray(a, np.float64) for a in encoder(jnp.asarray(x)))
  var = np.exp(2 * log_scale)
  # E_q ||x - A z - b||^2 = ||x - A m - b||^2 + tr(A diag(s^2) A^T), with A = kernel^T.
  squares = ((x - mean @ kernel - bias) ** 2).sum(1) + var @ (kernel ** 2).sum(1)
  log_likelihood = -0.5 * squares / sigma ** 2 - 5 * np.log(sigma * np.sqrt(2 * np.pi))
  log_prior = -np.log(2 * np.pi) - 0.5 * (mean ** 2 + var).sum(1)
  entropy = np.log(2 * np.pi * np.e) + log_scale.sum(1)
  exact = float(np.mean(log_likelihood + log_prior + entropy))
  estimate, se = dsgrad.elbo(vae.objective(x), params, jax.random.key(1), num_samples=2000)
  assert abs(estimate - exact) < Z * se, (estimate, exact, se)
  assert se < 0.1  # a lost log(sigma) term (3.5 nats) or the entropy's would show
  assert vae.reconstruct(params, x).shape == (12, 5)
  # A Bernoulli decoder still needs probabilities.
  bernoulli = mcvae.MonteCarloVAE(_LinearEncoder(), nnx.Linear(2, 5, rngs=nnx.Rngs(1)))
  with pytest.raises(ValueError, match=r"must lie in \[0, 1\] for a Bernoulli decoder"):
    bernoulli.objective(x)
  with pytest.raises(ValueError, match="non-finite pixels"):
    vae.objective(np.where(np.arange(5) == 2, np.nan, x))


def test_params_with_nan_are_refused_where_they_enter_the_evaluations():
  """ais_nll returned (nan, nan) for NaN params, silently; reconstruct and sample_images
  NaN pixels."""
  vae = _vae()
  params = vae.init_params()
  params["decoder"]["body"]["head"]["bias"] = params["decoder"]["body"]["head"]["bias"].at[
      0].set(jnp.nan)
  images = _images(4)
  match = r"params\['decoder'\]\['body'\]\['head'\]\['bias'\] holds NaN or inf"
  with pytest.raises(ValueError, match=match):
    vae.ais_nll(params, images, jax.random.key(0))
  with pytest.raises(ValueError, match=match):
    vae.reconstruct(params, images)
  with pytest.raises(ValueError, match=match):
    vae.sample_images(params, jax.random.key(0), 2)


def test_an_encoder_that_cannot_read_its_data_dim_is_named():
  encoder = _LinearEncoder(data_dim=5)
  encoder.data_dim = 7  # declares a size its first layer cannot read
  with pytest.raises(TypeError) as caught:
    mcvae.MonteCarloVAE(encoder, _LinearGaussianDecoder(), binarize="none")
  assert "raised in the encoder given an image of 7 pixels" in "".join(
      getattr(caught.value, "__notes__", []))


def test_ais_nll_of_real_valued_data_is_the_closed_form_evidence():
  """A linear-Gaussian decoder's ``-log p(x)`` is ``-log N(x; b, A A^T + sigma^2 I)``; the
  encoder gives each image its posterior's exact marginals, so AIS from it is tight. On
  standardized data, which a Gaussian decoder now reads."""
  sigma = 0.5
  vae = mcvae.MonteCarloVAE(_LinearEncoder(), _LinearGaussianDecoder(), binarize="none",
                            observation_scale=sigma)
  params = vae.init_params()
  a = np.asarray(params["decoder"]["linear"]["kernel"], np.float64).T  # x = A z + b
  b = np.asarray(params["decoder"]["linear"]["bias"], np.float64)
  posterior_cov = np.linalg.inv(np.eye(2) + a.T @ a / sigma ** 2)
  to_mean = posterior_cov @ a.T / sigma ** 2  # posterior mean = to_mean (x - b)
  kernel, bias = np.zeros((5, 4)), np.zeros(4)
  kernel[:, :2], bias[:2] = to_mean.T, -(to_mean @ b)
  bias[2:] = 0.5 * np.log(np.diag(posterior_cov)) + 3.0  # the encoder subtracts 3
  params["encoder"]["linear"] = {"kernel": jnp.asarray(kernel, jnp.float32),
                                 "bias": jnp.asarray(bias, jnp.float32)}
  x = np.random.default_rng(0).normal(size=(16, 5)) * 2 - 1
  covariance = a @ a.T + sigma ** 2 * np.eye(5)
  centred = x - b
  exact = 0.5 * (np.einsum("ni,ij,nj->n", centred, np.linalg.inv(covariance), centred)
                 + np.linalg.slogdet(2 * np.pi * covariance)[1])
  _, _, per_image = vae.ais_nll(params, x.astype(np.float32), jax.random.key(1),
                                num_steps=50, num_particles=8)
  diff = per_image - exact
  se = diff.std(ddof=1) / np.sqrt(diff.size)
  assert abs(diff.mean()) < Z * se + 0.05, (diff, exact)
