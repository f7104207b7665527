"""The main job: where dsgrad pays. A hierarchical logistic regression on 10^6 rows.

A user's own model, written with :func:`dsgrad.objective_from_logdensity` (a log prior and
a per-row log likelihood over a pytree latent): 10^6 rows in 20,000 groups, each group
with its own intercept and two slopes drawn around shared means, plus fixed effects
(60,014 latent variables, mean-field Gaussian BBVI). The data are generated from a fixed
seed, so nothing is downloaded.

Every contender gets the same wall-clock budget of training steps (``--seconds``) and the
same Adam + cosine schedule with the same peak step size:

* ``hand``: the optax loop a user writes by hand (``jax.grad`` of a mini-batch loss in a
  jitted ``lax.scan``);
* dsgrad ``naive`` (the same estimator as the hand loop, under :func:`dsgrad.fit`);
* ``naive 2x batch``: the equal-cost baseline a sceptic asks for;
* ``joint_svrg`` and ``joint_saga``: the joint control variates, swapped in one line.
  The model says which latent rows a data row reads (``reads={"raw": "g"}``: row ``n``
  reads its group's ``raw[g[n]]`` and the shared effects), so joint SAGA's table holds
  those 17 coordinates per row (136 MB) instead of all 60,014 (447 GiB). (``cv``, which
  ended below the hand loop here, is in the scale suite: ``python -m benchmarks
  scale-suite``.)

On a CPU, XLA's threads run on one core unless ``--all-cores`` is given
(``dsgrad.pin_xla_threads(1)``: the rest of the process, compiles included, keeps every
core). Measured on a 2-core machine (AMD EPYC, jax 0.10.2): with XLA's loops split over
two threads, the same compiled ``cv`` step ran at about 1.1 ms in some processes and 23.5
ms in others (identical optimized programs; the time in one loop fusion, the flat
gradient's concatenation), and SVRG's full pass inside ``fit`` at up to 19 s instead of
0.09 s; pinned to one core, 6 processes of 6 ran it at 1.2-1.5 ms, and the naive step was
faster too (0.56 against 0.65 ms). Each run's steps are sized from a short timed probe,
and its ELBO is estimated after each eighth of it with one shared noise key (common random
numbers, so that the contenders' curves differ by their params, not by the estimate's
noise). Printed: the time each contender took to reach the hand loop's final ELBO, and the
ELBO at the end of its budget with a paired standard error against the hand loop. Plotted:
ELBO against training seconds (``results/hierarchical_logistic/elbo.png``).

    python examples/hierarchical_logistic.py                 # about 2 minutes on 2 cores
    python examples/hierarchical_logistic.py --seconds 60    # the scale suite's budget
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from _common import add_all_cores_flag, first_paragraph, place_xla_threads

PIECES = 8
"""ELBO estimates per run (after each eighth of its steps)."""


def generate(num_data: int, groups: int, dim: int, seed: int) -> dict:
  """Rows ``x`` (features), ``g`` (group of each row) and ``y`` (0/1 labels)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_data, dim), dtype=np.float32)
  g = rng.integers(0, groups, num_data).astype(np.int32)
  ab = np.array([-0.5, 1.0, -0.5]) + np.array([1.0, 0.5, 0.5]) * rng.standard_normal((groups, 3))
  beta = rng.standard_normal(dim) / np.sqrt(dim)
  logits = x @ beta + ab[g, 0] + ab[g, 1] * x[:, 0] + ab[g, 2] * x[:, 1]
  y = (rng.random(num_data) < 1 / (1 + np.exp(-logits))).astype(np.float32)
  return {"x": x, "g": g, "y": y}


def normal_logpdf(v, scale=1.0):
  return -0.5 * jnp.sum((v / scale) ** 2) - jnp.size(v) * jnp.log(scale)


def log_prior(z):
  return (normal_logpdf(z["beta"]) + normal_logpdf(z["mu"], 2.0)
          + normal_logpdf(z["log_tau"]) + normal_logpdf(z["raw"]))


def log_lik(z, rows):
  """Per-row Bernoulli log likelihood; group effects ``mu + exp(log_tau) * raw[g]``."""
  ab = z["mu"] + jnp.exp(z["log_tau"]) * z["raw"][rows["g"]]
  x = rows["x"]
  logit = x @ z["beta"] + ab[:, 0] + ab[:, 1] * x[:, 0] + ab[:, 2] * x[:, 1]
  return rows["y"] * logit - jax.nn.softplus(logit)


def adam_cosine(peak: float, steps: int):
  return optax.adam(optax.cosine_decay_schedule(peak, max(int(steps), 1), 0.01))


class Trace:
  """ELBO estimates with one noise key for every contender and piece."""

  def __init__(self, objective, seed: int, draws: int):
    self.objective, self.key, self.draws = objective, jax.random.key(10_000 + seed), draws

  def __call__(self, params, draws: int | None = None) -> np.ndarray:
    """The draws of the full-data ELBO (their mean estimates it)."""
    fn = dsgrad.diagnostics.elbo_draws(self.objective, draws or self.draws)
    return np.asarray(fn(params, self.key))

  def mean(self, params) -> float:
    return float(np.mean(self(params)))


def run_hand(data, unravel, num_data, params, peak, seconds, batch_size, key, trace):
  """The hand-written loop: ``(trace rows, final params, steps)``."""
  d = params["loc"].shape[0]

  def loss(p, rows, eps):
    z = unravel(p["loc"] + jnp.exp(p["log_scale"]) * eps)
    return -num_data * jnp.mean(log_lik(z, rows)) - log_prior(z) - jnp.sum(p["log_scale"])

  def make(adam):
    def step(data, carry, k):
      p, state = carry
      k_batch, k_noise = jax.random.split(k)
      idx = jax.random.randint(k_batch, (batch_size,), 0, num_data)
      rows = jax.tree.map(lambda a: a[idx], data)
      grads = jax.grad(loss)(p, rows, jax.random.normal(k_noise, (d,)))
      updates, state = adam.update(grads, state, p)
      return (optax.apply_updates(p, updates), state), None
    # The data are an argument: as a constant, XLA would fold them into the program.
    return jax.jit(lambda data, p, s, ks: jax.lax.scan(lambda c, k: step(data, c, k), (p, s),
                                                       ks)[0])

  def timed(fn, *args):
    started = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - started

  probe, probe_steps = make(optax.adam(peak)), 500
  keys = jax.random.split(jax.random.key(1), probe_steps)
  timed(probe, data, params, optax.adam(peak).init(params), keys)  # compiles
  _, elapsed = timed(probe, data, params, optax.adam(peak).init(params), keys)
  total = max(PIECES, int(seconds * probe_steps / elapsed) // PIECES * PIECES)
  adam = adam_cosine(peak, total)
  run, state = make(adam), adam.init(params)
  all_keys = jax.random.split(key, total).reshape(PIECES, total // PIECES)
  run = run.lower(data, params, state, all_keys[0]).compile()
  rows, spent = [(0.0, trace.mean(params))], 0.0
  for keys in all_keys:
    (params, state), elapsed = timed(run, data, params, state, keys)
    spent += elapsed
    rows.append((spent, trace.mean(params)))
    if spent > 1.05 * seconds:
      break
  return rows, params, total


def run_dsgrad(objective, estimator, params, peak, seconds, batch_size, key, trace,
               refreshes: bool = False):
  """``chain(estimator, adam_cosine)`` under :func:`dsgrad.fit`, in eighths of its steps:
  ``(trace rows, final params, steps)``. The estimator's first full pass (SVRG's snapshot)
  counts as training time; with ``refreshes``, one more every epoch is expected when
  sizing the run."""
  def fit(optimizer, params, state, start, steps, segment=None):
    return dsgrad.fit(objective, optimizer, params, key, num_steps=start + steps,
                      batch_size=batch_size, opt_state=state, start_step=start,
                      elbo_samples=0, progress=False, eval_every=segment or steps)

  # A probe for the step's seconds: the estimator alone with a constant step size.
  probe_steps = 200
  probe = optax.chain(estimator, optax.adam(peak))
  state = probe.init(params)  # reads no data: the first update takes SVRG's snapshot
  fit(probe, params, state, 0, probe_steps)  # warms up; its timing is not used
  # Two lengths, so that what a call costs besides its steps cancels out (the first
  # update's full pass among it), in segments of one length: one program to compile.
  short, long = (fit(probe, params, state, 0, n, probe_steps).timing.steps
                 for n in (probe_steps, 3 * probe_steps))
  step_seconds = max(long - short, 1e-3 * long) / (2 * probe_steps)
  # Joint SVRG's refresh, once an epoch, costs about its first full pass: in what a call
  # costs besides its steps.
  epoch = max(1, objective.num_data // batch_size)
  refresh = max(0.0, short - probe_steps * step_seconds) / epoch if refreshes else 0.0
  total = max(PIECES, int(seconds / (step_seconds + refresh)) // PIECES * PIECES)
  optimizer = optax.chain(estimator, adam_cosine(peak, total))
  state = optimizer.init(params)
  rows, spent, at = [(0.0, trace.mean(params))], 0.0, 0
  for _ in range(PIECES):
    result = fit(optimizer, params, state, at, total // PIECES)
    params, state, at = result.params, result.opt_state, at + total // PIECES
    spent += result.timing.steps
    rows.append((spent, trace.mean(params)))
    if spent > 1.05 * seconds:
      break
  return rows, params, at


def reached(rows, target: float) -> float:
  """Seconds at which the trace first reaches ``target`` (linear between estimates)."""
  for (t0, e0), (t1, e1) in zip(rows, rows[1:]):
    if e1 >= target:
      return t0 + (t1 - t0) * (target - e0) / (e1 - e0) if e1 > e0 else t1
  return math.inf


def main(argv=None):
  parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
  parser.add_argument("--rows", type=command_line.count(1), default=1_000_000, help="data rows")
  parser.add_argument("--groups", type=command_line.count(1), default=20_000, help="groups")
  parser.add_argument("--seconds", type=command_line.positive(), default=10.0,
                      help="training seconds per contender")
  parser.add_argument("--batch-size", type=command_line.count(1), default=100, help="data per step")
  parser.add_argument("--peak", type=command_line.positive(), default=3e-3,
                      help="peak Adam step size of every contender (the scale suite's, tuned "
                           "for the hand loop on a seed it does not report)")
  parser.add_argument("--seed", type=command_line.count(0),
                      default=0, help="seed of the batches and noise")
  add_all_cores_flag(parser)  # why one core: the module's docstring
  parser.add_argument("--out", type=command_line.folder(),
                      default=os.path.join("results", "hierarchical_logistic"))
  args = parser.parse_args(argv)
  if args.rows < 2 * args.batch_size:  # the sceptic's baseline draws twice the batch
    parser.error(f"--rows {args.rows} must be at least twice --batch-size "
                 f"({2 * args.batch_size}): 'naive 2x batch' draws that many rows a step")
  xla_cores = place_xla_threads(args)
  os.makedirs(args.out, exist_ok=True)
  started = time.perf_counter()

  data = {k: jnp.asarray(v) for k, v in generate(args.rows, args.groups, 8, seed=0).items()}
  latent = {"beta": jnp.zeros(8), "mu": jnp.zeros(3), "log_tau": jnp.zeros(3),
            "raw": jnp.zeros((args.groups, 3))}
  objective = dsgrad.objective_from_logdensity(log_prior, log_lik, data, latent,
                                               name="hierarchical", reads={"raw": "g"})
  flat, unravel = jax.flatten_util.ravel_pytree(latent)
  d = flat.size
  params = {"loc": jnp.zeros(d), "log_scale": jnp.full(d, -2.0)}
  trace = Trace(objective, args.seed, draws=2)
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print(f"{args.rows:,} rows, {args.groups:,} groups, {d:,} latents; "
        f"{args.seconds:g} s of steps per contender, batch {args.batch_size}, "
        f"peak {args.peak:g}; {jax.devices()[0].device_kind}, {cores} core(s)"
        + (f", XLA's threads on {xla_cores}" if xla_cores else ""))

  key = jax.random.key(args.seed)
  runs = {}
  runs["hand"] = run_hand(data, unravel, args.rows, params, args.peak, args.seconds,
                          args.batch_size, key, trace)
  contenders = {"naive": (dsgrad.naive(), args.batch_size),
                "naive 2x batch": (dsgrad.naive(), 2 * args.batch_size),
                "joint_svrg": (dsgrad.joint_svrg(objective), args.batch_size),
                "joint_saga": (dsgrad.joint_saga(
                    objective, dsgrad.approx.sparse_linearize(objective)), args.batch_size)}
  for name, (estimator, batch) in contenders.items():
    runs[name] = run_dsgrad(objective, estimator, params, args.peak, args.seconds, batch,
                            key, trace, refreshes=name == "joint_svrg")

  final = {name: trace(p, 8) for name, (_, p, _) in runs.items()}
  target = runs["hand"][0][-1][1]
  table = []
  print(f"\nTarget: the hand loop's final ELBO, {target:,.0f} (2 draws).")
  print(f"{'contender':>15} {'steps':>8} {'seconds':>8} {'reached target':>15} "
        f"{'final ELBO':>12} {'vs hand (se)':>18}")
  for name, (rows, _, steps) in runs.items():
    means = rows
    at = reached(means, target)
    diff = np.asarray(final[name]) - np.asarray(final["hand"])
    se = float(np.std(diff, ddof=1) / np.sqrt(diff.size))
    table.append({"contender": name, "steps": steps, "seconds": means[-1][0],
                  "reached_seconds": at if math.isfinite(at) else None,
                  "final_elbo": float(np.mean(final[name])),
                  "vs_hand": float(diff.mean()), "vs_hand_se": se, "trace": means})
    reach = f"{at:.1f} s" if math.isfinite(at) else "not reached"
    gain = "" if name == "hand" else f"{diff.mean():+,.0f} ({se:,.0f})"
    print(f"{name:>15} {steps:>8,} {means[-1][0]:>8.1f} {reach:>15} "
          f"{np.mean(final[name]):>12,.0f} {gain:>18}")
  print(f"\nwhole job: {time.perf_counter() - started:.0f} s")

  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"args": vars(args), "target": target, "rows": table,
               "device": jax.devices()[0].device_kind}, f, indent=1)
  plot(table, target, os.path.join(args.out, "elbo.png"), args,
       f"{jax.devices()[0].device_kind}, {cores} core(s)")


def plot(table, target, path, args, where: str) -> None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no plot")
    return
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for row in table:
    t, e = zip(*row["trace"])
    ax.plot(t, e, marker=".", label=row["contender"], lw=2 if row["contender"] == "hand" else 1.3)
  ax.axhline(target, color="grey", ls=":", lw=1, label="hand loop's final ELBO")
  tail = [e for row in table for _, e in row["trace"][len(row["trace"]) // 3:]]
  ax.set_ylim(min(tail) - 0.1 * (max(tail) - min(tail)), max(tail) + 0.1 * (max(tail) - min(tail)))
  ax.set_xlabel(f"training seconds (steps only; {where})")
  ax.set_ylabel("full-data ELBO")
  ax.set_title(f"hierarchical logistic regression, {args.rows:,} rows, {args.groups:,} groups; "
               f"python examples/hierarchical_logistic.py", fontsize=8)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
