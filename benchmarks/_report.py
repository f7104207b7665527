"""Writing benchmark tables into docs/benchmarks.md with machine, versions and date."""

from __future__ import annotations

import datetime
import os
import platform
import re

import jax


def usable_cpus(cgroup_file: str = "/sys/fs/cgroup/cpu.max") -> int:
  """The CPU cores this process may run on: those of its affinity mask (``taskset``, a
  container's cpuset), fewer where a cgroup v2 quota allows less (``docker --cpus``)."""
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
  cpus = cpus or os.cpu_count() or 1
  try:
    with open(cgroup_file) as f:
      quota, period = f.read().split()[:2]
    if quota != "max":
      cpus = min(cpus, max(1, -(-int(quota) // int(period))))
  except (OSError, ValueError):
    pass
  return cpus


_XLA_CORES = None


def set_xla_cores(cores) -> None:
  """Records that XLA's threads were started on ``cores`` (``--xla-cores``), for
  :func:`environment`."""
  global _XLA_CORES
  _XLA_CORES = len(cores)


def environment() -> str:
  """One line naming the machine, the JAX backend and library versions."""
  import flax
  import numpy
  import optax

  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      fields = dict(l.split(":", 1) for l in f.read().split("\n\n")[0].splitlines()
                    if ":" in l)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    # The model name of these cloud machines is "AMD EPYC" for two generations whose
    # ratios differ by up to 1.3x: the family, model and vector width tell them apart.
    cpu = (f"{fields.get('model name', cpu)} (family {fields.get('cpu family', '?')} "
           f"model {fields.get('model', '?')}, "
           f"{'AVX-512' if 'avx512f' in fields.get('flags', '').split() else 'no AVX-512'})")
  except OSError:
    pass
  devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
  xla = "" if _XLA_CORES is None else f", XLA's threads on {_XLA_CORES}"
  return (f"{datetime.date.today().isoformat()}; {cpu}, {usable_cpus()} cores visible{xla}; "
          f"backend {jax.default_backend()} ({devices}); python {platform.python_version()}, "
          f"jax {jax.__version__}, optax {optax.__version__}, flax {flax.__version__}, "
          f"numpy {numpy.__version__}")


# The repository root when this code runs from a checkout (pyproject.toml and docs/ beside
# benchmarks/); a copy elsewhere must be told where to write.
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
_IN_CHECKOUT = (os.path.isfile(os.path.join(_ROOT, "pyproject.toml"))
                and os.path.isdir(os.path.join(_ROOT, "docs")))
DOCS_DIR = os.path.join(_ROOT, "docs") if _IN_CHECKOUT else None
_FOLDERS = {"out": None, "data": None}


_QUIET = {"on": False}


def set_quiet(quiet: bool) -> None:
  """``--quiet``: no progress bars in this process (the printed results stay)."""
  _QUIET["on"] = bool(quiet)


def progress(items, description: str, total: int | None = None):
  """``items`` with a progress bar on stderr: how many are done, the time each took and
  an estimate of the time left (tqdm). Set the bar's last result with
  ``bar.set_postfix_str(...)``. Silent under ``--quiet`` or without tqdm."""
  items = list(items) if total is None and not hasattr(items, "__len__") else items
  try:
    from tqdm.auto import tqdm
  except ImportError:
    tqdm = None
  if _QUIET["on"] or tqdm is None:
    return _Silent(items)
  return tqdm(items, desc=description, total=total, leave=False, dynamic_ncols=True)


class _Silent:
  """What :func:`progress` returns when quiet: the items, and a postfix that goes nowhere."""

  def __init__(self, items):
    self.items = items

  def __iter__(self):
    return iter(self.items)

  def set_postfix_str(self, *args, **kwargs):
    pass


def set_folders(out: str | None = None, data: str | None = None) -> None:
  """Sets the output folder (tables go to ``<out>/benchmarks.md``, figures to
  ``<out>/figures/``) and the data folder for this process (``--out``, ``--data-dir``)."""
  if out is not None:
    _FOLDERS["out"] = os.path.abspath(out)
  if data is not None:
    if not os.path.isdir(data):
      raise SystemExit(f"--data-dir {data!r} is not a folder")
    _FOLDERS["data"] = os.path.abspath(data)


def out_dir() -> str:
  """Where tables and figures go: ``--out``, else the checkout's ``docs/``."""
  if _FOLDERS["out"] is not None:
    return _FOLDERS["out"]
  if DOCS_DIR is None:
    raise SystemExit("this copy of the benchmarks is not in a dsgrad checkout, so it has no "
                     "docs/ to write to: pass --out DIR (or --no-write to print only)")
  return DOCS_DIR


def data_dir() -> str:
  """The folder of the embedded data sets: ``--data-dir``, else ``DSGRAD_DATA_DIR``, else
  ``../shared/data`` beside the checkout."""
  if _FOLDERS["data"] is not None:
    return _FOLDERS["data"]
  if os.environ.get("DSGRAD_DATA_DIR"):
    return os.environ["DSGRAD_DATA_DIR"]
  beside = os.path.join(_ROOT, "..", "shared", "data")
  if _IN_CHECKOUT and os.path.isdir(beside):
    return os.path.abspath(beside)
  raise SystemExit("no data folder: pass --data-dir DIR (the folder holding australian.dat, "
                   "sonar.all-data, ...) or set DSGRAD_DATA_DIR")


def format_bytes(b: int) -> str:
  """``b`` bytes as GiB (from 1 GiB up) or MiB, for benchmark tables."""
  return f"{b / 2**30:,.2f} GiB" if b >= 2**30 else f"{b / 2**20:,.1f} MiB"


def docs_path(relative: str) -> str:
  """Absolute path of ``relative`` (e.g. ``figures/x.png``) under the output folder
  (:func:`out_dir`), its parent folders created."""
  path = os.path.join(out_dir(), relative)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return path


def write_section(name: str, body: str, path: str | None = None) -> str:
  """Replaces (or appends) the section between ``<!-- bench:name -->`` markers."""
  path = os.path.abspath(path or docs_path("benchmarks.md"))
  begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
  block = f"{begin}\n{body.rstrip()}\n{end}"
  text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
  pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
  text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)
  return path


def add_output_flags(parser, name: str) -> None:
  """A benchmark's ``--section`` (its page section and data file, by default
  ``<name>-<backend>``: :func:`section_of`) and ``--no-write`` (print only)."""
  parser.add_argument("--section", default=None, help=f"default: {name}-<backend>")
  parser.add_argument("--no-write", action="store_true",
                      help="print only: no data file, docs/benchmarks.md unchanged")


def section_of(args, name: str) -> str:
  """The section :func:`add_output_flags` names: ``--section``, else ``<name>-<backend>``."""
  return args.section or f"{name}-{jax.default_backend()}"


def publish(section: str, body: str | None, write: bool, data=None, render=None) -> None:
  """Prints a benchmark's result and, if ``write``, records the run and puts its section in
  docs/benchmarks.md.

  Every run is appended to ``docs/data/<section>.json`` (machine and versions, date, command)
  and the page's section is rendered from the newest record, so ``python -m benchmarks
  render`` rebuilds the page from the data files alone.

  Args:
    section: the section's name (``<!-- bench:section -->`` markers, the data file's name).
    body: the printed table, for benchmarks without a renderer; the record keeps it as the
      run's output.
    write: whether to record the run and update the page (False: print only).
    data: the raw numbers (JSON-serializable), with ``render``.
    render: a function of one run record returning the section's text (a module-level
      function, recorded by name so the page can be re-rendered later).
  """
  record = new_record(data, render, body)
  # Rendered from the record as it will be read back, so what is printed now and what the
  # page shows after a re-render cannot differ.
  import json
  record = json.loads(json.dumps(record))
  if write:  # first, so that a run is kept even where rendering it fails
    print(f"wrote {save_run(section, record)}", flush=True)
  text = render_record(record)
  print(text, flush=True)
  if write:
    print(f"wrote {write_section(section, text)}")


def command() -> str:
  """This process's command line as a user would type it (``python -m benchmarks ...``),
  without ``--out`` and ``--data-dir``, which say only where files are."""
  import sys
  args, skip = [], False
  for arg in sys.argv[1:]:
    if skip:
      skip = False
    elif arg in ("--out", "--data-dir"):
      skip = True
    elif not arg.startswith(("--out=", "--data-dir=")):
      args.append(arg)
  return " ".join(["python -m benchmarks", *args])


def new_record(results, render, output: str | None = None) -> dict:
  """One run's record: date, environment, command, and either the raw ``results`` with the
  name of the ``render`` function that turns them into the section (``output`` unused),
  or, without ``render``, the printed ``output`` of a benchmark that keeps no raw
  numbers."""
  record = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "environment": environment(), "command": command()}
  if render is not None:
    record["renderer"] = f"{render.__module__}:{render.__name__}"
    record["results"] = results
  else:
    record["output"] = output
  return record


def render_record(record: dict) -> str:
  """The section text of one run record (see :func:`new_record`)."""
  if "renderer" not in record:
    if "output" not in record:
      raise SystemExit(f"a run record of {record.get('command')!r} has neither a renderer "
                       "nor an output to show")
    return record["output"]
  import importlib
  module, name = record["renderer"].split(":")
  return getattr(importlib.import_module(module), name)(record)


def save_run(section: str, record: dict) -> str:
  """Appends one run's record to ``<out>/data/<section>.json`` (a JSON list of runs, the
  newest last) and returns the path."""
  import json
  path = docs_path(os.path.join("data", f"{section}.json"))
  runs = json.load(open(path)) if os.path.exists(path) else []
  runs.append(record)
  with open(path, "w") as f:
    json.dump(runs, f, indent=1)
  return path


def elbo_or_diverged(objective, params, key, num_samples: int, **kwargs) -> tuple:
  """``dsgrad.elbo``'s ``(estimate, standard error)``, or ``(-inf, nan)`` for a run that
  diverged (non-finite params, or an ELBO that is not finite there), which dsgrad refuses
  to estimate: a benchmark records the divergence instead of stopping."""
  import dsgrad  # pylint: disable=import-outside-toplevel
  if not bool(dsgrad.checks.all_finite(params)):
    return float("-inf"), float("nan")
  try:
    return dsgrad.elbo(objective, params, key, num_samples, **kwargs)
  except dsgrad.diagnostics.NonFiniteELBO:
    return float("-inf"), float("nan")
