"""Step-size x seed grids of training runs in one jitted program, and their ELBO traces."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad.diagnostics import elbo_draws
from dsgrad.training.batching import batch_indices
from dsgrad.training.segments import train_step


def trainer(make_optimizer, objective, params0, batch_size: int, num_steps: int,
            num_evals: int, *, keep_states: bool = False):
  """``(step_size, key) -> (trace, final optimizer state)`` for one training run.

  Batches are reshuffled epochs (:func:`dsgrad.training.batching.batch_indices`), noise is drawn
  per step. The trace holds the params after each of ``num_evals`` evenly spaced
  segments (leaves ``(num_evals, ...)``); with ``keep_states`` it holds
  ``(params, optimizer state)`` pairs, for variance traces.

  Args:
    make_optimizer: ``step_size -> optax transformation`` (the step size may be traced).
    objective: the objective.
    params0: initial params.
    batch_size: ``B``.
    num_steps: total steps (a multiple of ``num_evals``).
    num_evals: number of trace points.
  """
  per_eval = num_steps // num_evals

  def train(step_size, key):
    opt = make_optimizer(step_size)
    batch_key, noise_key = jax.random.split(key)

    def step(carry, t):
      idx = batch_indices(batch_key, t, 1, objective.num_data, batch_size)[0]
      return train_step(objective, opt, *carry, idx, jax.random.fold_in(noise_key, t)), None

    def segment(carry, first):
      carry, _ = jax.lax.scan(step, carry, first + jnp.arange(per_eval))
      return carry, carry if keep_states else carry[0]

    carry = (params0, opt.init(params0))
    carry, trace = jax.lax.scan(segment, carry, per_eval * jnp.arange(num_evals))
    return trace, carry[1]

  return train


def run_grid(train, step_sizes, keys, *, vmap_step_sizes: bool = True,
             keep_state: bool = True):
  """Runs ``train`` for every (step size, seed): ``(traces, final states)``, leaves
  ``(L, S, ...)``.

  With ``vmap_step_sizes`` the whole grid is one vmapped program; otherwise (an
  optimizer whose step size must be a Python float, or a state too large to hold
  ``L`` times) step sizes run one after another, seeds vmapped. Without ``keep_state``
  the final states are dropped inside the program (``None`` is returned for them).
  """
  if not keep_state:
    full = train
    train = lambda s, k: (full(s, k)[0], None)  # noqa: E731
  if vmap_step_sizes:
    runs = jax.jit(jax.vmap(jax.vmap(train, in_axes=(None, 0)), in_axes=(0, None)))
    return runs(jnp.asarray(step_sizes, jnp.float32), keys)
  outs = [jax.jit(jax.vmap(lambda k, s=float(s): train(s, k)))(keys) for s in step_sizes]
  traces = jax.tree.map(lambda *a: jnp.stack(a), *[o[0] for o in outs])
  states = (jax.tree.map(lambda *a: jnp.stack(a), *[o[1] for o in outs])
            if keep_state else None)
  return traces, states


def elbo_many(objective, num_samples: int, chunk_size: int = 4096):
  """``(params with leading axis R, key) -> (R,)`` full-data ELBO estimates.

  The vmapped mean of :func:`dsgrad.diagnostics.elbo_draws` (:func:`dsgrad.elbo`'s
  chunking and noise, without its ``log q`` correction: the same ELBO, a little noisier
  near the optimum).
  """
  runner = elbo_draws(objective, num_samples, chunk_size)
  return jax.jit(jax.vmap(lambda p, k: jnp.mean(runner(p, k)), in_axes=(0, None)))


def diverged_mask(trace, size_limit: float = 1e3):
  """``(L, S, E)`` bool: the run is still sane (finite, every |param| < limit) at each
  evaluation and at all earlier ones."""
  sane = np.asarray(jax.tree.reduce(jnp.logical_and, jax.tree.map(
      lambda a: jnp.all(jnp.isfinite(a) & (jnp.abs(a) < size_limit),
                        axis=tuple(range(3, a.ndim))), trace)))
  return np.cumprod(sane, axis=2).astype(bool)


def mean_over_seeds(values):
  """Mean over seeds (axis 1) treating diverged runs (nan) as -inf: never 'best'."""
  v = np.where(np.isfinite(values), values, -np.inf)
  return v.mean(axis=1)
