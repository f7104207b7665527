"""The README's main job runs end to end (few steps) and writes finite results."""

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def test_quickstart_runs(tmp_path):
  import logistic_regression as quickstart
  results = quickstart.main(["--steps", "60", "--batch-size", "10", "--out", str(tmp_path)])
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert set(saved["results"]) == {"naive", "cv", "inc", "joint_svrg", "joint_saga"}
  for name, r in saved["results"].items():
    assert math.isfinite(r["final_elbo"]) and r["grad_variance"] > 0, name
    assert results[name]["final_elbo"] == r["final_elbo"]
  assert saved["results"]["joint_saga"]["table_bytes"] > 0
