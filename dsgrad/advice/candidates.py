"""The ways to train that :func:`dsgrad.recommend` races, as contenders: an estimator, a
noise control, or an equal-cost use of naive's time, each with the objective and batch
size it steps on."""

from __future__ import annotations

import math
from typing import NamedTuple

from dsgrad import estimators
from dsgrad.approx.sparse import sparse_linearize
from dsgrad import noise as noise_lib
from dsgrad.advice import race as race_lib

CANDIDATES = ("naive", "joint_svrg", "naive_batch", "cv", "naive_samples", "path_derivative",
              "rqmc", "joint_saga")
"""What :func:`recommend` can race: naive; the control variates ``cv``, ``joint_svrg``
and ``joint_saga``; naive with the path-derivative ("sticking the landing") gradient
(mean-field Gaussian objectives); naive with ``K`` randomized QMC samples per datum
(Gaussian noise); and the equal-cost baselines: naive with ``K`` independent samples per
datum, and naive with a ``K``-times larger batch, ``K`` the control variates' cost in naive
steps where step costs are given, else 2.

The default order is :func:`recommend`'s priority, compiled two at a time: each control
variate is paired with a naive variant. On a held-out MLP the best at minute budgets was a
larger batch or more samples on two seeds of three, and a share spent on the control
variates first had no room left to race them; on a hierarchical model a control variate
was best. Joint SVRG comes before cv: its control variate also takes out subsampling
noise, at about cv's cost per step (1.4-2.0 naive steps both, on the held-out models),
and on a hierarchical model of 10^6 data it ended 97 nats above cv where the share could
compile only one of them. Joint SAGA comes last: its table is the largest state and its
step the slowest to compile."""


class Candidate(NamedTuple):
  """What :func:`dsgrad.recommend` measured for one candidate.

  Attributes:
    name: a name from :data:`CANDIDATES`.
    description: what it is, in words (e.g. ``"naive, 3 MC samples per datum"``).
    seconds_per_step: median of interleaved timing rounds.
    budget_steps: the steps it affords in the budget (its schedule's length).
    state_bytes: its estimator and optimizer state's memory.
    raced_fraction: the fraction of its run (and of the budget) it was raced to.
    elbo: its ELBO at that point, and ``elbo_se`` its standard error.
    gain: its ELBO minus naive's at equal wall-clock, mean over its last round's checkpoints
      (:func:`dsgrad.advice.race.checkpoint_difference`), and ``gain_se`` its standard error.
    time_ratio: the time it took to reach the ELBO naive reached at the end of the race,
      relative to naive's, both counted from the race's start (below 1: faster; ``inf``:
      not reached in the race; ``nan``: naive ended the race no higher than it started).
    note: why it did not race, when it did not.
    rounds: the rounds of successive halving it raced.
    gain_factor: how many ``gain_se`` the gain must exceed to count as a win: 2, or
      Student-t's 97.5% quantile where ``gain_se`` comes from the spread of a few
      checkpoints (:func:`dsgrad.advice.race.gain_factor`; 3.18 for four).
  """

  name: str
  description: str
  seconds_per_step: float = math.nan
  budget_steps: int = 0
  state_bytes: int = 0
  raced_fraction: float = 0.0
  elbo: float = math.nan
  elbo_se: float = math.nan
  gain: float = math.nan
  gain_se: float = math.nan
  time_ratio: float = math.nan
  note: str = ""
  rounds: int = 0
  gain_factor: float = 2.0


EQUAL_COST = ("rqmc", "naive_samples", "naive_batch")

NAIVE_PROGRAMS = ("naive", "path_derivative", "rqmc", "naive_samples", "naive_batch")
"""The candidates whose step is naive's on the objective or a variant of it: their
programs compile in about naive's time (they are priced so by :class:`dsgrad.advice.admission.Share`)."""


def cost_guess(name: str, k: int = 2) -> float:
  """A candidate's step cost in naive steps, guessed before it is compiled: the length
  its first program's schedule is built for (:mod:`dsgrad.advice.step_sizes`).
  From the held-out models of ``python -m benchmarks advice`` on two CPU cores: the path
  derivative 1.1-1.35 naive steps, cv and joint SVRG 1.4-2.0, ``K = 2`` samples or batch
  0.7-1.8; joint SAGA's dense table 15-21 (it is compiled again)."""
  if name in ("naive", "path_derivative"):
    return 1.0 if name == "naive" else 1.2
  if name in EQUAL_COST:
    return (1 + k) / 2 * 0.85
  return 1.7


def _declared_table(objective):
  """:func:`dsgrad.approx.sparse_linearize` where a mean-field objective's model declares
  which coordinates each datum reads (``reads``), else ``None``."""
  source = objective.source or ()
  if source[:1] == ("meanfield_gaussian",) and source[1].sparse is not None:
    return sparse_linearize(objective)
  return None


def base_contenders(names, objective, approx, batch_size, max_table_bytes):
  """``[(Contender | None, description, note)]`` for the candidates that need no cost
  ratio."""
  n, out = objective.num_data, []
  for name in names:
    if name in EQUAL_COST:
      continue
    try:
      if name == "naive":
        out.append((name, race_lib.Contender(name, objective, estimators.naive(), batch_size),
                    "naive", ""))
      elif name == "path_derivative":
        source = objective.source or ()
        if source[:1] != ("meanfield_gaussian",):
          out.append((name, None, "naive, path derivative", "only for objectives made by "
                      "dsgrad.meanfield_gaussian (build yours with path_derivative=True)"))
          continue
        from dsgrad.families.gaussian import meanfield_gaussian
        # The objective's data (a with_data copy's), not those its source was built on.
        variant = meanfield_gaussian(source[1]._replace(data=objective.data),
                                     shared_noise=objective.shared_noise, path_derivative=True)
        out.append((name, race_lib.Contender(name, variant, estimators.naive(), batch_size),
                    "naive, path derivative (sticking the landing)", ""))
      else:
        factory = getattr(estimators, name)
        extra = ({"every": max(1, n // batch_size)} if name == "joint_svrg" else
                 {"max_table_bytes": max_table_bytes} if name == "joint_saga" else {})
        own = _declared_table(objective) if name == "joint_saga" and approx is None else None
        out.append((name, race_lib.Contender(name, objective,
                                             factory(objective, own or approx, **extra),
                                             batch_size),
                    "joint_saga, a table of the rows each datum reads" if own else name, ""))
    except MemoryError as error:
      out.append((name, None, name, str(error).split(". ")[0]))
  return out


def equal_cost_contenders(names, objective, batch_size, k):
  """``[(name, Contender | None, description, note)]`` for the equal-cost candidates:
  ``k`` samples per datum, or a ``k``-times batch (``k`` from
  :func:`dsgrad.advice.admission.equal_cost_k`)."""
  out = []
  for name in names:
    if name == "naive_samples":
      out.append((name, race_lib.Contender(name, noise_lib.multi_sample(objective, k),
                                     estimators.naive(), batch_size),
                  f"naive, {k} MC samples per datum", ""))
    elif name == "rqmc":
      if getattr(objective.noise_fn, "gaussian", None) is None:
        out.append((name, None, f"naive, {k} RQMC samples",
                    "the noise is not dsgrad.gaussian_noise"))
        continue
      try:
        samples = noise_lib.multi_sample(objective, k, sampler="rqmc")
      except ValueError as error:  # more noise coordinates than Sobol dimensions
        out.append((name, None, f"naive, {k} RQMC samples", str(error).split("; ")[0]))
        continue
      out.append((name, race_lib.Contender(name, samples, estimators.naive(), batch_size),
                  f"naive, {k} randomized QMC samples per datum", ""))
    elif name == "naive_batch":
      big = min(objective.num_data, k * batch_size)
      if big == batch_size:  # a race against itself
        out.append((name, None, "naive, a larger batch",
                    f"the batch is already all {objective.num_data} data"))
        continue
      out.append((name, race_lib.Contender(name, objective, estimators.naive(), big),
                  f"naive, batch {big}", ""))
  return out
