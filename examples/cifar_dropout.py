"""Gaussian dropout on LeNet features (the joint control variate paper's App. E, Fig. 5).

A LeNet (a Flax NNX module) is trained on the images, or loaded from the checkpoint an
earlier run saved; its 84 penultimate features are then fixed, and the output layer is
fine-tuned with cross-entropy under Gaussian dropout on the features (multiplicative
noise N(1, 0.5^2)), batch 100, plain SGD over a grid of learning rates, with the naive,
cv, joint SAGA and joint SVRG estimators on the same batches and noise.

Prints a table of the full-data objective per estimator and learning rate; saves the
four panels of Fig. 5 (objective trace at lr 0.05, trace under the best lr, objective vs
lr at two iteration counts) as PNGs, and results.json with every history.

    python examples/cifar_dropout.py --dataset digits          # offline, scikit-learn digits
    python examples/cifar_dropout.py --data-dir ~/data         # CIFAR-10 python batches
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import dsgrad
from dsgrad import command_line
from _common import (add_run_flags, check_batch_fits, check_checkpoint_config, chosen_estimators,
                     first_paragraph, place_xla_threads)
from dsgrad.training import checkpoint


class LeNet(nnx.Module):
  """LeNet-5 with 'SAME' convolutions: conv(6)-pool-conv(16)-pool-fc(120)-fc(84)-fc(10).

  Works for any image size divisible by 4 (32x32x3 CIFAR-10, 8x8x1 digits).

  Args:
    height, width, channels: input image shape.
    num_classes: outputs of the last layer.
    rngs: Flax NNX random streams.
  """

  def __init__(self, height: int, width: int, channels: int, num_classes: int = 10, *,
               rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(channels, 6, (5, 5), padding="SAME", rngs=rngs)
    self.conv2 = nnx.Conv(6, 16, (5, 5), padding="SAME", rngs=rngs)
    self.fc1 = nnx.Linear(16 * (height // 4) * (width // 4), 120, rngs=rngs)
    self.fc2 = nnx.Linear(120, 84, rngs=rngs)
    self.out = nnx.Linear(84, num_classes, rngs=rngs)

  def features(self, x):
    """The 84 penultimate activations (what the dropout GLM sees)."""
    pool = lambda h: nnx.avg_pool(h, (2, 2), strides=(2, 2))
    h = pool(nnx.relu(self.conv1(x)))
    h = pool(nnx.relu(self.conv2(h)))
    h = h.reshape(h.shape[0], -1)
    return nnx.relu(self.fc2(nnx.relu(self.fc1(h))))

  def __call__(self, x):
    return self.out(self.features(x))


def load_images(args):
  """``(train images (N, H, W, C) float32 in [0, 1], labels, description)``."""
  if args.dataset == "digits":
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    return x, digits.target.astype(np.int32), "scikit-learn digits (1,797 8x8 images)"
  try:
    data = dsgrad.datasets.load_cifar10(args.data_dir, "train", download=not args.no_download,
                                        verify_official=not args.no_verify)
  except FileNotFoundError as err:
    raise SystemExit(f"{err}\n(or run offline on scikit-learn's digits: --dataset digits)")
  x = data.images.astype(np.float32) / 255.0
  return x, data.labels, f"CIFAR-10 training set ({x.shape[0]:,} images)"


def train_lenet(x, y, args):
  """Trains (or restores) the LeNet; returns it."""
  model = LeNet(x.shape[1], x.shape[2], x.shape[3], rngs=nnx.Rngs(args.seed))
  path = (os.path.join(args.checkpoint_dir, f"lenet_{args.dataset}.msgpack")
          if args.checkpoint_dir else None)
  state = nnx.state(model, nnx.Param)
  if path and os.path.exists(path):
    nnx.replace_by_pure_dict(state, checkpoint.restore(path, nnx.to_pure_dict(state)))
    nnx.update(model, state)
    print(f"LeNet restored from {path}")
    return model
  optimizer = nnx.Optimizer(model, optax.adam(args.lenet_lr), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, xb, yb):
    def loss_fn(model):
      logits = model(xb)
      return optax.losses.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  rng = np.random.default_rng(args.seed)
  batches = max(1, x.shape[0] // args.lenet_batch)
  bar = _progress(args.lenet_epochs * batches, "LeNet")
  for epoch in range(args.lenet_epochs):
    order = rng.permutation(x.shape[0])
    for b in range(batches):
      idx = order[b * args.lenet_batch:(b + 1) * args.lenet_batch]
      loss = step(model, optimizer, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
      bar(1, loss=float(loss) if b == batches - 1 else None)
  bar(0, close=True)
  if path:
    checkpoint.save(path, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  return model


def _progress(total, what):
  try:
    from tqdm.auto import tqdm
  except ImportError:
    return lambda n, loss=None, close=False: None
  bar = tqdm(total=total, desc=what, unit="step")

  def update(n, loss=None, close=False):
    bar.update(n)
    if loss is not None:
      bar.set_postfix(loss=f"{loss:.3f}")
    if close:
      bar.close()
  return update


def lenet_features(model, x, chunk=2048):
  fn = nnx.jit(lambda m, xb: m.features(xb))
  return np.concatenate([np.asarray(fn(model, jnp.asarray(x[i:i + chunk])))
                         for i in range(0, x.shape[0], chunk)])


def estimators(glm, objective, batch_size):
  approx = dsgrad.approx.dropout_taylor(glm)
  epoch = max(1, glm.num_data // batch_size)
  return {
      "naive": lambda: dsgrad.naive(),
      # The paper's estimators (c = 1), beside the adaptive weight (dsgrad's default).
      "cv": lambda: dsgrad.cv(objective, approx, control_weight=1.0),
      "joint_saga": lambda: dsgrad.joint_saga(objective, approx, warmup_steps=epoch,
                                              control_weight=1.0),
      "joint_svrg": lambda: dsgrad.joint_svrg(objective, approx, every=epoch,
                                              control_weight=1.0),
      # The same with the variance-minimizing weight of the control, from earlier steps:
      # a poor approximation (large weights, App. E's expansion) is switched off.
      "cv_adaptive": lambda: dsgrad.cv(objective, approx, control_weight="adaptive"),
      "joint_saga_adaptive": lambda: dsgrad.joint_saga(objective, approx, warmup_steps=epoch,
                                                       control_weight="adaptive"),
      "joint_svrg_adaptive": lambda: dsgrad.joint_svrg(objective, approx, every=epoch,
                                                       control_weight="adaptive"),
  }


def run_one(objective, make, lr, params0, key, args, tag):
  """One SGD run; resumes from ``--checkpoint-dir`` when an earlier run left a checkpoint.

  Returns ``(steps, objective values)``: the full-data objective (mean cross-entropy
  under dropout, Monte Carlo over ``--eval-samples`` draws per datum) after each segment.
  """
  optimizer = optax.chain(make(), optax.sgd(lr))
  kw = dict(num_steps=args.steps, batch_size=args.batch_size, eval_every=args.eval_every,
            elbo_samples=args.eval_samples, progress=False)
  path = (os.path.join(args.checkpoint_dir, "runs", f"{tag}.msgpack")
          if args.checkpoint_dir else None)
  if path:
    os.makedirs(os.path.dirname(path), exist_ok=True)
  result = dsgrad.fit(objective, optimizer, params0, key, checkpoint_path=path, resume=True,
                      **kw)
  # dsgrad.fit reports the ELBO, -E mean_n f; the dropout objective is E mean_n f.
  return result.history.step.astype(int).tolist(), (-result.history.elbo).tolist()


def mark_off_scale(ax, xs, ys, top, color) -> list:
  """Draws a triangle at the top edge above each point beyond ``top`` or not finite (a
  diverged run), so that no point leaves the plot unmarked; returns their x values."""
  xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
  off = ~np.isfinite(ys) | (ys > top)
  if np.any(off):
    ax.scatter(xs[off], np.full(int(off.sum()), top), marker="^", color=color,
               clip_on=False, zorder=5)
  return xs[off].tolist()


def figure(histories, lrs, args, path_prefix, what):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = list(histories)
  finite = lambda v: np.where(np.isfinite(v), v, np.nan)
  paths = []
  steps = np.asarray(histories[names[0]][lrs[0]][0])
  traces = {n: np.stack([finite(np.asarray(histories[n][lr][1])) for lr in lrs]) for n in names}
  early = len(steps) // 4 - 1 if len(steps) >= 4 else 0
  panels = [("trace_lr", f"objective at lr = {args.trace_lr:g}"),
            ("trace_best", "objective under the best lr at each iteration"),
            ("vs_lr_early", f"objective vs lr after {steps[early]:,} iterations"),
            ("vs_lr_final", f"objective vs lr after {steps[-1]:,} iterations")]
  for key, title in panels:
    fig, ax = plt.subplots(figsize=(5, 3.6))
    plotted, series = [], []
    for n in names:
      if key == "trace_lr":
        xs, ys = steps, traces[n][lrs.index(args.trace_lr)]
      elif key == "trace_best":
        xs, ys = steps, np.nanmin(traces[n], axis=0)
      else:
        xs, ys = lrs, traces[n][:, early if key == "vs_lr_early" else -1]
        ax.set_xscale("log")
      line, = ax.plot(xs, ys, marker="o" if key.startswith("vs_lr") else None, label=n)
      plotted.append(ys)
      series.append((xs, ys, line.get_color()))
    # Diverged runs leave the plot through the top, at the uniform predictor's loss.
    plotted = np.concatenate(plotted)
    lo = np.nanmin(plotted)
    hi = 1.1 * np.log(10)
    if key.startswith("trace"):
      hi = min(hi, np.nanmax(plotted[np.isfinite(plotted)]))
    margin = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.05
    ax.set_ylim(lo - margin, hi + margin)
    marked = sum(len(mark_off_scale(ax, xs, ys, hi + margin, color))
                 for xs, ys, color in series)
    if marked:
      ax.text(0.99, 0.99, f"^ at the top: {marked} value(s) off scale (diverged)",
              transform=ax.transAxes, ha="right", va="top", fontsize=7)
    ax.set_xlabel("iteration" if key.startswith("trace") else "learning rate")
    ax.set_ylabel("full-data objective (cross-entropy)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(what, fontsize=7)
    fig.tight_layout()
    path = f"{path_prefix}_{key}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
  return paths


def main(argv=None):
  parser = argparse.ArgumentParser(description=first_paragraph(__doc__),
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "digits"],
                      help="which images (cifar10 needs the data; digits runs offline)")
  parser.add_argument("--data-dir", default=None,
                      help="folder with cifar-10-batches-py/ (also searched: $DSGRAD_DATA, "
                           "~/.cache/dsgrad, ~/.keras/datasets, ./data)")
  parser.add_argument("--no-download", action="store_true",
                      help="never download the CIFAR-10 archive")
  parser.add_argument("--no-verify", action="store_true",
                      help="accept CIFAR-format batches smaller than the official 10,000")
  parser.add_argument("--lenet-epochs", type=command_line.count(1), default=None,
                      help="LeNet training epochs (default: 5 on CIFAR-10, 30 on digits)")
  parser.add_argument("--lenet-batch", type=command_line.count(1), default=128,
                      help="LeNet training batch size")
  parser.add_argument("--lenet-lr", type=command_line.positive(),
                      default=1e-3, help="Adam step size")
  add_run_flags(parser, steps=2000, eval_every=100, batch_size=100, out="cifar_dropout")
  parser.add_argument("--eval-samples", type=command_line.count(1), default=8,
                      help="dropout draws per datum in each full-data objective estimate")
  parser.add_argument("--dropout-std", type=command_line.positive(), default=0.5,
                      help="standard deviation s of the multiplicative noise N(1, s^2)")
  parser.add_argument("--lrs", default="1,0.5,0.2,0.1,0.05,0.02,0.01",
                      help="comma-separated SGD learning rates")
  parser.add_argument("--trace-lr", type=command_line.positive(), default=0.05,
                      help="the learning rate of the first panel (must be in --lrs)")
  parser.add_argument("--estimators", default="naive,cv,joint_saga,joint_svrg",
                      help="comma-separated estimators to compare (also cv_adaptive, "
                           "joint_saga_adaptive, joint_svrg_adaptive)")
  parser.add_argument("--checkpoint-dir", type=command_line.folder(), default=None,
                      help="save the LeNet and every run here; a rerun resumes where it "
                           "stopped")
  args = parser.parse_args(argv)
  lrs = [float(v) for v in args.lrs.split(",")]
  if args.trace_lr not in lrs:
    parser.error(f"--trace-lr {args.trace_lr} is not in --lrs {lrs}")
  if args.steps % args.eval_every:
    parser.error("--steps must be a multiple of --eval-every")
  if args.lenet_epochs is None:
    args.lenet_epochs = 5 if args.dataset == "cifar10" else 30
  place_xla_threads(args)

  check_checkpoint_config(args.checkpoint_dir, {
      k: v for k, v in vars(args).items() if k not in ("steps", "out", "checkpoint_dir",
                                                         "no_download", "estimators")})
  started = time.perf_counter()
  x, y, what = load_images(args)
  model = train_lenet(x, y, args)
  accuracy = float(np.mean(np.argmax(np.asarray(nnx.jit(lambda m, v: m(v))(
      model, jnp.asarray(x[:4096]))), 1) == y[:4096]))
  features = lenet_features(model, x)
  print(f"data: {what}; LeNet training accuracy {accuracy:.3f} (first 4,096 images); "
        f"features {features.shape}")
  glm = dsgrad.models.dropout_glm(features, y, 10, args.dropout_std)
  check_batch_fits(parser, args.batch_size, glm.num_data, "training images")
  objective = glm.objective()
  params0 = glm.init_params()
  makes = estimators(glm, objective, args.batch_size)
  names = chosen_estimators(parser, args.estimators, makes)
  key = jax.random.key(args.seed)
  histories = {n: {} for n in names}
  bar = _progress(len(names) * len(lrs), "SGD runs")
  for name in names:
    tic = time.perf_counter()
    for lr in lrs:
      histories[name][lr] = run_one(objective, makes[name], lr, params0, key, args,
                                    f"{name}_lr{lr:g}")
      bar(1)
    print(f"  {name:<11} {len(lrs)} learning rates in {time.perf_counter() - tic:.0f} s",
          flush=True)
  bar(0, close=True)

  print(f"\nfull-data objective after {args.steps:,} steps (lower is better; inf = diverged)")
  print(f"{'lr':>8} " + " ".join(f"{n:>11}" for n in names))
  for lr in lrs:
    print(f"{lr:8g} " + " ".join(f"{histories[n][lr][1][-1]:11.4f}" for n in names))
  best = {n: min(histories[n][lr][1][-1] for lr in lrs) for n in names}
  print("best     " + " ".join(f"{best[n]:11.4f}" for n in names))

  os.makedirs(args.out, exist_ok=True)
  results = {"data": what, "args": vars(args), "lenet_train_accuracy": accuracy,
             "histories": {n: {f"{lr:g}": {"step": h[0], "objective": h[1]}
                               for lr, h in histories[n].items()} for n in names},
             "best_final": best, "seconds": time.perf_counter() - started}
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  try:
    paths = figure(histories, lrs, args, os.path.join(args.out, "fig5"), what)
    print("wrote " + ", ".join(paths))
  except ImportError:
    print("matplotlib not installed: no figures")
  print(f"total {time.perf_counter() - started:.0f} s")
  return results


if __name__ == "__main__":
  main()
