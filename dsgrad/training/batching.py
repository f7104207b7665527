"""Mini-batches: the one sampler of data orders that :func:`dsgrad.fit`, the diagnostics,
the benchmarks and the MCMC code share.

A run's batches are a deterministic function of one PRNG key: epoch ``e`` is the
permutation drawn from ``fold_in(key, e)``, cut into ``N // B`` batches (the remainder
dropped, as in the paper), and batch ``t`` is slice ``t`` of the epochs laid end to end
(:func:`batch_indices`). A run resumed at step ``t`` therefore sees the same batches as
an uninterrupted one. :func:`sample_batch` draws one uniform batch (with or without
replacement) with its noise, for Monte Carlo draws of an estimator at fixed parameters.

Permutations
------------
Random permutations of ``0 .. N-1`` by one sort of distinct random integers.

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

Example::

    >>> import jax, dsgrad
    >>> batches = dsgrad.training.batching.epoch_batches(jax.random.key(0), 10, 3, 4)
    >>> batches.shape, bool((jax.numpy.sort(batches[:3].ravel()) < 10).all())
    ((4, 3), True)
"""

from __future__ import annotations

import collections
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.training import compile_cache, host_data

ROUNDS = 3
_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35  # fmix32's multipliers (odd, so invertible mod 2^32)
_M1_INV, _M2_INV = pow(_M1, -1, 2**32), pow(_M2, -1, 2**32)


def mix_bits(x, words):
  """The bijection ``h`` of uint32 ``x``: per word, xor it, then murmur3's ``fmix32``."""
  for w in words:
    x = x ^ w
    x = x ^ (x >> 16)
    x = x * jnp.uint32(_M1)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(_M2)
    x = x ^ (x >> 16)
  return x


def unmix_bits(y, words):
  """The inverse of :func:`mix_bits` with the same ``words``."""
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
  words, keys = _sort_keys(key, num)
  return _from_sorted_keys(words, jax.lax.sort(keys))


def _sort_keys(key, num: int):
  """``(words, keys)``: the bijection's random words and the distinct keys ``h(i)``
  whose sort order is :func:`permutation`'s."""
  words = jax.random.bits(key, (ROUNDS,), jnp.uint32)
  return words, mix_bits(jnp.arange(num, dtype=jnp.uint32), list(words))


def _from_sorted_keys(words, sorted_keys):
  """The indices in key order: the sorted keys mapped back through ``h^-1``."""
  return unmix_bits(sorted_keys, list(words)).astype(jnp.int32)


def batch_indices(key, start, num_steps: int, num_data: int, batch_size: int):
  """Indices of batches ``start, ..., start + num_steps - 1`` of reshuffled epochs.

  Epoch ``e`` is the permutation :func:`epoch_permutation` draws from ``fold_in(key, e)``,
  cut into ``N // B`` batches (the remainder is dropped, as in the paper). Jittable in
  ``start``.

  Returns:
    ``(num_steps, batch_size)`` int32 array.
  """
  checks.check_batch_size(batch_size, num_data)
  num_epochs = window_epochs(num_steps, num_data, batch_size)
  first_epoch = start // (num_data // batch_size)
  perms = jax.vmap(lambda e: epoch_permutation(key, e, num_data, batch_size))(
      first_epoch + jnp.arange(num_epochs))
  return slice_window(perms, start, num_steps, num_data, batch_size)


def epoch_permutation(key, epoch, num_data: int, batch_size: int):
  """Epoch ``epoch``'s data order, ``(N // B * B,)`` int32 (the remainder dropped).

  A uniformly shuffled order from one sort of distinct random integers
  (:func:`permutation`), not ``jax.random.permutation``, whose sort of pairs on a
  CPU costs more than an epoch of cheap steps at large ``N``. Earlier dsgrad versions
  used ``jax.random.permutation``, so the same key gives other batches than with them."""
  perm = permutation(jax.random.fold_in(key, epoch), num_data)
  return perm[:_epoch_length(num_data, batch_size)]


def _epoch_length(num_data: int, batch_size: int) -> int:
  """Data an epoch uses: ``N // B`` whole batches, the remainder dropped."""
  return (num_data // batch_size) * batch_size


def window_epochs(num_steps: int, num_data: int, batch_size: int) -> int:
  """How many consecutive epochs a window of ``num_steps`` batches can touch."""
  return num_steps // (num_data // batch_size) + 2


def slice_window(perms, start, num_steps: int, num_data: int, batch_size: int):
  """Batches ``start ...`` from the stacked permutations of the window's epochs."""
  per_epoch = num_data // batch_size
  first_epoch = start // per_epoch
  if isinstance(perms, np.ndarray):  # NumPy's slice compiles nothing
    offset = int(start) - int(first_epoch) * per_epoch
    return perms.reshape(-1, batch_size)[offset:offset + num_steps]
  # int32 offsets whatever jax_enable_x64 says: dynamic_slice wants one index dtype.
  offset = jnp.asarray(start - first_epoch * per_epoch, jnp.int32)
  return jax.lax.dynamic_slice(perms.reshape(-1, batch_size),
                               (offset, jnp.zeros((), jnp.int32)), (num_steps, batch_size))


def _compiled(name: tuple, build, args) -> tuple:
  """``build()``, a jitted function, compiled for the types of ``args`` and kept in the
  shared cache; with the seconds compiling took (0.0 where it was kept), which
  :func:`dsgrad.fit` counts as compiling, not as its steps' time."""
  return compile_cache.get_or_build(
      ("epoch orders",) + name + tuple(jax.typeof(a) for a in args),
      lambda: build().lower(*args).compile())


def _epoch_permutation_program(num_data: int, batch_size: int, count: int = 1):
  """``(key, first) -> (count, N // B * B)``: epochs ``first .. first + count - 1``."""
  return jax.jit(lambda k, first: jax.vmap(
      lambda e: epoch_permutation(k, e, num_data, batch_size))(
          first + jnp.arange(count, dtype=jnp.int32)))


def _epoch_keys_program(num_data: int, count: int):
  return jax.jit(lambda key, first: jax.vmap(
      lambda e: _sort_keys(jax.random.fold_in(key, e), num_data))(
          first + jnp.arange(count, dtype=jnp.int32)))


def _epoch_unmix_program(num_data: int, batch_size: int):
  return jax.jit(lambda words, keys: jax.vmap(_from_sorted_keys)(words, keys)[
      :, :_epoch_length(num_data, batch_size)])


def _epoch_orders(key, first, num_data: int, batch_size: int, count: int, on_host: bool):
  """``((count, N // B * B) orders of epochs first ..., compile seconds)``, by
  :func:`_epoch_permutation_program`, or ``on_host`` with the sort done by NumPy: the same
  numbers (the keys are distinct, so any sort gives one order). XLA's CPU sort is a
  comparison sort through a callback, several times slower than NumPy's; on a CPU an
  epoch's order of ``N = 10^5`` then costs about as much as tens of cheap steps."""
  first = jnp.int32(first)
  if not on_host:
    program, seconds = _compiled(("device", num_data, batch_size, count),
                                 lambda: _epoch_permutation_program(num_data, batch_size, count),
                                 (key, first))
    return program(key, first), seconds
  keys_program, keys_seconds = _compiled(
      ("keys", num_data, count), lambda: _epoch_keys_program(num_data, count), (key, first))
  words, keys = keys_program(key, first)
  keys = np.sort(np.asarray(keys), axis=-1)
  unmix_program, unmix_seconds = _compiled(
      ("unmix", num_data, batch_size), lambda: _epoch_unmix_program(num_data, batch_size),
      (words, keys))
  return unmix_program(words, keys), keys_seconds + unmix_seconds


BULK_EPOCHS = 16
"""Short epochs' orders computed in one call (:data:`BULK_ELEMENTS`): with small data a
long segment spans hundreds of epochs, and three dispatches per epoch (about 0.15 ms on
a CPU) then cost more than the segment's steps."""
BULK_ELEMENTS = 2 ** 22
"""Below this many indices in :data:`BULK_EPOCHS` epochs (16 MB), a window that lacks even
one epoch computes that many at once (the next segments use them): one epoch per call
costs three dispatches and a sort with the device idle, which with 5,000 data and
batches of 50 cost about as much again as the steps (0.7 ms per epoch on a 2-core CPU),
and with 50,000 data a run in segments of 890 steps 18% above its rate in long segments
(4.6% computed in bulk: 0.30 ms per epoch against 0.96 ms one at a time; Student-t
regression of ``python -m benchmarks advice``, two CPU cores). Above it an epoch costs
more than a call, and the epochs past a run's end would be wasted work."""


SHARED_ORDERS_BYTES = 2 ** 26
"""Epoch orders kept between :func:`fit` calls (64 MB: 16 epochs of 10^6 data), so that a
run advanced in many calls (a resumed run, a race) sorts each epoch once: a sort of 10^6
keys takes about 30 ms on a CPU, as long as 45 steps of a model with 60,000 latents."""
SHARED_ORDERS_EPOCHS = 16
"""Epochs kept on the host whatever their size, where they fit in an eighth of the free
memory: :func:`dsgrad.recommend` advances up to eight runs in turn, each in its own epochs
(a window may span two). With two kept (64 MB of 10^7 data), the runs evicted each
other's: 24 sorts of about 0.5 s in a 60 s budget, charged to race pieces of 0.5 s, so
that cv measured 0.02x naive's steps a second (0.5x measured alone)."""
_shared_orders: collections.OrderedDict = collections.OrderedDict()
_shared_lock = threading.Lock()


class EpochOrders:
  """The epoch permutations of a :func:`fit` run, each computed once on device and kept
  while segments need it (a permutation of N costs O(N log N), which per segment would
  dominate the steps at large N), and those used last kept for later calls with the same
  key (:data:`SHARED_ORDERS_BYTES`, :data:`SHARED_ORDERS_EPOCHS`). The stacked window of the latest
  epochs is kept too, placed with ``sharding`` when given (a mesh: every process holds
  the same orders), so that the blocks of one window share one copy."""

  def __init__(self, key, num_data: int, batch_size: int, sharding=None):
    self.key, self.n, self.b, self.sharding = key, num_data, batch_size, sharding
    self.cache: dict = {}
    # ((epochs, rows), their stacked permutations, and on the host their NumPy stack)
    self.stacked = (None, None, None)
    on_cpu = (jax.default_backend() == "cpu" if sharding is None
              else all(d.platform == "cpu" for d in sharding.device_set))
    # On a CPU the orders are kept as NumPy rows: slicing and stacking hundreds of
    # small device arrays per segment costs more than the steps of a cheap model.
    self.on_host = on_cpu
    words = (jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
             else key)
    self.shared_id = (np.asarray(words).tobytes(), num_data, batch_size, on_cpu)
    self.compile_seconds = 0.0  # compiling the programs that compute the orders
    # Short epochs are computed in bulk even where a window lacks one (BULK_ELEMENTS).
    self.short_epochs = num_data * BULK_EPOCHS <= BULK_ELEMENTS

  def _compute(self, first: int, count: int) -> None:
    perms, seconds = _epoch_orders(self.key, first, self.n, self.b, count, self.on_host)
    self.compile_seconds += seconds
    rows = list(np.asarray(perms)) if self.on_host else jnp.unstack(perms)
    self.cache.update(zip(range(first, first + count), rows))
    kept = SHARED_ORDERS_BYTES // rows[0].nbytes
    if self.on_host:  # a device sorts fast, and its memory is the model's
      free = host_data.free_memory_bytes()
      kept = max(kept, min(SHARED_ORDERS_EPOCHS, (free or 0) // 8 // rows[0].nbytes))
    with _shared_lock:  # the epochs used last, up to the bytes (and a few thousand short ones)
      _shared_orders.update(zip([self.shared_id + (e,) for e in range(first, first + count)],
                                rows))
      while len(_shared_orders) > max(2, min(4096, kept)):
        _shared_orders.popitem(last=False)

  def _from_shared(self, epochs) -> None:
    with _shared_lock:
      for epoch in epochs:
        row = _shared_orders.get(self.shared_id + (epoch,))
        if row is not None:
          self.cache[epoch] = row
          _shared_orders.move_to_end(self.shared_id + (epoch,))  # evicted last

  def window(self, start: int, length: int, program_length: int | None = None,
             host: bool = False):
    """``(epochs, N // B * B)``: the permutations a segment of ``length`` steps at
    ``start`` slices; with ``program_length``, as many rows as a program of that many
    steps slices, the rows past the segment's epochs repeating its last (never read);
    ``host``: as NumPy rows (orders kept on the host only), the stack the device's is of."""
    # The epochs the segment's steps touch; the window's rows past them (the most a segment
    # can touch, from any start) repeat its last. Computed for the worst case, the next
    # epoch was sorted before any step reached it: at 10^7 data 0.5 s, in a short call.
    per_epoch = self.n // self.b
    first = start // per_epoch
    wanted = range(first, (start + max(1, length) - 1) // per_epoch + 1)
    rows = window_epochs(program_length or length, self.n, self.b)
    if self.stacked[0] == (wanted, rows):
      return self.stacked[2 if host else 1]
    for epoch in [e for e in self.cache if e < first]:
      del self.cache[epoch]
    self._from_shared([e for e in wanted if e not in self.cache])
    missing = [e for e in wanted if e not in self.cache]
    while missing:
      # Short epochs in bulk (the ones past the window are kept for the next segments);
      # long ones as the window needs them. Sixteen long epochs at once put sixteen
      # sorts (about 0.5 s at 10^6 data, 190 MB of keys) into one segment every few,
      # and epochs past the run's end are wasted.
      self._compute(missing[0], BULK_EPOCHS if self.short_epochs else 1)
      missing = [e for e in missing if e not in self.cache]
    epochs = [self.cache[e] for e in wanted] + [self.cache[wanted[-1]]] * (rows - len(wanted))
    # device_put: jnp.asarray of a NumPy array compiles a program for each new shape.
    # Kept on the host too: the host rows' reads slice it for each block, and at 10^7 data
    # a stack (or a copy back from the device) of two epochs costs 40-50 ms.
    on_host = None
    if self.on_host:  # aligned as XLA wants its arguments: device_put then copies nothing
      on_host = np.stack(epochs, out=host_data.aligned_empty(
          (len(epochs),) + epochs[0].shape, epochs[0].dtype))
      stacked = jax.device_put(on_host, self.sharding)  # None: the default device
    else:
      stacked = jnp.stack(epochs)
      if self.sharding is not None:
        stacked = jax.device_put(np.asarray(stacked), self.sharding)
    self.stacked = ((wanted, rows), stacked, on_host)
    return on_host if host else stacked


# One compiled program (for each size), not one per operation of the shuffles.
@functools.partial(jax.jit, static_argnames=("num_data", "batch_size", "num_steps"))
def epoch_batches(key, num_data: int, batch_size: int, num_steps: int):
  """Indices of the first ``num_steps`` batches of reshuffled epochs: the batches
  :func:`dsgrad.fit` takes with this key (``batch_indices(key, 0, num_steps, ...)``).

  Returns:
    ``(num_steps, batch_size)`` int32 array.
  """
  return batch_indices(key, 0, num_steps, num_data, batch_size)


def uniform_indices(key, num_data: int, shape, replace: bool = True):
  """Indices drawn uniformly from ``0 .. num_data-1``, int32: independently (``replace``,
  any ``shape``), or distinct (``shape`` an int at most ``num_data``; the first entries
  of a :func:`permutation`).

  The subsampling MCMC methods draw with replacement, as their estimators assume;
  Monte Carlo draws of an estimator use either.
  """
  if replace:
    return jax.random.randint(key, shape, 0, num_data, jnp.int32)
  size = int(np.prod(shape)) if isinstance(shape, tuple) else int(shape)
  if size > num_data:
    # A slice of the permutation would silently return all num_data indices instead.
    raise ValueError(f"{size} distinct indices cannot be drawn from {num_data} data: a "
                     "batch drawn without replacement holds at most num_data indices "
                     "(draw with replacement, or a smaller batch)")
  return permutation(key, num_data)[:shape]


@jax.jit
def split_in_two(key) -> tuple:
  """``jax.random.split(key)`` as a pair of keys, in one compiled program: on a concrete
  key, splitting and unpacking compile a small program each."""
  first, second = jax.random.split(key)
  return first, second


@jax.jit
def fold_in(key, data):
  """``jax.random.fold_in(key, data)``, compiled once: run eagerly it compiles two
  programs (the cast of ``data`` and the hash)."""
  return jax.random.fold_in(key, data)


@checks.arguments(key=checks.prng_key(), batch_size=checks.count(1))
def sample_batch(key, objective, batch_size: int, replace: bool = True):
  """Uniform random batch ``(indices, noise)`` of ``objective``'s data: with or without
  replacement (:func:`uniform_indices`), its noise from an independent key."""
  k_idx, k_noise = jax.random.split(key)
  indices = uniform_indices(k_idx, objective.num_data, (batch_size,) if replace else batch_size,
                            replace)
  return indices, objective.sample_noise(k_noise, batch_size)
