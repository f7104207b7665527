"""The naive estimator: the plain mini-batch reparameterization gradient (Eq. 4)."""

from __future__ import annotations

import optax

from dsgrad import checks


@checks.arguments(objective=checks.optional(checks.objective()))
def naive(objective=None) -> optax.GradientTransformationExtraArgs:
  """The naive estimator ``g = mean_b grad f(w; n_b, eps_b)``: passes gradients through.

  It controls no variance; it exists so that estimators can be swapped in one line and
  compared on equal terms. Cost: none beyond the gradient. Memory: none.

  Args:
    objective: optional and unused: ``naive(objective)`` is accepted, like
      ``cv(objective)`` and the other estimators, so that a loop over estimator
      factories, or a one-word swap, calls every one the same way.

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

  del objective

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None, **extra_args):
    del params, extra_args
    return updates, state

  # Its state is optax's empty one, so only this mark tells fit that the optimizer it was
  # handed is naive alone: a gradient where a step belongs.
  update_fn.outputs_a_gradient = True
  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
