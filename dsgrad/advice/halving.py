"""Successive halving's plan: how far each round races its lanes, and which lanes stay.

A race compares lanes at equal wall-clock: after a fraction ``f`` of its run every lane
has spent ``f`` of the budget. Plain successive halving keeps the better half after each
round. Early in a run that rule can drop the run's eventual winner: progress there is
limited by the number of steps, so the lane with the cheapest step leads, and a control
variate, whose step costs more but whose gradient is less noisy, overtakes only later
(on a hierarchical model of 20,000 data joint SVRG was 574 nats behind naive at 0.1% of
the budget and led it from about 0.7%; on one of 10^6 data the reference race dropped
it at 4% while it ended 57 nats above the lane it kept).

So a lane outside the better half stays while it is *within one doubling of naive*: at
time ``f`` its ELBO is at least naive's at its previous checkpoint (at ``f / 2`` or
later), so it reaches naive's level in at most twice naive's time. A lane that costs at
most twice naive's step and progresses as much per step always is, early on. Keeping it
costs share: the remaining rounds are re-planned from the share left, each growing the
run by a common factor (2 in the plan), and the extra lanes are kept only where that
factor stays at least :data:`MIN_GROWTH`. Where no lane qualifies the plan is unchanged.

References:
  Jamieson, Talwalkar (2016). Non-stochastic best arm identification and hyperparameter
  optimization. AISTATS (successive halving).
"""

from __future__ import annotations

import numpy as np

MIN_GROWTH = 1.5
"""The least factor by which each re-planned round grows the runs where extra lanes are
kept: at a smaller one, a round's end is too close to its start for the lanes' ELBOs to
move apart by more than their noise, and the race would spend its share comparing lanes
it cannot yet tell apart."""


def halving_fractions(num_lanes: int, share: float) -> tuple[list, list]:
  """``(fractions, counts)``: successive halving with a reference that always races.

  Round ``r`` takes its ``counts[r]`` lanes (the reference and the best half, rounded up,
  of the other lanes still racing) from ``fractions[r - 1]`` to ``fractions[r] = 2^r
  fractions[0]`` of their runs; the last round has the reference and one other lane.
  The rounds together cost ``share`` of the budget: each lane spends the same fraction
  of the budget as of its run.
  """
  others, counts = num_lanes - 1, [num_lanes]
  while others > 1:
    others = (others + 1) // 2
    counts.append(others + 1)
  # Round r costs counts[r] (f_r - f_{r-1}) = counts[r] 2^(r-1) f_0 (f_{-1} = 0).
  unit = counts[0] + sum(c * 2 ** (r - 1) for r, c in enumerate(counts[1:], start=1))
  first = share / unit
  return [first * 2 ** r for r in range(len(counts))], counts


def replan(now: float, counts: list, remaining: float, least: float = 1.0) -> list | None:
  """The fractions of the rounds after ``now`` (the fraction the last round reached),
  with ``counts[j]`` lanes in the ``j``-th of them, that spend ``remaining`` of the budget:
  round ``j`` ends at ``now g^(j+1)``, the growth ``g`` (at most 2) solving
  ``now sum_j counts[j] g^j (g - 1) = remaining``. ``None`` where ``g`` would be below
  ``least``."""
  if now <= 0 or not counts:
    return None
  cost = lambda g: now * sum(c * g ** j * (g - 1) for j, c in enumerate(counts))
  if cost(max(least, 1.0)) > remaining:
    return None
  low, high = max(least, 1.0), 2.0
  if cost(high) <= remaining:
    low = high
  for _ in range(60):  # cost is increasing in g: bisection
    middle = 0.5 * (low + high)
    low, high = (middle, high) if cost(middle) <= remaining else (low, middle)
  return [now * low ** (j + 1) for j in range(len(counts))]


def within_one_doubling(difference: float, standard_error: float) -> bool:
  """Whether a lane's ELBO minus naive's at naive's previous checkpoint (paired, common
  random numbers) says it is not behind naive's pace by more than one doubling of time:
  not below zero by more than two standard errors."""
  return bool(difference + 2 * standard_error >= 0)


def survivors(ranked: list, planned: int, close: list, now: float, later_counts: list,
              remaining, replanned: bool) -> tuple[list, list | None]:
  """``(kept, fractions)`` after a round: the best ``planned`` of ``ranked`` (the other
  lanes, best first), and the lanes of ``close`` (those within one doubling of naive)
  beyond them where the share left lets the remaining rounds grow the runs by
  :data:`MIN_GROWTH` or more with them.

  Args:
    remaining: ``lanes in the next round -> share left`` (what the lanes have spent so
      far, and the estimates that many lanes would add beyond the plan's, taken off).
    replanned: whether an earlier round changed the plan (then the remaining rounds are
      re-planned whatever is kept).

  Returns:
    ``fractions``, the remaining rounds' (the next with the kept lanes and naive, the
    later ones with ``later_counts`` lanes), or ``None`` where the plan stands.
  """
  kept = ranked[:planned]
  extra = [i for i in ranked[planned:] if i in close]
  if extra:
    lanes = len(kept) + len(extra) + 1
    plan = replan(now, [lanes, *later_counts], remaining(lanes), MIN_GROWTH)
    if plan is not None:
      return kept + extra, plan
  if not replanned:
    return kept, None
  lanes = len(kept) + 1
  plan = replan(now, [lanes, *later_counts], remaining(lanes))
  # Nothing left to spend (the extra lanes' rounds overran by a chunk): the remaining
  # rounds still compare the lanes, a tenth further on each.
  return kept, plan or [now * 1.1 ** (j + 1) for j in range(1 + len(later_counts))]


def round_estimates(counts: list, final_checkpoints: int) -> int:
  """The ELBO estimates of rounds with ``counts`` lanes each: one per lane in every round
  but the last, ``final_checkpoints`` per lane in the last."""
  return int(np.sum(counts[:-1])) + counts[-1] * final_checkpoints


def estimates_planned(counts: list, final_checkpoints: int) -> int:
  """The ELBO estimates a race with ``counts`` lanes per round makes after the start's:
  its rounds' (:func:`round_estimates`) and, where there is a round after the first,
  naive's extra one halfway through the first (a race of one round keeps no lane
  beyond its plan, so it needs no pace to compare with)."""
  return round_estimates(counts, final_checkpoints) + (len(counts) > 1)
