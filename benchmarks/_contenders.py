"""What the peers benchmarks share: a contender as they time it (:class:`Runner`) and
dsgrad's own contender, :func:`dsgrad.train_step` in a scan. Its own module, so that the
task modules (``peers``, ``peers_vae``) import it and not each other."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax

import dsgrad


class Runner(NamedTuple):
  """One contender at one learning rate: ``init(key) -> state`` (may include a full
  pass), ``segment(state, indices (S, B), keys (S,)) -> state`` (jit-compiled by the
  caller) and ``params(state) -> (loc, log_scale)`` flat, row-major ``(D, K)``."""

  init: Callable
  segment: Callable
  params: Callable


def train_step_runner(objective, opt, initial: Callable, params_of: Callable) -> Runner:
  """A dsgrad contender: :func:`dsgrad.train_step` with ``opt`` (an estimator chained
  with Adam) in a scan, from ``initial()``."""

  def segment(state, indices, keys):
    def step(carry, xs):
      return dsgrad.train_step(objective, opt, *carry, *xs), None
    return jax.lax.scan(step, state, (indices, keys))[0]

  def init(key):
    del key
    params = initial()
    return params, opt.init(params)

  return Runner(init, segment, params_of)
