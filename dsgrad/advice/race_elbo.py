"""The ELBO estimates a race compares its lanes on: how much data each reads, so that
together they take a bounded part of the advice's time.

A full-data estimate reads every datum once per Monte Carlo draw. On large data that is
more work than the race can afford: at 10^6 data, 64 draws of a hierarchical model took
0.64 s on two CPU cores, and the race needs about 25 of them, against a 5 s share of a
minute's budget. Each draw then reads a sample of the data instead, drawn uniformly with
replacement (unbiased, its spread in the standard error), the same rows and noise for
every lane (common random numbers). On that model the standard error per second of
estimating was the same for sampled and full passes (within 10% from 4,096 to 65,536
rows), so the sample costs precision only in proportion to the time it saves.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import numpy as np

from dsgrad import diagnostics
from dsgrad.advice import halving
from dsgrad.advice import race as race_lib
from dsgrad.objective import Objective

ESTIMATES_SHARE = 0.25
"""The part of the advice's share its ELBO estimates may take, all of them together."""


class Estimates(NamedTuple):
  """The race's ELBO estimates, as chosen.

  Attributes:
    evaluate: ``params -> draws`` (numpy float64), the same data and noise every call.
    start: the draws at the start.
    seconds: one estimate's measured time (0 when nothing is priced).
    rows: the data each draw reads (``num_data``: a full pass).
    num_data: ``N``.
    num_samples: draws per estimate.
  """

  evaluate: Callable
  start: np.ndarray
  seconds: float
  rows: int
  num_data: int
  num_samples: int

  def describe(self) -> str:
    """One line of the advice: what each estimate read."""
    if self.rows >= self.num_data:
      return f"ELBO estimates: {self.num_samples} draws, each a full pass over the data."
    return (f"ELBO estimates: {self.num_samples} draws, each on {self.rows:,} of the "
            f"{self.num_data:,} data drawn at random (the same for every candidate), to "
            f"keep them within {ESTIMATES_SHARE:.0%} of the advice's share.")


def estimates_needed(num_lanes: int, share: float, own_start: bool = False) -> int:
  """The ELBO estimates a race of ``num_lanes`` makes after the start's, as planned
  (:func:`dsgrad.advice.halving.estimates_planned`; lanes kept beyond the plan pay for theirs
  out of the race's share), and the start's where the race estimates it itself
  (``own_start``: it starts from naive's run, past the parameters estimated first)."""
  counts = halving.halving_fractions(num_lanes, share)[1]
  return halving.estimates_planned(counts, race_lib.FINAL_CHECKPOINTS) + own_start


def choose(objective: Objective, params, key, num_samples: int, rows, allowed: float | None,
           num_candidates: int, share: float, chunk_size: int = 4096) -> Estimates:
  """The race's estimates: on ``rows`` data per draw (an integer, rounded up to whole
  chunks; at least ``N`` is a full pass), or with ``rows="auto"`` on as many as keep all
  of them within :data:`ESTIMATES_SHARE` of ``allowed`` seconds (a full pass where that
  fits, or where nothing is priced: ``allowed`` None).

  With ``"auto"`` and something priced, one chunk's estimate is timed first (its
  program takes the row count as an argument: it compiles once), and the full pass's
  cost is that time times its chunks.
  """
  n = objective.num_data
  program = diagnostics.sampled_elbo_draws(objective, num_samples, chunk_size)
  chunk = max(1, min(chunk_size, n))
  call = lambda p, r: diagnostics.finite_elbo_draws(program(p, key, r), "dsgrad.recommend")
  timed = None  # (rows, seconds, draws) of an estimate already timed
  if rows == "auto" and allowed is not None and chunk < n:
    call(params, chunk)  # compiles
    timed = (chunk, *_timed(call, params, chunk))
    target = ESTIMATES_SHARE * allowed / (1 + estimates_needed(num_candidates, share))
    chunks = int(target // timed[1])
    rows = n if chunks * chunk >= n else max(1, chunks) * chunk
  # A sample reads whole chunks: say what it reads.
  rows = n if rows == "auto" else min(-(-int(rows) // chunk) * chunk, n)
  if timed is None:
    start = call(params, rows)  # compiles
    if allowed is None:
      return Estimates(lambda p: call(p, rows), start, 0.0, rows, n, num_samples)
  if timed is None or timed[0] != rows:
    timed = (rows, *_timed(call, params, rows))
  _, seconds, start = timed
  return Estimates(lambda p: call(p, rows), start, seconds, rows, n, num_samples)


def _timed(call, params, rows):
  started = time.perf_counter()
  draws = call(params, rows)
  return time.perf_counter() - started, draws
