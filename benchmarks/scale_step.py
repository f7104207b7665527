"""Where a step's time goes at scale: for each scale-suite model (10^6 rows, written with
:func:`dsgrad.objective_from_logdensity`), the warm step of every estimator beside the
same numbers written by hand and the arithmetic floor, repeated over interleaved rounds.

Per model, in one process, each timed call runs ``--steps`` steps (compiled before the
rounds; batch ``B``, Adam):

* ``floor``: the mini-batch gradient alone (``jax.grad`` of the hand-written loss,
  summed over the steps so nothing is dropped): the arithmetic any step does;
* ``hand naive``: a hand-written optax loop (``lax.scan``, fit's own batches given as an
  index array, one noise draw per step, Adam);
* ``hand cv (c = 1)``: the same plus ``linearize``'s control variate with the paper's
  weight written in plain JAX (minus the JVP of the gradient in the noise direction);
* ``fit naive``, ``fit cv (c = 1)``, ``fit cv (adaptive)``, ``fit joint SVRG`` (its step:
  no refresh in the call), ``fit joint SAGA`` (the declared rows' table where the model
  declares them; ruled out where the table does not fit): ``dsgrad.fit`` with the
  estimator before Adam, its time the history's wall-clock of the steps;
* full passes, once: joint SVRG's refresh (the snapshot's full gradient), joint SAGA's
  table initialisation, and an ELBO evaluation of 100 draws on the full data, with their
  share of a one-minute run at the measured step (SVRG: one refresh an epoch).

Reported: the median step of each, its spread over rounds ((max - min) / median; target
10%), and the ratios the targets name: fit naive over hand naive, every estimator over
fit naive (target 1.3x on the GLM) and fit cv over hand cv (target 1.15x on the MLP).

    python -m benchmarks scale-step                          # the four suite models
    taskset -c 0 python -m benchmarks scale-step --models mlp wide_glm --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report
from benchmarks import scale_models
from benchmarks import scale_suite

FIT = {"fit naive": "naive", "fit cv (c = 1)": "cv1", "fit cv (adaptive)": "cv",
       "fit joint SVRG": "joint_svrg", "fit joint SAGA": "joint_saga"}
MAX_TABLE_BYTES = 4 * 2**30


def _hand(model, batches, learning_rate, kind):
  """A jitted hand-written segment ``(data, params, opt_state, keys) -> (params,
  opt_state)`` (``kind``: ``"naive"``, ``"cv"``), or the floor ``(data, params, keys) ->
  summed grads``. The data are an argument, as in the suite's hand loop: as constants, XLA
  would fold gigabytes into the program."""
  loss = scale_models.hand_loss(model)
  adam = optax.adam(learning_rate)
  d = model.dim

  def grads_at(data, params, idx, key):
    rows = jax.tree.map(lambda a: a[idx], data)
    eps = jax.random.normal(key, (d,))
    grads = jax.grad(loss)(params, rows, eps)
    if kind == "cv":  # c = 1: minus the JVP of the gradient in the noise direction
      _, deviation = jax.jvp(lambda e: jax.grad(loss)(params, rows, e),
                             (jnp.zeros_like(eps),), (eps,))
      grads = jax.tree.map(jnp.subtract, grads, deviation)
    return grads

  if kind == "floor":
    def floor(data, params, keys):
      def body(total, xs):
        return jax.tree.map(jnp.add, total, grads_at(data, params, *xs)), None
      zero = jax.tree.map(jnp.zeros_like, params)
      return jax.lax.scan(body, zero, (batches, keys))[0]
    return jax.jit(floor), None

  def segment(data, params, state, keys):
    def step(carry, xs):
      params, state = carry
      updates, state = adam.update(grads_at(data, params, *xs), state, params)
      return (optax.apply_updates(params, updates), state), None
    return jax.lax.scan(step, (params, state), (batches, keys))[0]

  return jax.jit(segment), adam


def _fit_estimator(label, objective):
  name = FIT[label]
  if name == "cv1":
    return dsgrad.cv(objective, control_weight=1.0)
  return scale_suite._estimator(name, objective, every_never=True)


def _full_passes(model, params, batch_size: int) -> dict:
  """Seconds of a full-data ELBO (warm), and its share of a one-minute run; and of one
  epoch's order, which fit draws once an epoch (kept between calls, so the timed calls,
  which repeat one window, leave it out as the hand loop, given its batches, does)."""
  objective, out = model.objective, {}
  batching = dsgrad.training.batching
  batching.EpochOrders(jax.random.key(12), model.num_data, batch_size).window(0, 1)  # compiles
  batching._shared_orders.clear()  # kept from an earlier model with the same N and B
  orders = batching.EpochOrders(jax.random.key(13), model.num_data, batch_size)
  started = time.perf_counter()
  orders.window(0, 1)
  out["epoch order"] = (time.perf_counter() - started) / len(orders.cache)
  key = jax.random.key(5)
  jax.block_until_ready(dsgrad.elbo(objective, params, key, num_samples=100))
  started = time.perf_counter()
  jax.block_until_ready(dsgrad.elbo(objective, params, key, num_samples=100))
  out["ELBO, 100 draws"] = time.perf_counter() - started
  return out


def run(models, steps, rounds, batch_size, num_data, learning_rate=1e-3) -> dict:
  results = {}
  for name in models:
    model = scale_models.BUILDERS[name](num_data=num_data)
    params = scale_suite._initial_params(model.dim)
    fit_key = jax.random.key(3)
    batches = dsgrad.training.batching.epoch_batches(jax.random.split(fit_key)[0], model.num_data,
                                            batch_size, steps)
    keys = jax.random.split(jax.random.key(2), steps)
    calls, ruled_out, first_updates = {}, {}, {}
    for kind, label in (("floor", "floor"), ("naive", "hand naive"),
                        ("cv", "hand cv (c = 1)")):
      run_hand, adam = _hand(model, batches, learning_rate, kind)
      args = ((model.data, params, keys) if adam is None
              else (model.data, params, adam.init(params), keys))
      compiled = run_hand.lower(*args).compile()
      calls[label] = lambda compiled=compiled, args=args: jax.block_until_ready(
          compiled(*args))
    for label in FIT:
      if FIT[label] == "joint_saga":
        shapes = jax.eval_shape(dsgrad.joint_saga(
            model.objective, scale_suite._saga_approx(model.objective),
            max_table_bytes=None).init, params)
        if dsgrad.state_bytes(shapes) > MAX_TABLE_BYTES:
          ruled_out[label] = (f"table {_report.format_bytes(dsgrad.state_bytes(shapes))}"
                              f" > {_report.format_bytes(MAX_TABLE_BYTES)}")
          continue
      optimizer = optax.chain(_fit_estimator(label, model.objective),
                              optax.adam(learning_rate))
      state, first = scale_suite.first_update(model.objective, optimizer, params, fit_key,
                                              batch_size)
      if FIT[label] in ("joint_svrg", "joint_saga"):
        first_updates[label] = first
      scale_suite._timed_fit(model.objective, optimizer, params, fit_key, steps, batch_size,
                             state)  # compiles
      calls[label] = (lambda optimizer=optimizer, state=state, objective=model.objective:
                      scale_suite._timed_fit(objective, optimizer, params, fit_key, steps,
                                             batch_size, state)[1])
    times = {label: [] for label in calls}
    for _ in _report.progress(range(rounds), f"{name}: interleaved rounds"):
      for label, call in calls.items():
        started = time.perf_counter()
        elapsed = call()
        elapsed = elapsed if isinstance(elapsed, float) else time.perf_counter() - started
        times[label].append(elapsed / steps)
    results[name] = {"summary": model.summary, "dim": model.dim, "num_data": model.num_data,
                     "step_seconds": times, "ruled_out": ruled_out,
                     "full_passes": {**_full_passes(model, params, batch_size),
                                     **{f"{label}: first update": seconds
                                        for label, seconds in first_updates.items()}}}
    del model
  return results


def render(record) -> str:
  data, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}`; batch {config['batch_size']}, "
           f"{config['steps']:,} warm steps per timed call, median of {config['rounds']} "
           f"interleaved rounds; spread = (max - min) / median over the rounds. Measured: "
           f"{record['environment']}.", ""]
  for name, r in data.items():
    times = r["step_seconds"]
    median = {k: statistics.median(v) for k, v in times.items()}
    naive, hand = median["fit naive"], median["hand naive"]
    lines += [f"#### {name}: {r['summary']} ({r['dim']:,} latents)", "",
              "| step | ms / step | spread | / floor | / hand naive | / fit naive |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, value in median.items():
      spread = (max(times[label]) - min(times[label])) / value
      lines.append(f"| {label} | {1e3 * value:.3f} | {spread:.0%} | "
                   f"{value / median['floor']:.2f}x | {value / hand:.2f}x | "
                   f"{value / naive:.2f}x |")
    for label, reason in r["ruled_out"].items():
      lines.append(f"| {label} | ruled out: {reason} | | | | |")
    cv_hand = median["fit cv (c = 1)"] / median["hand cv (c = 1)"]
    passes = []
    # A refresh once an epoch: its share of an epoch of joint SVRG's own steps.
    epoch = r["num_data"] / config["batch_size"] * median.get("fit joint SVRG", naive)
    naive_epoch = r["num_data"] / config["batch_size"] * naive
    for label, seconds in r["full_passes"].items():
      if seconds is None:
        continue
      # Joint SVRG's snapshot (its first update's full pass) is taken again once an epoch.
      refresh = "refresh" in label or "SVRG: first update" in label
      share = (f"{seconds / (epoch + seconds):.1%} of an epoch's run" if refresh
               else f"{seconds / (naive_epoch + seconds):.1%} of an epoch of fit naive"
               if label == "epoch order" else f"{seconds / 60:.1%} of a minute")
      passes.append(f"{label} {seconds:.2f} s ({share})")
    lines += ["", f"fit cv (c = 1) / hand cv (c = 1): {cv_hand:.2f}x. Full passes: "
              + "; ".join(passes) + ".", ""]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks scale-step",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", nargs="*", choices=list(scale_models.BUILDERS),
                      default=list(scale_models.BUILDERS))
  parser.add_argument("--num-data", type=command_line.count(1), default=1_000_000)
  parser.add_argument("--steps", type=command_line.count(1), default=3000)
  parser.add_argument("--rounds", type=command_line.count(1), default=5)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--section", default=None, help="default: scale-step-<backend>")
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  results = run(args.models, args.steps, args.rounds, args.batch_size, args.num_data)
  config = {"models": args.models, "steps": args.steps, "rounds": args.rounds,
            "batch_size": args.batch_size, "num_data": args.num_data}
  section = args.section or f"scale-step-{jax.default_backend()}"
  _report.publish(section, None, not args.no_write, render=render,
                  data={"results": results, "config": config})


if __name__ == "__main__":
  main()
