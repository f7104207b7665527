"""UCI Sonar and Statlog Australian credit, as used by the joint control variate paper.

Both loaders return ``(features, labels)`` as float32 ``(N, D)`` and int32 ``(N,)`` in
``{0, 1}``. Features are standardized (zero mean, unit variance per column) unless
``standardize=False``; add an intercept column yourself if the model needs one.

References:
  Wang, Geffner, Domke (2024), Sec. 7.1 (Sonar: N=208, D=60; Australian: N=690, D=14).
  UCI Machine Learning Repository: "Connectionist Bench (Sonar, Mines vs. Rocks)" and
  "Statlog (Australian Credit Approval)", CC BY 4.0.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from dsgrad import checks

_HOW_TO_GET = ("Download it from the UCI Machine Learning Repository ({name}) or use the "
               "copy in the repository's ../shared/data/, and pass its path.")

# sha256 of the files as distributed with this project (shared/data); other faithful
# copies (e.g. Sonar with M/R labels) are accepted after the structural checks.
KNOWN_SHA256 = {
    "sonar": "bc8ed9e91e2523a9eabc6b9fef9da17b5d3c723ad29bf1396f56354a6e21c4cb",
    "australian": "f70c7bf41634c70ee5b57743b2b555bc710dcbc4ec83464d498e5c05fba4af4b",
}


def standardize(features: np.ndarray) -> np.ndarray:
  """Columns shifted to mean 0 and scaled to standard deviation 1 (constant columns: 0)."""
  x = checks.numeric_array(features, "features").astype(np.float64)
  if not np.all(np.isfinite(x)):
    raise ValueError("features contain non-finite values (NaN or inf)")
  # Z-scores do not depend on a column's scale: dividing by its largest magnitude first
  # keeps x**2 finite for values up to 1e308, which would otherwise overflow into an
  # infinite spread and a column of zeros.
  magnitude = np.max(np.abs(x), axis=0) if x.size else np.ones(x.shape[1:])
  x = x / np.where(magnitude > 0, magnitude, 1.0)
  std = x.std(0)
  return ((x - x.mean(0)) / np.where(std > 0, std, 1.0)).astype(np.float32)


def add_intercept(features: np.ndarray) -> np.ndarray:
  """``(N, D)`` features with a column of ones appended (``(N, D + 1)`` float32), so that a
  GLM's last weight is its intercept."""
  x = checks.float32_values(features, "features")
  if x.ndim != 2:
    raise ValueError(f"features must have shape (N, D), got {x.shape}: reshape one "
                     "feature to (N, 1)")
  return np.concatenate([x, np.ones((x.shape[0], 1), np.float32)], axis=1)


def sha256(path: str | os.PathLike) -> str:
  """Hex sha256 of a file."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _read_rows(path, delimiter, name, uci_name):
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{name}: no file at {path!r}. " + _HOW_TO_GET.format(name=uci_name))
  checks.check_regular_file(path, name)
  # utf-8-sig: a file saved by a spreadsheet or a Windows editor may start with a byte
  # order mark, which would make the first field non-numeric.
  with open(path, "r", encoding="utf-8-sig", errors="replace") as f:
    lines = [line.strip() for line in f if line.strip()]
  return [line.split(delimiter) if delimiter else line.split() for line in lines]


def _check_shape(rows, name, path, num_rows, num_cols, uci_name):
  if not rows:
    raise ValueError(f"{name}: {path!r} is empty (no data rows). "
                     + _HOW_TO_GET.format(name=uci_name))
  widths = {len(r) for r in rows}
  if widths != {num_cols}:
    bad = next(i for i, r in enumerate(rows) if len(r) != num_cols)
    raise ValueError(f"{name}: {path!r} is corrupt: row {bad + 1} has {len(rows[bad])} fields, "
                     f"expected {num_cols}. " + _HOW_TO_GET.format(name=uci_name))
  if len(rows) != num_rows:
    raise ValueError(f"{name}: {path!r} has {len(rows)} rows, expected {num_rows} (truncated "
                     f"or not the original file). " + _HOW_TO_GET.format(name=uci_name))


def _to_float(rows, name, path):
  try:
    return np.asarray(rows, dtype=np.float64)
  except ValueError as err:
    raise ValueError(f"{name}: {path!r} contains a non-numeric field ({err})") from err


def load_sonar(path: str | os.PathLike, *, standardize_features: bool = True):
  """UCI Sonar: 208 sonar returns, 60 energies in [0, 1], two classes.

  Accepts the comma-separated file with the label in the last column as ``1``/``-1``
  (this project's copy) or ``R``/``M`` (the UCI original). The project's copy has 97
  ``1`` and 111 ``-1`` rows; UCI's original has 97 rocks and 111 mines, so ``1``
  corresponds to rock and both files load identically with ``1``/``R`` -> 1 and
  ``-1``/``M`` -> 0. (shared/data's README states the opposite mapping; the counts say
  otherwise. The label's meaning does not matter for the paper's experiments.)

  Args:
    path: the ``sonar.all-data`` file.
    standardize_features: standardize the 60 features (the paper's preprocessing).

  Returns:
    ``(features (208, 60) float32, labels (208,) int32 in {0, 1})``, 1 = rock.

  Raises:
    FileNotFoundError: no file at ``path``.
    ValueError: wrong row or column count, non-numeric or out-of-range features, or
      unknown labels -- with what was found and how to get the file.
  """
  name, uci = "sonar", "Connectionist Bench (Sonar, Mines vs. Rocks)"
  rows = _read_rows(path, ",", name, uci)
  _check_shape(rows, name, path, 208, 61, uci)
  labels_raw = [r[-1].strip() for r in rows]
  mapping = {"1": 1, "-1": 0, "R": 1, "M": 0}
  unknown = sorted(set(labels_raw) - set(mapping))
  if unknown:
    raise ValueError(f"{name}: {path!r} has unknown labels {unknown[:3]}; expected 1/-1 or R/M")
  x = _to_float([r[:-1] for r in rows], name, path)
  if not np.all(np.isfinite(x)) or x.min() < 0 or x.max() > 1:
    raise ValueError(f"{name}: {path!r} has features outside [0, 1] "
                     f"(min {x.min():.3g}, max {x.max():.3g}); the file is corrupt")
  y = np.asarray([mapping[v] for v in labels_raw], np.int32)
  return (standardize(x) if standardize_features else checks.float32_values(x, name)), y


def load_australian(path: str | os.PathLike, *, standardize_features: bool = True):
  """Statlog Australian credit approval: 690 applications, 14 attributes, 0/1 label.

  The attributes mix categorical codes and amounts on very different scales, so they
  are standardized by default (as the data set's README asks).

  Args:
    path: the whitespace-separated ``australian.dat`` file.
    standardize_features: standardize the 14 attributes.

  Returns:
    ``(features (690, 14) float32, labels (690,) int32 in {0, 1})``.

  Raises:
    FileNotFoundError / ValueError: as for :func:`load_sonar`.
  """
  name, uci = "australian", "Statlog (Australian Credit Approval)"
  rows = _read_rows(path, None, name, uci)
  _check_shape(rows, name, path, 690, 15, uci)
  data = _to_float(rows, name, path)
  if not np.all(np.isfinite(data)):
    raise ValueError(f"{name}: {path!r} contains non-finite values; the file is corrupt")
  y = data[:, -1]
  if not set(np.unique(y)) <= {0.0, 1.0}:
    raise ValueError(f"{name}: {path!r} has labels {sorted(set(np.unique(y)))[:4]}, expected 0/1")
  x = data[:, :-1]
  return ((standardize(x) if standardize_features else checks.float32_values(x, name)),
          y.astype(np.int32))
