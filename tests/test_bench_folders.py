"""Benchmarks write where they are told: ``--out`` for tables and figures, ``--data-dir``
for data, the checkout's ``docs/`` only by default, and nothing at all with ``--no-write``."""

import os

import pytest

from benchmarks import __main__ as bench_main
from benchmarks import _report


@pytest.fixture(autouse=True)
def _restore_folders():
  saved = dict(_report._FOLDERS)
  yield
  _report._FOLDERS.update(saved)


def test_out_sends_tables_to_the_given_folder(tmp_path, monkeypatch):
  from benchmarks import checks
  docs = os.path.join(_report._ROOT, "docs", "benchmarks.md")
  before = os.stat(docs).st_mtime_ns
  # The timed runs are test_bench_checks's business: what is checked is where main writes.
  monkeypatch.setattr(checks, "run", lambda *a, **k: (
      [(200, 3, "naive", 1.0, 0.9, 0.95)], [("naive", 1.0, 0.9)], [("compile", 0.5)]))
  code = bench_main.main(["checks", "--sizes", "200x3", "--batch-size", "10", "--steps", "2",
                          "--rounds", "1", "--estimators", "naive", "--out", str(tmp_path)])
  assert code == 0
  assert "<!-- bench:checks-" in (tmp_path / "benchmarks.md").read_text()
  assert "<!-- bench:checks-" in (tmp_path / "errors.md").read_text()
  assert os.stat(docs).st_mtime_ns == before  # the checkout's docs untouched


def test_an_installed_copy_needs_out_and_data_dir(monkeypatch, tmp_path):
  monkeypatch.setattr(_report, "DOCS_DIR", None)
  monkeypatch.setattr(_report, "_IN_CHECKOUT", False)
  monkeypatch.delenv("DSGRAD_DATA_DIR", raising=False)
  _report._FOLDERS.update(out=None, data=None)
  with pytest.raises(SystemExit, match="--out DIR"):
    _report.docs_path("benchmarks.md")
  with pytest.raises(SystemExit, match="--data-dir DIR"):
    _report.data_dir()
  _report.set_folders(out=str(tmp_path), data=str(tmp_path))
  assert _report.docs_path("figures/x.png") == str(tmp_path / "figures" / "x.png")
  assert _report.data_dir() == str(tmp_path)
  with pytest.raises(SystemExit, match="not a folder"):
    _report.set_folders(data=str(tmp_path / "missing"))


def test_paper_no_write_writes_no_figure(monkeypatch):
  from benchmarks import paper_large

  def refuse(*args):
    raise AssertionError(f"--no-write wrote {args}")

  monkeypatch.setattr(_report, "docs_path", refuse)
  monkeypatch.setattr(_report, "write_section", refuse)
  # The runs themselves are other tests' business: what is checked is what main writes.
  ran = []
  monkeypatch.setattr(paper_large, "run_task", lambda *a, **k: ran.append(a) or
                      {"times": {}, "timing_steps": 1})
  monkeypatch.setattr(paper_large, "summarize", lambda *a: (None, None, None))
  monkeypatch.setattr(paper_large, "format_task", lambda *a: "table")
  code = paper_large.main(["ppca", "--steps", "20", "--evals", "2", "--seeds", "1",
                           "--estimators", "naive", "--no-write"])
  assert code == 0 and len(ran) == 1


def test_progress_bars_show_what_runs_and_quiet_silences_them(capsys):
  from benchmarks import _report
  try:
    _report.set_quiet(False)
    bar = _report.progress(range(3), "tuning naive")
    assert list(bar) == [0, 1, 2]
    bar.set_postfix_str("ELBO -12.5")
    shown = capsys.readouterr().err
    assert "tuning naive" in shown and "/3" in shown, shown  # what runs, and how many
    _report.set_quiet(True)
    bar = _report.progress(range(3), "tuning naive")
    assert list(bar) == [0, 1, 2]
    bar.set_postfix_str("ELBO -12.5")
    assert capsys.readouterr().err == ""
  finally:
    _report.set_quiet(False)
