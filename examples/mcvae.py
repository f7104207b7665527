"""Monte Carlo VAEs on binarized images: VAE, IWAE, L-MCVAE and A-MCVAE (the MCVAE paper's
Table 1, Sec. 4.3).

Each method trains the same encoder/decoder (MLPs, or the convolutional networks with
--conv) with Adam on dynamically binarized images, using any dsgrad estimator. At the
chosen epochs it reports, on held-out images, the negative ELBO of the method's own bound
and the negative log-likelihood estimated by AIS with HMC transitions started from the
encoder (the paper: 5 transitions of 3 leapfrog steps). Prints the table, saves image
grids of samples and reconstructions per method as PNGs, and results.json.

    python examples/mcvae.py                                  # offline: scikit-learn digits
    python examples/mcvae.py --dataset mnist --data-dir ~/mnist --epochs 10,30,100
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np
import optax
from flax import nnx

import dsgrad
from dsgrad import command_line
from _common import add_all_cores_flag, check_checkpoint_config, first_paragraph, place_xla_threads
from dsgrad import mcvae

METHODS = {  # name -> MonteCarloVAE settings (the paper's rows of Table 1)
    "vae": dict(method="vae"),
    "iwae": dict(method="iwae", num_particles=10),
    "lmcvae": dict(method="lmcvae", num_steps=5),
    "amcvae": dict(method="amcvae", num_steps=3, num_particles=2),
}
ESTIMATORS = ("naive", "cv", "joint_svrg", "joint_saga")


def load(args):
  """``(train images (N, H, W), held-out images, description)``, values in [0, 1]."""
  if args.dataset == "digits":
    from sklearn.datasets import load_digits
    x = (load_digits().images / 16.0).astype(np.float32)
    order = np.random.default_rng(12345).permutation(x.shape[0])  # a fixed split
    test, train = x[order[:args.held_out]], x[order[args.held_out:]]
    return train, test, (f"scikit-learn digits: {train.shape[0]:,} training and "
                         f"{test.shape[0]:,} held-out 8x8 images")
  if not args.data_dir:
    raise SystemExit("--dataset mnist needs --data-dir with the MNIST IDX files")
  test, _ = dsgrad.datasets.load_mnist(args.data_dir, "test")
  try:
    train, _ = dsgrad.datasets.load_mnist(args.data_dir, "train")
  except FileNotFoundError:
    # Only the official test split is at hand (as in the repository's shared data):
    # train on its last images and hold out its first --held-out.
    if not 0 < args.held_out < test.shape[0]:
      raise SystemExit(f"--held-out must be between 1 and {test.shape[0] - 1} when only "
                       f"the MNIST test split is in {args.data_dir}")
    train, test = test[args.held_out:], test[:args.held_out]
    return (train.reshape(-1, 28, 28), test.reshape(-1, 28, 28),
            f"MNIST test split only: {train.shape[0]:,} of its images for training, "
            f"its first {test.shape[0]:,} held out")
  test = test[:args.held_out]
  return (train.reshape(-1, 28, 28), test.reshape(-1, 28, 28),
          f"MNIST: {train.shape[0]:,} training and {test.shape[0]:,} held-out images")


def networks(args, image_shape, seed):
  rngs = nnx.Rngs(seed)
  h, w = image_shape
  if args.conv:
    return (mcvae.ConvEncoder((h, w, 1), args.latent_dim, (32, 64), rngs=rngs),
            mcvae.ConvDecoder(args.latent_dim, (h, w, 1), (64, 32), rngs=rngs))
  hidden = (args.hidden,)
  return (mcvae.MLPEncoder(h * w, args.latent_dim, hidden, rngs=rngs),
          mcvae.MLPDecoder(args.latent_dim, h * w, hidden, rngs=rngs))


def make_estimator(name, objective, batch_size):
  epoch = max(1, objective.num_data // batch_size)
  return {"naive": lambda: optax.identity(),
          "cv": lambda: dsgrad.cv(objective),
          "joint_svrg": lambda: dsgrad.joint_svrg(objective, every=epoch),
          "joint_saga": lambda: dsgrad.joint_saga(objective, warmup_steps=epoch)}[name]()


def evaluate(vae, held_out, params, test, args):
  """Held-out negative ELBO (the method's own bound) and AIS negative log-likelihood."""
  key = jax.random.key(args.seed + 1)
  neg_elbo, se = dsgrad.elbo(held_out, params, key, args.elbo_samples)
  nll, nll_se, per_image = vae.ais_nll(params, test, jax.random.fold_in(key, 1),
                               num_steps=args.ais_steps, num_leapfrog=args.ais_leapfrog,
                               num_particles=args.ais_particles,
                               step_size=args.ais_step_size,
                               binarize_key=jax.random.key(2024))  # same images for all
  return {"neg_elbo": -neg_elbo, "neg_elbo_se": se, "nll": nll, "nll_se": nll_se,
          "nll_per_image": per_image.tolist()}


def train_method(name, train, test, args, epochs):
  encoder, decoder = networks(args, train.shape[1:], args.seed)
  vae = mcvae.MonteCarloVAE(encoder, decoder, step_size=args.step_size, **METHODS[name])
  objective = vae.objective(train, name=name)
  held_out = vae.objective(test, name=f"{name} (held-out)")
  optimizer = optax.chain(make_estimator(args.estimator, objective, args.batch_size),
                          optax.adam(args.lr))
  steps_per_epoch = objective.num_data // args.batch_size
  params, opt_state, step, history = vae.init_params(), None, 0, None
  rows, seconds = {}, 0.0
  for epoch in epochs:
    path = (os.path.join(args.checkpoint_dir, f"{name}_to_epoch{epoch}.msgpack")
            if args.checkpoint_dir else None)
    result = dsgrad.fit(objective, optimizer, params, jax.random.key(args.seed),
                        num_steps=epoch * steps_per_epoch, batch_size=args.batch_size,
                        eval_every=steps_per_epoch, elbo_samples=0, progress=args.progress,
                        opt_state=opt_state, start_step=step, history=history,
                        checkpoint_path=path, resume=True)
    params, opt_state, history = result.params, result.opt_state, result.history
    step = epoch * steps_per_epoch
    seconds = float(history.wall_time[-1])
    rows[epoch] = evaluate(vae, held_out, params, test, args)
    print(f"{name:>7} epoch {epoch:>3}: held-out -ELBO {rows[epoch]['neg_elbo']:.2f}, "
          f"AIS NLL {rows[epoch]['nll']:.2f}  ({seconds:.0f} s of training)", flush=True)
  if vae.sampler(params)[0] is not None:
    eta, betas = vae.sampler(params)
    rows["sampler"] = {"step_size_mean": float(np.mean(eta)),
                       "betas": [round(float(b), 4) for b in betas]}
  rows["ms_per_step"] = 1000 * seconds / max(step, 1)
  return vae, params, rows


def image_grid(images, shape, columns):
  h, w = shape
  rows = -(-len(images) // columns)
  grid = np.ones((rows * (h + 1) + 1, columns * (w + 1) + 1))
  for i, img in enumerate(images):
    r, c = divmod(i, columns)
    grid[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = \
        np.asarray(img).reshape(h, w)
  return grid


def save_grids(models, test, args, shape):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no image grids")
    return []
  originals = test[:10].reshape(10, -1)
  fig, axes = plt.subplots(len(models), 2, figsize=(9, 1.3 * len(models)), squeeze=False)
  for row, (name, (vae, params)) in enumerate(models.items()):
    samples = vae.sample_images(params, jax.random.key(args.seed + 7), 20)
    recon = vae.reconstruct(params, originals)
    axes[row, 0].imshow(image_grid(samples, shape, 10), cmap="gray", vmin=0, vmax=1)
    axes[row, 0].set_title(f"{name}: samples (pixel means)", fontsize=8)
    axes[row, 1].imshow(image_grid(np.concatenate([originals, recon]), shape, 10),
                        cmap="gray", vmin=0, vmax=1)
    axes[row, 1].set_title(f"{name}: held-out images (top) and reconstructions", fontsize=8)
    for ax in axes[row]:
      ax.axis("off")
  fig.tight_layout()
  path = os.path.join(args.out, "images.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  print(f"wrote {path}")
  return [path]


def table(results, epochs) -> str:
  """Markdown table in the layout of the paper's Table 1 (held-out, nats per image)."""
  head = (["method"] + [f"-ELBO ep {e}" for e in epochs] + [f"AIS NLL ep {e}" for e in epochs]
          + ["ms/step"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, rows in results.items():
    cells = ([f"{rows[e]['neg_elbo']:.2f} ± {rows[e]['neg_elbo_se']:.2f}" for e in epochs]
             + [f"{rows[e]['nll']:.2f} ± {rows[e]['nll_se']:.2f}" for e in epochs])
    lines.append("| " + " | ".join([name] + cells + [f"{rows['ms_per_step']:.1f}"]) + " |")
  return "\n".join(lines)


def paired_differences(results, epoch) -> list[str]:
  """Each method's held-out AIS NLL minus the VAE's, image by image (the same binarized
  images and AIS settings), with the standard error of the mean difference."""
  if "vae" not in results:
    return []
  base = np.asarray(results["vae"][epoch]["nll_per_image"])
  lines = []
  for name, rows in results.items():
    if name != "vae":
      diff = np.asarray(rows[epoch]["nll_per_image"]) - base
      lines.append(f"{name} - vae, AIS NLL at epoch {epoch}: {diff.mean():+.3f} ± "
                   f"{diff.std(ddof=1) / np.sqrt(diff.size):.3f} (paired over images)")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=first_paragraph(__doc__),
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--dataset", default="digits", choices=["digits", "mnist"],
                      help="digits runs offline; mnist reads IDX files from --data-dir")
  parser.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files")
  parser.add_argument("--held-out", type=command_line.count(1), default=300,
                      help="held-out images (digits: taken out of the 1,797; mnist: the "
                           "first of the test split, the rest of which is the training set "
                           "when the training split is absent)")
  parser.add_argument("--methods", default="vae,iwae,lmcvae,amcvae",
                      help=f"comma-separated, from {sorted(METHODS)}")
  parser.add_argument("--estimator", default="naive", choices=ESTIMATORS,
                      help="gradient estimator before Adam (naive: the paper's setting)")
  parser.add_argument("--epochs", default="10,30,100",
                      help="comma-separated epochs at which to evaluate (the last is the "
                           "training length)")
  parser.add_argument("--batch-size", type=command_line.count(1),
                      default=50, help="images per step")
  parser.add_argument("--lr", type=command_line.positive(), default=1e-3, help="Adam step size")
  parser.add_argument("--latent-dim", type=command_line.count(1), default=None,
                      help="latent size d (default: 8 on digits, 64 on mnist)")
  parser.add_argument("--hidden", type=command_line.count(1), default=256, help="MLP hidden width")
  parser.add_argument("--conv", action="store_true",
                      help="use the convolutional encoder/decoder instead of MLPs")
  parser.add_argument("--step-size", type=command_line.positive(), default=0.02,
                      help="initial Langevin/MALA step size (learned during training)")
  parser.add_argument("--elbo-samples", type=command_line.count(1), default=5,
                      help="Monte Carlo passes over the held-out images per -ELBO estimate")
  parser.add_argument("--ais-steps", type=command_line.count(1), default=100,
                      help="AIS (HMC) transitions (the paper: 5)")
  parser.add_argument("--ais-leapfrog", type=command_line.count(1), default=3,
                      help="leapfrog steps per HMC transition")
  parser.add_argument("--ais-particles", type=command_line.count(1),
                      default=4, help="AIS particles per image")
  parser.add_argument("--ais-step-size", type=command_line.positive(), default=0.2,
                      help="leapfrog step in the encoder-whitened coordinates")
  parser.add_argument("--seed", type=command_line.count(0), default=0,
                      help="seed of the networks, batches and noise (runs are deterministic)")
  parser.add_argument("--out", type=command_line.folder(),
                      default=os.path.join("results", "mcvae"),
                      help="folder for results.json and images.png")
  parser.add_argument("--checkpoint-dir", type=command_line.folder(), default=None,
                      help="save every training stage here; a rerun resumes where it stopped")
  parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                      help="progress bars")
  add_all_cores_flag(parser)
  args = parser.parse_args(argv)
  names = [m.strip() for m in args.methods.split(",")]
  if not names or set(names) - set(METHODS):
    parser.error(f"--methods: unknown {sorted(set(names) - set(METHODS))}; choose from "
                 f"{sorted(METHODS)}")
  epochs = sorted({int(e) for e in args.epochs.split(",")})
  if epochs[0] < 1:
    parser.error("--epochs must be positive")
  if args.latent_dim is None:
    args.latent_dim = 8 if args.dataset == "digits" else 64
  place_xla_threads(args)
  check_checkpoint_config(args.checkpoint_dir, {
      k: v for k, v in vars(args).items()
      if k not in ("epochs", "out", "checkpoint_dir", "methods", "progress")})

  train, test, description = load(args)
  print(f"{description}; estimator {args.estimator}, batch {args.batch_size}, "
        f"{jax.devices()[0].platform}")
  os.makedirs(args.out, exist_ok=True)
  start = time.perf_counter()
  results, models = {}, {}
  for name in names:
    vae, params, rows = train_method(name, train, test, args, epochs)
    results[name], models[name] = rows, (vae, params)
  print("\n" + table(results, epochs))
  paired = paired_differences(results, epochs[-1])
  for line in paired:
    print(line)
  figures = save_grids(models, test, args, train.shape[1:])
  summary = {"description": description, "config": vars(args), "epochs": epochs,
             "table": table(results, epochs),
             "paired_nll_vs_vae": paired_differences(results, epochs[-1]),
             "results": {n: {str(k): v for k, v in r.items()} for n, r in results.items()},
             "seconds": time.perf_counter() - start, "figures": figures}
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(f"total {summary['seconds']:.0f} s; wrote {os.path.join(args.out, 'results.json')}")
  return summary


if __name__ == "__main__":
  main()
