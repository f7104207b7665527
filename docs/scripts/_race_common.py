"""What `race_start_state.py` and `second_look.py` share: a scale-suite model with the
suite's optimizer and an ELBO with common noise, naive alone trained to a fraction of the
budget, and a race piece as `recommend` runs it (three pieces, by `Run.advance_for`)."""

import sys

import jax
import jax.numpy as jnp

from benchmarks import scale_models, scale_suite
from dsgrad import diagnostics
from dsgrad.advice import runs as runs_lib

BUDGET, RACE_SECONDS = 60.0, 1.4


def setup():
  """``(name, objective, params, make_optimizer, elbo)`` for the model and peak named on the
  command line (default: two_index, 0.001); ``elbo(params)`` uses the same noise always."""
  name = sys.argv[1] if len(sys.argv) > 1 else "two_index"
  peak = float(sys.argv[2]) if len(sys.argv) > 2 else 0.001
  model = scale_models.BUILDERS[name]()
  objective = model.objective
  program = diagnostics.sampled_elbo_draws(objective, 4, 4096)

  def elbo(params):
    return float(jnp.concatenate([program(params, jax.random.fold_in(jax.random.key(7), i),
                                          objective.num_data) for i in range(2)]).mean())

  return (name, objective, scale_suite._initial_params(model.dim),
          lambda steps: scale_suite._cosine(peak, steps), elbo)


def naive_alone(contender, make, params, fraction: float):
  """``(run, seconds per step, its program)``: naive, started as `recommend` starts it,
  on its own program once timed, trained alone to ``fraction`` of :data:`BUDGET`."""
  naive = runs_lib.Run(contender, make, jax.random.key(0), params)
  naive.start(naive.compile(10**7, 64))
  naive.advance(128)
  naive.advance(round(0.3 / naive.seconds_per_step))
  step = naive.seconds_per_step
  own = naive.compile(BUDGET / step, 256)
  naive.use(own, naive.seconds / BUDGET)
  while naive.seconds < fraction * BUDGET:
    naive.advance(round(0.5 / step))
  naive.use(own, fraction)
  return naive, step, own


def race(run, seconds: float = RACE_SECONDS) -> None:
  """``seconds`` of ``run``'s steps in three pieces, as `recommend`'s race takes them."""
  for i in range(1, 4):
    run.advance_for(i * seconds / 3 - run.raced_seconds())
