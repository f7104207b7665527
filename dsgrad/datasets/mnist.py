"""MNIST from the standard IDX files (plain or gzipped), verified as they are read."""

from __future__ import annotations

import gzip
import hashlib
import math
import os

import numpy as np

from dsgrad import checks

# md5 of the official gzipped files (yann.lecun.com/exdb/mnist, as also used by torchvision).
KNOWN_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049
_HOW_TO_GET = ("Get the four MNIST IDX files (train-images-idx3-ubyte.gz, ...) from a "
               "mirror of yann.lecun.com/exdb/mnist and pass their directory.")


def _read(directory, stem):
  for name in (stem + ".gz", stem):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      checks.check_regular_file(path, "mnist")
      with open(path, "rb") as f:
        raw = f.read()
      if name in KNOWN_MD5 and hashlib.md5(raw).hexdigest() != KNOWN_MD5[name]:
        raise ValueError(f"mnist: {path!r} does not have the official md5 "
                         f"{KNOWN_MD5[name]} (corrupt or truncated download). " + _HOW_TO_GET)
      if name.endswith(".gz"):
        try:
          raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
          raise ValueError(f"mnist: {path!r} is not a valid gzip file ({err}). "
                           + _HOW_TO_GET) from err
      return path, raw
  raise FileNotFoundError(f"mnist: {os.fspath(directory)!r} has neither {stem}.gz nor "
                          f"{stem}. " + _HOW_TO_GET)


def _parse(path, raw, magic, ndim):
  header = 4 * (1 + ndim)
  if len(raw) < header:
    raise ValueError(f"mnist: {path!r} is too short for an IDX header (truncated)")
  fields = np.frombuffer(raw[:header], ">u4").astype(np.int64)
  if fields[0] != magic:
    raise ValueError(f"mnist: {path!r} has IDX magic number {fields[0]}, expected {magic} "
                     f"(wrong file or corrupt)")
  shape = tuple(int(f) for f in fields[1:])
  expected = header + math.prod(shape)  # Python ints: huge sizes must not wrap around
  if len(raw) != expected:
    raise ValueError(f"mnist: {path!r} holds {len(raw)} bytes but its header announces "
                     f"{shape} items ({expected} bytes): truncated or corrupt. " + _HOW_TO_GET)
  return np.frombuffer(raw[header:], np.uint8).reshape(shape)


def load_mnist(directory: str | os.PathLike, split: str = "train"):
  """MNIST images and labels from the IDX files in ``directory``.

  Reads ``{train,t10k}-{images-idx3,labels-idx1}-ubyte`` with or without ``.gz``; the
  official gzipped files are checked against their published md5.

  Args:
    directory: folder holding the files.
    split: ``"train"`` (60,000 images) or ``"test"`` (10,000).

  Returns:
    ``(images (N, 784) float32 in [0, 1], labels (N,) int32 in [0, 10))``.

  Raises:
    FileNotFoundError: a file is missing.
    ValueError: wrong magic number, truncated data, mismatched counts, labels out of range.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  prefix = "train" if split == "train" else "t10k"
  directory = os.fspath(directory)
  img_path, img_raw = _read(directory, f"{prefix}-images-idx3-ubyte")
  lab_path, lab_raw = _read(directory, f"{prefix}-labels-idx1-ubyte")
  images = _parse(img_path, img_raw, _IMAGES_MAGIC, 3)
  labels = _parse(lab_path, lab_raw, _LABELS_MAGIC, 1)
  if images.shape[0] != labels.shape[0]:
    raise ValueError(f"mnist: {img_path!r} has {images.shape[0]} images but {lab_path!r} has "
                     f"{labels.shape[0]} labels")
  if images.shape[1:] != (28, 28):
    raise ValueError(f"mnist: {img_path!r} holds images of shape {images.shape[1:]}, "
                     "expected (28, 28) (not MNIST, or another data set in IDX format)")
  if labels.size and labels.max() > 9:
    raise ValueError(f"mnist: {lab_path!r} has labels above 9 (corrupt)")
  flat = images.reshape(images.shape[0], -1).astype(np.float32) / 255.0
  return flat, labels.astype(np.int32)


def write_idx(path, array: np.ndarray) -> None:
  """Writes a uint8 array in IDX format (gzipped when ``path`` ends in ``.gz``).

  For tests and for saving subsets in the format :func:`load_mnist` reads.
  """
  a = np.asarray(array, np.uint8)
  magic = {1: _LABELS_MAGIC, 3: _IMAGES_MAGIC}.get(a.ndim)
  if magic is None:
    raise ValueError(f"write_idx supports 1-D labels and 3-D images, got {a.ndim}-D")
  raw = np.asarray([magic, *a.shape], ">u4").tobytes() + a.tobytes()
  opener = gzip.open if os.fspath(path).endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(raw)
