"""Saving and restoring estimator and training state.

Estimator states are NamedTuples of arrays, so any pytree checkpointer works (orbax for
large multi-host states). These two functions cover the common single-host case with
``flax.serialization`` (msgpack) and add what a user needs: an atomic write, and a clear
error for a missing, corrupt or mismatched file.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import jax
import numpy as np
from flax import serialization


def save(path: str | os.PathLike, tree: Any) -> None:
  """Writes a pytree of arrays (params, optimizer/estimator state, ...) to ``path``.

  The file is written to a temporary name and renamed, so an interrupted save never
  leaves a truncated checkpoint behind.

  Args:
    path: destination file.
    tree: any pytree of arrays and NamedTuples (e.g. ``(params, opt_state, key)``).
      PRNG keys must be raw ``uint32`` arrays (``jax.random.key_data``).
  """
  path = os.fspath(path)
  data = serialization.to_bytes(jax.device_get(tree))
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".dsgrad-ckpt-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _read(path) -> bytes:
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no checkpoint at {path!r}")
  with open(path, "rb") as f:
    return f.read()


def restore_raw(path: str | os.PathLike) -> dict:
  """Reads a checkpoint written by :func:`save` as nested dicts of numpy arrays, without
  a template (NamedTuples come back as dicts keyed by position).

  Raises:
    FileNotFoundError: if ``path`` does not exist.
    ValueError: if the file is not a valid checkpoint.
  """
  data = _read(path)
  try:
    return serialization.msgpack_restore(data)
  except Exception as err:  # msgpack raises several types
    raise ValueError(f"checkpoint {os.fspath(path)!r} is corrupt: {err}") from err


def restore(path: str | os.PathLike, like: Any) -> Any:
  """Reads a checkpoint written by :func:`save` into the structure of ``like``.

  Args:
    path: the checkpoint file.
    like: a pytree with the structure, shapes and dtypes to restore (e.g. a freshly
      initialized ``(params, opt_state)``).

  Returns:
    The restored pytree, bit-identical to what was saved.

  Raises:
    FileNotFoundError: if ``path`` does not exist.
    ValueError: if the file is not a valid checkpoint or does not match ``like``.
  """
  path = os.fspath(path)
  data = _read(path)
  try:
    restored = serialization.from_bytes(like, data)
  except Exception as err:  # msgpack and flax raise several types
    raise ValueError(f"checkpoint {path!r} is corrupt or does not match the expected "
                     f"structure: {err}") from err
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(like)):
    if np.shape(got) != np.shape(want):
      raise ValueError(f"checkpoint {path!r} holds an array of shape {np.shape(got)} where "
                       f"{np.shape(want)} was expected")
  return restored
