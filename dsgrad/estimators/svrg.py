"""The joint control variate, SVRG version (App. B, Alg. 2)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dsgrad import checks
from dsgrad import tables
from dsgrad.approx import base as approx_lib
from dsgrad.estimators import _common, _weights
from dsgrad.objective import Objective


class JointSvrgState(NamedTuple):
  """State of :func:`joint_svrg`.

  Attributes:
    count: number of updates taken.
    snapshot: the snapshot parameters ``w~``.
    snapshot_mean: ``g_bar = mean_n E_xi grad f~(w~; n, xi)``, the full-data
      noise-integrated approximate gradient at the snapshot.
    control_weight: ``()`` for a fixed weight, else the
      :class:`dsgrad.estimators.AdaptiveWeightState`.
    data_digest: :func:`dsgrad.tables.data_digest` of the data ``g_bar`` was computed on;
      :func:`dsgrad.fit` given this state with other data has the next update take a
      snapshot (:func:`dsgrad.tables.for_data`).
  """

  count: jax.Array
  snapshot: Any
  snapshot_mean: Any
  control_weight: Any = ()
  data_digest: Any = ()


@checks.arguments(objective=checks.objective(), approx=checks.approximation(),
                  control_weight=checks.or_word(checks.probability(), "adaptive"),
                  every=checks.optional(checks.count(1)),
                  chunk_size=checks.optional(checks.count(1)),
                  control_weight_horizon=checks.positive())
def joint_svrg(objective: Objective, approx: approx_lib.Approximation | None = None, *,
               every: int | None = None, chunk_size: int | None = None,
               control_weight: float | str = "adaptive",
               control_weight_horizon: float = 100
               ) -> optax.GradientTransformationExtraArgs:
  """The joint control variate with an SVRG snapshot instead of a table (Alg. 2).

      g + g_bar - mean_{n in B} grad f~(w~; n, eps_n)

  with ``g`` the incoming naive gradient, ``w~`` a snapshot of the parameters and
  ``g_bar = mean_n E grad f~(w~; n)``. Every ``every`` updates the snapshot is moved to
  the current parameters and ``g_bar`` recomputed by a full pass over the data, in
  chunks of ``chunk_size`` inside ``jit`` (``lax.cond``, so other steps do not pay it).
  The paper uses one refresh per epoch (``every = N / B``): about one extra gradient
  evaluation per step, amortized.

  Cost per step: one ``approx.grad_and_expected`` on the batch at ``w~``; plus ``N``
  expected-gradient evaluations every ``every`` steps. Memory: two params-sized trees
  (``Theta(D)``), no table.

  Args:
    objective: the objective whose gradient is passed as ``updates``.
    approx: the approximation ``f~``; default :func:`dsgrad.approx.linearize`.
    every: refresh period ``K`` in updates (positive); default (``None``): once an
      epoch, ``K = N // B`` for the batch size ``B`` of the updates (the paper's choice).
    chunk_size: data per chunk in the full pass; default (``None``):
      :func:`dsgrad.tables.full_pass_chunk` (64 MiB of rows, 1,024 to 16,384 of them).
    control_weight: ``c`` in ``g + c (g_bar - grad f~(w~))``: ``"adaptive"`` (the
      default; per coordinate, from earlier steps, see :func:`dsgrad.cv`), or a fixed number in
      ``[0, 1]`` (``1``: the paper's estimator).
    control_weight_horizon: horizon of the adaptive weight's moving averages, in steps.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with state :class:`JointSvrgState`.
    The first update takes the first snapshot (one full pass).

  Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.full(3, -1.0)}
    >>> opt = optax.chain(dsgrad.joint_svrg(objective), optax.adam(1e-2))  # refresh an epoch
    >>> state = opt.init(params)
    >>> indices = jnp.arange(10)
    >>> noise = objective.sample_noise(jax.random.key(1), 10)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    >>> params = optax.apply_updates(params, updates)
    >>> jax.tree.map(jnp.shape, params)
    {'loc': (3,), 'log_scale': (3,)}

  References:
    Wang, Geffner, Domke (2024), App. B, Alg. 2.
    Johnson, Zhang (2013). Accelerating SGD using predictive variance reduction. NeurIPS.
  """
  approx = approx or approx_lib.linearize()
  _weights.check_horizon(control_weight_horizon, "joint_svrg")
  n = objective.num_data
  chunk_size = tables.full_pass_chunk(objective.data, chunk_size)

  def full_mean(objective, params):
    return tables.full_pass_mean(
        lambda idx: approx.expected_grad(objective, params, idx), n, chunk_size)

  def init_fn(params):
    _common.check_params_fit(objective, params, "joint_svrg", approx)
    if not _common.has_leaves(params):  # optax.tree.map_params placeholder
      return JointSvrgState(jnp.zeros([], jnp.int32), params, params,
                            _weights.init(control_weight, params), jnp.zeros([], jnp.uint32))
    # Both filled by the first update's refresh (a full pass over the data it is handed):
    # the state reads no data. A copy, so that params and state can both be donated.
    snapshot = jax.tree.map(jnp.copy, params)
    return JointSvrgState(jnp.zeros([], jnp.int32), snapshot,
                          jax.tree.map(jnp.zeros_like, params),
                          _weights.init(control_weight, params), jnp.zeros([], jnp.uint32))

  def update_fn(updates, state, params, *, indices, noise, objective, **extra_args):
    del extra_args
    # The batch size is static under jit, so the default period is a constant too.
    period = every if every is not None else max(1, n // indices.shape[0])
    refresh = state.count % period == 0
    params_like = optax.tree.cast_like(params, state.snapshot)
    snapshot, snapshot_mean, digest = jax.lax.cond(
        refresh,
        lambda: (params_like, optax.tree.cast_like(full_mean(objective, params_like),
                                                   state.snapshot_mean),
                 tables.data_digest(objective)),
        lambda: (state.snapshot, state.snapshot_mean, state.data_digest))
    g, g_tilde, _ = _common.gradient_and_terms(objective, approx, updates, params, snapshot,
                                               indices, noise, False)
    out, weight_state = _weights.apply(control_weight, control_weight_horizon,
                                       state.control_weight, g,
                                       optax.tree.sub(snapshot_mean, g_tilde))
    new_state = JointSvrgState(optax.safe_increment(state.count), snapshot, snapshot_mean,
                               weight_state, digest)
    return optax.tree.cast_like(out, g), new_state

  return _common.transformation(objective, init_fn, update_fn, "joint_svrg")
