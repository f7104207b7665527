"""A second look: where the race's pick has run on, would joint SVRG now beat it?

Naive alone trains to 20% of a 60 s budget; the 2x batch (the race's pick on the count
model) continues it to 35% and then to 50%. At each of those two points joint SVRG and
the 2x batch each continue the 2x batch's state for 1.4 s of steps, as in `recommend`'s
race, over four batch/noise keys. The printout is joint SVRG's ELBO minus the 2x batch's,
with its spread over the keys.

Run from the repository root (two cores, a few minutes):

    PYTHONPATH=. python docs/scripts/second_look.py [model] [peak]
"""

import dsgrad

dsgrad.pin_xla_threads(1)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from _race_common import BUDGET, RACE_SECONDS, naive_alone, race, setup  # noqa: E402
from dsgrad.advice import candidates as candidates_lib  # noqa: E402
from dsgrad.advice import runs as runs_lib  # noqa: E402

KEYS = 4


def main():
  name, objective, params, make, elbo = setup()
  built = {c.candidate.name: c for c in candidates_lib.build(
      ("naive", "joint_svrg", "naive_batch"), objective, params, 100)}

  def run_of(name_, key=0):
    return runs_lib.Run(built[name_], make, jax.random.key(key), params)

  naive, step, _ = naive_alone(built["naive"], make, params, 0.2)
  segment = lambda seconds: max(1, round(RACE_SECONDS / 3 / (8 * seconds)))  # noqa: E731
  programs = {}
  for n in ("joint_svrg", "naive_batch"):  # each on a schedule over the steps it affords
    probe = run_of(n)
    probe.continue_from(naive, probe.compile(BUDGET / step, segment(step)), 0.2)
    probe.start_race(first_update=n == "joint_svrg")
    probe.advance_for(0.5)
    probe.advance_for(0.5)
    own_step = probe.seconds_per_step
    programs[n] = probe.compile(BUDGET / own_step, segment(own_step))
  pick = run_of("naive_batch")
  pick.continue_from(naive, programs["naive_batch"], 0.2)
  pick.start_race(first_update=False)
  print(f"{name}: naive alone to 20% ({naive.steps_run:,} steps, ELBO "
        f"{elbo(naive.params):,.0f}); then the 2x batch:")
  for at in (0.35, 0.5):
    pick.advance_for((at - 0.2) * BUDGET - pick.raced_seconds())
    pick.use(pick.program, at)
    ends = {}
    for n in ("joint_svrg", "naive_batch"):
      for k in range(KEYS):
        run = run_of(n, 100 + k)
        run.continue_from(pick, programs[n], at)
        run.start_race(first_update=n == "joint_svrg")
        race(run)
        ends.setdefault(n, []).append(elbo(run.params))
    gap = np.asarray(ends["joint_svrg"]) - np.asarray(ends["naive_batch"])
    print(f"  at {at:.0%} (the 2x batch at ELBO {elbo(pick.params):,.0f}): joint SVRG minus "
          f"the 2x batch after {RACE_SECONDS} s: {gap.mean():+,.0f} (sd over keys "
          f"{gap.std(ddof=1):,.0f}; by key {np.round(gap).astype(int).tolist()})")


if __name__ == "__main__":
  main()
