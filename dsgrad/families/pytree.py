"""Variational parameters shaped like the model's own parameters (any pytree).

A network's posterior should not need hand-written flattening. The families work on a
flat latent ``z`` in R^d; :func:`structured` turns an objective over flat mean-field (or
full-rank) parameters into the same objective over parameters whose ``loc`` and
``log_scale`` (or ``log_diag``) have the structure of an example latent: a dict of
arrays, a Flax NNX module's ``nnx.State``, any pytree. Every estimator works on it
unchanged (they work on any pytree) and gives back the same structure; the loss and its
gradients are the flat objective's, rearranged.

Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> latent = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    >>> x, y = jnp.ones((20, 2)), jnp.zeros((20, 3))
    >>> def log_prior(z):
    ...   return -0.5 * sum(jnp.sum(v ** 2) for v in jax.tree.leaves(z))
    >>> def log_lik(z, batch):
    ...   return -0.5 * jnp.sum((batch["x"] @ z["w"] + z["b"] - batch["y"]) ** 2, axis=1)
    >>> flat = dsgrad.objective_from_logdensity(log_prior, log_lik, {"x": x, "y": y}, latent)
    >>> objective = dsgrad.families.structured(flat, latent)
    >>> params = dsgrad.families.structured_init(latent, log_scale=-1.0)
    >>> jax.tree.map(jnp.shape, objective.grad(params, jnp.arange(4),
    ...                                       objective.sample_noise(jax.random.key(0), 4)))
    {'loc': {'b': (3,), 'w': (2, 3)}, 'log_scale': {'b': (3,), 'w': (2, 3)}}
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from dsgrad import checks
from dsgrad.objective import Objective

STRUCTURED_FIELDS = ("loc", "log_scale", "log_diag")
"""The parameter fields that take the latent's structure; others (a full-rank factor's
``unit_lower``) stay as they are."""


def latent_unravel(latent, what: str = "an example value of the latent"):
  """``(d, unravel)``: the size of an example latent's flattening and the function that
  rearranges a flat ``(d,)`` vector like it.

  Raises:
    ValueError: an empty pytree (the message asks for ``what``).
    TypeError: a leaf that is not a floating array.
  """
  leaves = jax.tree.leaves(latent)
  if not leaves:
    raise ValueError(f"latent is an empty pytree; give {what}")
  for leaf in leaves:
    if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
      raise TypeError(f"latent leaves must be floating arrays, got dtype "
                      f"{jnp.result_type(leaf)}")
  flat, unravel = ravel_pytree(latent)
  return int(flat.shape[0]), unravel


def flat_params(params) -> dict:
  """Structured parameters as the flat ones the families use (``ravel_pytree`` of each
  structured field)."""
  return {k: ravel_pytree(v)[0] if k in STRUCTURED_FIELDS else v for k, v in params.items()}


def structured_params(params, latent) -> dict:
  """Flat family parameters (e.g. ``family.params()``, :func:`dsgrad.meanfield_init`)
  with their structured fields rearranged like ``latent``.

  Raises:
    ValueError: if a structured field's size is not the latent's.
  """
  d, unravel = latent_unravel(latent)
  out = {}
  for k, v in params.items():
    if k in STRUCTURED_FIELDS:
      if jnp.shape(v) != (d,):
        raise ValueError(f"params[{k!r}] has shape {jnp.shape(v)} but the latent has {d} "
                         "entries")
      v = unravel(jnp.asarray(v))
    out[k] = v
  return out


# Every Gaussian family's start (structured_init, meanfield_init, the family modules):
# standard deviation 0.1, as NumPyro's and Pyro's AutoNormal guides start. With N rows the
# posterior's scale is about 1/sqrt(N) of the prior's, so a start at the prior's scale (1)
# costs the optimizer its longest walk, and noise of that size on a network's initial
# weights, or inside an exp, makes the first gradients garbage or overflow (a held-out
# Weibull model's ELBO was -1e29 at scale 1 and its first steps diverged).
INITIAL_LOG_SCALE = math.log(0.1)


@checks.arguments(log_scale=checks.real())
def structured_init(latent, loc=None, log_scale: float = INITIAL_LOG_SCALE) -> dict:
  """Mean-field parameters shaped like ``latent``: ``loc`` the latent itself (default;
  e.g. a network's initialized weights) or ``loc``, ``log_scale`` a constant: by default
  ``log(0.1)``, a standard deviation of 0.1 in every coordinate (AutoNormal's start in
  NumPyro and Pyro).

  Raises:
    ValueError: ``loc`` (or the latent taken as ``loc``) does not have the latent's
      structure and shapes, or holds NaN or inf.
  """
  latent_unravel(latent)
  loc = latent if loc is None else loc
  who = "dsgrad.families.structured_init"
  checks.check_same_structure(loc, latent, f"{who}: loc", "the latent")
  checks.parameters().check(loc, f"{who}: loc")
  return {"loc": jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), loc),
          "log_scale": jax.tree.map(lambda v: jnp.full(jnp.shape(v), log_scale, jnp.float32),
                                    latent)}


def structured(objective: Objective, latent) -> Objective:
  """``objective`` (over flat family parameters) over parameters shaped like ``latent``.

  Args:
    objective: a BBVI objective of a model whose flat latent is ``ravel_pytree(latent)``
      (e.g. :func:`dsgrad.objective_from_logdensity` with this ``latent``).
    latent: an example value of the latent: any pytree of float arrays.

  Returns:
    An :class:`dsgrad.Objective` with the same data, noise and number of data whose
    params have ``loc`` and ``log_scale`` (or ``log_diag``) shaped like ``latent``
    (:func:`structured_init`, :func:`structured_params`); its values equal the flat
    objective's at the flattened params, and its gradients are theirs, rearranged.

  Raises:
    ValueError/TypeError: an empty latent or one with non-float leaves, or a latent
      whose size is not the objective's (its noise's last axis).
  """
  d, _ = latent_unravel(latent)
  noise = objective.noise_spec(1)
  # The Gaussian families draw one standard normal per latent coordinate: a latent of
  # another size would be flattened into params the loss reads as another model's.
  if isinstance(noise, jax.ShapeDtypeStruct) and noise.shape and noise.shape[-1] != d:
    raise ValueError(f"dsgrad.families.structured: the latent has {d} entries but objective "
                     f"{objective.name!r} draws {noise.shape[-1]} noise coordinates per "
                     "sample: give an example latent of the objective's model")
  flat_loss = objective.loss_fn

  def loss_fn(params, rows, noise):
    return flat_loss(flat_params(params), rows, noise)

  return dataclasses.replace(objective, loss_fn=loss_fn, name=f"{objective.name}[structured]",
                             source=None, table_approximation=_structured_table(objective, latent))


def _structured_table(flat: Objective, latent):
  """``flat``'s table approximation (e.g. the coordinates each row reads, for joint SAGA)
  over structured params: its functions see the flat params and a flat view of the
  objective they are called with (its data, its noise), and their gradients come back
  shaped like the params. ``None`` where ``flat`` has none."""
  if flat.table_approximation is None:
    return None
  shaped = lambda tree: structured_params(tree, latent)  # noqa: E731  (a gradient's too)

  def view(objective):  # the flat objective on the data and noise it is called with
    return dataclasses.replace(objective, loss_fn=flat.loss_fn, name=flat.name,
                               source=flat.source, table_approximation=flat.table_approximation)

  def table_approximation(objective):
    from dsgrad.approx.base import Approximation, DatumStatistics  # it imports the families
    approx = flat.table_approximation(view(objective))

    def over_flat(fn, outputs=1):  # fn(objective, params, *rest) on flat params
      def call(obj, params, *rest):
        out = fn(view(obj), flat_params(params), *rest)
        return shaped(out) if outputs == 1 else tuple(map(shaped, out))
      return call

    inner, stats = approx.statistics, None
    if inner is not None:
      stats = DatumStatistics(
          lambda params, rows: inner.statistics(flat_params(params), rows),
          over_flat(inner.datum_terms, 2), over_flat(inner.datum_expected),
          over_flat(inner.global_terms, 2),
          inner.expected_of_mean and (lambda params, mean: shaped(
              inner.expected_of_mean(flat_params(params), flat_params(mean)))),
          inner.expected_change and over_flat(inner.expected_change))
    # Not through_objective: an estimator that reweights the objective's loss would not
    # reach the flat loss the view calls.
    return Approximation(over_flat(approx.grad_and_expected, 2),
                         over_flat(approx.expected_grad), f"{approx.name}[structured]",
                         statistics=stats)

  return table_approximation


@checks.arguments(params=checks.parameters(), key=checks.prng_key(),
                  num_samples=checks.count(1))
def sample_structured(params, key, num_samples: int):
  """``num_samples`` draws from the Gaussian posterior with structured ``params``: a
  pytree like the latent whose leaves have a leading axis ``num_samples``.

  Args:
    params: mean-field ``{"loc", "log_scale"}`` (:func:`structured_init`) or full-rank
      ``{"loc", "log_diag", "unit_lower"}`` (:func:`structured_params` of
      ``dsgrad.families.by_name("fullrank", d).params()``), ``loc`` and the scales shaped
      like the latent; a full-rank draw is ``loc + L eps`` with ``L`` the family's
      Cholesky factor over the flattened latent, so draws keep the correlations it learned.
    key: a JAX PRNG key.
    num_samples: the number of draws, at least 1.

  Raises:
    ValueError: params of neither form, fields of another structure than ``loc``, or
      values that are NaN or inf.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> latent = {"w": jnp.zeros(2), "b": jnp.zeros(())}
    >>> params = dsgrad.families.structured_params(
    ...     dsgrad.families.by_name("fullrank", 3).params(), latent)
    >>> jax.tree.map(jnp.shape, dsgrad.families.sample_structured(params, jax.random.key(0), 5))
    {'b': (5,), 'w': (5, 2)}
  """
  who = "dsgrad.families.sample_structured"
  full_rank = isinstance(params, dict) and {"loc", "log_diag", "unit_lower"} <= set(params)
  scale = "log_diag" if full_rank else "log_scale"
  if not (isinstance(params, dict) and {"loc", scale} <= set(params)):
    got = sorted(map(str, params)) if isinstance(params, dict) else type(params).__name__
    raise ValueError(f"{who}: params must be {{'loc': ..., 'log_scale': ...}}, each shaped "
                     f"like the latent (dsgrad.families.structured_init), or full-rank "
                     f"{{'loc', 'log_diag', 'unit_lower'}}, got {got}")
  checks.check_same_structure(params[scale], params["loc"], f"{who}: params[{scale!r}]",
                              "params['loc']")
  if full_rank:
    from dsgrad.families.gaussian import FullRankGaussian  # it imports this module
    loc, unravel = ravel_pytree(params["loc"])
    d = loc.shape[0]
    if jnp.shape(params["unit_lower"]) != (d, d):
      raise ValueError(f"{who}: params['unit_lower'] has shape "
                       f"{jnp.shape(params['unit_lower'])}, expected ({d}, {d}) for a latent "
                       f"of {d} entries")
    flat = flat_params(params)
    eps = jax.random.normal(key, (num_samples, d), loc.dtype)
    return jax.vmap(lambda e: unravel(FullRankGaussian.transform(flat, e)))(eps)

  def draw(loc, log_scale, k):
    eps = jax.random.normal(k, (num_samples,) + jnp.shape(loc), jnp.result_type(loc))
    return loc + jnp.exp(log_scale) * eps
  leaves, treedef = jax.tree.flatten(params["loc"])
  keys = jax.random.split(key, len(leaves))
  scales = treedef.flatten_up_to(params["log_scale"])
  return jax.tree.unflatten(treedef, [draw(m, s, k) for m, s, k in zip(leaves, scales, keys)])
