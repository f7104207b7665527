"""One-off: joint SAGA and SVRG within less than one epoch (the peers benchmark's synthetic task at
batch 100). Synthetic logistic regression with N rows (argument), D = 100, mean-field BBVI,
Adam 0.01, 3,000 steps of batch 100, from loc 0 and scale 0.1; final ELBO by quadrature.
``python docs/scripts/saga_before_one_epoch.py 1000000`` gives the figures quoted in
``dsgrad.joint_saga``'s docstring (and 50000 the within-several-epochs contrast)."""
import sys

import jax
import numpy as np
import optax

import dsgrad
from benchmarks import peers

n = int(sys.argv[1])
x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), n, 100)
task = peers.Task("s", np.asarray(x), np.asarray(y), 1, 100, 3000, "")
evaluate = peers.elbo_evaluator(task)
model = peers._model(task)
objective = dsgrad.meanfield_gaussian(model)
approx = dsgrad.approx.glm_taylor(model)
for name, est in [
    ("naive", dsgrad.naive()),
    ("joint SAGA, c = 1", dsgrad.joint_saga(objective, approx, chunk_size=16384)),
    ("joint SAGA, adaptive", dsgrad.joint_saga(objective, approx, chunk_size=16384,
                                               control_weight="adaptive")),
    ("joint SAGA, App. F logit table", dsgrad.joint_saga(
        objective, dsgrad.approx.glm_mean_taylor(model), chunk_size=16384)),
    ("joint SVRG, every epoch", dsgrad.joint_svrg(objective, approx, every=n // 100,
                                                  chunk_size=16384))]:
  opt = optax.chain(est, optax.adam(0.01))
  result = dsgrad.fit(objective, opt, peers._initial(100), jax.random.key(0), num_steps=3000,
                      batch_size=100, eval_every=3000, elbo_samples=0, progress=False)
  print(f"{name:<32} ELBO {evaluate(result.params['loc'], result.params['log_scale']):,.1f}",
        flush=True)
