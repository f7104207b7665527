"""``python -m benchmarks render [--check]``: the benchmarks page from its data files.

Each section of docs/benchmarks.md between ``<!-- bench:NAME -->`` markers is rebuilt from
the newest run in ``docs/data/NAME.json``; the prose around the sections is left as it is.
Older runs stay in the data files and leave the page. ``--check`` writes nothing and fails
(exit status 1, with a diff) when the committed page differs from what its data renders.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re

from benchmarks import _report

# The lazy body ends at the section's nearest closing marker: an optional body would
# rather span to a later closing marker of the same name than be empty.
_SECTION = re.compile(r"(<!-- bench:(\S+?) -->\n)(.*?)(<!-- /bench:\2 -->)", re.S)


def render_page(text: str, data_folder: str) -> str:
  """``text`` (a benchmarks page) with every marked section rebuilt from ``data_folder``.

  Raises:
    SystemExit: a section has no data file, its data file holds no run, or it appears
      twice on the page.
  """
  names = re.findall(r"<!-- bench:(\S+?) -->", text)
  twice = sorted({name for name in names if names.count(name) > 1})
  if twice:
    raise SystemExit(f"the benchmarks page has section(s) {twice} more than once; keep one")

  def section(match):
    name = match.group(2)
    path = os.path.join(data_folder, f"{name}.json")
    if not os.path.isfile(path):
      raise SystemExit(f"section {name!r} of the benchmarks page has no data file {path}")
    runs = json.load(open(path))
    if not runs:
      raise SystemExit(f"{path} holds no run")
    return match.group(1) + _report.render_record(runs[-1]).rstrip() + "\n" + match.group(4)
  return _SECTION.sub(section, text)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks render",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 if the page differs from its data")
  args = parser.parse_args(argv)
  page = os.path.join(_report.out_dir(), "benchmarks.md")
  text = open(page).read()
  rendered = render_page(text, os.path.join(_report.out_dir(), "data"))
  if args.check:
    if rendered != text:
      print("".join(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True),
                                         page, "rendered from docs/data")))
      return 1
    print(f"{page} matches its data files")
    return 0
  with open(page, "w") as f:
    f.write(rendered)
  print(f"wrote {page}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
