"""Random permutations of ``0 .. N-1`` by one sort of distinct random integers.

``jax.random.permutation`` shuffles by sorting (random key, value) pairs, in as many rounds
as ``N`` needs for the keys to be unlikely to tie. On a CPU, XLA sorts pairs far more slowly
than a single array of integers, so that one epoch's order of ``N = 10^6`` data can cost
more than the epoch's steps (``python -m benchmarks scale steps``, "epoch order" rows).

Here the keys are ``h(i)`` for a random bijection ``h`` of the 32-bit integers, drawn from
the PRNG key: ``h`` is a few rounds of "xor a random word, then murmur3's finalizer", each
step of which is invertible. The keys are distinct, because ``h`` is a bijection; sorting
them alone is the fast sort; mapping the sorted keys back through ``h^-1`` gives the
indices in key order, a permutation of ``0 .. N-1``. Its law is that of the order of ``h``
over ``0 .. N-1``: uniform for a uniformly random bijection, and pseudo-random here (the
tests check position, adjacency and pairwise-order frequencies against the uniform law).

References:
  Knuth, TAOCP vol. 2, Sec. 3.4.2 (a random permutation as the sort order of random keys).
  Appleby, MurmurHash3 (2011): the 32-bit finalizer ``fmix32``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ROUNDS = 3
_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35  # fmix32's multipliers (odd, so invertible mod 2^32)
_M1_INV, _M2_INV = pow(_M1, -1, 2**32), pow(_M2, -1, 2**32)


def _mix(x, words):
  for w in words:
    x = x ^ w
    x = x ^ (x >> 16)
    x = x * jnp.uint32(_M1)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(_M2)
    x = x ^ (x >> 16)
  return x


def _unmix(y, words):
  for w in reversed(words):
    y = y ^ (y >> 16)
    y = y * jnp.uint32(_M2_INV)
    y = y ^ (y >> 13) ^ (y >> 26)  # the inverse of x ^ (x >> 13) on 32 bits
    y = y * jnp.uint32(_M1_INV)
    y = y ^ (y >> 16)
    y = y ^ w
  return y


def permutation(key, num: int):
  """A random permutation of ``0 .. num-1``, ``(num,)`` int32; jittable and vmappable in
  ``key``.

  Args:
    key: a JAX PRNG key.
    num: ``N``, at most ``2^31 - 1``.

  Returns:
    ``(num,)`` int32 array holding every index once.
  """
  if not 0 <= num < 2**31:
    raise ValueError(f"permutation: num must lie in [0, 2^31), got {num}")
  words = list(jax.random.bits(key, (ROUNDS,), jnp.uint32))
  keys = jax.lax.sort(_mix(jnp.arange(num, dtype=jnp.uint32), words))
  return _unmix(keys, words).astype(jnp.int32)
