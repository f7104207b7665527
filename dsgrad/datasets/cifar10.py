"""CIFAR-10 from the official "python version" batches, read without executing code.

The official batches are Python pickles. A pickle can name any callable, so unpickling an
untrusted file can run arbitrary code; :class:`RestrictedUnpickler` admits only the few
numpy globals an ndarray needs and refuses everything else, and the loader then checks
that each batch is the expected dict of bytes, a uint8 ``(10000, 3072)`` array and a list
of labels in ``[0, 10)``.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
import urllib.request
from typing import NamedTuple

import numpy as np

from dsgrad import checks

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"  # published on the CIFAR-10 page
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
IMAGES_PER_BATCH = 10_000
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")

# The globals an ndarray's pickle refers to (numpy 1.x and 2.x module paths), and
# _codecs.encode, which Python 3 writes for bytes under protocol 2 (it only turns a str
# into bytes).
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
}


class ForbiddenGlobalError(pickle.UnpicklingError):
  """A pickle named a global that :class:`RestrictedUnpickler` does not admit."""


class RestrictedUnpickler(pickle.Unpickler):
  """An unpickler that refuses every global except numpy's ndarray reconstruction.

  A pickle that names ``os.system``, ``builtins.eval`` or any other callable raises
  :class:`ForbiddenGlobalError` (a ``pickle.UnpicklingError``) before anything is called.
  """

  def find_class(self, module, name):
    if (module, name) in _ALLOWED_GLOBALS:
      return super().find_class(module, name)
    raise ForbiddenGlobalError(
        f"refusing to load the global {module}.{name}: a CIFAR-10 batch holds only bytes, "
        "lists and numpy arrays, so this file is not an official batch (and may be "
        "malicious)")


def restricted_loads(raw: bytes):
  """``pickle.loads`` through :class:`RestrictedUnpickler` (bytes keys kept as bytes)."""
  return RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()


class Cifar10(NamedTuple):
  """Images and labels of one split.

  Attributes:
    images: ``(N, 32, 32, 3)`` uint8, channels last.
    labels: ``(N,)`` int32 in ``[0, 10)`` (names in :data:`CLASSES`).
  """

  images: np.ndarray
  labels: np.ndarray


def _how_to_get(searched) -> str:
  places = "\n  ".join(os.fspath(p) for p in searched)
  return (f"Put the official CIFAR-10 python batches (folder {FOLDER}/ or the archive "
          f"{ARCHIVE}, md5 {ARCHIVE_MD5}, from {URL}) in one of:\n  {places}\n"
          "or pass --data-dir / set $DSGRAD_DATA.")


def _read_batch(path):
  if os.path.exists(path):
    checks.check_regular_file(path, "cifar10")
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as err:
    raise FileNotFoundError(f"cifar10: cannot read {os.fspath(path)!r} ({err})") from err
  try:
    batch = restricted_loads(raw)
  except ForbiddenGlobalError:
    raise
  except Exception as err:  # truncated or garbled pickles raise many kinds of errors
    raise ValueError(f"cifar10: {os.fspath(path)!r} is not a readable pickle ({type(err).__name__}: "
                     f"{err}); the file is truncated or corrupt") from err
  if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
    raise ValueError(f"cifar10: {os.fspath(path)!r} is not a CIFAR-10 batch (expected a dict "
                     "with b'data' and b'labels')")
  data, labels = batch[b"data"], batch[b"labels"]
  if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2
      or data.shape[1] != 3072):
    raise ValueError(f"cifar10: {os.fspath(path)!r} has data of type {type(data).__name__} "
                     f"{getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}; expected "
                     "uint8 (n, 3072)")
  if not isinstance(labels, list) or len(labels) != data.shape[0]:
    raise ValueError(f"cifar10: {os.fspath(path)!r} has {len(labels) if isinstance(labels, list) else 'no'} "
                     f"labels for {data.shape[0]} images")
  for position, label in enumerate(labels):
    # Python ints only (what the official pickles hold): a float label would be
    # truncated by a cast and a string one would fail inside numpy, naming neither.
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
      raise ValueError(f"cifar10: {os.fspath(path)!r} has a label of type "
                       f"{type(label).__name__} ({label!r}) at position {position}; labels "
                       "must be integers in [0, 10)")
    if not 0 <= label <= 9:
      raise ValueError(f"cifar10: {os.fspath(path)!r} has label {label} at position "
                       f"{position}, outside [0, 10)")
  labels = np.asarray(labels, np.int64)
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return images, labels.astype(np.int32)


def _extract(archive, target_dir):
  checks.check_regular_file(archive, "cifar10")
  with open(archive, "rb") as f:
    digest = hashlib.md5(f.read()).hexdigest()
  if digest != ARCHIVE_MD5:
    raise ValueError(f"cifar10: {os.fspath(archive)!r} has md5 {digest}, not the official "
                     f"{ARCHIVE_MD5} (corrupt or truncated download); delete it and retry")
  with tarfile.open(archive, "r:gz") as tar:
    tar.extractall(target_dir, filter="data")


def find_cifar10(data_dir=None, *, download: bool = True) -> str:
  """The path of the ``cifar-10-batches-py`` folder, extracting or downloading if needed.

  Searches ``data_dir``, ``$DSGRAD_DATA``, ``~/.cache/dsgrad``, ``~/.keras/datasets`` and
  ``./data`` for the folder, then for the archive (verified by md5, then extracted); then
  downloads the archive into the first of those places when ``download`` and the network
  allow.

  Raises:
    FileNotFoundError: nothing found and no download possible; the message lists the
      places searched and where to get the files.
    ValueError: an archive with the wrong checksum.
  """
  places = [p for p in (data_dir, os.environ.get("DSGRAD_DATA"),
                        os.path.join(os.path.expanduser("~"), ".cache", "dsgrad"),
                        os.path.join(os.path.expanduser("~"), ".keras", "datasets"),
                        os.path.join(os.getcwd(), "data")) if p]
  for place in places:
    folder = os.path.join(place, FOLDER)
    if os.path.isdir(folder):
      return folder
    if os.path.basename(os.path.normpath(place)) == FOLDER and os.path.isdir(place):
      return place
  for place in places:
    archive = os.path.join(place, ARCHIVE)
    if os.path.isfile(archive):
      _extract(archive, place)
      return os.path.join(place, FOLDER)
  if not download:
    raise FileNotFoundError("cifar10: no data found. " + _how_to_get(places))
  target = places[0]
  archive = os.path.join(target, ARCHIVE)
  try:
    os.makedirs(target, exist_ok=True)
    partial = archive + ".part"
    with urllib.request.urlopen(URL, timeout=30) as response, open(partial, "wb") as out:
      while chunk := response.read(1 << 20):
        out.write(chunk)
    os.replace(partial, archive)
  except OSError as err:
    raise FileNotFoundError(f"cifar10: no data found and the download from {URL} failed "
                            f"({err}). " + _how_to_get(places)) from err
  _extract(archive, target)
  return os.path.join(target, FOLDER)


def load_cifar10(data_dir=None, split: str = "train", *, download: bool = True,
                 verify_official: bool = True) -> Cifar10:
  """CIFAR-10 images and labels from the official python batches.

  Args:
    data_dir: a folder holding ``cifar-10-batches-py/`` (or the archive), or that folder
      itself; see :func:`find_cifar10` for the other places searched.
    split: ``"train"`` (50,000 images, five batches) or ``"test"`` (10,000).
    download: fetch the official archive when nothing is found (md5 verified).
    verify_official: require the official 10,000 images per batch; pass ``False`` for
      smaller batches in the same format (e.g. written by :func:`write_batch`).

  Returns:
    A :class:`Cifar10`.

  Raises:
    FileNotFoundError: no data (the message says where to put it); a missing batch.
    ValueError: a truncated, corrupt or non-CIFAR batch, or a batch of the wrong size.
    ForbiddenGlobalError: (a ``pickle.UnpicklingError``) a batch that names a global
      other than numpy's array reconstruction (a malicious or foreign pickle); nothing in
      it is executed.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  folder = find_cifar10(data_dir, download=download)
  names = TRAIN_BATCHES if split == "train" else (TEST_BATCH,)
  images, labels = [], []
  for name in names:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"cifar10: {folder!r} lacks the batch {name!r}; the folder is "
                              f"incomplete. " + _how_to_get([os.path.dirname(folder)]))
    x, y = _read_batch(path)
    if verify_official and x.shape[0] != IMAGES_PER_BATCH:
      raise ValueError(f"cifar10: {path!r} holds {x.shape[0]} images, the official batches "
                       f"hold {IMAGES_PER_BATCH} (truncated or not official; verify_official=False "
                       "accepts smaller batches)")
    images.append(x)
    labels.append(y)
  return Cifar10(np.concatenate(images), np.concatenate(labels))


def write_batch(path, images: np.ndarray, labels) -> None:
  """Writes a batch in the official format (for tests and small fixtures).

  Args:
    path: file to write.
    images: ``(n, 32, 32, 3)`` uint8.
    labels: ``n`` ints in ``[0, 10)``.
  """
  data = np.asarray(images, np.uint8).transpose(0, 3, 1, 2).reshape(len(images), 3072)
  batch = {b"batch_label": b"written by dsgrad", b"labels": [int(v) for v in labels],
           b"data": data, b"filenames": [f"{i}.png".encode() for i in range(len(images))]}
  with open(path, "wb") as f:
    pickle.dump(batch, f, protocol=2)
