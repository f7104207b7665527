"""Loaders read the official formats and reject corrupt or truncated files clearly."""

import os

import numpy as np
import pytest

from dsgrad.datasets import load_australian, load_sonar
from dsgrad.datasets.uci import KNOWN_SHA256, sha256

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def _write_sonar(path, n=208, labels=("1", "-1"), value="0.5"):
  rng = np.random.default_rng(0)
  with open(path, "w") as f:
    for i in range(n):
      feats = ",".join(f"{v:.4f}" for v in rng.uniform(0, 1, 60))
      f.write(f"{feats},{labels[i % 2]}\n")
  return path


def _write_australian(path, n=690):
  rng = np.random.default_rng(1)
  with open(path, "w") as f:
    for i in range(n):
      f.write(" ".join(str(v) for v in rng.integers(0, 50, 14)) + f" {i % 2}\n")
  return path


def test_sonar_formats_and_preprocessing(tmp_path):
  for labels in [("1", "-1"), ("R", "M")]:
    x, y = load_sonar(_write_sonar(tmp_path / "s.csv", labels=labels))
    assert x.shape == (208, 60) and x.dtype == np.float32 and y.shape == (208,)
    assert set(y.tolist()) == {0, 1} and y[0] == 1
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(x.std(0), 1, atol=1e-4)
  raw, _ = load_sonar(tmp_path / "s.csv", standardize_features=False)
  assert raw.min() >= 0 and raw.max() <= 1


def test_files_saved_with_windows_line_ends_or_a_byte_order_mark_read_alike(tmp_path):
  """A byte order mark (a spreadsheet's or a Windows editor's "UTF-8") made the first field
  non-numeric: the file was refused."""
  plain = _write_sonar(tmp_path / "s.csv")
  expected = load_sonar(plain)
  for name, data in [("crlf", plain.read_bytes().replace(b"\n", b"\r\n")),
                     ("bom", b"\xef\xbb\xbf" + plain.read_bytes())]:
    (tmp_path / name).write_bytes(data)
    for got, want in zip(load_sonar(tmp_path / name), expected):
      np.testing.assert_array_equal(got, want)


def test_australian_format(tmp_path):
  x, y = load_australian(_write_australian(tmp_path / "a.dat"))
  assert x.shape == (690, 14) and y.dtype == np.int32 and set(y.tolist()) == {0, 1}


def test_missing_truncated_and_corrupt_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="no file at .*UCI"):
    load_sonar(tmp_path / "nope")
  path = _write_sonar(tmp_path / "s.csv", n=100)
  with pytest.raises(ValueError, match="has 100 rows, expected 208"):
    load_sonar(path)
  path = _write_sonar(tmp_path / "s.csv")
  lines = path.read_text().splitlines()
  lines[5] = lines[5].rsplit(",", 3)[0]
  path.write_text("\n".join(lines))
  with pytest.raises(ValueError, match="corrupt: row 6 has 58 fields, expected 61"):
    load_sonar(path)
  path = _write_sonar(tmp_path / "s.csv", labels=("Mine", "R"))
  with pytest.raises(ValueError, match="unknown labels"):
    load_sonar(path)
  lines = _write_sonar(tmp_path / "s.csv").read_text().splitlines()
  lines[3] = "7.5" + lines[3][lines[3].index(","):]
  (tmp_path / "s.csv").write_text("\n".join(lines))
  with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
    load_sonar(tmp_path / "s.csv")
  bad = _write_australian(tmp_path / "a.dat")
  text = bad.read_text().splitlines()
  text[10] = text[10].replace(text[10].split()[2], "abc", 1)
  bad.write_text("\n".join(text))
  with pytest.raises(ValueError, match="non-numeric field"):
    load_australian(bad)


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="../shared/data is not beside the checkout")
def test_shared_copies_load_and_match_checksums():
  x, y = load_sonar(os.path.join(SHARED, "sonar.all-data"))
  assert x.shape == (208, 60) and int(y.sum()) == 97
  x, y = load_australian(os.path.join(SHARED, "australian.dat"))
  assert x.shape == (690, 14) and int(y.sum()) == 306
  assert sha256(os.path.join(SHARED, "sonar.all-data")) == KNOWN_SHA256["sonar"]
  assert sha256(os.path.join(SHARED, "australian.dat")) == KNOWN_SHA256["australian"]
