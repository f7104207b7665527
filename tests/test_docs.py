"""The documentation cannot rot: every Python block of the README, the getting-started
and the how-to pages runs (the tutorials' blocks too, marked slow: ``-m slow``, a minute
of the default run's time), every public name has a docstring, and the site builds with
warnings as errors."""

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = os.path.join(ROOT, "docs")
PAGES = ["../README.md", "getting-started.md"] + sorted(
    os.path.relpath(p, DOCS) for folder in ("howto", "tutorials")
    for p in glob.glob(os.path.join(DOCS, folder, "*.md")))
sys.path.insert(0, DOCS)


def _python_blocks(page):
  with open(os.path.join(DOCS, page)) as f:
    return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if p.startswith("tutorials") else p
    for p in PAGES])
def test_code_blocks_run(page, tmp_path, monkeypatch):
  blocks = _python_blocks(page)
  if page != "howto/reproduce.md":
    assert blocks, f"{page} has no python block"
  monkeypatch.chdir(tmp_path)
  namespace = {"__name__": f"docs:{page}"}
  for block in blocks:  # the blocks of a page run in order, sharing names
    exec(compile(block, f"docs/{page}", "exec"), namespace)


def test_every_public_name_has_a_docstring(monkeypatch):
  import hooks

  import dsgrad
  assert hooks.undocumented_public_names() == []

  def undocumented():
    pass

  monkeypatch.setattr(dsgrad, "undocumented", undocumented, raising=False)
  monkeypatch.setattr(dsgrad, "__all__", dsgrad.__all__ + ["undocumented"])
  assert hooks.undocumented_public_names() == ["dsgrad.undocumented"]


# Slow (15 s): building the site is publishing, done after -m slow; every page's code
# blocks and the rendered tables are checked by default above and below.
@pytest.mark.slow
def test_site_builds_without_warnings(tmp_path):
  if shutil.which("mkdocs") is None:
    pytest.skip("mkdocs not installed (pip install -e '.[docs]')")
  result = subprocess.run(["mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert (tmp_path / "site" / "api" / "index.html").exists()


def test_benchmarks_page_is_rendered_from_its_data(tmp_path):
  """Every table of docs/benchmarks.md is what its newest data record renders to, and a
  record changed on disk changes the page (so the comparison can fail)."""
  import json

  sys.path.insert(0, ROOT)
  from benchmarks import render
  page = open(os.path.join(DOCS, "benchmarks.md")).read()
  assert render.render_page(page, os.path.join(DOCS, "data")) == page
  assert "# Benchmarks" in page and page.count("<!-- bench:") >= 40

  # A newer run of one section replaces that section's text and nothing else.
  data = tmp_path / "data"
  shutil.copytree(os.path.join(DOCS, "data"), data)
  runs = json.load(open(data / "memory.json"))
  runs.append(dict(runs[-1], output="a newer run's table"))
  json.dump(runs, open(data / "memory.json", "w"))
  rendered = render.render_page(page, str(data))
  assert rendered != page
  assert "<!-- bench:memory -->\na newer run's table\n<!-- /bench:memory -->" in rendered
  os.remove(data / "memory.json")
  with pytest.raises(SystemExit, match="memory"):
    render.render_page(page, str(data))


def test_an_empty_section_ends_at_its_own_marker_and_a_repeated_one_is_refused(tmp_path):
  """An empty section renders in place, leaving the text after it; the same section
  placed twice is refused (rendered, the first would have swallowed the page up to the
  second's closing marker)."""
  import json

  sys.path.insert(0, ROOT)
  from benchmarks import render
  json.dump([{"output": "table"}], open(tmp_path / "a.json", "w"))
  page = "<!-- bench:a -->\n<!-- /bench:a -->\n\nprose that stays\n"
  assert render.render_page(page, str(tmp_path)) == (
      "<!-- bench:a -->\ntable\n<!-- /bench:a -->\n\nprose that stays\n")
  with pytest.raises(SystemExit, match=r"\['a'\] more than once"):
    render.render_page(page + "\n" + page, str(tmp_path))
