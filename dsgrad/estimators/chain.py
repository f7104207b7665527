"""How a dsgrad estimator composes with other optax transformations.

An estimator corrects the *raw* gradient, so in an ``optax.chain`` it comes before any
transformation that rescales the gradient (Adam's moments, clipping, a schedule):
``optax.chain(dsgrad.joint_saga(...), optax.adam(...))``. :func:`check_chain_order`
refuses a chain built the other way round, which would run without error and give
wrong updates.
"""

from __future__ import annotations

import jax


def _is_estimator_state(state) -> bool:
  # Imported here: the estimator modules import this one.
  from dsgrad.estimators._weights import AdaptiveWeightState
  from dsgrad.estimators.inc import IncState
  from dsgrad.estimators.saga import JointSagaState
  from dsgrad.estimators.smiso import SmisoState
  from dsgrad.estimators.svrg import JointSvrgState
  kinds = (JointSagaState, JointSvrgState, IncState, SmisoState, AdaptiveWeightState)
  return any(isinstance(s, kinds) for s in
             jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, kinds)))


def check_chain_order(opt_state, where: str) -> None:
  """Refuses an ``optax.chain`` state in which a stateful transform (Adam's moments, a
  schedule's count, ...) comes before a dsgrad estimator: that transform rescales the
  gradient before the estimator corrects it, and every update would be wrong."""
  if not isinstance(opt_state, tuple) or hasattr(opt_state, "_fields"):
    return
  for position, member in enumerate(opt_state):
    if _is_estimator_state(member):
      before = [i for i, s in enumerate(opt_state[:position]) if jax.tree.leaves(s)]
      if before:
        raise ValueError(
            f"{where}: the optimizer chains a stateful transform (position {before[0]}, "
            f"state {type(opt_state[before[0]]).__name__}) before the dsgrad estimator "
            f"(position {position}). The estimator corrects the gradient, so it must "
            "come first: optax.chain(dsgrad.joint_saga(...), optax.adam(...)).")
      check_chain_order(member, where)
      return
    check_chain_order(member, where)
