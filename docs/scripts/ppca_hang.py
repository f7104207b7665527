"""Reproduces the PPCA joint_saga hang in XLA's CPU runtime (jax 0.10.2) with the
LAPACK-backed Cholesky and triangular solve, and shows that the loop-based jnp versions
that ``dsgrad.models.ppca`` now uses finish. Run from the project root:

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python docs/scripts/ppca_hang.py 200 4 lapack  # hangs
    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python docs/scripts/ppca_hang.py 200 4 jnp     # finishes

Arguments: steps, trace points, ``lapack`` or ``jnp``.
"""
import argparse
import sys
import time

import jax

import importlib

ppca_module = importlib.import_module("dsgrad.models.ppca")

if sys.argv[3] == "lapack":
  ppca_module._cholesky = jax.numpy.linalg.cholesky
  ppca_module._solve_lower = lambda chol, b: jax.scipy.linalg.solve_triangular(chol, b, lower=True)
from benchmarks import paper_large as pl, _grid
task = pl.build_task("ppca", argparse.Namespace(mnist_dir=None, mnist_n=0))
g = pl.gradient_estimators(task, 100); m = pl.optimizers(task, g)
train = _grid.trainer(m["joint"], task.objective, task.params0, 100, int(sys.argv[1]), int(sys.argv[2]))
t0 = time.time()
out = jax.jit(lambda k: train(1e-3, k))(jax.random.key(0)); jax.block_until_ready(out)
print("ok", time.time() - t0, flush=True)
