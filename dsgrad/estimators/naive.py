"""The naive estimator: the plain mini-batch reparameterization gradient (Eq. 4)."""

from __future__ import annotations

import jax
import optax

from dsgrad import checks


def naive(*, value_checks: bool | None = None) -> optax.GradientTransformationExtraArgs:
  """The naive estimator ``g = mean_b grad f(w; n_b, eps_b)``: passes gradients through.

  It controls no variance; it exists so that estimators can be swapped in one line and
  compared on equal terms. Cost: none beyond the gradient. Memory: none.

  Args:
    value_checks: (``None``, the default: the library-wide setting,
      :func:`dsgrad.checks.set_value_checks`) raise a ``ValueError`` if the incoming gradient has NaN or inf
      (set ``False`` under ``optax.apply_if_finite``).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; extra arguments (``indices``,
    ``noise``, ...) are accepted and ignored.

  Example::

    >>> import jax, jax.numpy as jnp, optax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.full(3, -1.0)}
    >>> opt = optax.chain(dsgrad.naive(), optax.adam(1e-2))
    >>> state = opt.init(params)
    >>> indices = jnp.arange(10)
    >>> noise = objective.sample_noise(jax.random.key(1), 10)
    >>> grads = objective.grad(params, indices, noise)
    >>> updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
    >>> params = optax.apply_updates(params, updates)
    >>> jax.tree.map(jnp.shape, params)
    {'loc': (3,), 'log_scale': (3,)}

  References:
    Wang, Geffner, Domke (2024), Eq. 4.
  """
  value_checks = checks.resolve_value_checks(value_checks)

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None, **extra_args):
    if updates is None:  # the fused step: compute the gradient here
      objective = extra_args.get("objective")
      if objective is None or "indices" not in extra_args or "noise" not in extra_args:
        raise ValueError("dsgrad.naive: update(None, ...) computes the gradient itself and "
                         "needs objective=, indices= and noise=")
      updates = objective.grad(params, extra_args["indices"], extra_args["noise"],
                               validate=False)
    if params is not None and jax.tree.leaves(params):
      # Static: a gradient of other shapes would be broadcast into params by
      # optax.apply_updates, or fail there without naming the gradient.
      checks.check_same_structure(updates, params, "updates (gradient)", "params")
    if value_checks:
      checks.value_checks(checks.finite_checks(updates, "updates (gradient) passed to dsgrad.naive"))
    return updates, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
