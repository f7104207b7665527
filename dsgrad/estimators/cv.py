"""The approximation-based control variate for Monte Carlo noise (Eq. 9)."""

from __future__ import annotations

import optax

from dsgrad import checks
from dsgrad.approx import base as approx_lib
from dsgrad.estimators import _common, _weights, chain
from dsgrad.objective import Objective


@checks.arguments(objective=checks.objective(),
                  control_weight=checks.or_word(checks.probability(), "adaptive"),
                  control_weight_horizon=checks.positive(),
                  approx=checks.approximation())
def cv(objective: Objective, approx: approx_lib.Approximation | None = None, *,
       control_weight: float | str = "adaptive", control_weight_horizon: float = 100) -> optax.GradientTransformationExtraArgs:
  """Control variate for the Monte Carlo noise of each datum (Eq. 9).

  ``g_cv = mean_b [grad f(w; n_b, eps_b) + E_xi grad f~(w; n_b, xi) - grad f~(w; n_b, eps_b)]``

  It removes Monte Carlo noise up to the approximation error but cannot reduce
  subsampling noise: ``V[g_cv] >= V_n[grad f(w; n)]`` (Eq. 10).

  Cost per step: one call of ``approx.grad_and_expected`` on the batch (for
  :func:`dsgrad.approx.linearize`, one Jacobian-vector product of the gradient).
  Memory: none.

  Args:
    objective: the objective whose gradient is passed as ``updates``.
    approx: the approximation ``f~``; default :func:`dsgrad.approx.linearize`.
    control_weight: ``c`` in ``g + c (E grad f~ - grad f~)``: ``"adaptive"`` (the
      default): one ``c`` per parameter coordinate that minimizes its variance,
      estimated from moving averages over earlier steps and clipped to ``[0, 1]``
      (unbiased; falls back towards naive when the approximation is poor or the state
      stale, so that a control variate does not cost the user); or a fixed number in
      ``[0, 1]``, ``1`` being the paper's estimator. Adaptive keeps four params-sized
      arrays (three moving averages and the weight; state
      :class:`dsgrad.estimators.AdaptiveWeightState`) and costs one pass over the
      gradient and the control per step (``python -m benchmarks step-cost`` measures
      it); pass ``control_weight=1.0`` where the approximation is known to be good and
      every microsecond counts.
    control_weight_horizon: horizon of those moving averages, in steps.

  Returns:
    An ``optax.GradientTransformationExtraArgs``. ``update`` needs ``params`` and the
    batch's ``indices=`` and ``noise=``; put it first in an ``optax.chain``.

  Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.full(3, -1.0)}
    >>> opt = optax.chain(dsgrad.cv(objective), optax.adam(1e-2))
    >>> state = opt.init(params)
    >>> indices = jnp.arange(10)
    >>> noise = objective.sample_noise(jax.random.key(1), 10)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    >>> params = optax.apply_updates(params, updates)
    >>> jax.tree.map(jnp.shape, params)
    {'loc': (3,), 'log_scale': (3,)}

  References:
    Wang, Geffner, Domke (2024), Eq. 8-10. Miller et al. (2017), NeurIPS.
  """
  approx = approx or approx_lib.linearize()
  _weights.check_horizon(control_weight_horizon, "cv")

  def init_fn(params):
    _common.check_params_fit(objective, params, "cv", approx)
    if control_weight == "adaptive":
      return _weights.init(control_weight, params)
    return chain.FixedWeightState()

  def update_fn(updates, state, params, *, indices, noise, objective, **extra_args):
    del extra_args
    g, g_tilde, e_tilde = _common.gradient_and_terms(objective, approx, updates, params,
                                                     params, indices, noise, True)
    out, state = _weights.apply(control_weight, control_weight_horizon, state, g,
                                optax.tree.sub(e_tilde, g_tilde))
    return optax.tree.cast_like(out, g), state

  return _common.transformation(objective, init_fn, update_fn, "cv")
