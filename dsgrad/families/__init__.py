"""Variational families as Flax NNX modules (mean-field and full-rank Gaussian)."""

from dsgrad.families.gaussian import FullRankGaussian, MeanFieldGaussian, bbvi_objective

__all__ = ["MeanFieldGaussian", "FullRankGaussian", "bbvi_objective"]
