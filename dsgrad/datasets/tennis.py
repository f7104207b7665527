"""Tennis match results (ATP-style CSVs) for the Bradley-Terry model."""

from __future__ import annotations

import csv
import glob
import os
from typing import NamedTuple

import numpy as np

from dsgrad import checks

_HOW_TO_GET = ("Use CSVs with a header and winner_id/loser_id columns, e.g. "
               "atp_matches_YYYY.csv from github.com/JeffSackmann/tennis_atp.")


class TennisData(NamedTuple):
  """Matches ready for :func:`dsgrad.models.bradley_terry` (``player_a`` = winner).

  Attributes:
    winners: ``(N,)`` int32 player index of each match's winner.
    losers: ``(N,)`` int32 player index of the loser.
    player_ids: ``(M,)`` the original ids (as strings), indexed by player index.
    player_names: ``(M,)`` names when the files have ``winner_name``/``loser_name``.
  """

  winners: np.ndarray
  losers: np.ndarray
  player_ids: np.ndarray
  player_names: np.ndarray

  @property
  def num_players(self) -> int:
    return int(self.player_ids.shape[0])


def load_tennis(path: str | os.PathLike | list) -> TennisData:
  """Reads match results from one CSV, a list of CSVs, or every ``*.csv`` in a directory.

  Each file needs a header with ``winner_id`` and ``loser_id`` (or, lacking ids,
  ``winner_name`` and ``loser_name``). Players are numbered in order of first
  appearance across the files (sorted by file name for a directory).

  Returns:
    A :class:`TennisData`.

  Raises:
    FileNotFoundError: nothing at ``path`` or an empty directory.
    ValueError: missing columns, empty ids, a player beating themself, or no matches --
      naming the file and line.
  """
  if isinstance(path, (list, tuple)):
    paths = [os.fspath(p) for p in path]
  elif os.path.isdir(path):
    paths = sorted(glob.glob(os.path.join(os.fspath(path), "*.csv")))
    if not paths:
      raise FileNotFoundError(f"tennis: no .csv files in {os.fspath(path)!r}. " + _HOW_TO_GET)
  else:
    paths = [os.fspath(path)]
  index, ids, names, winners, losers = {}, [], [], [], []

  def player(pid, name):
    if pid not in index:
      index[pid] = len(ids)
      ids.append(pid)
      names.append(name)
    return index[pid]

  for p in paths:
    if not os.path.exists(p):
      raise FileNotFoundError(f"tennis: no file at {p!r}. " + _HOW_TO_GET)
    checks.check_regular_file(p, "tennis")
    # utf-8-sig: a byte-order mark would otherwise become part of the first column's
    # name, so the id columns would not be found and players would be merged by name.
    with open(p, newline="", encoding="utf-8-sig", errors="replace") as f:
      reader = csv.DictReader(f)
      columns = set(reader.fieldnames or ())
      if {"winner_id", "loser_id"} <= columns:
        wkey, lkey = "winner_id", "loser_id"
      elif {"winner_name", "loser_name"} <= columns:
        wkey, lkey = "winner_name", "loser_name"
      else:
        raise ValueError(f"tennis: {p!r} has no winner_id/loser_id (or winner_name/"
                         f"loser_name) columns; found {sorted(columns)[:8]}. " + _HOW_TO_GET)
      for line, row in enumerate(reader, 2):
        w, l = (row.get(wkey) or "").strip(), (row.get(lkey) or "").strip()
        if not w or not l:
          raise ValueError(f"tennis: {p!r} line {line}: empty {wkey} or {lkey} (truncated "
                           f"or corrupt file)")
        if w == l:
          raise ValueError(f"tennis: {p!r} line {line}: player {w!r} is both winner and loser")
        winners.append(player(w, (row.get("winner_name") or w).strip()))
        losers.append(player(l, (row.get("loser_name") or l).strip()))
  if not winners:
    raise ValueError(f"tennis: no matches in {paths}. " + _HOW_TO_GET)
  return TennisData(np.asarray(winners, np.int32), np.asarray(losers, np.int32),
                    np.asarray(ids), np.asarray(names))
