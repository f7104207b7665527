"""``python -m dsgrad.bench <benchmark> [options]``."""

import sys

BENCHMARKS = {
    "step-cost": "dsgrad.bench.step_cost",
    "paper": "dsgrad.bench.paper",
    "scale": "dsgrad.bench.scale",
    "precision": "dsgrad.bench.precision",
    "memory": "dsgrad.bench.memory",
    "hmcecs": "dsgrad.bench.hmcecs",
    "mcvae-ppca": "dsgrad.bench.mcvae_ppca",
    "dais": "dsgrad.bench.dais",
    "peers": "dsgrad.bench.peers",
    "checks": "dsgrad.bench.checks",
}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
    print("usage: python -m dsgrad.bench {" + ",".join(BENCHMARKS) + "} [options]")
    for name, module in BENCHMARKS.items():
      print(f"  {name:<12} {module}")
    return 0 if argv and argv[0] in ("-h", "--help") else 2
  import importlib
  return importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
  sys.exit(main())
