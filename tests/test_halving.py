"""Successive halving's rule for the step-limited start of a run (dsgrad.advice.halving), on
lanes whose ELBO is a known function of the time they have run: no model is compiled, so
which lane the race keeps, and how far it races them, is exact."""

import types

import numpy as np
import pytest

from dsgrad.advice import halving
from dsgrad.advice import race as race_lib
from dsgrad.advice import race_elbo

NOISE = np.random.default_rng(0).normal(size=64)  # common random numbers


class CurveLane:
  """A lane whose ELBO after a fraction ``t`` of the budget is ``-scale A / t - floor``:
  ``scale`` is how much more time than naive it needs for the same early progress (its
  step cost over naive's, at equal progress per step), ``floor`` where it levels off."""

  def __init__(self, name, scale, floor, amplitude=0.2, total=10 ** 7):
    self.contender = types.SimpleNamespace(name=name)
    self.scale, self.floor, self.amplitude = scale, floor, amplitude
    self.total_steps, self.steps, self.chunk, self.trace = total, 0, 1, []
    self.seconds_per_step = 1.0 / total

  def advance_to(self, fraction):
    self.steps = max(self.steps, int(round(fraction * self.total_steps)))

  def continue_from(self, other, fraction):
    self.steps = int(round(fraction * self.total_steps))

  def prepare(self, length):
    pass

  @property
  def fraction(self):
    return self.steps / self.total_steps

  @property
  def params(self):
    return self

  def elbo(self):
    return -self.scale * self.amplitude / max(self.fraction, 1e-12) - self.floor


def _race(lanes, share):
  evaluate = lambda lane: lane.elbo() + NOISE
  return race_lib.race(lanes, 0, evaluate, share, lambda message: None)


def _rounds(trace):
  return len(trace) - 1


def test_a_lane_within_one_doubling_of_naive_is_kept_and_wins_where_it_overtakes():
  """joint SVRG's step costs 1.8x naive's: early it trails naive, a larger batch and more
  samples, but it is ahead of where naive was at half the time, and it levels off
  higher. Plain halving drops it after the first round and ends with the batch; the rule
  keeps it, and the final round shows it ahead. A lane 19x slower to progress (joint SAGA
  with a dense table) is dropped after the first round all the same."""
  names = ["naive", "naive_batch", "naive_samples", "joint_svrg", "joint_saga"]
  lanes = [CurveLane("naive", 1.0, 10.0), CurveLane("naive_batch", 1.05, 8.0),
           CurveLane("naive_samples", 1.1, 9.0), CurveLane("joint_svrg", 1.8, 0.0),
           CurveLane("joint_saga", 19.0, 0.0)]
  traces = _race(lanes, share=0.12)
  by_name = dict(zip(names, (traces[i] for i in range(len(lanes)))))
  assert _rounds(by_name["joint_saga"]) == 1
  furthest = max(_rounds(t) for t in traces.values())
  assert _rounds(by_name["joint_svrg"]) == furthest
  final = {n: t[-1][-1][1].mean() for n, t in by_name.items() if _rounds(t) == furthest}
  assert max(final, key=final.get) == "joint_svrg"
  # The extra lanes' rounds fit the share: every lane's fraction is budget spent.
  assert sum(lane.fraction for lane in lanes) <= 0.12 + 1e-6


def test_without_a_close_lane_the_plan_is_plain_successive_halving():
  """Every other lane far slower than naive: none is within one doubling, so the rounds
  end at the planned fractions with the planned lanes, the share spent exactly."""
  lanes = [CurveLane("naive", 1.0, 0.0)] + [CurveLane(f"slow{i}", 8.0 + i, 0.0)
                                            for i in range(4)]
  traces = _race(lanes, share=0.12)
  fractions, counts = halving.halving_fractions(5, 0.12)
  naive_ends = [points[-1][0] for points in traces[0][1:]]
  assert naive_ends == pytest.approx(fractions, rel=1e-6)
  raced = [sum(_rounds(t) > r for t in traces.values()) for r in range(len(counts))]
  assert raced == counts
  assert sum(lane.fraction for lane in lanes) == pytest.approx(0.12, rel=1e-6)


@pytest.mark.parametrize("counts", [[3], [4, 2], [6, 3, 2]])
def test_a_replanned_race_spends_what_is_left(counts):
  """The growth factor solves the remaining rounds' cost; at the plan's own counts and
  share it is the plan's doubling."""
  now, remaining = 0.01, 0.05
  plan = halving.replan(now, counts, remaining)
  ends = [now] + plan
  spent = sum(c * (b - a) for c, a, b in zip(counts, ends, ends[1:]))
  assert spent == pytest.approx(remaining, rel=1e-9) or plan[0] / now == pytest.approx(2.0)
  fractions, planned = halving.halving_fractions(5, 0.12)
  again = halving.replan(fractions[0], planned[1:], 0.12 - planned[0] * fractions[0])
  assert again == pytest.approx(fractions[1:], rel=1e-9)
  assert halving.replan(now, counts, remaining, least=10.0) is None


@pytest.mark.parametrize("origin", [0.0, 0.02])
@pytest.mark.parametrize("num_lanes", [2, 5])
def test_the_planned_estimates_are_the_ones_a_race_makes(num_lanes, origin):
  """The share prices a race's ELBO estimates before it runs: where no lane is kept
  beyond the plan, the count it prices is the count made (naive's halfway estimate only
  where there is a second round; the start's where the race starts after naive's)."""
  lanes = [CurveLane("naive", 1.0, 0.0)] + [CurveLane(f"slow{i}", 8.0 + i, 0.0)
                                            for i in range(num_lanes - 1)]
  calls = []
  evaluate = lambda lane: calls.append(lane) or lane.elbo() + NOISE
  race_lib.race(lanes, 0, evaluate, 0.12, lambda message: None,
                start=None if origin else NOISE, origin=origin)
  assert len(calls) == race_elbo.estimates_needed(num_lanes, 0.12, own_start=origin > 0)
