"""Second derivatives of a user's log density, also through ``jax.custom_vjp`` functions.

The control variates' approximations and the subsampling samplers' Taylor proxy
differentiate the user's log density twice, forward over reverse (``jax.jvp`` of a
gradient, ``jax.hessian``): the cheapest way JAX has. JAX refuses to differentiate a
``jax.custom_vjp`` function forward (a hand-written backward pass has no forward rule),
and a log density may hold one: a numerically stable softplus, a clipped or rescaled
gradient, a function from a library written that way. There the same products come from
reverse mode alone: ``J v`` is the transpose of the linear map ``u -> J^T u``, a VJP of
the VJP, about twice the work of the forward product; it is taken only where forward mode
is refused, so every other model keeps the forward pass.

References:
  JAX documentation, "Custom derivative rules" (``custom_vjp`` functions support reverse
  mode over reverse mode, not forward mode) and "The Autodiff Cookbook" (the JVP as the
  transpose of a VJP).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.extend
import jax.numpy as jnp


def _holds_custom_vjp(jaxpr) -> bool:
  """Whether ``jaxpr`` or a program inside it (a ``jit``, a ``scan``, a ``cond``) calls a
  ``custom_vjp`` function. JAX refuses forward mode through one while it lowers a program,
  not where ``jax.jvp`` is called, so the refusal cannot be caught there: it is read
  from the program first."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name.startswith("custom_vjp"):
      return True
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's Jaxpr
        if isinstance(inner, jax.extend.core.Jaxpr) and _holds_custom_vjp(inner):
          return True
  return False


def forward_mode_applies(fn: Callable, *args, **kwargs) -> bool:
  """Whether JAX can differentiate ``fn`` forward at ``args``: it calls no ``custom_vjp``
  function (traced once more, which JAX's trace cache makes cheap for jitted pieces)."""
  return not _holds_custom_vjp(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)


def jvp(fn: Callable, primals: tuple, tangents: tuple) -> tuple:
  """``jax.jvp(fn, primals, tangents)``, also where ``fn`` holds a ``custom_vjp`` function.

  Args:
    fn: a function of ``len(primals)`` arrays or pytrees, differentiable in reverse mode.
    primals: the point, a tuple.
    tangents: the direction, a tuple like ``primals``.

  Returns:
    ``(fn(*primals), J tangents)``, as ``jax.jvp`` returns them.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from dsgrad import derivatives
    >>> @jax.custom_vjp
    ... def softplus(x):
    ...   return jnp.logaddexp(0.0, x)
    >>> softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))
    >>> grad = jax.grad(lambda x: jnp.sum(softplus(x)))
    >>> value, hvp = derivatives.jvp(grad, (jnp.zeros(2),), (jnp.ones(2),))
    >>> hvp  # softplus'' (0) = 1/4
    Array([0.25, 0.25], dtype=float32)
  """
  if forward_mode_applies(fn, *primals):
    return jax.jvp(fn, primals, tangents)
  out, pullback = jax.vjp(fn, *primals)
  # pullback is linear in its cotangent: the VJP of it, at any cotangent, maps the
  # tangents through its transpose, J.
  (pushed,) = jax.vjp(pullback, jax.tree.map(jnp.zeros_like, out))[1](tuple(tangents))
  return out, pushed


def hessian(fn: Callable) -> Callable:
  """``jax.hessian(fn)`` (in the first argument), or ``jax.jacrev(jax.jacrev(fn))`` where
  ``fn`` holds a ``custom_vjp`` function.

  Args:
    fn: a scalar function whose first argument is an array.

  Returns:
    A function of ``fn``'s arguments returning the Hessian in the first.
  """
  def both_ways(*args, **kwargs):
    if forward_mode_applies(fn, *args, **kwargs):
      return jax.hessian(fn)(*args, **kwargs)
    return jax.jacrev(jax.jacrev(fn))(*args, **kwargs)

  return both_ways
