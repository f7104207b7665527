"""Helpers shared by the examples (not part of the library)."""

from __future__ import annotations

import json
import os


def check_checkpoint_config(checkpoint_dir: str | None, config: dict) -> None:
  """Records ``config`` in ``checkpoint_dir`` on the first run; on a rerun, refuses to
  resume checkpoints written under a different configuration (seed, data, grid, ...)."""
  if not checkpoint_dir:
    return
  os.makedirs(checkpoint_dir, exist_ok=True)
  path = os.path.join(checkpoint_dir, "config.json")
  config = json.loads(json.dumps(config))  # normalize tuples and numbers
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    changed = {k: (saved.get(k), v) for k, v in config.items() if saved.get(k) != v}
    if changed:
      raise SystemExit(f"--checkpoint-dir {checkpoint_dir} holds runs made with other "
                       f"settings {changed} (saved, now); use another directory or the same "
                       "settings (only --steps may grow)")
    return
  with open(path, "w") as f:
    json.dump(config, f, indent=1)
