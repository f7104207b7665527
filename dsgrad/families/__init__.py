"""Variational families as Flax NNX modules (mean-field and full-rank Gaussian), and
parameters shaped like any pytree latent (:func:`structured`)."""

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


__all__ = ["MeanFieldGaussian", "FullRankGaussian", "bbvi_objective", "by_name", "FAMILIES"]
