"""``recommend`` + ``Recommendation.fit`` on six models written for this check, as a user
would write them with ``dsgrad.objective_from_logdensity`` (none is in the catalogue or
the scale suite): an ordinal probit with a dict latent and integer labels, a Student-t
regression with the full-rank family and per-datum noise, 30 rows with the batch all of
them, Poisson counts with per-group intercepts declared by ``reads=``, negative-binomial
counts with a (groups, 2) latent leaf and a learned dispersion, and a two-component
mixture likelihood. Each at the budgets given, with the advice's default candidates, or
every candidate with ``all``.

Run from the repository root (two cores):

    PYTHONPATH=. python docs/scripts/heldout_advice.py 5,20,60 [all]

It prints, per model and budget, recommend + fit in budgets, recommend's seconds, the
pick, whether the fitted parameters are finite, and each candidate's gain or why it was
not raced.
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad

RNG = np.random.default_rng(0)
MODELS = {}


def model(build):
  MODELS[build.__name__] = build
  return build


def _normal_prior(z):
  return sum(-0.5 * jnp.sum(leaf ** 2) for leaf in jax.tree.leaves(z))


@model
def ordinal_probit():
  """Five ordered labels from a probit with cutpoints: log of a difference of normal
  cdfs at +-inf for the end labels (a NaN second derivative there)."""
  n, d = 20_000, 5
  x = RNG.normal(size=(n, d)).astype(np.float32)
  y = np.clip(np.round(x @ RNG.normal(size=d) + RNG.normal(size=n)), -2, 2).astype(np.int32) + 2

  def log_lik(z, b):
    cuts = jnp.cumsum(jnp.concatenate([z["c"][:1], jnp.exp(z["c"][1:])]))
    eta, cdf = b["x"] @ z["w"], jax.scipy.stats.norm.cdf
    upper, lower = jnp.append(cuts, jnp.inf)[b["y"]], jnp.append(-jnp.inf, cuts)[b["y"]]
    return jnp.log(jnp.clip(cdf(upper - eta) - cdf(lower - eta), 1e-30))

  latent = {"w": jnp.zeros(d), "c": jnp.zeros(4)}
  return dsgrad.objective_from_logdensity(_normal_prior, log_lik, {"x": x, "y": y}, latent), \
      "meanfield", d + 4, 100


@model
def student_t_fullrank():
  """A Student-t regression with a learned scale; full-rank q, one noise draw per datum."""
  n, d = 5_000, 4
  x = RNG.normal(size=(n, d)).astype(np.float32)
  y = (x @ RNG.normal(size=d) + RNG.standard_t(3, size=n)).astype(np.float32)

  def log_lik(z, b):
    return jax.scipy.stats.t.logpdf(b["y"] - b["x"] @ z[:d], 3.0, scale=jnp.exp(z[d]))

  return dsgrad.objective_from_logdensity(_normal_prior, log_lik, {"x": x, "y": y}, d + 1,
                                          family="fullrank", shared_noise=False), \
      "fullrank", d + 1, 50


@model
def thirty_rows():
  """A logistic regression on 30 rows, the batch all of them."""
  x = RNG.normal(size=(30, 2)).astype(np.float32)
  y = (RNG.random(30) < 0.5).astype(np.float32)

  def log_lik(z, b):
    return b["y"] * (b["x"] @ z) - jnp.logaddexp(0.0, b["x"] @ z)

  return dsgrad.objective_from_logdensity(_normal_prior, log_lik, {"x": x, "y": y}, 2), \
      "meanfield", 2, 30


@model
def poisson_groups():
  """Poisson counts, 2,000 group intercepts (declared: row n reads a[g[n]]), 3 slopes."""
  n, g = 200_000, 2_000
  groups = RNG.integers(0, g, n).astype(np.int32)
  x = RNG.normal(size=(n, 3)).astype(np.float32)
  rate = np.exp(0.5 * RNG.normal(size=g)[groups] + x @ np.array([0.3, -0.2, 0.1]))
  y = RNG.poisson(rate).astype(np.float32)

  def log_lik(z, b):
    eta = z["a"][b["g"]] + b["x"] @ z["b"]
    return b["y"] * eta - jnp.exp(eta)

  latent = {"a": jnp.zeros(g), "b": jnp.zeros(3)}
  return dsgrad.objective_from_logdensity(_normal_prior, log_lik,
                                          {"x": x, "y": y, "g": groups}, latent,
                                          reads={"a": "g"}), "meanfield", g + 3, 100


@model
def negative_binomial_groups():
  """Negative-binomial counts: a (5,000, 2) latent of group intercepts and slopes, a
  global intercept and a learned dispersion."""
  n, g = 300_000, 5_000
  groups = RNG.integers(0, g, n).astype(np.int32)
  x = RNG.normal(size=n).astype(np.float32)
  ab = 0.3 * RNG.normal(size=(g, 2))
  mean = np.exp(ab[groups, 0] + ab[groups, 1] * x + 1.0)
  y = RNG.negative_binomial(5, 5 / (5 + mean)).astype(np.float32)

  def log_lik(z, b):
    ab_rows = z["ab"][b["g"]]
    eta = ab_rows[:, 0] + ab_rows[:, 1] * b["x"] + z["c"][0]
    r = jax.nn.softplus(z["c"][1]) + 1e-3
    gammaln = jax.scipy.special.gammaln
    return (gammaln(b["y"] + r) - gammaln(r) + r * jax.nn.log_sigmoid(jnp.log(r) - eta)
            + b["y"] * jax.nn.log_sigmoid(eta - jnp.log(r)))

  latent = {"ab": jnp.zeros((g, 2)), "c": jnp.zeros(2)}
  return dsgrad.objective_from_logdensity(_normal_prior, log_lik,
                                          {"x": x, "y": y, "g": groups}, latent,
                                          reads={"ab": "g"}), "meanfield", 2 * g + 2, 100


@model
def mixture_regression():
  """A regression with 10% outliers: a two-component likelihood (logsumexp), per-datum
  noise."""
  n, d = 100_000, 6
  x = RNG.normal(size=(n, d)).astype(np.float32)
  outlier = RNG.random(n) < 0.1
  y = (x @ RNG.normal(size=d)
       + np.where(outlier, 10 * RNG.normal(size=n), RNG.normal(size=n))).astype(np.float32)

  def log_lik(z, b):
    r = b["y"] - b["x"] @ z[:d]
    inlier = jnp.log(0.9) + jax.scipy.stats.norm.logpdf(r, scale=jnp.exp(z[d]))
    return jnp.logaddexp(inlier, jnp.log(0.1) + jax.scipy.stats.norm.logpdf(r, scale=10.0))

  return dsgrad.objective_from_logdensity(_normal_prior, log_lik, {"x": x, "y": y}, d + 1,
                                          shared_noise=False), "meanfield", d + 1, 100


def main(budgets, candidates):
  for name, build in MODELS.items():
    objective, family, dim, batch = build()
    params = dsgrad.families.by_name(family, dim).params()
    for budget in budgets:
      started = time.perf_counter()
      advice, result = dsgrad.recommend_and_fit(
          objective, lambda steps: optax.adam(optax.cosine_decay_schedule(3e-3, steps)),
          params, jax.random.key(1), batch_size=batch, budget=budget, candidates=candidates,
          progress=False, fit_kwargs={"progress": False})
      took = time.perf_counter() - started
      finite = all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(result.params))
      print(f"{name}, budget {budget:g} s: {took / budget:.3f} budgets, recommend "
            f"{advice.seconds_spent:.2f} s, pick {advice.best}, params finite: {finite}")
      for row in advice.ranking:
        print(f"    {row.describe()}: " + (f"{row.gain:+.4g} +- {row.gain_se:.2g}"
                                           if row.raced else row.why_not[:110]))


if __name__ == "__main__":
  everything = len(sys.argv) > 2 and sys.argv[2] == "all"
  main([float(b) for b in sys.argv[1].split(",")],
       dsgrad.advice.candidates.CANDIDATES if everything else
       dsgrad.advice.candidates.DEFAULT_CANDIDATES)
