"""Running a transition kernel for many iterations: compiled chunks of ``lax.scan``, a
progress bar between them, and the draws kept when an interrupt stops the run."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.training import compile_cache, cpu_threads, host_data
from dsgrad.training import progress as progress_lib
from dsgrad.training.progress import Interrupted


@checks.arguments(key=checks.prng_key(), num_samples=checks.count(1),
                  chunk_size=checks.count(1))
def run_chain(key, step, state, num_samples: int, *, chunk_size: int = 200, model=None,
              progress: bool = True, position=None, sign=None):
  """Runs ``step(key, state) -> (state, info)`` for ``num_samples`` iterations.

  Chunks of ``chunk_size`` iterations run as one jitted ``lax.scan``; a progress bar
  (tqdm when installed, else nothing) advances between chunks. With ``model``, ``step`` is
  ``step(model, key, state)`` and the model is an argument of the compiled chunks, so its
  data are their inputs rather than constants. ``position(state)`` reads each draw
  (default ``state.position``) and ``sign(state)`` its sign (default ``state.sign``, else 1).

  Raises:
    TypeError: ``state`` has no ``.position`` and no ``position`` is given (a bare array
      where the algorithm's ``init(position, key)`` result belongs).

  Returns:
    ``(positions (R, d) numpy, signs (R,) numpy, stacked info (numpy), final state,
    seconds)``; compilation (one program for all chunks; none where an earlier chain with
    the same ``step`` and shapes compiled it) is excluded from ``seconds``.
  """
  cpu_threads.warn_if_split()  # the chain's seconds are timed on the pool
  if position is None:
    if not hasattr(state, "position"):
      raise TypeError(
          f"dsgrad.mcmc.run_chain: state is a {type(state).__name__}, not a chain state "
          "with a .position: pass what the algorithm's init returns "
          "(algorithm.init(position, key)), or say where the draw is with position=")
    position = _position_of
  sign = _sign_of if sign is None else sign
  bar = _bar(progress, num_samples)
  outputs, seconds, done = [], 0.0, 0
  length = min(chunk_size, num_samples)
  try:
    # A chunk reading rows from disk on this thread reports Ctrl-C as XLA's own error.
    with host_data.reads_interruptible():
      for size, batch in key_windows(key, num_samples, length):
        if not outputs:  # compiled before the clock starts (every chunk runs this program)
          run_chunk.compile(model, state, batch, np.int32(size), step=step,
                            position=position, sign=sign)
        start = time.perf_counter()
        # The chain's state is not donated: an interrupt keeps the last whole chunk's.
        after, out = run_chunk(model, state, batch, np.int32(size), step=step,
                               position=position, sign=sign)
        jax.block_until_ready(out)
        seconds += time.perf_counter() - start
        outputs.append(jax.tree.map(lambda a: np.asarray(a)[:size], out))
        _check_finite(outputs, state, seconds, done)
        state, done = after, done + size
        bar(size)
  except KeyboardInterrupt:
    bar(0, close=True)
    if not outputs:
      raise
    raise Interrupted(f"sampling interrupted after {done} of {num_samples} draws; they are "
                      "kept: catch dsgrad.Interrupted and take its .result (in a notebook, "
                      "sys.last_value.result)", _chain_result(outputs, state, seconds), done,
                      num_samples) from None
  bar(0, close=True)
  return _chain_result(outputs, state, seconds)


class Diverged(ValueError):
  """Raised by :func:`run_chain` when the chain's position left the finite numbers.

  Attributes:
    result: :func:`run_chain`'s tuple over the draws before the first non-finite one;
      its state is the chain's at the start of the chunk in which it diverged.
    iteration: the first iteration whose position is not finite.
  """

  def __init__(self, message: str, result, iteration: int):
    super().__init__(message)
    self.result, self.iteration = result, iteration


def _check_finite(outputs, state, seconds, done: int) -> None:
  """Refuses a chain whose position left the finite numbers in the last chunk (its first
  draw is iteration ``done``): a kernel without a Metropolis correction (SGLD, SG-HMC) at
  too large a step size diverges, and every later draw would be NaN without an error.
  The draws before it are kept in the error."""
  leaves = [np.asarray(leaf).reshape(len(leaf), -1) for leaf in jax.tree.leaves(outputs[-1][0])]
  if not leaves:
    return
  bad = np.flatnonzero(~np.isfinite(np.concatenate(leaves, axis=1)).all(axis=1))
  if bad.size:
    first = int(bad[0])
    kept = outputs[:-1] + [jax.tree.map(lambda a: a[:first], outputs[-1])]
    raise Diverged(
        f"the chain's position is not finite from iteration {done + first:,}: it diverged. "
        "A kernel without a Metropolis correction (SGLD, SG-HMC) does at too large a step "
        f"size; take a smaller one. The {done + first:,} draws before it are kept: catch "
        "dsgrad.mcmc.Diverged and take its .result", _chain_result(kept, state, seconds),
        done + first)


def _position_of(state):
  return state.position


def _sign_of(state):
  return state.sign if hasattr(state, "sign") else jnp.ones((), state.position.dtype)


def split_keys(key, num: int) -> list:
  """``list(jax.random.split(key, num))``, sliced on the host: each eager slice of a device
  array of keys compiled a small program of its own on a first call."""
  data, wrap = _on_host(jax.random.split(key, num))
  return [wrap(row) for row in data]


def key_windows(key, num: int, length: int):
  """Yields ``(size, keys)``: ``jax.random.split(key, num)`` in windows of ``length`` keys,
  the last (of ``size < length`` keys) padded with keys from the start, which
  :func:`fixed_length_scan` leaves unused: every window has one length, and so one
  compiled program. Sliced on the host (see :func:`split_keys`)."""
  data, wrap = _on_host(jax.random.split(key, max(num, 1)))
  for start in range(0, num, max(length, 1)):
    size = min(length, num - start)
    window = data[start:start + size]
    yield size, wrap(window if size == length else np.concatenate([window, data[:length - size]]))


def _on_host(keys):
  """``(keys' data as numpy, data -> keys)``, for typed keys and raw ``uint32`` ones."""
  if not jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
    return np.asarray(keys), jnp.asarray
  impl = jax.random.key_impl(keys)
  return (np.asarray(jax.random.key_data(keys)),
          lambda data: jax.random.wrap_key_data(data, impl=impl))


def fixed_length_scan(one, state, keys, count):
  """``lax.scan(one, state, keys)`` over the first ``count`` keys only, ``count`` traced:
  ``(state, outputs)`` with outputs of ``len(keys)`` rows, the first ``count`` filled.
  A shorter last chunk runs the same compiled program as the others (compiling a second
  length cost as much as the first: seconds for a chain at XLA's default optimisation)."""
  shapes = jax.eval_shape(lambda s, k: one(s, k)[1], state, keys[0])
  outputs = jax.tree.map(lambda o: jnp.zeros((keys.shape[0],) + o.shape, o.dtype), shapes)

  def body(i, carry):
    state, outputs = carry
    state, out = one(state, keys[i])
    return state, jax.tree.map(
        lambda buffer, o: jax.lax.dynamic_update_index_in_dim(buffer, o, i, 0), outputs, out)
  return jax.lax.fori_loop(0, count, body, (state, outputs))


@compile_cache.jit_by_text(static_argnames=("step", "position", "sign"))
def run_chunk(model, state, keys, count, *, step, position, sign):
  """The first ``count`` of ``len(keys)`` iterations (:func:`fixed_length_scan`): one
  program, kept in the compile cache, for every chain with the same ``step``,
  ``position``, ``sign`` and argument shapes, so a second chain on a model of the same
  shapes compiles nothing."""
  def one(state, k):
    state, info = step(k, state) if model is None else step(model, k, state)
    return state, (position(state), sign(state), info)
  return fixed_length_scan(one, state, keys, count)


def _chain_result(outputs, state, seconds):
  """:func:`run_chain`'s return value from its chunks' outputs."""
  positions, signs, info = jax.tree.map(lambda *a: np.concatenate(a), *outputs)
  return positions, signs, info, state, seconds


def _bar(enabled, total):
  return progress_lib.bar(enabled, total, "draw")
