"""Helpers shared by the examples (not part of the library)."""

from __future__ import annotations

import json
import os

import dsgrad
from dsgrad import command_line


def first_paragraph(doc: str) -> str:
  """The first paragraph of a module docstring on one line (a command's description)."""
  return " ".join(doc.strip().split("\n\n")[0].split())


def check_checkpoint_config(checkpoint_dir: str | None, config: dict) -> None:
  """Records ``config`` in ``checkpoint_dir`` on the first run; on a rerun, refuses to
  resume checkpoints written under a different configuration (seed, data, grid, ...)."""
  if not checkpoint_dir:
    return
  os.makedirs(checkpoint_dir, exist_ok=True)
  path = os.path.join(checkpoint_dir, "config.json")
  # Where XLA's threads run is no setting of the runs: a directory written before the flag
  # existed, or with it, resumes either way.
  config = json.loads(json.dumps({k: v for k, v in config.items() if k != "all_cores"}))
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


def add_all_cores_flag(parser) -> None:
  """``--all-cores``: what :func:`place_xla_threads` leaves as it is."""
  parser.add_argument("--all-cores", action="store_true",
                      help="let XLA's threads use every core (default: one, "
                           "dsgrad.pin_xla_threads(1))")


def place_xla_threads(args) -> int | None:
  """XLA's compute threads on one core (``dsgrad.pin_xla_threads(1)``) unless
  ``--all-cores``: on 2-core machines a pool split over both made the same step slower and
  its time uneven. Call it after the arguments are checked, before any JAX array exists.
  Returns how many cores the pool was given, or None where it was left as it is."""
  if not args.all_cores and hasattr(os, "sched_setaffinity"):
    return len(dsgrad.pin_xla_threads(1))
  return None


def add_run_flags(parser, *, steps: int, eval_every: int, batch_size: int, out: str):
  """The flags every training example shares: steps, evaluation interval, batch size,
  seed, output folder, ``--all-cores``."""
  add_all_cores_flag(parser)
  parser.add_argument("--steps", type=command_line.count(1), default=steps,
                      help="optimization steps per run")
  parser.add_argument("--eval-every", type=command_line.count(1), default=eval_every,
                      help="steps between full-data evaluations (--steps must be a multiple)")
  parser.add_argument("--batch-size", type=command_line.count(1),
                      default=batch_size, help="data per step")
  parser.add_argument("--seed", type=command_line.count(0), default=0,
                      help="seed of every batch and noise draw (runs are deterministic given it)")
  parser.add_argument("--out", type=command_line.folder(),
                      default=os.path.join("results", out),
                      help="folder for results.json and the figures")


def plot_elbo(histories: dict, path: str, title: str) -> bool:
  """ELBO against iterations and against training seconds (log scale), one line per run.

  Args:
    histories: ``{name: {"step": [...], "wall_time": [...], "elbo": [...]}}``.
    path: PNG to write.
    title: figure title.

  Returns:
    False (and prints why) when matplotlib is missing, else True.
  """
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no plot")
    return False
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for name, h in histories.items():
    axes[0].plot(h["step"], h["elbo"], label=name)
    axes[1].plot(h["wall_time"], h["elbo"], label=name)
  # The first quarter of each run is mostly the climb from the start: leave it out of
  # the vertical range so that the differences at the end stay visible.
  tail = [e for h in histories.values() for e in h["elbo"][len(h["elbo"]) // 4:]]
  lo, hi = min(tail), max(max(h["elbo"]) for h in histories.values())
  margin = 0.05 * (hi - lo) or 1.0
  for ax, label in zip(axes, ["iteration", "training seconds (log scale)"]):
    ax.set_xlabel(label)
    ax.set_ylabel("full-data ELBO")
    ax.set_ylim(lo - margin, hi + margin)
    ax.grid(alpha=0.3)
  axes[1].set_xscale("log")
  axes[0].legend()
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  print(f"wrote {path}")
  return True


def chosen_estimators(parser, spec: str, available, required=()) -> list[str]:
  """The names in the comma-separated ``--estimators`` value ``spec``, in order; exits
  through ``parser.error`` on a name not in ``available`` or a missing ``required`` one."""
  names = [name.strip() for name in spec.split(",")]
  unknown = sorted(set(names) - set(available))
  missing = sorted(set(required) - set(names))
  if unknown or missing:
    parser.error(f"--estimators: unknown {unknown}, missing {missing}; choose from "
                 f"{sorted(available)}" + (f", including {sorted(required)}" if required else ""))
  return names


def check_batch_fits(parser, batch_size: int, num_data: int, what: str) -> None:
  """Exits through ``parser.error`` where ``--batch-size`` exceeds the ``num_data`` rows
  the data turned out to hold (known only once they are loaded)."""
  if batch_size > num_data:
    parser.error(f"--batch-size {batch_size} exceeds the {num_data:,} {what}")
