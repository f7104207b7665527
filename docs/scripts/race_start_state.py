"""Where `recommend`'s race starts, and what the race concludes from there.

`recommend` races at 20% of the budget by the clock, while the candidates compile beside
naive's training. This script measures (1) how many steps naive has taken by then, and
the ELBO it starts the race from, against naive alone at 20% of the budget; and (2) the
race's gains over naive, 1.4 s of steps each as in `recommend`, from naive alone's 20%
state, over four batch/noise keys (how much a run's own noise moves them).

Run from the repository root (two cores, about four minutes):

    PYTHONPATH=. python docs/scripts/race_start_state.py [model] [peak]

``model`` is a scale-suite model (default two_index, peak 0.001).
"""

import dsgrad

dsgrad.pin_xla_threads(1)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _race_common import BUDGET, RACE_SECONDS, naive_alone, race, setup  # noqa: E402
from dsgrad.advice import candidates as candidates_lib  # noqa: E402
from dsgrad.advice import runs as runs_lib  # noqa: E402

RACE_AT = 0.2
NAMES = ("naive", "joint_svrg", "cv", "naive_batch")


def main():
  name, objective, params, make, elbo = setup()

  # (1) The state recommend races from: naive's, when its first candidate continues it.
  seen = {}
  continue_from = runs_lib.Run.continue_from

  def spy(run, other, program, fraction):
    seen.setdefault("start", (other.steps_run, jax.tree.map(jnp.copy, other.params),
                              fraction))
    return continue_from(run, other, program, fraction)

  runs_lib.Run.continue_from = spy
  advice = dsgrad.recommend(objective, make, params, jax.random.key(0), batch_size=100,
                            budget=BUDGET, progress=False)
  runs_lib.Run.continue_from = continue_from
  steps, start, fraction = seen["start"]
  print(f"{name}, recommend: the race began at {fraction:.1%} of the budget, after {steps:,} naive "
        f"steps, from ELBO {elbo(start):,.0f}; it picked {advice.best}:")
  for c in advice.ranking:
    if c.raced and c.name != "naive":
      print(f"  {c.name:12s} {c.gain:+9.0f} +- {c.gain_se:.0f}")

  # (2) Naive alone to 20% of the budget, then the same race from there, four keys.
  built = [c for c in candidates_lib.build(NAMES, objective, params, 100)
           if isinstance(c, candidates_lib.Contender)]
  naive, step, own = naive_alone(built[0], make, params, RACE_AT)
  print(f"naive alone: {naive.steps_run:,} steps by {RACE_AT:.0%} of the budget, ELBO "
        f"{elbo(naive.params):,.0f}; the race from there, four keys:")
  piece = RACE_SECONDS / 3
  ends = {}
  for contender in built:
    cname = contender.candidate.name
    program_c = own if cname == "naive" else runs_lib.Run(
        contender, make, jax.random.key(0), params).compile(
            BUDGET / (step * candidates_lib.EQUAL_COST_FACTOR), max(1, round(piece / (8 * step))))
    for k in range(4):
      run = runs_lib.Run(contender, make, jax.random.key(100 + k), params)
      run.continue_from(naive, program_c, RACE_AT)
      run.start_race(first_update=cname != "naive")
      race(run)
      ends.setdefault(cname, []).append(elbo(run.params))
  for cname, values in ends.items():
    if cname != "naive":
      gains = np.asarray(values) - np.asarray(ends["naive"])
      print(f"  {cname:12s} {gains.mean():+9.0f} (sd over keys {gains.std(ddof=1):.0f})")


if __name__ == "__main__":
  main()
