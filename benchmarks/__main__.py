"""``python -m benchmarks <benchmark> [options]``."""

import sys

BENCHMARKS = {
    "step-cost": "benchmarks.step_cost",
    "paper": "benchmarks.paper",
    "scale": "benchmarks.scale",
    "scale-suite": "benchmarks.scale_suite",
    "follow-spread": "benchmarks.follow_spread",
    "disk-step": "benchmarks.disk_step",
    "scale-step": "benchmarks.scale_step",
    "scale-batch": "benchmarks.scale_batch",
    "leaves-apart": "benchmarks.leaves_apart",
    "two-threads": "benchmarks.two_threads",
    "precision": "benchmarks.precision",
    "memory": "benchmarks.memory",
    "hmcecs": "benchmarks.hmcecs",
    "hmcecs-groups": "benchmarks.hmcecs_groups",
    "mcvae-ppca": "benchmarks.mcvae_ppca",
    "dais": "benchmarks.dais",
    "peers": "benchmarks.peers",
    "checks": "benchmarks.checks",
    "bridge-cost": "benchmarks.bridge_cost",
    "fit-overhead": "benchmarks.fit_overhead",
    "narrow-posterior": "benchmarks.narrow_posterior",
    "schedule-free": "benchmarks.schedule_free",
    "compile-cache": "benchmarks.compile_cache",
    "race-rates": "benchmarks.race_rates",
    "render": "benchmarks.render",
}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
    print("usage: python -m benchmarks {" + ",".join(BENCHMARKS) + "} [options] "
          "[--out DIR] [--data-dir DIR] [--quiet]")
    print("  --out DIR       where tables (DIR/benchmarks.md) and figures (DIR/figures/) go; "
          "default: the checkout's docs/")
    print("  --data-dir DIR  the embedded data sets; default: ../shared/data beside the "
          "checkout, or $DSGRAD_DATA_DIR")
    print("  --quiet         no progress bars (results are still printed)")
    print("  --xla-cores K   XLA's threads on K cores, the rest of the process on all "
          "(dsgrad.pin_xla_threads)")
    for name, module in BENCHMARKS.items():
      print(f"  {name:<12} {module}")
    return 0 if argv and argv[0] in ("-h", "--help") else 2
  import argparse
  import importlib
  from benchmarks import _report
  from dsgrad import command_line
  # Folders every benchmark shares, accepted anywhere after the benchmark's name.
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("--out", default=None)
  common.add_argument("--data-dir", default=None)
  common.add_argument("--quiet", action="store_true")
  common.add_argument("--xla-cores", type=command_line.count(1), default=None)
  folders, rest = common.parse_known_args(argv[1:])
  if folders.xla_cores is not None:
    import dsgrad
    _report.set_xla_cores(dsgrad.pin_xla_threads(folders.xla_cores))
  _report.set_folders(folders.out, folders.data_dir)
  _report.set_quiet(folders.quiet)
  return importlib.import_module(BENCHMARKS[argv[0]]).main(rest)


if __name__ == "__main__":
  sys.exit(main())
