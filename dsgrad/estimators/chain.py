"""How a dsgrad estimator composes with other optax transformations: the chain-order rule.

An estimator corrects the *raw* mini-batch gradient, so in an ``optax.chain`` it comes
first: ``optax.chain(dsgrad.joint_saga(...), optax.adam(...))``. The rule, in one place:

* **Nothing may stand before an estimator in a chain**: not a stateful transform (Adam's
  moments, a schedule's count) and not a stateless one (``optax.clip_by_global_norm``,
  ``optax.scale``, whose states are empty). Each changes the gradient the estimator
  corrects, and a clipping threshold may do so only on some steps, so no check of the
  first update's values can see it.
* **A transformation may contain an estimator**: a wrapper whose state holds the chain's
  (``optax.inject_hyperparams``, ``optax.apply_if_finite``) is looked through, and an
  ensemble that maps the whole chain over a batch of models (``jax.vmap`` of its ``init``
  and ``update``) has the chain's state with a leading model axis: the same structure,
  in the same order, so it passes.

:func:`check_chain_order` applies the rule to an optimizer state's structure (no
values: it costs nothing and runs at trace time); :func:`dsgrad.fit` and
:func:`dsgrad.train_step` call it, and a hand-written loop gets the same rule from
:func:`checked` (``dsgrad.checked(optimizer)`` in place of ``optimizer``). Without it, the
joint estimators' first-update check compares the incoming gradient with the objective's
and catches a transformation that changed it on that step; ``cv`` keeps no step count
and has no such check, and a clipping threshold may change the gradient only later.
"""

from __future__ import annotations

from typing import NamedTuple

import optax


class FixedWeightState(NamedTuple):
  """The state of a control variate with a fixed weight ``c`` (no fields): it marks the
  estimator's place in a chain for :func:`check_chain_order`."""


def _estimator_kinds():
  # Imported here: the estimator modules import this one.
  from dsgrad.estimators._weights import AdaptiveWeightState
  from dsgrad.estimators.inc import IncState
  from dsgrad.estimators.saga import JointSagaState
  from dsgrad.estimators.smiso import SmisoState
  from dsgrad.estimators.svrg import JointSvrgState
  return (JointSagaState, JointSvrgState, IncState, SmisoState, AdaptiveWeightState,
          FixedWeightState)


def _members(state):
  """The sub-states of a container state: a chain's tuple, a wrapper's NamedTuple
  fields, a ``multi_transform``'s dict or list."""
  if isinstance(state, dict):
    return list(state.values())
  if isinstance(state, (tuple, list)):
    return list(state)
  return []


def _is_chain(state) -> bool:
  """An ``optax.chain``'s state: a plain tuple of its members' states (a NamedTuple is one
  transformation's state)."""
  return isinstance(state, tuple) and not hasattr(state, "_fields")


def _holds_estimator(state, kinds) -> bool:
  if isinstance(state, kinds):
    return True
  return any(_holds_estimator(s, kinds) for s in _members(state))


def check_chain_order(opt_state, where: str) -> None:
  """Refuses an optimizer state in which any transformation stands before a dsgrad
  estimator in an ``optax.chain`` (see the module docstring for the rule).

  Args:
    opt_state: the optimizer's state, or its abstract shapes (only the structure is
      read).
    where: the caller's name, for the message.

  Raises:
    ValueError: naming the position and state type of the first transformation before
      the estimator.
  """
  kinds = _estimator_kinds()

  def walk(state):
    if isinstance(state, kinds):
      return
    is_chain = _is_chain(state)
    members = _members(state)
    for position, member in enumerate(members):
      if not _holds_estimator(member, kinds):
        continue
      if is_chain and position > 0:
        first = type(members[0]).__name__
        raise ValueError(
            f"{where}: the optimizer chains a transformation (position 0, state {first}) "
            f"before the dsgrad estimator (position {position}). The estimator corrects "
            "the raw mini-batch gradient, so it must come first: nothing may come before "
            "it, stateful (Adam, a schedule) or not (clipping, scaling). Write "
            "optax.chain(dsgrad.joint_saga(...), optax.clip_by_global_norm(...), "
            "optax.adam(...)).")
      walk(member)

  walk(opt_state)


def computes_own_gradient(opt_state) -> bool:
  """Whether an optimizer with this state may be called in the fused form,
  ``update(None, state, params, indices=..., noise=..., objective=...)``: its first
  transformation is a dsgrad estimator, which then computes the naive gradient itself in
  the same program as its control variate (one read of the batch). Only the structure
  is read. A plain chain is looked into; a wrapper (``optax.inject_hyperparams``,
  ``optax.apply_if_finite``) is not, since it may read the incoming gradient itself.
  """
  kinds = _estimator_kinds()
  state = opt_state
  while True:
    if isinstance(state, kinds):
      return True
    if not _is_chain(state) or not state:
      return False
    state = state[0]


def checked(optimizer) -> optax.GradientTransformationExtraArgs:
  """``optimizer`` with the chain rule :func:`dsgrad.fit` applies, for a loop of your own.

  Its ``init`` and ``update`` are ``optimizer``'s, after :func:`check_chain_order` on the
  state (at trace time, from the structure alone: nothing is computed).

  Args:
    optimizer: an optax transformation, e.g. ``optax.chain(dsgrad.cv(objective),
      optax.adam(1e-2))``.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Raises:
    ValueError: from ``init`` or ``update``, when a transformation stands before a dsgrad
      estimator in a chain (clipping before ``cv``, say), naming its position.

  Example::

    >>> import jax, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 50, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = dsgrad.meanfield_init(objective.source[1])
    >>> wrong = optax.chain(optax.clip_by_global_norm(1.0), dsgrad.cv(objective))
    >>> try:
    ...   dsgrad.checked(wrong).init(params)
    ... except ValueError as error:
    ...   print(str(error)[:58])
    dsgrad.checked: the optimizer chains a transformation (pos
    >>> right = dsgrad.checked(optax.chain(dsgrad.cv(objective), optax.clip_by_global_norm(1.0)))
    >>> state = right.init(params)
  """
  optimizer = optax.with_extra_args_support(optimizer)

  def init(params):
    state = optimizer.init(params)
    check_chain_order(state, "dsgrad.checked")
    return state

  def update(updates, state, params=None, **extra_args):
    check_chain_order(state, "dsgrad.checked")
    return optimizer.update(updates, state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(init, update)

