"""Whether :func:`dsgrad.recommend`'s race measures each candidate's step rate as a long run
sees it, on data too large to keep in memory comfortably: 10^7 rows read from ``.npy``
files on disk (``dsgrad.data.open_memmap``).

The model, written as a user would (:func:`dsgrad.objective_from_logdensity`): Poisson
regression with a log-exposure offset, 16 features and one effect for each of 5,000 regions
(5,016 latent variables), generated from a fixed seed into ``--data-folder``. Mean-field
Gaussian BBVI, batch 500, Adam over a cosine schedule.

* **alone**: each candidate of ``recommend``'s default set (naive, cv, joint SVRG, naive
  with twice the batch) for one epoch of steps in one ``dsgrad.fit`` call, after a
  compiling call; its steps per second of steps time (joint SVRG's one refresh an epoch
  included);
* **race**: ``recommend`` with ``--budget`` seconds, its candidates' steps per second as
  the race measured them, then ``Recommendation.fit()``: its total in budgets.

A race measures well where each candidate's rate relative to naive's is the one it has
alone (the column "race / alone").

    python -m benchmarks race-rates --budget 60
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks import _report

NUM_REGIONS, NUM_FEATURES, BATCH = 5_000, 16, 500
COLUMNS = ("x", "region", "log_exposure", "y")


def write_data(folder: str, num_data: int, seed: int = 0) -> None:
  """The model's columns as ``.npy`` files in ``folder`` (skipped where already there),
  each written as a part file and renamed once complete: a run stopped while writing
  leaves no file of zero rows to be read as data by the next."""
  import numpy as np
  paths = {c: os.path.join(folder, f"{c}-{num_data}.npy") for c in COLUMNS}
  if all(os.path.exists(path) for path in paths.values()):
    return
  rng = np.random.default_rng(seed)
  beta = rng.normal(size=NUM_FEATURES) * 0.2
  effect = rng.normal(size=NUM_REGIONS) * 0.4
  shapes = {"x": ((num_data, NUM_FEATURES), np.float32), "region": ((num_data,), np.int32),
            "log_exposure": ((num_data,), np.float32), "y": ((num_data,), np.int32)}
  files = {c: np.lib.format.open_memmap(paths[c] + ".part.npy", "w+", dtype, shape)
           for c, (shape, dtype) in shapes.items()}
  for start in range(0, num_data, 1_000_000):
    n = min(1_000_000, num_data - start)
    x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
    region = rng.integers(0, NUM_REGIONS, n)
    offset = (0.3 * rng.normal(size=n)).astype(np.float32)
    rows = {"x": x, "region": region, "log_exposure": offset,
            "y": rng.poisson(np.exp(x @ beta + effect[region] + offset))}
    for c, array in files.items():
      array[start:start + n] = rows[c]
  for c, array in files.items():
    array.flush()
    os.replace(paths[c] + ".part.npy", paths[c])


def objective(folder: str, num_data: int):
  """The objective on the files in ``folder``, and its initial params."""
  import jax
  import jax.numpy as jnp
  import dsgrad
  data = {c: dsgrad.data.open_memmap(os.path.join(folder, f"{c}-{num_data}.npy"))
          for c in COLUMNS}

  def log_prior(z):
    return -0.5 * jnp.sum(z["beta"] ** 2) - 2.0 * jnp.sum(z["effect"] ** 2)

  def log_lik(z, batch):
    eta = batch["x"] @ z["beta"] + z["effect"][batch["region"]] + batch["log_exposure"]
    return batch["y"] * eta - jnp.exp(eta) - jax.scipy.special.gammaln(batch["y"] + 1.0)

  latent = {"beta": jnp.zeros(NUM_FEATURES), "effect": jnp.zeros(NUM_REGIONS)}
  built = dsgrad.objective_from_logdensity(log_prior, log_lik, data, latent)
  return built, dsgrad.families.by_name("meanfield", NUM_FEATURES + NUM_REGIONS).params()


def schedule(num_steps: int):
  import optax
  return optax.adam(optax.cosine_decay_schedule(3e-3, num_steps))


def alone(built, params) -> dict:
  """``{candidate: steps per second}`` over one epoch in one fit call (after a compile)."""
  import jax
  import optax
  import dsgrad
  rates = {}
  for name, batch in (("naive", BATCH), ("cv", BATCH), ("joint_svrg", BATCH),
                      ("naive_batch", 2 * BATCH)):
    estimator = dsgrad.naive() if name.startswith("naive") else getattr(dsgrad, name)(built)
    steps = built.num_data // batch
    run = lambda n: dsgrad.fit(built, optax.chain(estimator, schedule(steps)), params,  # noqa: E731
                               jax.random.key(3), num_steps=n, batch_size=batch,
                               segment_steps=min(steps, 2048), elbo_samples=0, progress=False)
    run(min(steps, 2048))  # compiles
    result = run(steps)
    rates[name] = steps / result.timing.steps
    print(f"alone: {name} {rates[name]:,.0f} steps/s", flush=True)
  return rates


def race(built, params, budget: float) -> dict:
  """``recommend`` and its ``fit()``: the race's rates, the pick, the seconds."""
  import jax
  import dsgrad
  started = time.perf_counter()
  advice = dsgrad.recommend(built, schedule, params, jax.random.key(1), batch_size=BATCH,
                            budget=budget, progress=False)
  advised = time.perf_counter() - started
  print(advice, flush=True)
  result = advice.fit(progress=False)
  total = time.perf_counter() - started
  return {"rates": {c.name: c.steps_per_second for c in advice.ranking if c.raced},
          "gains": {c.name: [c.gain, c.gain_se] for c in advice.ranking if c.raced},
          "best": advice.best, "recommend_seconds": advised, "total_seconds": total,
          "final_elbo": float(result.history.elbo[-1]),
          "final_elbo_se": float(result.history.elbo_se[-1])}


def render(record) -> str:
  r, config = record["results"], record["results"]["config"]
  alone_rates, race_rates = r["alone"], r["race"]["rates"]
  lines = [f"Command: `{record['command']}`; {config['num_data']:,} rows on disk (memory-"
           f"mapped `.npy`), batch {BATCH}, {NUM_FEATURES + NUM_REGIONS:,} latent variables; "
           f"recommend's budget {config['budget']:g} s. Measured: {record['environment']}.",
           "", "| candidate | alone (steps/s) | alone / naive | race (steps/s) | "
           "race / naive | race / alone, each over naive | race's gain over naive (nats) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for name, rate in alone_rates.items():
    raced = race_rates.get(name)
    relative = rate / alone_rates["naive"]
    in_race = None if raced is None else raced / race_rates["naive"]
    gain = r["race"]["gains"].get(name)
    lines.append(f"| {name} | {rate:,.0f} | {relative:.3f} | "
                 + ("not raced | | |" if raced is None else
                    f"{raced:,.0f} | {in_race:.3f} | {in_race / relative:.2f} | ")
                 + ("" if gain is None else f"{gain[0]:+,.1f} ({gain[1]:,.1f}) |"))
  lines += ["", "A control variate's race rate is its steps' alone: the first update's extra "
            "time (joint SVRG's snapshot, a full pass) is charged to its race by the fraction "
            "of an epoch it ran; alone, its epoch includes one such pass.",
            "", f"Recommended: {r['race']['best']}; recommend took "
            f"{r['race']['recommend_seconds']:.1f} s, recommend and `.fit()` together "
            f"{r['race']['total_seconds'] / config['budget']:.3f} budgets; final ELBO "
            f"{r['race']['final_elbo']:,.1f} ({r['race']['final_elbo_se']:,.1f})."]
  return "\n".join(lines)


def main(argv=None):
  from dsgrad import command_line
  parser = argparse.ArgumentParser(prog="python -m benchmarks race-rates",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num-data", type=command_line.count(1), default=10_000_000)
  parser.add_argument("--budget", type=command_line.positive(), default=60.0)
  parser.add_argument("--data-folder", default=None,
                      help="where the generated .npy files are kept (default: a temporary one)")
  _report.add_output_flags(parser, "race-rates")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory(prefix="dsgrad-race-rates-") as scratch:
    folder = args.data_folder or scratch
    os.makedirs(folder, exist_ok=True)
    write_data(folder, args.num_data)
    built, params = objective(folder, args.num_data)
    results = {"alone": alone(built, params), "race": race(built, params, args.budget),
               "config": {"num_data": args.num_data, "budget": args.budget}}
  section = _report.section_of(args, "race-rates")
  _report.publish(section, None, not args.no_write, render=render, data=results)


if __name__ == "__main__":
  main()
