"""What a model brought through the NumPyro bridge costs per step, against the same log
density written by hand in JAX (``python -m benchmarks bridge-cost``).

The Bayesian neural network of ``peers bnn`` (8 -> 110 tanh -> 1, 1,102 latent
variables), N = 20,000, B = 100: dsgrad's naive step (noise, gradient, Adam) inside one
jitted ``lax.scan``, for each way of writing the log density, side by side in one process
(:func:`benchmarks._timing.time_per_step`: rounds rotated, median of rounds, compile
round discarded). The rows that mix the bridge's prior with the hand-written likelihood
(and the reverse) say which half of the bridged density the extra time is in; the
one-site row writes the same network with all its weights in one vector site.
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report, _timing, peers_models
from dsgrad.models.base import Model

HAND = "hand-written log density"


def one_site_bnn(num_data: int, batch_size: int):
  """The ``peers bnn`` network in NumPyro with every weight in one site ``w`` (flattened
  in the order of the five-site model's bridge: b1, b2, log_noise, w1, w2)."""
  import numpyro
  import numpyro.distributions as dist

  x_np, y_np = peers_models.bnn_data(num_data)
  x, y = jnp.asarray(x_np), jnp.asarray(y_np)
  d_in, h = peers_models.BNN_INPUTS, peers_models.BNN_HIDDEN
  dim = d_in * h + 2 * h + 2

  def model(idx=None):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(dim), 1.0).to_event(1))
    b1, b2, log_noise = w[:h], w[h], w[h + 1]
    w1 = w[h + 2:h + 2 + d_in * h].reshape(d_in, h)
    w2 = w[h + 2 + d_in * h:]
    with numpyro.handlers.substitute(data={} if idx is None else {"N": idx}):
      with numpyro.plate("N", num_data, subsample_size=batch_size) as ind:
        mean = jnp.tanh(x[ind] @ w1 + b1) @ w2 / math.sqrt(h) + b2
        numpyro.sample("y", dist.Normal(mean, jnp.exp(log_noise)), obs=y[ind])

  return model


def objectives(num_data: int, batch_size: int):
  """``({row: objective}, latent dimension)``: all of the same log density over the same
  flat latent."""
  from dsgrad.contrib import numpyro as bridge
  spec = peers_models.bnn(num_data, batch_size)
  bridged = spec.objective.numpyro_model.model
  dim = bridged.latent_dim

  def model(log_prior, log_likelihood, data=None):
    return dsgrad.meanfield_gaussian(Model(log_prior, log_likelihood, num_data, dim,
                                           "bnn", data=data))

  return {
      HAND: model(spec.log_prior, spec.log_likelihood),
      "bridge, five sites (as in `peers bnn`)": spec.objective,
      "bridge, one vector site": bridge.objective(one_site_bnn(num_data, batch_size)),
      "bridge's prior + hand-written likelihood": model(bridged.log_prior,
                                                        spec.log_likelihood),
      "hand-written prior + bridge's likelihood": model(spec.log_prior,
                                                        bridged.log_likelihood,
                                                        bridged.data),
  }, dim


def run(num_data=20_000, batch_size=100, steps=400, rounds=7, log=True) -> dict:
  """``{row: seconds per step}`` (median of ``rounds``)."""
  objs, dim = objectives(num_data, batch_size)
  optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-3))
  params = {"loc": jnp.zeros(dim), "log_scale": jnp.full(dim, -2.0)}
  seconds, _ = _timing.time_per_step(objs, dict.fromkeys(objs, optimizer), params,
                                     batch_size, steps, rounds=rounds, log=log)
  return seconds


def format_table(seconds: dict, config: dict) -> str:
  base = seconds[HAND]
  lines = [f"Command: `python -m benchmarks bridge-cost` -- the `peers bnn` network (1,102 "
           f"latent variables), N = {config['num_data']:,}, B = {config['batch_size']}; "
           f"dsgrad's naive step with Adam, {config['steps']} steps inside one jitted "
           f"`lax.scan`, median of {config['rounds']} rotated rounds after a compile round.",
           "", f"Measured: {_report.environment()}", "",
           "| log density | ms / step | ratio to hand-written |", "| --- | ---: | ---: |"]
  for name, s in seconds.items():
    lines.append(f"| {name} | {1e3 * s:.4f} | {s / base:.2f}x |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks bridge-cost",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num-data", type=command_line.count(1), default=20_000)
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--steps", type=command_line.count(1), default=400)
  parser.add_argument("--rounds", type=command_line.count(1), default=7)
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  config = dict(num_data=args.num_data, batch_size=args.batch_size, steps=args.steps,
                rounds=args.rounds)
  table = format_table(run(**config), config)
  _report.publish(f"bridge-cost-{jax.default_backend()}", table, not args.no_write)
  return 0
