"""What ``dsgrad.fit`` costs over a hand-written optax loop, and what a control variate
costs over naive, on models written here as a user would write them (not from
``dsgrad.models``).

Three models, each a plain :class:`dsgrad.models.Model` closing over its arrays:

* ``logistic``: logistic regression, N = 100,000, D = 50;
* ``hierarchical``: logistic regression with 1,000 group intercepts (N = 100,000,
  1,010 latent variables), the intercepts' prior a Gaussian of fixed scale;
* ``mlp``: a Bayesian 20-32-2 MLP classifier (N = 20,000, 738 latent variables);
* ``student_t``: robust linear regression with Student-t (3 degrees of freedom) noise of
  learned scale, N = 50,000, 21 latent variables (run only when named: ``--models``).

Mean-field Gaussian BBVI, batch 100, one noise draw per batch, Adam 1e-3, the same
number of steps for every contender. Contenders:

* **hand-written loop**: a jitted ``lax.scan`` over the steps of plain JAX and optax
  (value-and-grad of the negative ELBO, Adam), with fit's batches (reshuffled epochs,
  :func:`dsgrad.training.batching.epoch_batches`) precomputed as an index array;
* **fit naive**: ``dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.adam(1e-3)),
  ...)`` with one segment and no ELBO evaluation; its time is the call's wall-clock minus
  its compile time (so argument checks, state set-up and the checks' round trip count);
* **fit naive (checks every step)**: the same with the finiteness check in every step
  (``dsgrad.training.segments.CHECK_AT_END_BYTES = 0``) rather than at each segment's end;
* **fit cv**: the same with ``dsgrad.cv(objective)`` (``linearize``: one JVP of the
  gradient);
* **epoch orders**: the run's reshuffled epochs alone (part of fit's time; the
  hand-written loop is given them);
* **hand-written cv**: the same numbers as ``fit cv`` with ``control_weight=1.0``
  written in plain JAX: the naive gradient plus ``-d/dt grad f(loc, t eps)|_0``, one
  forward-over-reverse pass, and Adam.

Interleaved rounds in one process; the table reports the median over rounds and the
ratios. Targets: fit naive within 1.05x of the hand-written loop; on the MLP, cv within
1.15x of the hand-written cv step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from benchmarks import _report


def _logistic(key, num_data=100_000, dim=50):
  kx, kw, ky = jax.random.split(key, 3)
  x = jax.random.normal(kx, (num_data, dim))
  w = jax.random.normal(kw, (dim,)) / np.sqrt(dim)
  y = jnp.where(jax.random.bernoulli(ky, jax.nn.sigmoid(x @ w)), 1.0, -1.0)

  def log_likelihood(z, idx):
    return jax.nn.log_sigmoid(y[idx] * (x[idx] @ z))

  def log_prior(z):
    return -0.5 * jnp.sum(z ** 2)

  return dsgrad.models.Model(log_prior, log_likelihood, num_data, dim, name="logistic")


def _hierarchical(key, num_data=100_000, dim=10, groups=1_000):
  kx, kg, kw, kb, ky = jax.random.split(key, 5)
  x = jax.random.normal(kx, (num_data, dim))
  group = jax.random.randint(kg, (num_data,), 0, groups)
  w = jax.random.normal(kw, (dim,)) / np.sqrt(dim)
  b = 0.5 * jax.random.normal(kb, (groups,))
  y = jnp.where(jax.random.bernoulli(ky, jax.nn.sigmoid(x @ w + b[group])), 1.0, -1.0)

  def log_likelihood(z, idx):
    logits = x[idx] @ z[:dim] + z[dim:][group[idx]]
    return jax.nn.log_sigmoid(y[idx] * logits)

  def log_prior(z):
    return -0.5 * jnp.sum(z[:dim] ** 2) - 0.5 * jnp.sum(z[dim:] ** 2) / 0.5 ** 2

  return dsgrad.models.Model(log_prior, log_likelihood, num_data, dim + groups, name="hierarchical")


def _mlp(key, num_data=20_000, inputs=20, hidden=32, classes=2):
  kx, kw = jax.random.split(key)
  x = jax.random.normal(kx, (num_data, inputs))
  teacher = jax.random.normal(kw, (inputs, classes))
  y = jnp.argmax(x @ teacher + 0.5 * jnp.sin(3 * x[:, :classes]), axis=1)
  sizes = [(inputs, hidden), (hidden,), (hidden, classes), (classes,)]
  counts = [int(np.prod(s)) for s in sizes]

  def unpack(z):
    out, at = [], 0
    for shape, count in zip(sizes, counts):
      out.append(z[at:at + count].reshape(shape))
      at += count
    return out

  def log_likelihood(z, idx):
    w1, b1, w2, b2 = unpack(z)
    logits = jnp.tanh(x[idx] @ w1 + b1) @ w2 + b2
    return jnp.take_along_axis(jax.nn.log_softmax(logits), y[idx][:, None], 1)[:, 0]

  def log_prior(z):
    return -0.5 * jnp.sum(z ** 2)

  return dsgrad.models.Model(log_prior, log_likelihood, num_data, sum(counts), name="mlp")


def _student_t(key, num_data=50_000, dim=20, dof=3.0):
  kx, kw, ke = jax.random.split(key, 3)
  x = jax.random.normal(kx, (num_data, dim))
  w = jax.random.normal(kw, (dim,))
  y = x @ w + jax.random.t(ke, dof, (num_data,))

  def log_likelihood(z, idx):
    r = y[idx] - x[idx] @ z[:dim]
    scale = jnp.exp(z[dim])
    return (-0.5 * (dof + 1) * jnp.log1p((r / scale) ** 2 / dof) - z[dim])

  def log_prior(z):
    return -0.5 * jnp.sum(z[:dim] ** 2) / 10.0 - 0.5 * z[dim] ** 2

  return dsgrad.models.Model(log_prior, log_likelihood, num_data, dim + 1, name="student_t")


MODELS = {"logistic": _logistic, "hierarchical": _hierarchical, "mlp": _mlp,
          "student_t": _student_t}


def bbvi_loss(model):
  """The mean-field BBVI mini-batch loss as a hand-written loop computes it (entropy up to
  its constant): ``(params, indices, eps) -> scalar``."""
  n = model.num_data

  def loss(params, idx, eps):
    z = params["loc"] + jnp.exp(params["log_scale"]) * eps
    return (-n * jnp.mean(model.log_likelihood_at(z, idx)) - model.log_prior(z)
            - jnp.sum(params["log_scale"]))

  return loss


def _hand_loop(model, batches, learning_rate, with_cv):
  """The hand-written loop: ``(params, opt_state, keys) -> (params, opt_state)``."""
  adam = optax.adam(learning_rate)
  loss = bbvi_loss(model)

  def step(carry, xs):
    params, opt_state = carry
    idx, key = xs
    eps = jax.random.normal(key, params["loc"].shape)
    grads = jax.grad(loss)(params, idx, eps)
    if with_cv:  # linearize's control variate, c = 1: minus the JVP of the gradient
      at = lambda e: jax.grad(loss)(params, idx, e)
      _, deviation = jax.jvp(at, (jnp.zeros_like(eps),), (eps,))
      grads = jax.tree.map(lambda g, d: g - d, grads, deviation)
    updates, opt_state = adam.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  @jax.jit
  def run(params, opt_state, keys):
    return jax.lax.scan(step, (params, opt_state), (batches, keys))[0]

  return run, adam


def epoch_batches(key, num_data, batch_size, steps):
  per_epoch = num_data // batch_size
  epochs = -(-steps // per_epoch)
  orders = [jax.random.permutation(k, num_data)[:per_epoch * batch_size]
            for k in jax.random.split(key, epochs)]
  return jnp.concatenate(orders).reshape(-1, batch_size)[:steps]


EVALUATIONS = {
    # fit as a user calls it: the default segments and evaluations
    # (dsgrad.training.evaluation_plan).
    "fit naive (default evaluations)": {},
    # The default before the evaluation plan: 100 draws after every segment of an epoch.
    "fit naive (100 draws an epoch)": dict(eval_every="epoch", elbo_samples=100),
}
"""fit's evaluation settings per contender; the others evaluate nothing, in one segment."""


def run(models=tuple(MODELS), steps=20_000, batch_size=100, rounds=3, learning_rate=1e-3):
  results = {}
  fit_key = jax.random.key(3)
  for name in models:
    model = MODELS[name](jax.random.key(0))
    objective = dsgrad.meanfield_gaussian(model)
    params0 = dsgrad.meanfield_init(model, 0.0, -2.0)
    # fit's own batches: it draws them from split(key)[0] of the key it is given.
    batches = dsgrad.training.batching.epoch_batches(jax.random.split(fit_key)[0], model.num_data,
                                            batch_size, steps)
    keys = jax.random.split(jax.random.key(2), steps)
    hand = {}
    for label, with_cv in (("hand-written loop", False), ("hand-written cv (c = 1)", True)):
      loop, adam = _hand_loop(model, batches, learning_rate, with_cv)
      compiled = loop.lower(params0, adam.init(params0), keys).compile()
      hand[label] = (compiled, adam)
    fits = {"fit naive": lambda: optax.chain(dsgrad.naive(), optax.adam(learning_rate)),
            # The checks as fit ran them before they were settled at a segment's end.
            "fit naive (checks every step)": lambda: optax.chain(dsgrad.naive(),
                                                                 optax.adam(learning_rate)),
            "fit cv (c = 1)": lambda: optax.chain(dsgrad.cv(objective, control_weight=1.0),
                                                  optax.adam(learning_rate)),
            "fit cv (adaptive)": lambda: optax.chain(dsgrad.cv(objective),
                                                     optax.adam(learning_rate)),
            "fit naive (default evaluations)": lambda: optax.adam(learning_rate),
            "fit naive (100 draws an epoch)": lambda: optax.adam(learning_rate)}
    made = {label: make() for label, make in fits.items()}
    times = {label: [] for label in list(hand) + list(fits) + ["epoch orders"]}
    for round_ in _report.progress(range(rounds + 1), f"{name}: rounds (the first warms up)"):
      # Part of fit's own work: the run's epoch orders, which the hand loop gets for free.
      t0 = time.perf_counter()
      orders = dsgrad.training.batching.EpochOrders(jax.random.split(fit_key)[0], model.num_data,
                                           batch_size)
      jax.block_until_ready(orders.window(0, steps))
      if round_:
        times["epoch orders"].append(time.perf_counter() - t0)
      for label, (compiled, adam) in hand.items():
        params = jax.tree.map(jnp.copy, params0)
        t0 = time.perf_counter()
        out = compiled(params, adam.init(params), keys)
        jax.block_until_ready(out)
        if round_:
          times[label].append(time.perf_counter() - t0)
      for label, optimizer in made.items():
        every_step = label == "fit naive (checks every step)"
        cap = dsgrad.training.segments.CHECK_AT_END_BYTES
        dsgrad.training.segments.CHECK_AT_END_BYTES = 0 if every_step else cap
        settings = dict(EVALUATIONS.get(label, dict(eval_every=steps, elbo_samples=0)))
        if settings.get("eval_every") == "epoch":
          settings["eval_every"] = model.num_data // batch_size
        t0 = time.perf_counter()
        try:
          result = dsgrad.fit(objective, optimizer, params0, fit_key, num_steps=steps,
                              batch_size=batch_size, progress=False, **settings)
          jax.block_until_ready(result.params)
        finally:
          dsgrad.training.segments.CHECK_AT_END_BYTES = cap
        if round_:  # the first round compiles; later ones reuse the executable
          times[label].append(time.perf_counter() - t0 - result.compile_seconds)
    results[name] = dict(latent_dim=model.latent_dim, num_data=model.num_data,
                         seconds={k: statistics.median(v) for k, v in times.items()},
                         raw={k: v for k, v in times.items()})
    print(name, {k: f"{1e3 * v / steps:.3f} ms/step" for k, v in
                 results[name]["seconds"].items()}, flush=True)
  return results, dict(steps=steps, batch_size=batch_size, rounds=rounds,
                       learning_rate=learning_rate)


def render(record):
  """The fit-overhead section of one run record (``docs/data/fit-overhead-*.json``)."""
  results, config = record["results"]["results"], record["results"]["config"]
  # Runs before the checks-off and checks-every-step contenders were added lack their
  # columns.
  unchecked = all("fit naive (checks off)" in r["seconds"] for r in results.values())
  every = all("fit naive (checks every step)" in r["seconds"] for r in results.values())
  orders = all("epoch orders" in r["seconds"] for r in results.values())
  evaluations = [label for label in EVALUATIONS
                 if all(label in r["seconds"] for r in results.values())]
  lines = [
      f"Command: `{record['command']}` -- mean-field BBVI, B="
      f"{config['batch_size']}, {config['steps']:,} Adam steps per run, median of "
      f"{config['rounds']} interleaved rounds after a compiling round; fit's time is its "
      "wall-clock minus its compile time.",
      "",
      f"Measured: {record['environment']}",
      "",
      "| model | latent | hand-written loop, ms/step | fit naive | fit cv (c = 1) | "
      "hand-written cv (c = 1) | fit cv (adaptive) | fit naive / hand loop | "
      "fit cv / hand-written cv |" + (" fit naive, checks off / hand loop |" if unchecked
                                      else "")
      + (" fit naive, checks every step / hand loop |" if every else "")
      + (" epoch orders / hand loop |" if orders else "")
      + "".join(f" {label[len('fit naive ('):-1]} / fit naive |" for label in evaluations),
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (
          unchecked + every + orders + len(evaluations)),
  ]
  verdicts = []
  for name, r in results.items():
    s = {k: 1e3 * v / config["steps"] for k, v in r["seconds"].items()}
    naive_ratio = s["fit naive"] / s["hand-written loop"]
    cv_ratio = s["fit cv (c = 1)"] / s["hand-written cv (c = 1)"]
    lines.append(f"| {name} | {r['latent_dim']:,} | {s['hand-written loop']:.3f} | "
                 f"{s['fit naive']:.3f} | {s['fit cv (c = 1)']:.3f} | "
                 f"{s['hand-written cv (c = 1)']:.3f} | {s['fit cv (adaptive)']:.3f} | "
                 f"{naive_ratio:.2f}x | {cv_ratio:.2f}x |")
    for column, shown in (("fit naive (checks off)", unchecked),
                          ("fit naive (checks every step)", every), ("epoch orders", orders)):
      if shown:
        lines[-1] += f" {s[column] / s['hand-written loop']:.2f}x |"
    lines[-1] += "".join(f" {s[label] / s['fit naive']:.2f}x |" for label in evaluations)
    verdicts.append(f"{name}: fit naive {naive_ratio:.2f}x the hand-written loop (<= 1.05x: "
                    f"{'met' if naive_ratio <= 1.05 else 'missed'})")
    if name == "mlp":
      verdicts.append(f"mlp: fit cv {cv_ratio:.2f}x the hand-written cv step (<= 1.15x: "
                      f"{'met' if cv_ratio <= 1.15 else 'missed'})")
  lines += ["", "Targets, from this table: " + "; ".join(verdicts) + "."]
  if unchecked:
    lines += ["", "Column \"checks off\": the same fit with "
              "`dsgrad.naive(value_checks=False)` (runs from before the per-step checks "
              "left the estimators for `dsgrad.checked`); the difference to fit naive is what its "
              "value checks cost, the rest is fit's own work (drawing the epochs' orders, "
              "placing the state)."]
  if every:
    lines[-1] += (" Column \"checks every step\": fit naive with the finiteness check "
                  "in every step (a failure code per step, as before "
                  "`dsgrad.training.segments.CHECK_AT_END_BYTES`), instead of once at the segment's "
                  "end.")
  if orders:
    lines[-1] += (" Column \"epoch orders\": the time fit spends drawing the run's "
                  "reshuffled epochs (`dsgrad.training.batching.EpochOrders`, one sort of N keys "
                  "per epoch), which the hand-written loop is given precomputed; it is "
                  "part of fit naive's time.")
  if evaluations:
    lines[-1] += (" Columns \"default evaluations\" and \"100 draws an epoch\": fit naive as "
                  "a user calls it, with its default ELBO evaluations "
                  "(`dsgrad.training.evaluation_plan`: the ones before the last priced at a tenth of "
                  "the steps, the last with 100 draws), and with 100 draws after every epoch "
                  "(the default before that plan), over fit naive without evaluations; "
                  "their time includes the evaluations.")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks fit-overhead",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=command_line.count(1), default=20_000)
  parser.add_argument("--rounds", type=command_line.count(1), default=3)
  parser.add_argument("--models", nargs="*", default=[m for m in MODELS if m != "student_t"],
                      choices=list(MODELS))
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  results, config = run(tuple(args.models), steps=args.steps, rounds=args.rounds)
  _report.publish(f"fit-overhead-{jax.default_backend()}", None, not args.no_write,
                  render=render, data={"results": results, "config": config})


if __name__ == "__main__":
  main()
