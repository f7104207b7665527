"""The epoch orders' permutation (dsgrad.training.batching.permutation): a permutation, and uniform."""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dsgrad.training import batching


def _draws(n, num, seed):
  keys = jax.random.split(jax.random.key(seed), num)
  return np.asarray(jax.jit(jax.vmap(lambda k: batching.permutation(k, n)))(keys))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, 65537])
def test_every_index_once(n):
  perm = np.asarray(batching.permutation(jax.random.key(n), n))
  assert perm.dtype == np.int32
  np.testing.assert_array_equal(np.sort(perm), np.arange(n))


def test_the_mixing_is_a_bijection_of_the_32_bit_integers():
  words = list(jax.random.bits(jax.random.key(0), (batching.ROUNDS,), jnp.uint32))
  x = jnp.concatenate([jnp.arange(4096, dtype=jnp.uint32),
                       jnp.array([2**31 - 1, 2**31, 2**32 - 1], dtype=jnp.uint32)])
  mixed = batching.mix_bits(x, words)
  np.testing.assert_array_equal(batching.unmix_bits(mixed, words), x)
  assert len(np.unique(np.asarray(mixed))) == len(x)


def test_all_orders_of_four_are_equally_likely():
  # 24,000 draws over the 24 orders: chi-square with 23 degrees of freedom. (Checked: with
  # the random words replaced by zeros, this test and the next fail.)
  draws = _draws(4, 24_000, seed=1)
  counts = collections.Counter(map(tuple, draws))
  observed = np.array([counts[p] for p in itertools.permutations(range(4))])
  assert observed.sum() == len(draws)
  chi2 = np.sum((observed - 1000.0) ** 2 / 1000.0)
  assert chi2 < stats.chi2.ppf(0.999, 23), (chi2, observed)


def test_positions_and_neighbours_are_uniform_for_a_larger_n():
  n, num = 40, 8_000
  draws = _draws(n, num, seed=2)
  # Where each datum lands: a 40 x 40 table of counts, each 200 in expectation.
  table = np.zeros((n, n))
  for position in range(n):
    table[:, position] = np.bincount(draws[:, position], minlength=n)
  chi2 = np.sum((table - num / n) ** 2 / (num / n))
  assert chi2 < stats.chi2.ppf(0.999, (n - 1) ** 2), chi2
  # Which datum follows datum 0: uniform over the other 39.
  where = np.argmax(draws == 0, axis=1)
  follower = draws[where < n - 1, where[where < n - 1] + 1]
  counts = np.bincount(follower, minlength=n)[1:]
  expected = len(follower) / (n - 1)
  chi2 = np.sum((counts - expected) ** 2 / expected)
  assert chi2 < stats.chi2.ppf(0.999, n - 2), chi2


def test_no_order_left_in_a_long_permutation():
  # Position against index, and each index against the next: rank correlations about 0,
  # within 4 standard errors (1 / sqrt(n)).
  n = 100_000
  perm = np.asarray(batching.permutation(jax.random.key(3), n)).astype(np.float64)
  bound = 4.0 / np.sqrt(n)
  assert abs(np.corrcoef(np.arange(n), perm)[0, 1]) < bound
  assert abs(np.corrcoef(perm[:-1], perm[1:])[0, 1]) < bound
  assert abs(np.corrcoef(perm[:-2], perm[2:])[0, 1]) < bound


def test_refuses_more_than_int32_indices():
  with pytest.raises(ValueError, match=r"\[0, 2\^31\)"):
    batching.permutation(jax.random.key(0), 2**31)


def test_epoch_orders_sorted_on_the_host_are_the_device_program_s():
  # On a CPU, EpochOrders sorts the keys with NumPy; the orders must be the ones the
  # jitted program (used on accelerators) and batch_indices compute, so a run's batches
  # do not depend on where it runs.
  batching._shared_orders.clear()  # the counts below are of orders computed here
  # Several epochs in one call (as a long segment over small data asks) are the same
  # orders as one at a time.
  for num_data, batch_size in ((10, 3), (997, 10)):
    single = [batching._epoch_permutation_program(num_data, batch_size)(
        jax.random.key(4), jnp.int32(epoch))[0] for epoch in range(2, 6)]
    for count in (1, 4):
      for first in range(2, 6, count):
        expected = np.stack(single[first - 2:first - 2 + count])
        for on_host in (True, False):
          orders, _ = batching._epoch_orders(jax.random.key(4), first, num_data, batch_size,
                                             count, on_host)
          np.testing.assert_array_equal(np.asarray(orders), expected)
  orders = batching.EpochOrders(jax.random.key(2), 997, 10)
  window = batching.slice_window(orders.window(0, 250), 0, 250, 997, 10)
  np.testing.assert_array_equal(np.asarray(window),
                                np.asarray(batching.epoch_batches(jax.random.key(2), 997, 10, 250)))
  # Short epochs are computed in bulk even where a window lacks one (a call per epoch
  # cost as much as a cheap model's steps); long ones one at a time.
  small = batching.EpochOrders(jax.random.key(3), 50, 10)
  small.window(0, 5)
  assert sorted(small.cache) == list(range(batching.BULK_EPOCHS))
  large = batching.EpochOrders(jax.random.key(3),
                                batching.BULK_ELEMENTS // batching.BULK_EPOCHS + 10, 10)
  per_large = large.n // 10
  large.window(0, 5)
  assert sorted(large.cache) == [0]  # only the epoch its steps touch
  large.window(per_large - 2, 5)  # across the boundary: the next one too
  assert sorted(large.cache) == [0, 1]
  # A window of many long epochs computes those, not sixteen: a bulk of long epochs put
  # sixteen sorts into one segment every few (a 10^6-row run's pieces spread 20-30%).
  wide = batching.EpochOrders(jax.random.key(3), large.n, large.n // 4)
  window = wide.window(0, 20)
  rows = batching.window_epochs(20, large.n, large.n // 4)  # the most 20 steps can touch
  assert sorted(wide.cache) == list(range(5)) and window.shape[0] == rows == 7
  np.testing.assert_array_equal(
      np.asarray(batching.slice_window(window, 0, 20, large.n, large.n // 4)),
      np.asarray(batching.epoch_batches(jax.random.key(3), large.n, large.n // 4, 20)))
  # A window over many short epochs (computed in bulk), then the next one, which reuses
  # the epochs computed past the first.
  orders = batching.EpochOrders(jax.random.key(3), 50, 10)
  for start in (0, 150):
    window = batching.slice_window(orders.window(start, 150), start, 150, 50, 10)
    np.testing.assert_array_equal(
        np.asarray(window),
        np.asarray(batching.epoch_batches(jax.random.key(3), 50, 10, 300))[start:start + 150])


def test_a_later_call_with_the_same_key_reuses_the_epoch_orders(monkeypatch):
  # A run advanced in many fit calls sorts each epoch once, not once per call.
  batching._shared_orders.clear()
  computed = []
  real = batching.EpochOrders._compute
  monkeypatch.setattr(batching.EpochOrders, "_compute",
                      lambda self, first, count: computed.append(first) or real(self, first, count))
  n = batching.BULK_ELEMENTS // batching.BULK_EPOCHS + 10  # epochs computed one at a time
  before = np.asarray(batching.EpochOrders(jax.random.key(5), n, 10).window(0, 5))
  after = np.asarray(batching.EpochOrders(jax.random.key(5), n, 10).window(0, 5))
  assert computed == [0]
  np.testing.assert_array_equal(before, after)
  other = batching.EpochOrders(jax.random.key(6), n, 10).window(0, 5)  # its own orders
  assert computed == [0, 0] and not np.array_equal(np.asarray(other), before)
  batching.EpochOrders(jax.random.key(5), n, 20).window(0, 5)  # another batch size too
  assert computed == [0, 0, 0]


def test_runs_advanced_in_turn_sort_each_of_their_epochs_once(monkeypatch):
  # recommend advances several runs in turn, each in its own epochs. With the orders kept
  # up to a byte budget that holds two epochs (64 MB at 10^7 data), the runs evicted each
  # other's and every race piece sorted again (24 sorts of 0.5 s in a 60 s budget).
  batching._shared_orders.clear()
  monkeypatch.setattr(batching, "SHARED_ORDERS_BYTES", 1)  # no epoch within the bytes
  computed = []
  real = batching.EpochOrders._compute
  monkeypatch.setattr(batching.EpochOrders, "_compute",
                      lambda self, first, count: computed.append(first) or real(self, first, count))
  n, b = batching.BULK_ELEMENTS // batching.BULK_EPOCHS + 10, 10  # epochs one at a time
  per_epoch = n // b
  for _ in range(3):  # three runs' calls in turn, three times: at epochs 0, 2 and 4
    for start in (0, 2 * per_epoch, 4 * per_epoch):
      batching.EpochOrders(jax.random.key(5), n, b).window(start, 5)
  assert sorted(computed) == [0, 2, 4]
  # The epochs used last are kept: one used again outlives ones computed after it.
  monkeypatch.setattr(batching, "SHARED_ORDERS_EPOCHS", 2)
  batching._shared_orders.clear()
  computed.clear()
  for start in (0, 2 * per_epoch, 0, 4 * per_epoch, 0):
    batching.EpochOrders(jax.random.key(5), n, b).window(start, 5)
  assert computed == [0, 2, 4]


def test_orders_kept_on_the_host_reach_the_device_and_the_row_reads_without_a_copy():
  # At 10^7 data a window of two epochs is 80 MB: copied to the device (unaligned) and
  # back to NumPy for the host rows' reads, each fit call cost about 50 ms more.
  orders = batching.EpochOrders(jax.random.key(7), 1000, 10)
  device = orders.window(0, 5, 20)
  host = orders.window(0, 5, 20, host=True)
  assert isinstance(host, np.ndarray)
  np.testing.assert_array_equal(np.asarray(device), host)
  if orders.on_host:  # a CPU: the device array is the host stack's memory
    assert device.unsafe_buffer_pointer() == host.ctypes.data
