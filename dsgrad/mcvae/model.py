"""A VAE trained by any of the four bounds, as a doubly-stochastic :class:`dsgrad.Objective`.

    vae = MonteCarloVAE(encoder, decoder, method="lmcvae", num_steps=5)
    objective = vae.objective(train_images)
    params = vae.init_params()
    opt = optax.chain(dsgrad.joint_svrg(objective), optax.adam(1e-3))
    result = dsgrad.fit(objective, opt, params, key, num_steps=..., batch_size=100)

The objective's per-datum loss is ``f(w; n, eps) = -log p_hat(x_n)``: minus one of the
bounds of :mod:`dsgrad.mcvae.bounds` for image ``n``, so its mean over data and noise
is the negative ELBO the paper's Table 1 reports. The noise ``eps`` of a datum is all of
its randomness: the dynamic binarization of the image, the proposal draws, the Langevin
noise and the MALA accept/reject uniforms -- each centred to mean zero, so
:func:`dsgrad.approx.linearize` applies and ``cv``, ``joint_svrg`` and ``joint_saga``
work on it unchanged.

The parameters are ``{"encoder": dict, "decoder": dict, "sampler": dict}``: the
modules' weights as plain nested dicts (``nnx.to_pure_dict``, so any checkpointer and
optax transformation handles them) and the sampler part, which holds the learnable Langevin/MALA step sizes (one per latent
coordinate, Eq. 27's preconditioned step) and the annealing schedule's logits
(:func:`dsgrad.mcvae.schedule_from_logits`).

References:
  Thin et al. (2021). Monte Carlo variational auto-encoders. ICML. Sec. 2-4, Alg. 1-2,
  Eq. 1, 14, 25-27.
  Burda, Grosse, Salakhutdinov (2015). Importance weighted autoencoders.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsgrad import checks
from dsgrad.training import compile_cache
from dsgrad import elbo_estimates
from dsgrad.mcvae import bounds
from dsgrad.mcvae.networks import (bernoulli_log_likelihood, check_images,
                                   gaussian_log_likelihood)
from dsgrad.models.base import model_data
from dsgrad.objective import Objective, standard_normal

METHODS = ("vae", "iwae", "lmcvae", "amcvae")


@checks.arguments(num_particles=checks.count(1), num_steps=checks.count(0),
                  step_size=checks.positive(), observation_scale=checks.positive())
@dataclasses.dataclass(frozen=True, eq=False)
class MonteCarloVAE:
  """A latent-variable model ``p(z) p_theta(x | z)`` with an amortized ``q_phi(z | x)``.

  Attributes:
    encoder: an NNX module ``x (..., D) -> (mean, log_scale)`` (e.g.
      :class:`dsgrad.mcvae.MLPEncoder` or :class:`dsgrad.mcvae.ConvEncoder`).
    decoder: an NNX module ``z (..., d) -> (..., D)``: Bernoulli logits, or Gaussian
      means when it has ``output == "gaussian"`` (:class:`dsgrad.mcvae.ConvDecoder`).
      Both modules expose ``data_dim`` (``D``, pixels of a flattened image).
    method: ``"vae"`` (ELBO), ``"iwae"`` (``num_particles`` importance samples),
      ``"lmcvae"`` (Langevin SIS, Alg. 1) or ``"amcvae"`` (MALA AIS, Alg. 2).
    num_particles: samples per datum. IWAE: its ``K``. VAE / L-MCVAE / A-MCVAE: the
      bound is averaged over the particles (A-MCVAE needs 2 or more for the
      leave-one-out control variate of Eq. 26).
    num_steps: Langevin/MALA steps ``K`` (L-MCVAE and A-MCVAE).
    step_size: initial step size ``eta`` of every latent coordinate.
    learn_step_size: learn ``eta`` through the ELBO (else it stays at ``step_size``).
    learn_schedule: learn the annealing temperatures (else the linear schedule).
    control_variate: A-MCVAE's leave-one-out baseline for the REINFORCE term.
    binarize: ``"dynamic"`` draws a binary image ``x_bin ~ Bernoulli(x)`` per datum and
      step (dynamic binarization, part of the noise); ``"none"`` uses ``x`` as is.
    observation_scale: standard deviation of a Gaussian decoder's pixels.

  Example: an L-MCVAE (two Langevin steps) on 200 random binary 16-pixel images; its
  held-out negative log-likelihood by AIS falls as it trains::

    >>> import jax, optax, dsgrad
    >>> from flax import nnx
    >>> from dsgrad import mcvae
    >>> images = (jax.random.uniform(jax.random.key(0), (200, 16)) < 0.3).astype(float)
    >>> rngs = nnx.Rngs(0)
    >>> vae = mcvae.MonteCarloVAE(mcvae.MLPEncoder(16, 2, (16,), rngs=rngs),
    ...                           mcvae.MLPDecoder(2, 16, (16,), rngs=rngs),
    ...                           method="lmcvae", num_steps=2)
    >>> params = vae.init_params()
    >>> result = dsgrad.fit(vae.objective(images), optax.adam(1e-2), params,
    ...                     jax.random.key(1), num_steps=200, batch_size=20, elbo_samples=0,
    ...                     progress=False)
    >>> (before, _, _), (after, _, _) = (vae.ais_nll(p, images[:50], jax.random.key(2))
    ...                                  for p in (params, result.params))
    >>> bool(after < before)
    True
  """

  encoder: nnx.Module
  decoder: nnx.Module
  method: str = "vae"
  num_particles: int = 1
  num_steps: int = 0
  step_size: float = 0.01
  learn_step_size: bool = True
  learn_schedule: bool = True
  control_variate: bool = True
  binarize: str = "dynamic"
  observation_scale: float = 0.1

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
    if self.method in ("lmcvae", "amcvae") and self.num_steps < 1:
      raise ValueError(f"method {self.method!r} needs num_steps >= 1")
    if self.method == "amcvae" and self.control_variate and self.num_particles < 2:
      # With one particle there is no other to leave out: the baseline would be zero and
      # the REINFORCE term's variance that of no control variate, without a word.
      raise ValueError("amcvae's leave-one-out control variate needs num_particles >= 2, "
                       f"got {self.num_particles}: pass num_particles=2 or more, or "
                       "control_variate=False")
    if self.binarize not in ("dynamic", "none"):
      raise ValueError(f"binarize must be 'dynamic' or 'none', got {self.binarize!r}")
    if self.gaussian and self.binarize != "none":
      raise ValueError("a Gaussian decoder models grey/colour values: use binarize='none'")
    for role in ("encoder", "decoder"):
      _check_only_parameters(getattr(self, role), role)
    object.__setattr__(self, "_split", (nnx.split(self.encoder), nnx.split(self.decoder)))
    # Shapes from one abstract call: the image size D and the latent size d.
    try:
      encoded = jax.eval_shape(lambda: self.encoder(jnp.zeros((1, self.data_dim))))
    except (TypeError, ValueError) as error:
      error.add_note(f"(raised in the encoder given an image of {self.data_dim} pixels, its "
                     "data_dim: the encoder must read flattened images of data_dim pixels)")
      raise
    mean, _ = _encoder_output(encoded)
    try:
      logits = jax.eval_shape(lambda: self.decoder(jnp.zeros((1, mean.shape[-1]))))
    except (TypeError, ValueError) as error:
      error.add_note(f"(raised in the decoder given a latent of size {mean.shape[-1]}, the "
                     "encoder's mean's: the two must agree on the latent size)")
      raise
    if logits.shape[-1] != self.data_dim:
      raise ValueError(f"the decoder outputs {logits.shape[-1]} pixels but the encoder reads "
                       f"{self.data_dim}; encoder and decoder must agree on the image size")
    object.__setattr__(self, "latent_dim", int(mean.shape[-1]))

  @property
  def data_dim(self) -> int:
    """``D``, the number of pixels of a flattened image (read from the encoder)."""
    if not hasattr(self.encoder, "data_dim"):
      raise ValueError("the encoder must expose `data_dim` (the flattened image size): "
                       "set self.data_dim = D in its __init__")
    return int(self.encoder.data_dim)

  @property
  def gaussian(self) -> bool:
    """Whether the decoder outputs Gaussian means (else Bernoulli logits)."""
    return getattr(self.decoder, "output", "bernoulli") == "gaussian"

  # -------------------------------------------------------------- parameters
  def init_params(self) -> dict:
    """The parameters as a pytree: the modules' states and the sampler's parameters."""
    sampler = {}
    if self.method in ("lmcvae", "amcvae"):
      sampler = {"log_step_size": jnp.full((self.latent_dim,), math.log(self.step_size),
                                           jnp.float32),
                 "schedule_logits": jnp.zeros((self.num_steps,), jnp.float32)}
    return {"encoder": nnx.to_pure_dict(nnx.state(self.encoder)),
            "decoder": nnx.to_pure_dict(nnx.state(self.decoder)), "sampler": sampler}

  def modules(self, params):
    """``(encoder, decoder)`` NNX modules carrying ``params`` (pure under ``jit``)."""
    out = []
    for (graphdef, template), values in zip(self._split, (params["encoder"],
                                                          params["decoder"])):
      state = jax.tree.map(lambda v: v, template)  # a fresh State to fill
      nnx.replace_by_pure_dict(state, values)
      out.append(nnx.merge(graphdef, state))
    return tuple(out)

  def sampler(self, params):
    """``(step_size, betas)`` in use: learned or fixed, per the configuration."""
    if self.method not in ("lmcvae", "amcvae"):
      return None, None
    raw = params["sampler"]
    log_eta = raw["log_step_size"]
    if not self.learn_step_size:
      log_eta = jax.lax.stop_gradient(log_eta)
    logits = raw["schedule_logits"]
    if not self.learn_schedule:
      logits = jnp.zeros_like(logits)
    return jnp.exp(log_eta), bounds.schedule_from_logits(logits)

  # ------------------------------------------------------------------- noise
  @checks.arguments(key=checks.prng_key(), batch_size=checks.count(1))
  def noise_fn(self, key, batch_size: int) -> dict:
    """All randomness of a batch, each part centred (mean zero), leading axis ``B``."""
    n, k, d = self.num_particles, self.num_steps, self.latent_dim
    keys = jax.random.split(key, 4)
    noise = {"eps0": standard_normal(keys[1], (batch_size, n, d))}
    if self.binarize == "dynamic":
      noise["binarize"] = jax.random.uniform(keys[0], (batch_size, self.data_dim)) - 0.5
    if self.method in ("lmcvae", "amcvae"):
      noise["langevin"] = standard_normal(keys[2], (batch_size, n, k, d))
    if self.method == "amcvae":
      noise["accept"] = jax.random.uniform(keys[3], (batch_size, n, k)) - 0.5
    return noise

  # ------------------------------------------------------------------ bounds
  def log_joint_fn(self, decoder, x):
    """``z -> log p(z) + log p_theta(x | z)`` for one (binary) image ``x``."""
    d = self.latent_dim

    def log_joint(z):
      prior = bounds.gaussian_log_prob(z, jnp.zeros(d), jnp.zeros(d))
      if self.gaussian:
        return prior + gaussian_log_likelihood(decoder(z), x, self.observation_scale)
      return prior + bernoulli_log_likelihood(decoder(z), x)

    return log_joint

  def binarized(self, x, binarize_noise):
    """The image the bound sees: ``1[u < x]`` with ``u = noise + 1/2`` (dynamic), or ``x``
    (``binarize="none"``, where there is no binarization noise)."""
    if self.binarize == "dynamic":
      return (binarize_noise + 0.5 < x).astype(x.dtype)
    return x

  def datum_bound(self, params, x, noise) -> jax.Array:
    """The training surrogate for one image ``x`` (``(D,)``) and its noise (no batch
    axis): its value is the bound ``log p_hat(x)``, its gradient the method's gradient
    estimate (for A-MCVAE, Eq. 25 with the REINFORCE term)."""
    encoder, decoder = self.modules(params)
    x = self.binarized(x, noise.get("binarize"))
    mean, log_scale = encoder(x)
    log_joint = self.log_joint_fn(decoder, x)
    if self.method == "iwae":
      return bounds.iwae_bound(log_joint, mean, log_scale, noise["eps0"])
    if self.method == "vae":
      return jnp.mean(jax.vmap(lambda e: bounds.vae_bound(log_joint, mean, log_scale, e))(
          noise["eps0"]))
    eta, betas = self.sampler(params)
    if self.method == "lmcvae":
      return jnp.mean(jax.vmap(lambda e, u: bounds.langevin_sis_bound(
          log_joint, mean, log_scale, e, u, eta, betas))(noise["eps0"], noise["langevin"]))
    w, log_a = jax.vmap(lambda e, u, v: bounds.mala_ais_bound(
        log_joint, mean, log_scale, e, u, v, eta, betas))(
            noise["eps0"], noise["langevin"], noise["accept"])
    return bounds.amcvae_surrogate(w, log_a, self.control_variate)

  def objective(self, images, name: str | None = None) -> Objective:
    """The per-datum objective ``f(w; n, eps) = -log p_hat(x_n)`` over ``images``.

    Args:
      images: ``(N, D)`` or ``(N, H, W[, C])``: for a Bernoulli decoder, values in
        ``[0, 1]`` (grey levels are Bernoulli means for dynamic binarization); for a
        Gaussian one, any finite values its means can reach (those of
        :class:`dsgrad.mcvae.ConvDecoder` lie in ``(0, 1)``).
      name: label for tables and messages (default ``"mcvae:<method>"``).

    Raises:
      ValueError: images non-finite or of the wrong size, or, for a Bernoulli decoder,
        outside ``[0, 1]``.
    """
    data = model_data(images=jnp.asarray(self._checked_images(images)))
    datum_bound = self.datum_bound

    def loss_fn(params, rows, noise):
      return -jax.vmap(lambda x, e: datum_bound(params, x, e))(rows["images"], noise)

    return Objective(loss_fn, self.noise_fn, int(data["images"].shape[0]),
                     name=name or f"mcvae:{self.method}", data=data)

  def _checked_images(self, images) -> np.ndarray:
    # A Gaussian likelihood is defined on any real value (standardized data, say); only
    # Bernoulli pixels must be probabilities.
    return check_images(images, self.data_dim, unit_interval=not self.gaussian)

  # -------------------------------------------------------------- generation
  def _means(self, decoder, z):
    out = decoder(z)
    return out if self.gaussian else jax.nn.sigmoid(out)

  @checks.arguments(params=checks.parameters(), key=checks.prng_key(), num=checks.count(1))
  def sample_images(self, params, key, num: int) -> jax.Array:
    """Pixel means of ``p(x | z)`` for ``num`` draws ``z ~ p(z)``, shape ``(num, D)``."""
    _, decoder = self.modules(params)
    return self._means(decoder, jax.random.normal(key, (num, self.latent_dim)))

  @checks.arguments(params=checks.parameters())
  def reconstruct(self, params, images) -> jax.Array:
    """Pixel means of ``p(x | z)`` at the encoder's mean for each image, ``(N, D)``."""
    encoder, decoder = self.modules(params)
    x = jnp.asarray(self._checked_images(images))
    return self._means(decoder, encoder(x)[0])

  @checks.arguments(params=checks.parameters(), key=checks.prng_key(),
                    num_steps=checks.count(1), num_leapfrog=checks.count(1),
                    num_particles=checks.count(1), step_size=checks.positive(),
                    chunk_size=checks.count(1))
  def ais_nll(self, params, images, key, *, num_steps: int = 5, num_leapfrog: int = 3,
              num_particles: int = 1, step_size: float = 0.2, binarize_key=None,
              chunk_size: int = 256):
    """Held-out negative log-likelihood ``-log p(x)`` by AIS with HMC transitions.

    The evaluation of Sec. 4.3 (Wu et al. 2016): for every image, AIS from the
    encoder's ``q(z | x)`` to the posterior in ``num_steps`` HMC transitions of
    ``num_leapfrog`` leapfrog steps (the paper: 5 and 3), preconditioned by the
    encoder's scales (:func:`dsgrad.mcvae.ais_hmc_log_evidence`). More steps and
    particles tighten the estimate (it is a stochastic lower bound of ``log p(x)``, so
    the NLL is an upper bound in expectation).

    Args:
      params: the model's parameters.
      images: ``(N, ...)`` in ``[0, 1]``.
      key: PRNG key.
      num_steps: AIS transitions.
      num_leapfrog: leapfrog steps per HMC transition.
      num_particles: AIS particles per image.
      step_size: leapfrog step in the encoder-whitened coordinates.
      binarize_key: with dynamic binarization, the key of the one binarization of the
        held-out images (default: derived from ``key``); evaluation uses a fixed one.
      chunk_size: images per compiled chunk (bounded memory).

    Returns:
      ``(mean NLL, its standard error over images, per-image NLL array)``.
    """
    x = jnp.asarray(self._checked_images(images))
    if x.shape[0] < 2:
      raise ValueError(f"ais_nll needs at least 2 images for the standard error of the "
                       f"mean NLL, got {x.shape[0]}")
    # Params of another model are named, not a KeyError inside the chain.
    checks.check_objective_evaluates(self.objective(x[:2]), params, "mcvae.MonteCarloVAE.ais_nll")
    if self.binarize == "dynamic":
      binarize_key = jax.random.fold_in(key, 1) if binarize_key is None else binarize_key
      x = (jax.random.uniform(binarize_key, x.shape) < x).astype(x.dtype)
    chunk = _ais_chunk_fn(self, num_steps, num_leapfrog, num_particles, float(step_size))
    keys = jax.random.split(key, x.shape[0])
    pieces = [chunk(params, x[i:i + chunk_size], keys[i:i + chunk_size])
              for i in range(0, x.shape[0], chunk_size)]
    nll = -np.concatenate([np.asarray(p, np.float64) for p in pieces])
    return (*elbo_estimates.mean_and_standard_error(nll), nll)


def _check_only_parameters(module: nnx.Module, role: str) -> None:
  """Refuses a module that holds state besides its parameters (``nnx.Param``): batch
  statistics (``BatchNorm``) make a datum's term depend on its batch, which the
  estimators' reweighting of each datum assumes it does not, and random state
  (``Dropout``'s) is not part of the objective's noise; both failed inside ``jit`` with
  Flax's "Cannot mutate ... from a different trace level"."""
  others = nnx.to_flat_state(nnx.state(module, nnx.Not(nnx.Param)))
  found = sorted({getattr(value, "type", type(value)).__name__ for _, value in others})
  if found:
    raise ValueError(f"the {role} holds state besides its parameters ({', '.join(found)}): "
                     "MonteCarloVAE trains nnx.Param only. Batch statistics (BatchNorm) "
                     "make each image's term depend on its batch, and Dropout's random state "
                     "is not part of the bound's noise: use LayerNorm, and no dropout")


def _encoder_output(output):
  """The encoder's ``(mean, log_scale)``, refusing another output by name."""
  if not (isinstance(output, (tuple, list)) and len(output) == 2):
    shape = getattr(output, "shape", None)
    got = type(output).__name__ if shape is None else f"an array of shape {shape}"
    raise ValueError(f"the encoder must return (mean, log_scale), got {got}")
  return output


@compile_cache.cached
def _ais_chunk_fn(vae: MonteCarloVAE, num_steps, num_leapfrog, num_particles, step_size):
  """The jitted AIS evaluation of a chunk of images, compiled once per model and setting."""

  @compile_cache.jit_by_text
  def chunk(params, xs, keys):
    encoder, decoder = vae.modules(params)
    means, log_scales = encoder(xs)

    def one(xi, m, s, k):
      return bounds.ais_hmc_log_evidence(
          k, vae.log_joint_fn(decoder, xi), m, s, num_steps=num_steps,
          num_particles=num_particles, step_size=step_size, num_leapfrog=num_leapfrog,
          precondition=True)

    return jax.vmap(one)(xs, means, log_scales, keys)

  return chunk
