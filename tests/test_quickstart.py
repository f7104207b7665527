"""The README's main job and the quick example run end to end (small sizes, few steps) and
write finite results."""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


# Slow (22 s): the README runs the main job (tested below); this is the small example.
@pytest.mark.slow
def test_quickstart_runs(tmp_path, capsys):
  import logistic_regression as quickstart
  results = quickstart.main(["--steps", "60", "--batch-size", "10", "--seeds", "2",
                             "--lrs", "1e-3", "--no-progress", "--all-cores", "--out", str(tmp_path)])
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert set(saved["results"]) == {"naive", "cv", "inc", "joint_svrg", "joint_saga"}
  for name, r in saved["results"].items():
    assert len(r["final_elbo"]) == 2 and all(math.isfinite(v) for v in r["final_elbo"]), name
    assert r["grad_variance"] > 0 and r["lr"] == 1e-3, name
    assert results[name]["final_elbo_mean"] == r["final_elbo_mean"]
  assert saved["results"]["joint_saga"]["table_bytes"] > 0
  winner = max(results, key=lambda k: results[k]["final_elbo_mean"])
  out = capsys.readouterr().out
  assert f"Winner: {winner}" in out
  # At equal wall-clock each estimator takes the steps naive's time for --steps affords
  # at its own measured cost, and the hand-written loop takes --steps.
  equal = saved["equal_wall_clock"]
  naive_ms = saved["results"]["naive"]["ms_per_step"]
  for name, r in saved["results"].items():
    row = equal["rows"][name]
    assert row["steps"] == max(1, round(60 * naive_ms / r["ms_per_step"])), name
    assert len(row["final_elbo"]) == 2 and all(map(math.isfinite, row["final_elbo"])), name
  assert equal["rows"]["naive"]["final_elbo"] == saved["results"]["naive"]["final_elbo"]
  hand = equal["rows"]["hand loop"]
  assert hand["steps"] == 60 and all(map(math.isfinite, hand["final_elbo"]))
  assert "recommend" not in saved  # no advice on a budget of milliseconds
  best = max(saved["results"], key=lambda k: sum(equal["rows"][k]["final_elbo"]))
  assert equal["best"] == best and f"{best} - hand loop:" in out


def test_quickstart_refuses_a_reported_tuning_seed(tmp_path):
  import logistic_regression as quickstart
  with pytest.raises(SystemExit):
    quickstart.main(["--seeds", "3", "--tune-seed", "1", "--out", str(tmp_path)])


def test_main_job_runs_at_a_small_size(tmp_path, capsys):
  import hierarchical_logistic as main_job
  main_job.main(["--rows", "3000", "--groups", "40", "--seconds", "0.3", "--all-cores",
                 "--out", str(tmp_path)])
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  rows = {row["contender"]: row for row in saved["rows"]}
  assert set(rows) == {"hand", "naive", "naive 2x batch", "joint_svrg", "joint_saga"}
  for name, row in rows.items():
    elbos = [e for _, e in row["trace"]]
    assert row["steps"] > 0 and all(map(math.isfinite, elbos)), name
    # The run climbs from its start, and its time-to-target is read from its own trace.
    assert elbos[-1] > elbos[0], name
    reached = row["reached_seconds"]
    assert reached is None or reached <= row["seconds"] + 1e-9, name
  hand = rows["hand"]
  assert hand["vs_hand"] == 0.0 and hand["reached_seconds"] <= hand["seconds"] + 1e-9
  out = capsys.readouterr().out
  assert "reached target" in out and "joint_svrg" in out


def test_the_examples_refuse_a_batch_larger_than_their_data_by_name(tmp_path, capsys):
  # Before: fit's ValueError in a traceback, after the data were made or loaded (MovieLens
  # and CIFAR-10 check as the quick example does, with _common.check_batch_fits).
  import hierarchical_logistic as main_job
  import logistic_regression as quickstart
  with pytest.raises(SystemExit):
    main_job.main(["--rows", "100", "--batch-size", "60", "--out", str(tmp_path)])
  assert "--rows 100 must be at least twice --batch-size (120)" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    quickstart.main(["--batch-size", "1000", "--seeds", "1", "--all-cores", "--out",
                     str(tmp_path)])
  assert "--batch-size 1000 exceeds the 569 rows of breast_cancer" in capsys.readouterr().err


def test_checkpoints_written_before_the_all_cores_flag_still_resume(tmp_path):
  from _common import check_checkpoint_config
  before = {"seed": 0, "lrs": "1e-3", "dataset": "breast_cancer"}
  check_checkpoint_config(str(tmp_path), before)            # written by an older version
  check_checkpoint_config(str(tmp_path), {**before, "all_cores": False})  # resumes
  check_checkpoint_config(str(tmp_path), {**before, "all_cores": True})
  with pytest.raises(SystemExit, match="other settings"):   # a setting of the runs does not
    check_checkpoint_config(str(tmp_path), {**before, "seed": 1})
