"""The SAGA running mean counts a datum once per batch: ``first_occurrence`` marks exactly
the first position of each index, for any batch (checked against a plain loop)."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from dsgrad.tables import first_occurrence


# Batches of a few lengths: each new length compiles a program (90 of the test's 3 s).
@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 5, 17, 40]).flatmap(
    lambda size: st.lists(st.integers(0, 9), min_size=size, max_size=size)))
def test_first_occurrence_marks_each_index_once(values):
  seen, expected = set(), []
  for v in values:
    expected.append(v not in seen)
    seen.add(v)
  got = np.asarray(first_occurrence(jnp.asarray(values, jnp.int32)))
  np.testing.assert_array_equal(got, np.asarray(expected))
