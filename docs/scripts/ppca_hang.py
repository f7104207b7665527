"""Reproduces the PPCA joint_saga hang in XLA's CPU runtime (jax 0.10.2), and shows that it
goes away when the LAPACK-backed Cholesky and triangular solve are replaced by plain jnp
code. Run from the project root:

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python docs/scripts/ppca_hang.py 200 4 lapack  # hangs
    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python docs/scripts/ppca_hang.py 200 4 patch   # finishes

Arguments: steps, trace points, ``patch`` or anything else.
"""
import argparse
import sys
import time

import jax
import jax.numpy as jnp


def chol(a):
  n = a.shape[-1]; L = jnp.zeros_like(a)
  for j in range(n):
    d = jnp.sqrt(a[j, j] - jnp.sum(L[j, :j] ** 2))
    L = L.at[j, j].set(d)
    if j + 1 < n:
      col = (a[j+1:, j] - L[j+1:, :j] @ L[j, :j]) / d
      L = L.at[j+1:, j].set(col)
  return L
def trisolve(L, b, lower=True):
  n = L.shape[0]; rows = []
  for i in range(n):
    prev = jnp.stack(rows) if rows else jnp.zeros((0,) + b.shape[1:], b.dtype)
    rows.append((b[i] - L[i, :i] @ prev) / L[i, i])
  return jnp.stack(rows)
if sys.argv[3] == "patch":
  jnp.linalg.cholesky = chol
  jax.scipy.linalg.solve_triangular = trisolve
from dsgrad.bench import paper_large as pl, _grid
task = pl.build_task("ppca", argparse.Namespace(mnist_dir=None, mnist_n=0))
g = pl.gradient_estimators(task, 100); m = pl.optimizers(task, g)
train = _grid.trainer(m["joint"], task.objective, task.params0, 100, int(sys.argv[1]), int(sys.argv[2]))
t0 = time.time()
out = jax.jit(lambda k: train(1e-3, k))(jax.random.key(0)); jax.block_until_ready(out)
print("ok", time.time() - t0, flush=True)
