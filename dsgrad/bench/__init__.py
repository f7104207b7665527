"""Benchmarks: ``python -m dsgrad.bench <name>``. See docs/benchmarks.md."""
