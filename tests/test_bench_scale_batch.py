"""benchmarks/scale_batch.py: the fixed-cost verdict of a batch size follows from the step
times at it and at ten times the rows."""

from benchmarks import scale_batch


def _times(ms):
  return {"step_seconds": {"hand naive": [1e-3 * ms], "fit naive": [1e-3 * ms, 1e-3 * ms]}}


def test_a_step_that_less_than_doubles_for_ten_times_the_rows_is_fixed_cost_bound():
  rows = scale_batch._step_table({"100": _times(1.0), "1000": _times(1.5),
                                  "10000": _times(5.0), "30000": _times(9.0)})
  body = {line.split(" | ")[0].strip("| "): line for line in rows[2:]}
  assert body["100"].endswith("| 1.50x | yes |")  # 10x the rows for 1.5x the time
  assert body["1,000"].endswith("| 3.33x | no |")
  assert body["10,000"].endswith("| - | - |")  # the next size is not ten times the rows
  assert "| 0.1 |" in body["100"]  # 100 rows in 1 ms: 0.1 rows per microsecond


def test_a_timed_call_runs_one_epoch_within_bounds():
  assert scale_batch.steps_per_call(1_000_000, 1_000) == 1_000
  assert scale_batch.steps_per_call(1_000_000, 100_000) == 100  # at least 100 steps
  assert scale_batch.steps_per_call(1_000_000, 100) == 1_000  # at most 1,000
