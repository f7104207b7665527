"""The CIFAR-10 loader reads the official pickled batches without executing code, checks
what it reads, and says where to put the data when there is none."""

import os
import pickle

import numpy as np
import pytest

from dsgrad.datasets import cifar10


def _write_folder(root, per_batch=4, seed=0):
  rng = np.random.default_rng(seed)
  folder = root / cifar10.FOLDER
  folder.mkdir(parents=True)
  images, labels = [], []
  for name in cifar10.TRAIN_BATCHES + (cifar10.TEST_BATCH,):
    x = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, per_batch)
    cifar10.write_batch(folder / name, x, y)
    if name != cifar10.TEST_BATCH:
      images.append(x)
      labels.append(y)
  return folder, np.concatenate(images), np.concatenate(labels)


def test_round_trip_in_the_official_format(tmp_path):
  _, images, labels = _write_folder(tmp_path)
  data = cifar10.load_cifar10(tmp_path, "train", download=False, verify_official=False)
  np.testing.assert_array_equal(data.images, images)
  np.testing.assert_array_equal(data.labels, labels)
  assert data.images.shape == (20, 32, 32, 3) and data.labels.dtype == np.int32
  test = cifar10.load_cifar10(tmp_path, "test", download=False, verify_official=False)
  assert test.images.shape == (4, 32, 32, 3)
  # The official loader insists on 10,000 images per batch.
  with pytest.raises(ValueError, match="holds 4 images"):
    cifar10.load_cifar10(tmp_path, "train", download=False)


def test_the_channel_layout_matches_the_official_description(tmp_path):
  # Official rows: 1024 red values, then 1024 green, then 1024 blue, each row-major.
  folder = tmp_path / cifar10.FOLDER
  folder.mkdir()
  data = np.zeros((1, 3072), np.uint8)
  data[0, 0] = 200         # red of pixel (0, 0)
  data[0, 1024 + 33] = 100  # green of pixel (1, 1)
  with open(folder / "test_batch", "wb") as f:
    pickle.dump({b"data": data, b"labels": [3]}, f, protocol=2)
  test = cifar10.load_cifar10(tmp_path, "test", download=False, verify_official=False)
  assert test.images[0, 0, 0, 0] == 200 and test.images[0, 1, 1, 1] == 100
  assert test.images.sum() == 300


class _Evil:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.mkdir, (self.marker,))


def test_a_malicious_pickle_is_refused_without_running_it(tmp_path):
  folder = tmp_path / cifar10.FOLDER
  folder.mkdir()
  marker = str(tmp_path / "pwned")
  with open(folder / "test_batch", "wb") as f:
    pickle.dump({b"data": _Evil(marker), b"labels": [0]}, f, protocol=2)
  # Plain pickle would run it (shown on a copy, to prove the file is really malicious).
  with open(folder / "test_batch", "rb") as f:
    raw = f.read()
  with pytest.raises(pickle.UnpicklingError, match="refusing to load the global"):
    cifar10.load_cifar10(tmp_path, "test", download=False, verify_official=False)
  assert not os.path.exists(marker)
  pickle.loads(raw)
  assert os.path.isdir(marker)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not_a_batch", "bad_labels"])
def test_damaged_batches_get_a_clear_error(tmp_path, damage):
  folder, _, _ = _write_folder(tmp_path)
  path = folder / "test_batch"
  raw = path.read_bytes()
  if damage == "truncated":
    path.write_bytes(raw[: len(raw) // 2])
  elif damage == "garbage":
    path.write_bytes(b"\x00\x01not a pickle at all")
  elif damage == "not_a_batch":
    path.write_bytes(pickle.dumps([1, 2, 3], protocol=2))
  else:
    data = np.zeros((2, 3072), np.uint8)
    path.write_bytes(pickle.dumps({b"data": data, b"labels": [0, 12]}, protocol=2))
  with pytest.raises(ValueError, match="cifar10: .*test_batch"):
    cifar10.load_cifar10(tmp_path, "test", download=False, verify_official=False)


@pytest.mark.parametrize("label, match", [
    (3.7, "label of type float \\(3.7\\) at position 1"),
    ("cat", "label of type str \\('cat'\\) at position 1"),
    (True, "label of type bool"),
])
def test_labels_that_are_not_integers_are_refused(tmp_path, label, match):
  """float labels were silently truncated to integers and string labels
  raised a raw int() error that did not name the file."""
  folder, _, _ = _write_folder(tmp_path)
  path = folder / "test_batch"
  data = np.zeros((2, 3072), np.uint8)
  path.write_bytes(pickle.dumps({b"data": data, b"labels": [0, label]}, protocol=2))
  with pytest.raises(ValueError, match="cifar10: .*test_batch.* " + match):
    cifar10.load_cifar10(tmp_path, "test", download=False, verify_official=False)


def test_missing_data_says_where_to_put_it(tmp_path, monkeypatch):
  monkeypatch.setenv("DSGRAD_DATA", str(tmp_path / "nowhere"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError) as info:
    cifar10.load_cifar10(tmp_path / "mine", "train", download=False)
  message = str(info.value)
  assert cifar10.FOLDER in message and cifar10.ARCHIVE_MD5 in message
  assert str(tmp_path / "mine") in message and "--data-dir" in message


def test_an_archive_with_a_wrong_checksum_is_refused(tmp_path):
  (tmp_path / cifar10.ARCHIVE).write_bytes(b"not the archive")
  with pytest.raises(ValueError, match="not the official"):
    cifar10.load_cifar10(tmp_path, "train", download=False)


def test_the_folder_is_found_through_dsgrad_data(tmp_path, monkeypatch):
  _write_folder(tmp_path / "store")
  monkeypatch.setenv("DSGRAD_DATA", str(tmp_path / "store"))
  data = cifar10.load_cifar10(None, "test", download=False, verify_official=False)
  assert data.images.shape == (4, 32, 32, 3)


def test_download_is_verified_and_extracted(tmp_path, monkeypatch):
  import hashlib
  import tarfile
  source = tmp_path / "source"
  _write_folder(source)
  archive = tmp_path / "served.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(source / cifar10.FOLDER, arcname=cifar10.FOLDER)
  monkeypatch.setattr(cifar10, "URL", archive.as_uri())
  monkeypatch.setattr(cifar10, "ARCHIVE_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
  monkeypatch.setenv("DSGRAD_DATA", str(tmp_path / "nowhere"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  data = cifar10.load_cifar10(tmp_path / "fresh", "test", verify_official=False)
  assert data.images.shape == (4, 32, 32, 3)
  assert (tmp_path / "fresh" / cifar10.ARCHIVE).exists()
  # A download that does not match the published checksum is refused, not extracted.
  monkeypatch.setattr(cifar10, "ARCHIVE_MD5", "0" * 32)
  with pytest.raises(ValueError, match="not the official"):
    cifar10.load_cifar10(tmp_path / "other", "test", verify_official=False)
  assert not (tmp_path / "other" / cifar10.FOLDER).exists()
