"""Models: a log prior and a per-datum log likelihood, usable with any estimator."""

from dsgrad.models.base import LinearPredictor, Model
from dsgrad.models.dropout_glm import DropoutGLM, dropout_glm, softmax_cross_entropy
from dsgrad.models.logistic_regression import (logistic_regression, softmax_regression,
                                               synthetic_logistic_data)

__all__ = ["Model", "LinearPredictor", "DropoutGLM", "dropout_glm", "softmax_cross_entropy",
           "logistic_regression", "softmax_regression", "synthetic_logistic_data"]
