"""Writing benchmark tables into docs/benchmarks.md with machine, versions and date."""

from __future__ import annotations

import datetime
import os
import platform
import re

import jax


def environment() -> str:
  """One line naming the machine, the JAX backend and library versions."""
  import flax
  import numpy
  import optax
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    if names:
      cpu = names[0]
  except OSError:
    pass
  devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
  return (f"{datetime.date.today().isoformat()}; {cpu}, {os.cpu_count()} cores visible; "
          f"backend {jax.default_backend()} ({devices}); python {platform.python_version()}, "
          f"jax {jax.__version__}, optax {optax.__version__}, flax {flax.__version__}, "
          f"numpy {numpy.__version__}")


DOCS_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "docs"))


def format_bytes(b: int) -> str:
  """``b`` bytes as GiB (from 1 GiB up) or MiB, for benchmark tables."""
  return f"{b / 2**30:,.2f} GiB" if b >= 2**30 else f"{b / 2**20:,.1f} MiB"


def docs_path(relative: str) -> str:
  """Absolute path of ``relative`` (e.g. ``figures/x.png``) under the project's docs/."""
  return os.path.join(DOCS_DIR, relative)


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


def publish(section: str, body: str, write: bool) -> None:
  """Prints a benchmark's ``body`` and, if ``write``, puts it in docs/benchmarks.md."""
  print(body, flush=True)
  if write:
    print(f"\nwrote {write_section(section, body)}")
