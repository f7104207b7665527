"""Why does joint SVRG end behind naive on mean-field BBVI?

Mean-field Gaussian BBVI of the DAIS benchmark's synthetic logistic regression (N = 50,000,
d = 20, B = 256, Adam 0.01 divided by 10 at 60% and 85% of the steps, 3,000 steps, one
noise draw per batch), as in `python -m benchmarks dais`. Variants that separate the
candidate causes:

* snapshot age: refreshed once an epoch (every = N/B = 195) vs 4 times (49);
* the approximation's missing second-order terms: linearize() vs gaussian_taylor;
* a control that adds variance: the adaptive weight;
* Adam's second moment: each variant's final gradient variance next to naive's, and the
  final ELBO.

Usage: python docs/scripts/svrg_convergence.py [--steps 3000] [--seeds 3]
"""

import argparse
import time

import jax
import numpy as np
import optax

import dsgrad
from dsgrad.models import logistic_regression, synthetic_logistic_data


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--variants", default=None)
  args = parser.parse_args()
  x, y, _ = synthetic_logistic_data(jax.random.key(0), 60_000, 20)
  model = logistic_regression(x[:50_000], y[:50_000])
  family = dsgrad.families.MeanFieldGaussian(20, loc=0.0, log_scale=np.log(0.1))
  objective = family.objective(model)
  n, b = model.num_data, 256
  epoch = n // b
  steps = args.steps
  schedule = optax.piecewise_constant_schedule(1e-2, {int(0.6 * steps): 0.1,
                                                      int(0.85 * steps): 0.1})
  lin, taylor2 = dsgrad.approx.linearize(), dsgrad.approx.gaussian_taylor(model)
  variants = {
      "naive": lambda: dsgrad.naive(),
      "svrg, 1 refresh/epoch": lambda: dsgrad.joint_svrg(objective, lin, every=epoch,
                                                         chunk_size=n),
      "svrg, 4 refreshes/epoch": lambda: dsgrad.joint_svrg(objective, lin, every=epoch // 4,
                                                           chunk_size=n),
      "svrg, taylor2": lambda: dsgrad.joint_svrg(objective, taylor2, every=epoch, chunk_size=n),
      "svrg, adaptive": lambda: dsgrad.joint_svrg(objective, lin, every=epoch, chunk_size=n,
                                                  control_weight="adaptive"),
      "svrg, taylor2, adaptive": lambda: dsgrad.joint_svrg(
          objective, taylor2, every=epoch, chunk_size=n, control_weight="adaptive"),
  }
  if args.variants:
    variants = {k: v for k, v in variants.items() if k in args.variants.split(";")}
  print(f"{'variant':<26} {'final ELBO (mean ± se over seeds)':>34} {'var / naive var (loc, log_scale) at end':>42}")
  for name, make in variants.items():
    finals, ratios = [], []
    t0 = time.perf_counter()
    for seed in range(args.seeds):
      est = make()
      opt = optax.chain(est, optax.adam(schedule))
      result = dsgrad.fit(objective, opt, family.params(), jax.random.key(seed),
                          num_steps=steps, batch_size=b, eval_every=steps, elbo_samples=0,
                          progress=False)
      params = result.params
      finals.append(float(dsgrad.elbo(objective, params, jax.random.key(100 + seed), 2000,
                                      chunk_size=16_384)[0]))
      est_state = result.opt_state[0]
      var = {}
      for label, tx, st in [("est", est, est_state), ("naive", dsgrad.naive(), optax.EmptyState())]:
        s = np.asarray(dsgrad.estimator_samples(tx, st, params, objective,
                                                jax.random.key(200 + seed), 2000, b))
        var[label] = (s[:, :20].var(0).sum(), s[:, 20:].var(0).sum())
      ratios.append([var["est"][i] / var["naive"][i] for i in range(2)])
    finals, ratios = np.asarray(finals), np.asarray(ratios).mean(0)
    print(f"{name:<26} {finals.mean():>24,.2f} ± {finals.std(ddof=1) / np.sqrt(len(finals)):.2f}"
          f"      {ratios[0]:>8.3f}, {ratios[1]:>8.3f}   ({time.perf_counter() - t0:.0f} s)",
          flush=True)


if __name__ == "__main__":
  main()
