import pytest
"""``python -m benchmarks checks`` runs end to end on a tiny problem and its table holds
one row per estimator and size, with positive step times."""

from benchmarks import checks


# A smoke run of benchmark code; the checks themselves are tested in test_bad_input.
@pytest.mark.slow
def test_checks_benchmark_smoke():
  step_rows, per_call, once = checks.run(sizes=((200, 3),), batch_size=10, steps=3, rounds=1,
                               estimators=("naive", "joint_saga"))
  assert [row[:3] for row in step_rows] == [(200, 3, "naive"), (200, 3, "joint_saga")]
  assert all(on > 0 and off > 0 and deferred > 0 for *_, on, off, deferred in step_rows)
  assert len(once) == 4 and all(seconds >= 0 for _, seconds in once)
  assert [row[0] for row in per_call] == ["naive", "joint_saga"]
  assert all(on > 0 and off > 0 for _, on, off in per_call)
  table = checks.format_table(step_rows, per_call, once, dict(batch_size=10, steps=3, rounds=1))
  assert "| 200 | 3 | joint_saga |" in table and "SHA-256" in table
