"""Data-set loaders: each takes a path, verifies what it reads, and says how to get it."""

from dsgrad.datasets.uci import load_australian, load_sonar, standardize

__all__ = ["load_sonar", "load_australian", "standardize"]
