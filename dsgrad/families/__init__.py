"""Variational families as Flax NNX modules (mean-field and full-rank Gaussian), and
parameters shaped like any pytree latent (:func:`structured`)."""

from flax import nnx

from dsgrad import checks
from dsgrad.families.gaussian import FullRankGaussian, MeanFieldGaussian, bbvi_objective
from dsgrad.families.pytree import (flat_params, latent_unravel, sample_structured,
                                       structured, structured_init, structured_params)

FAMILIES = {"meanfield": MeanFieldGaussian, "fullrank": FullRankGaussian}


@checks.arguments(dim=checks.count(1))
def by_name(name: str, dim: int, **init):
  """A family module by name: ``"meanfield"`` or ``"fullrank"``.

  Args:
    name: the family's name (keys of ``FAMILIES``).
    dim: latent dimension ``d``.
    **init: initial values passed to the module (``loc``, ``log_scale``).

  Returns:
    A :class:`MeanFieldGaussian` or :class:`FullRankGaussian` of dimension ``dim``.

  Raises:
    ValueError: on an unknown name (the message lists the known ones).

  Example::

    >>> import dsgrad
    >>> family = dsgrad.families.by_name("fullrank", 3)
    >>> sorted(family.params())
    ['loc', 'log_diag', 'unit_lower']
  """
  if name not in FAMILIES:
    raise ValueError(f"unknown variational family {name!r}; choose one of {sorted(FAMILIES)}")
  return FAMILIES[name](dim, **init)


def objective_by_name(name: str, model, **options):
  """The BBVI objective of ``model`` over the family ``name`` (:meth:`objective`'s
  ``options``), built from the family's shapes: the objective reads no parameter values,
  and a full-rank family over 16,000 latents allocated a 1 GB factor only to drop it.

  Args:
    name: the family's name (keys of ``FAMILIES``).
    model: the model; the family's dimension is its ``latent_dim``.
    **options: ``shared_noise``, ``path_derivative``.

  Returns:
    The :class:`dsgrad.Objective` that ``by_name(name, d).objective(model)`` returns.

  Example: the same objective as the family module's own::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> family = dsgrad.families.by_name("fullrank", 3)
    >>> objective = dsgrad.families.objective_by_name("fullrank", model)
    >>> rows, noise = jax.numpy.arange(100), objective.sample_noise(jax.random.key(1), 100)
    >>> bool(objective.value(family.params(), rows, noise)
    ...      == family.objective(model).value(family.params(), rows, noise))
    True
  """
  return nnx.eval_shape(lambda: by_name(name, model.latent_dim)).objective(model, **options)


__all__ = ["MeanFieldGaussian", "FullRankGaussian", "bbvi_objective", "by_name",
           "objective_by_name", "FAMILIES"]
