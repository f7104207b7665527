"""Does ``recommend``'s race see joint SVRG at its best? In the race a candidate
continues naive's run and joint SVRG's first update takes its snapshot there, so for the
race's second or two its snapshot is fresh; over a run it ages for an epoch between
refreshes (10,000 steps at batch 100 on 10^6 rows).

On the scale suite's item-response model (10^6 rows, 2 cores, not pinned), naive trains
with ``dsgrad.training.paced.Run`` (the advice's own runs) for about 20% of a 60 s budget,
keeping its state half an epoch before that. From naive's state, three runs each take
``T`` seconds of steps: joint SVRG with a snapshot taken there (as the race does), joint
SVRG with its snapshot taken at naive's state half an epoch earlier, and naive with twice
the batch; then each goes on to the end of the budget. Printed: each run's full-data ELBO
minus the larger batch's (8 draws, the same noise for every run), after the race and at
the end. Run from the project root:

    PYTHONPATH=. python docs/scripts/race_snapshot_age.py 1.5
"""
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from benchmarks import scale_models
from dsgrad.advice import candidates as C
from dsgrad.training import paced as R
model = scale_models.item_response()
obj = model.objective
params = dsgrad.families.by_name("meanfield", model.dim, log_scale=0.0).params()  # as published
make = lambda n: optax.adam(optax.cosine_decay_schedule(3e-3, n, alpha=0.01))
key = jax.random.key(0)
budget, T = 60.0, float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
built = {c.candidate.name: c for c in C.build(("naive", "joint_svrg", "naive_batch"), obj, params, 100)}
elbo_prog = dsgrad.diagnostics.sampled_elbo_draws(obj, 8, 4096)
ek = jax.random.key(99)
elbo = lambda p: np.asarray(elbo_prog(p, ek, obj.num_data))
naive = R.Run(built["naive"], make, key, params)
prog_n = naive.compile(int(budget / 4.5e-4), 200)
naive.start(prog_n); naive.advance(400); naive.advance(int(1.0 / naive.seconds_per_step))
step = naive.seconds_per_step; print("naive step", step)
epoch = obj.num_data // 100
# naive to (20% - half an epoch), keep, then to 20%
target = int(0.2 * budget / step); half = epoch // 2
naive.advance(target - half - naive.step)
old_params, old_state, old_step = naive.params, naive.opt_state, naive.step
naive.advance(target - naive.step)
frac = naive.step / prog_n.length
print("naive at", naive.step, "fraction", frac)
progs = {n: R.Run(built[n], make, key, params).compile(int(budget / (step * (1.6 if n == 'joint_svrg' else 1.05))), 200) for n in ("joint_svrg", "naive_batch")}
def fresh(name):
  r = R.Run(built[name], make, key, params); r.continue_from(naive, progs[name], frac); return r
svrg_fresh, batch = fresh("joint_svrg"), fresh("naive_batch")
svrg_old = R.Run(built["joint_svrg"], make, key, params)
earlier = types.SimpleNamespace(params=old_params, opt_state=old_state)  # naive then
svrg_old.continue_from(earlier, progs["joint_svrg"], old_step / prog_n.length)
svrg_old.advance(200)  # its first update: the snapshot at the older params
svrg_old.params = jax.tree.map(jnp.copy, naive.params)
svrg_old.opt_state = (svrg_old.opt_state[0], jax.tree.map(jnp.copy, naive.opt_state[1]))
svrg_old.use(progs["joint_svrg"], frac)
runs = {"svrg fresh": svrg_fresh, "svrg half-epoch-old snapshot": svrg_old, "batch x2": batch}
for r in runs.values():
  r.advance(200)  # first segment (fresh: the snapshot) before the clock
  r.seconds, r.timings = 0.0, []
def report(label):
  draws = {n: elbo(r.params) for n, r in runs.items()}
  base = draws["batch x2"]
  for n, d in draws.items():
    diff = d - base
    print(f"{label}: {n:30s} - batch x2 = {diff.mean():+9.1f} (se {diff.std(ddof=1) / np.sqrt(len(diff)):.1f})")
for r in runs.values(): r.advance_for(T)
report(f"race {T} s")
left = budget * (1 - frac) - T
for r in runs.values(): r.advance_for(left)
report(f"to the end (+{left:.0f} s)")
