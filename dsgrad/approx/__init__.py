"""Approximations ``f~(w; n, eps)`` whose noise expectation is known in closed form.

The protocol (:class:`Approximation`, :class:`DatumStatistics`) and the generic
:func:`linearize` live in :mod:`dsgrad.approx.base`, which depends only on the objective;
the estimators import nothing else. The catalogue is grouped by the models it serves:

* :mod:`dsgrad.approx.gaussian` -- Gaussian variational families (``gaussian_mean_taylor``,
  ``gaussian_taylor``);
* :mod:`dsgrad.approx.glm` -- generalized linear models with a compact logit table
  (``glm_mean_taylor``, ``glm_taylor``, ``logistic_probit``), whose fused step
  (:class:`FusedTerms`) is in :mod:`dsgrad.approx.glm_fused`;
* :mod:`dsgrad.approx.sparse` -- models whose data read a few coordinates
  (``sparse_linearize``);
* :mod:`dsgrad.approx.dropout` -- Gaussian-dropout GLMs (``dropout_taylor``).

Every name is re-exported here: ``dsgrad.approx.glm_taylor(model)``.
"""

from dsgrad.approx.base import Approximation, DatumStatistics, FusedTerms, linearize
from dsgrad.approx.dropout import dropout_taylor, dropout_taylor_values
from dsgrad.approx.gaussian import gaussian_mean_taylor, gaussian_taylor
from dsgrad.approx.glm import (glm_mean_taylor, glm_taylor, logistic_probit,
                               sigmoid_probit_mixture, sigmoid_probit_mixture_gaussian_mean)
from dsgrad.approx.sparse import sparse_linearize

__all__ = ["Approximation", "DatumStatistics", "FusedTerms", "linearize", "gaussian_mean_taylor",
           "gaussian_taylor", "glm_mean_taylor", "glm_taylor", "logistic_probit",
           "sigmoid_probit_mixture", "sigmoid_probit_mixture_gaussian_mean",
           "sparse_linearize", "dropout_taylor", "dropout_taylor_values"]
