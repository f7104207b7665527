"""Benchmarks: ``python -m benchmarks <name>``. See docs/benchmarks.md."""
