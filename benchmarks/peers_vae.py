"""VAEs for ``python -m benchmarks peers``: real MNIST (the official 10,000-image test
split) and scikit-learn's digits.

A VAE's parameters are the encoder's and decoder's weights, learned by maximizing
``sum_n ELBO_n``; the doubly-stochastic gradient draws a mini-batch of images and, per
image, the latent noise and the dynamic binarization. Contenders, all on the same
networks (:class:`dsgrad.mcvae.MLPEncoder` / :class:`~dsgrad.mcvae.MLPDecoder`, the same
initial weights), batch, Adam and steps:

* ``optax (hand-written step), naive``: ``jax.grad`` of the batch's bound with
  ``optax.adam``, written directly (the bound itself is dsgrad's
  :meth:`dsgrad.mcvae.MonteCarloVAE.datum_bound`, so that every contender optimizes the
  same function);
* ``dsgrad naive``, ``dsgrad cv`` and ``dsgrad joint SVRG`` (first-order approximation,
  :func:`dsgrad.approx.linearize`, adaptive weight): the one-liner
  ``optax.chain(estimator, optax.adam(...))`` through :func:`dsgrad.train_step`;
* the same under a cosine-decayed rate (`` + cosine``).

Not included: joint SAGA, whose table holds a copy of the weights per image (MNIST:
10,000 x 318,000 floats, 12.7 GB); NumPyro SVI, whose VAE keeps the networks' weights in
its own module state (``numpyro.contrib.module``), so it would train other parameters
than the ones evaluated here.

ELBO: ``sum_n`` of the VAE bound with fixed noise (the same draws for every evaluation
and contender), evaluated outside the clock.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import dsgrad
from benchmarks import _contenders
from dsgrad.mcvae import MLPDecoder, MLPEncoder, MonteCarloVAE


class VaeSpec(NamedTuple):
  """A VAE task: the model, its objective over the images, and its size."""

  vae: MonteCarloVAE
  objective: object
  dim: int  # number of weights


def load_images(name: str, data_dir: str, quick: bool):
  if name == "vae-digits":
    from sklearn.datasets import load_digits
    images = (load_digits().images.reshape(-1, 64) / 16.0).astype(np.float32)
    return images, "scikit-learn digits (1,797 8x8 images, grey levels / 16)"
  path = os.path.join(data_dir, "mnist")
  images, _ = dsgrad.datasets.load_mnist(path, "test")
  if quick:
    images = images[:2_000]
  return images, (f"real MNIST: the official test split ({len(images):,} images of 28x28; "
                  "the training split is not available offline)")


def spec(images: np.ndarray, latent_dim: int, hidden: int) -> VaeSpec:
  d = images.shape[1]
  vae = MonteCarloVAE(MLPEncoder(d, latent_dim, (hidden,), rngs=nnx.Rngs(0)),
                      MLPDecoder(latent_dim, d, (hidden,), rngs=nnx.Rngs(1)))
  params = vae.init_params()
  dim = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(params))
  return VaeSpec(vae, vae.objective(images), dim)


def evaluator(task, draws: int = 2):
  """``(params, _) -> sum_n ELBO_n`` with fixed noise."""
  s = task.spec
  n = s.objective.num_data
  noise = s.vae.noise_fn(jax.random.key(12345), n * draws)
  noise = jax.tree.map(lambda a: a.reshape(draws, n, *a.shape[1:]), noise)
  idx = jnp.arange(n)

  @jax.jit
  def total(params):
    return -jnp.mean(jax.vmap(lambda e: jnp.sum(s.objective.loss_fn(params, idx, e)))(noise))

  return lambda params, _: float(total(params))


def contenders(task, runner_cls, adam, scheduled: str) -> dict:
  """``{label: (factory(setting) -> Runner, None)}``."""
  s = task.spec
  n = s.objective.num_data
  objective, vae = s.objective, s.vae

  def optax_runner(setting):
    tx = adam(setting, task.steps)

    def segment(state, indices, keys):
      def step(carry, xs):
        params, opt_state = carry
        idx, key = xs
        g = jax.grad(lambda p: n * jnp.mean(objective.loss_fn(p, idx, vae.noise_fn(
            key, idx.shape[0]))))(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None
      return jax.lax.scan(step, state, (indices, keys))[0]

    def init(key):
      del key
      params = vae.init_params()
      return params, tx.init(params)

    return runner_cls(init, segment, lambda st: (st[0], None))

  def dsgrad_runner(setting, estimator):
    off = {}
    approx = dsgrad.approx.linearize()
    est = {"naive": lambda: dsgrad.naive(),
           "cv": lambda: dsgrad.cv(objective, approx, **off),
           "joint_svrg": lambda: dsgrad.joint_svrg(objective, approx,
                                                   every=max(1, n // task.batch_size),
                                                   chunk_size=min(n, 2_000), **off)}[estimator]()
    opt = optax.chain(est, adam(setting, task.steps))
    return _contenders.train_step_runner(objective, opt, vae.init_params,
                                   lambda st: (st[0], None))

  out = {"optax (hand-written step), naive": (optax_runner, None)}
  labels = {"naive": "dsgrad naive", "cv": "dsgrad cv (1st order, adaptive)",
            "joint_svrg": "dsgrad joint SVRG (1st order, adaptive)"}
  for est, label in labels.items():
    out[label] = (lambda st, est=est: dsgrad_runner(st, est), None)
  out["optax (hand-written step), naive" + scheduled] = (optax_runner, None)
  for est in ("naive", "joint_svrg"):
    out[labels[est] + scheduled] = (lambda st, est=est: dsgrad_runner(st, est), None)
  return out
