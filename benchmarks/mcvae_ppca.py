"""The MCVAE paper's PPCA check (Sec. 4.2, Fig. 2): Monte Carlo estimators of the log
evidence and of its gradient on a linear Gaussian model whose evidence is exact.

    python -m benchmarks mcvae-ppca [--repetitions 200] [--no-write]

Model: ``p(z) = N(0, I_d)``, ``p(x | z) = N(theta0 + theta1 z, sigma^2 I_p)`` with fixed
``theta``, on a batch of 100 scikit-learn digits (``p = 64``, ``d = 16``). The amortized
``q(z | x) = N(A x + a, diag(exp(B x + b))^2)`` (mean-field, linear in ``x``) is fitted by
maximizing the IWAE bound with 100 samples, as in the paper (which follows Ruiz et al.
2021). Then, over ``--repetitions`` independent draws, each estimator gives
``log p_hat(x) - log p(x)`` (summed over the batch) and its gradient in
``(theta0, theta1)``, compared with the exact gradient of ``log p(x)``:
the VAE bound (``K = 0``), L-MCVAE and A-MCVAE at ``K = 5, 10``, and A-MCVAE at ``K = 5`` with the leave-one-out
control variate. Every estimator averages 2 particles per image, so the only difference
between the two A-MCVAE ``K = 5`` rows is the control variate. The step size is the
largest of a grid whose mean MALA acceptance at ``K = 5`` is at least 0.8 (the paper
targets 0.8 for A-MCVAE).

Writes a table into docs/benchmarks.md and a boxplot to docs/figures/mcvae_ppca.png.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import _report
from dsgrad import command_line
from dsgrad.mcvae import bounds

D_LATENT, SIGMA, BATCH = 16, 0.3, 100


def problem(seed: int = 0):
  """``(x, theta, exact log p(x) as a function of theta)`` for 100 digits."""
  from sklearn.datasets import load_digits
  x = jnp.asarray(load_digits().data[:BATCH] / 16.0, jnp.float32)
  k1 = jax.random.key(seed)
  theta = {"theta0": jnp.mean(x, 0),
           "theta1": 0.3 * jax.random.normal(k1, (x.shape[1], D_LATENT))}

  def exact(theta):
    cov = theta["theta1"] @ theta["theta1"].T + SIGMA ** 2 * jnp.eye(x.shape[1])
    return jnp.sum(jax.scipy.stats.multivariate_normal.logpdf(x, theta["theta0"], cov))

  return x, theta, exact


def log_joint_fn(theta, xi):
  def log_joint(z):
    r = xi - theta["theta0"] - theta["theta1"] @ z
    return (bounds.gaussian_log_prob(z, jnp.zeros_like(z), jnp.zeros_like(z))
            - 0.5 * jnp.sum(r ** 2) / SIGMA ** 2 - r.shape[0] * jnp.log(SIGMA)
            - 0.5 * r.shape[0] * jnp.log(2 * jnp.pi))
  return log_joint


def encode(phi, x):
  return x @ phi["A"] + phi["a"], x @ phi["B"] + phi["b"]


def fit_encoder(x, theta, steps: int, key):
  """Maximizes the IWAE bound (100 samples) in the linear encoder's parameters."""
  p = x.shape[1]
  phi = {"A": jnp.zeros((p, D_LATENT)), "a": jnp.zeros(D_LATENT),
         "B": jnp.zeros((p, D_LATENT)), "b": jnp.full(D_LATENT, -1.0)}
  opt = optax.adam(1e-2)

  def loss(phi, key):
    means, log_scales = encode(phi, x)
    eps = jax.random.normal(key, (x.shape[0], 100, D_LATENT))
    return -jnp.sum(jax.vmap(lambda xi, m, s, e: bounds.iwae_bound(
        log_joint_fn(theta, xi), m, s, e))(x, means, log_scales, eps))

  @jax.jit
  def step(phi, state, key):
    value, g = jax.value_and_grad(loss)(phi, key)
    updates, state = opt.update(g, state)
    return optax.apply_updates(phi, updates), state, value

  state = opt.init(phi)
  for k in jax.random.split(key, steps):
    phi, state, value = step(phi, state, k)
  return phi, float(value)


def estimator(kind: str, num_steps: int, step_size: float, control_variate: bool,
              particles: int = 2):
  """``(theta, phi, x, key) -> surrogate`` summed over the batch; its value is
  ``log p_hat(x)`` and its gradient the estimator's gradient."""

  def one(theta, xi, mean, log_scale, key):
    k0, k1, k2 = jax.random.split(key, 3)
    eps0 = jax.random.normal(k0, (particles, D_LATENT))
    noise = jax.random.normal(k1, (particles, num_steps, D_LATENT))
    log_joint = log_joint_fn(theta, xi)
    if kind == "lmcvae":
      w = jax.vmap(lambda e, u: bounds.langevin_sis_bound(
          log_joint, mean, log_scale, e, u, step_size))(eps0, noise)
      return jnp.mean(w), jnp.ones(())
    v = jax.random.uniform(k2, (particles, num_steps)) - 0.5
    w, log_a, path = jax.vmap(lambda e, u, vv: bounds.mala_ais_bound(
        log_joint, mean, log_scale, e, u, vv, step_size, return_path=True))(eps0, noise, v)
    return (bounds.amcvae_surrogate(w, log_a, control_variate),
            jnp.mean(path.accepted.astype(jnp.float32)))

  def batch(theta, phi, x, key):
    means, log_scales = encode(phi, x)
    values, accept = jax.vmap(one, in_axes=(None, 0, 0, 0, 0))(
        theta, x, means, log_scales, jax.random.split(key, x.shape[0]))
    return jnp.sum(values), accept

  return batch


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks mcvae-ppca",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--repetitions", type=command_line.count(1), default=200,
                      help="independent draws of each estimator")
  parser.add_argument("--encoder-steps", type=command_line.count(1), default=2000,
                      help="Adam steps fitting the encoder by IWAE-100")
  parser.add_argument("--seed", type=command_line.count(0),
                      default=0, help="seed of theta and all draws")
  parser.add_argument("--no-write", dest="write", action="store_false",
                      help="print only; do not touch docs/")
  args = parser.parse_args(argv)
  t_start = time.perf_counter()
  key = jax.random.key(args.seed)
  x, theta, exact = problem(args.seed)
  phi, iwae_loss = fit_encoder(x, theta, args.encoder_steps, jax.random.fold_in(key, 1))
  log_p = float(exact(theta))
  true_grad = jax.grad(exact)(theta)
  flat_true = np.asarray(jax.flatten_util.ravel_pytree(true_grad)[0], np.float64)
  grid = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]
  rates = {}  # mean MALA acceptance rate of a K = 5 A-MCVAE chain, per step size
  for eta in grid:
    _, accepted = jax.jit(estimator("amcvae", 5, eta, False))(theta, phi, x,
                                                             jax.random.fold_in(key, 2))
    rates[eta] = float(jnp.mean(accepted))
  step_size = max([eta for eta, r in rates.items() if r >= 0.8] or [grid[0]])
  print(f"log p(x) = {log_p:.2f} (100 images); IWAE-100 bound after fitting the encoder: "
        f"{-iwae_loss:.2f}; step size {step_size} (acceptance at K=5: "
        + ", ".join(f"{e}: {r:.2f}" for e, r in rates.items()) + ")")

  rows = {"VAE (K=0)": ("lmcvae", 0, False), "L-MCVAE, K=5": ("lmcvae", 5, False),
          "L-MCVAE, K=10": ("lmcvae", 10, False),
          "A-MCVAE, K=5": ("amcvae", 5, False), "A-MCVAE, K=10": ("amcvae", 10, False),
          "A-MCVAE, K=5, control variate": ("amcvae", 5, True)}
  results = {}
  for name, (kind, k, cv) in rows.items():
    fn = estimator(kind, k, step_size, cv)
    value_and_grad = jax.jit(jax.value_and_grad(fn, has_aux=True))
    gaps, grads, accepts = [], [], []
    for r in range(args.repetitions):
      (value, acc), g = value_and_grad(theta, phi, x, jax.random.fold_in(key, 1000 + r))
      gaps.append(float(value) - log_p)
      grads.append(np.asarray(jax.flatten_util.ravel_pytree(g)[0], np.float64))
      accepts.append(float(jnp.mean(acc)))
    gaps, grads = np.asarray(gaps), np.stack(grads)
    err = np.linalg.norm(grads - flat_true, axis=1) / np.linalg.norm(flat_true)
    results[name] = {"gaps": gaps, "grad_err": err, "grad0": grads[:, 0],
                     "accept": float(np.mean(accepts)) if kind == "amcvae" else float("nan"),
                     "grad_sd": float(np.mean(np.std(grads, axis=0, ddof=1)))}
    print(f"{name:<32} gap {gaps.mean():8.2f} ± {gaps.std(ddof=1):6.2f}   "
          f"grad rel. error {np.median(err):.3f}  mean grad sd {results[name]['grad_sd']:.3f}")

  lines = ["| estimator (2 particles/image) | mean log p_hat - log p (sd) | median | "
           "gradient sd (mean over coords) | median rel. gradient error | MALA acceptance rate |",
           "|---|---|---|---|---|---|"]
  for name, r in results.items():
    acc = "" if np.isnan(r["accept"]) else f"{r['accept']:.2f}"
    lines.append(f"| {name} | {r['gaps'].mean():.2f} ({r['gaps'].std(ddof=1):.2f}) | "
                 f"{np.median(r['gaps']):.2f} | {r['grad_sd']:.3f} | "
                 f"{np.median(r['grad_err']):.3f} | {acc} |")
  table = "\n".join(lines)
  elapsed = time.perf_counter() - t_start
  body = (f"`python -m benchmarks mcvae-ppca --repetitions {args.repetitions}` "
          f"({elapsed:.0f} s). {_report.environment()}\n\n"
          f"Linear Gaussian model on 100 digits (p = 64, d = {D_LATENT}, sigma = {SIGMA}); "
          f"exact log p(x) = {log_p:.2f}; mean-field linear encoder fitted by IWAE-100 "
          f"(bound {-iwae_loss:.2f}); step size {step_size}. Over {args.repetitions} "
          f"draws:\n\n{table}\n\n![PPCA check](figures/mcvae_ppca.png)\n")
  print(table)
  if args.write:
    _report.write_section("mcvae-ppca", body)
    _boxplots(results, _report.docs_path("figures/mcvae_ppca.png"))
  return 0


def _boxplots(results, path):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no figure")
    return
  names = list(results)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  axes[0].boxplot([results[n]["gaps"] for n in names])
  axes[0].set_title("log p_hat(x) - log p(x)", fontsize=9)
  axes[1].boxplot([results[n]["grad_err"] for n in names])
  axes[1].set_title("|grad estimate - grad log p(x)| / |grad log p(x)| (log scale)",
                    fontsize=9)
  axes[1].set_yscale("log")
  for ax in axes:
    ax.set_xticks(range(1, len(names) + 1), [n.replace(", ", "\n") for n in names],
                  fontsize=7)
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  print(f"wrote {path}")


if __name__ == "__main__":
  raise SystemExit(main())
