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
:func:`dsgrad.checked` (``dsgrad.checked(optimizer, objective)`` in place of
``optimizer``), which also compares the incoming gradient with the objective's each step.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad.training import compile_cache


class _DescentProbe:
  """The ``indices`` of :func:`check_descends`'s probe update: an estimator handed it
  returns the incoming gradient unchanged, so that the rule chained after it is probed
  without a batch, a table or a compile of the estimator's maths."""

  def __repr__(self) -> str:
    return "DESCENT_PROBE"


DESCENT_PROBE = _DescentProbe()


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


def check_chain_order(opt_state, where: str, *, steps: bool = False) -> None:
  """Refuses an optimizer state in which any transformation stands before a dsgrad
  estimator in an ``optax.chain`` (see the module docstring for the rule).

  Args:
    opt_state: the optimizer's state, or its abstract shapes (only the structure is
      read).
    where: the caller's name, for the message.
    steps: the optimizer's output is the step applied to the params (as in
      :func:`dsgrad.fit`), so it may not end with an estimator, whose output is a
      gradient: applied as a step it would climb the loss.

  Raises:
    ValueError: naming the position and state type of the first transformation before
      the estimator; :func:`dsgrad.smiso` chained with anything (it outputs steps); with
      ``steps``, an optimizer that ends with an estimator (other than smiso).
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
      if is_chain and position > 0 and _holds_estimator(members[0], kinds):
        raise ValueError(
            f"{where}: the optimizer chains two dsgrad estimators (positions 0 and "
            f"{position}). Each corrects the raw mini-batch gradient, not another's "
            "output: chain one, e.g. optax.chain(dsgrad.joint_svrg(...), optax.adam(...)).")
      if is_chain and position > 0:
        first = type(members[0]).__name__
        raise ValueError(
            f"{where}: the optimizer chains a transformation (position 0, state {first}) "
            f"before the dsgrad estimator (position {position}). The estimator corrects "
            "the raw mini-batch gradient, so it must come first: nothing may come before "
            "it, stateful (Adam, a schedule) or not (clipping, scaling). Write "
            "optax.chain(dsgrad.joint_saga(...), optax.clip_by_global_norm(...), "
            "optax.adam(...)).")
      if is_chain and len(members) > 1 and type(member).__name__ == "SmisoState":
        raise ValueError(
            f"{where}: dsgrad.smiso is chained with {len(members) - 1} other "
            "transformation(s). SMISO is an optimizer in its own right (App. A): its output "
            "is already the parameter step, which a transform after it would change. Use it "
            "alone: dsgrad.fit(objective, dsgrad.smiso(objective, step_size), ...).")
      walk(member)

  walk(opt_state)
  last = opt_state
  while _is_chain(last) and last:
    last = last[-1]
  if steps and isinstance(last, kinds) and type(last).__name__ != "SmisoState":
    raise ValueError(
        f"{where}: the optimizer ends with a dsgrad estimator, whose output is a gradient "
        "estimate, not a step: applied as one it would climb the loss. Chain an update rule "
        "after it: optax.chain(dsgrad.joint_svrg(...), optax.adam(1e-2)).")


def check_descends(optimizer, opt_state, params, where: str, enabled: bool = True):
  """Refuses an update rule whose first step climbs the loss, or is not finite from a
  finite gradient (a NaN or inf learning rate), and returns ``opt_state``
  (``optimizer.init(params)`` made here when ``None``).

  dsgrad adds the optimizer's output to the params, as optax does, so the output must
  point downhill: ``optax.sgd(1e-2)`` and ``optax.adam(1e-2)`` negate the gradient
  themselves. ``optax.identity()``, ``optax.scale(+c)`` or a negative learning rate step
  uphill: training then climbs the loss until it overflows, or (Adam, whose steps are
  bounded) ends far below where it started without an error. Any descent rule's first
  step from a fresh state has a negative inner product with the gradient, whatever the
  gradient: this one is fed a fixed pseudo-random one (:func:`_probe_gradient`), in one
  compiled program (0.1 s on 60,000 params, where its operations one by one took 0.44 s).
  A dsgrad estimator in the chain passes the probe through unchanged (it is handed
  :data:`DESCENT_PROBE` as its indices), so the rule after it is what is probed:
  ``optax.chain(dsgrad.cv(...), optax.adam(-1e-2))`` climbs as ``optax.adam(-1e-2)``
  does. Skipped where the state holds SMISO (whose output is itself the step) and where
  not ``enabled``.
  """
  opt_state = optimizer.init(params) if opt_state is None else opt_state
  leaves = jax.tree.leaves(params)
  from dsgrad.estimators.smiso import SmisoState  # the estimator modules import this one
  if not enabled or _holds_estimator(opt_state, SmisoState) or not leaves or not all(
      isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating)
      for leaf in leaves):
    return opt_state
  try:
    per_leaf, finite = (np.asarray(a) for a in _along_gradient(opt_state, params,
                                                               optimizer=optimizer))
  except Exception:  # noqa: BLE001  a rule that needs more (a loss value): the step says
    return opt_state
  paths = [jax.tree_util.keystr(path) for path, _ in
           jax.tree_util.tree_flatten_with_path(params)[0]]
  if not finite.all():  # from a gradient of +-1s: the rule's own numbers are not finite
    raise ValueError(
        f"{where}: the optimizer's first update of a finite gradient (+-1 in every entry) "
        f"is not finite (NaN or inf) in params{', params'.join(np.array(paths)[~finite])}: "
        "the update rule itself makes it so, before any data are read. A learning rate or "
        "schedule value that is NaN or inf does this (optax.adam(float('nan')), a schedule "
        "computed from a NaN); check the numbers the rule was built from.")
  per_leaf = per_leaf.astype(np.float64)
  uphill = 0 < per_leaf.sum() < np.inf  # inner products that overflow: no verdict
  if uphill:
    climbing = [path for path, inner in zip(paths, per_leaf) if inner > 0]
    some = (f" Here params{', params'.join(climbing)} climb while the rest descend: a rule "
            "leaves their gradient as it is (optax.masked(rule, mask) does so outside the "
            "mask); to hold them fixed, optax.multi_transform({'train': rule, 'fixed': "
            "optax.set_to_zero()}, labels)." if len(climbing) < len(per_leaf) else "")
    raise ValueError(
        f"{where}: the optimizer's first step climbs the loss (its update points along the "
        "gradient). The update is added to the params, so it must point downhill: optax's "
        "rules take a positive learning rate and negate the gradient themselves "
        "(optax.adam(1e-2), optax.sgd(1e-2)); optax.identity(), optax.scale(c > 0) or a "
        "negative learning rate step uphill." + some)
  return opt_state


def _probe_gradient(params):
  """A fixed pseudo-random gradient of +-1 shaped like ``params``, made inside the
  program from each entry's position (a multiplicative hash): the params' size in random
  normals drawn by NumPy took 16 s for a full-rank family of 20,000 latents (4 x 10^8
  entries) and JAX's threefry 5 s; this takes 0.4 s, and fuses into its one use."""
  leaves, structure = jax.tree.flatten(params)
  probe = []
  for k, leaf in enumerate(leaves):
    position = jax.lax.iota(jnp.uint32, leaf.size).reshape(leaf.shape) + jnp.uint32(7919 * k)
    bit = ((position * jnp.uint32(2654435761)) >> 15) & 1
    probe.append(jnp.where(bit == 1, 1.0, -1.0).astype(leaf.dtype))
  return jax.tree.unflatten(structure, probe)


# One program per optimizer and shapes, whose executable an optimizer made again with the
# same settings finds by its text.
@compile_cache.jit_by_text(static_argnames="optimizer")
def _along_gradient(opt_state, params, *, optimizer):
  """``(<update, probe>, update is finite)`` of each leaf."""
  probe = _probe_gradient(params)
  # A plain GradientTransformation's update takes no extra arguments: optax drops them.
  update = optax.with_extra_args_support(optimizer).update
  updates = update(probe, opt_state, params, indices=DESCENT_PROBE, noise=None,
                   objective=None)[0]
  pairs = list(zip(jax.tree.leaves(updates), jax.tree.leaves(probe)))
  return (jnp.stack([jnp.vdot(u.astype(jnp.float32), g.astype(jnp.float32))
                     for u, g in pairs]),
          jnp.stack([jnp.all(jnp.isfinite(u)) for u, _ in pairs]))


def named_missing_arguments(error: TypeError, where: str) -> TypeError:
  """``error``, or, where an update asked for keyword arguments that a dsgrad step does
  not pass (optax's bare "missing 3 required keyword-only arguments"), an error that says
  which, and what to use instead."""
  # Python names the function: an optax or dsgrad ``update_fn``, not the user's model.
  missing = re.search(r"update\w*\(\) missing \d+ required keyword-only arguments?: (.+)$",
                      str(error))
  if missing is None:
    return error
  if "'indices'" in missing.group(1):
    return TypeError(
        f"{where}: a dsgrad estimator received no indices and noise: it sits inside a "
        "wrapper that does not forward extra arguments to what it wraps (optax.MultiSteps). "
        "Put the estimator before the wrapper: optax.chain(dsgrad.cv(objective), "
        "optax.MultiSteps(optax.adam(1e-2), k))")
  return TypeError(
      f"{where}: the optimizer's update needs {missing.group(1)}, which a dsgrad step does "
      "not pass: it calls update(grads, state, params, indices=..., noise=..., "
      "objective=...). A rule that needs the loss's value (optax.lbfgs, a line search, "
      "optax.contrib.reduce_on_plateau) does not apply to a doubly-stochastic objective, "
      "whose values are noisy estimates: use a first-order rule (optax.adam)")


def holds_estimator(opt_state) -> bool:
  """Whether a dsgrad estimator (one that corrects the gradient with the batch's indices
  and noise) is in this optimizer state, at any depth."""
  return _holds_estimator(opt_state, _estimator_kinds())


def fused_update(optimizer, opt_state, params, *, indices, noise, objective):
  """One update in which the estimator first in the chain computes the naive gradient
  itself, in one program with its control variate, from one read of the batch's rows
  (:class:`dsgrad.approx.FusedTerms`; the numbers are those of passing the gradient).
  :func:`dsgrad.train_step` and :func:`dsgrad.fit` step this way.

  Args:
    optimizer: an optax transformation whose first member is a dsgrad estimator
      (:func:`computes_own_gradient` of its state).
    opt_state: its state.
    params: current params.
    indices: the batch's datum indices.
    noise: the batch's noise.
    objective: the objective (a jit argument of the caller's step carries its data).

  Returns:
    ``(updates, new state)``, as ``optimizer.update`` returns them.

  Raises:
    ValueError: the optimizer's first transformation is not a dsgrad estimator (pass
      the gradient to ``optimizer.update`` instead).
  """
  if not computes_own_gradient(opt_state):
    raise ValueError("dsgrad.fused_update: the optimizer's first transformation is not a "
                     "dsgrad estimator, which would compute the gradient itself; pass "
                     "objective.grad(params, indices, noise) to optimizer.update instead")
  return optimizer.update(None, opt_state, params, indices=indices, noise=noise,
                          objective=objective)


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
