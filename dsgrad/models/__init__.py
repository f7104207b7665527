"""Models: a log prior and a per-datum log likelihood, usable with any estimator."""

from dsgrad.models.base import (LinearPredictor, Model, SparseLikelihood,
                                check_sparse_likelihood, model_data, with_coordinates)
from dsgrad.models.bradley_terry import bradley_terry, synthetic_bradley_terry_data
from dsgrad.models.dropout_glm import DropoutGLM, dropout_glm, softmax_cross_entropy
from dsgrad.models.logistic_regression import (logistic_regression, softmax_regression,
                                               synthetic_logistic_data)
from dsgrad.models.movielens import (MovieLensLatent, movielens, movielens_latent,
                                     synthetic_movielens_data)
from dsgrad.models.ppca import ppca, synthetic_ppca_data

__all__ = ["Model", "LinearPredictor", "SparseLikelihood", "with_coordinates", "model_data",
           "check_sparse_likelihood", "DropoutGLM", "dropout_glm", "softmax_cross_entropy",
           "logistic_regression", "softmax_regression", "synthetic_logistic_data",
           "ppca", "synthetic_ppca_data", "bradley_terry", "synthetic_bradley_terry_data",
           "movielens", "movielens_latent", "MovieLensLatent", "synthetic_movielens_data"]
