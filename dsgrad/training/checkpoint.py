"""Saving and restoring estimator and training state.

Estimator states are NamedTuples of arrays, so any pytree checkpointer works (orbax for
large multi-host states). These functions cover the common single-host case with
``flax.serialization`` (msgpack) and add what a user needs:

* an atomic write (a temporary file renamed into place), and temporary files left by a
  save that was killed are removed by the next save to the same path;
* a SHA-256 checksum of the payload, verified on every read, so a damaged file is
  refused instead of restored with a wrong value;
* a restore that refuses, naming the entry, a checkpoint whose keys, shapes or dtypes
  differ from the template's.

File layout: the 14-byte tag ``DSGRAD-CKPT-1\\n``, the 32-byte SHA-256 digest of the
payload, then the payload (``flax.serialization.to_bytes``). Files written before the
tag existed (plain msgpack) are refused unless read with ``allow_unverified=True`` (with a
warning that they cannot be verified). One writer per path: :func:`exclusive`.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import socket
import tempfile
from typing import Any

import jax
import numpy as np
from flax import serialization, traverse_util

from dsgrad import checks

_TAG = b"DSGRAD-CKPT-1\n"
_DIGEST_BYTES = 32


def temp_prefix(path: str) -> str:
  """``.<name>.tmp-<host>-``: temporaries of saves to ``path`` from this host (a short
  hash of the host name, so that a shared file system never mixes hosts' process ids)."""
  host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
  return f".{os.path.basename(path)}.tmp-{host}-"


def _pid_is_running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except (PermissionError, OSError):
    return True  # exists, owned by someone else (or we cannot tell: keep the file)
  return True


def remove_orphan_temp_files(path: str | os.PathLike) -> list[str]:
  """Removes temporary files that an interrupted :func:`save` to ``path`` left behind.

  A save writes ``.<name>.tmp-<host>-<pid>-<random>`` next to ``path`` and renames it;
  a process killed mid-write (``kill -9``) leaves that file. Only files written from this
  host by a process that no longer runs are removed, so a save in progress (on this host
  or, on a shared file system, on another) is never disturbed. :func:`save` calls this
  first.

  Returns:
    The removed files.
  """
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  prefix = temp_prefix(path)
  removed = []
  for tmp in glob.glob(os.path.join(glob.escape(directory), glob.escape(prefix) + "*")):
    pid_text = os.path.basename(tmp)[len(prefix):].split("-", 1)[0]
    if not pid_text.isdigit():
      continue
    pid = int(pid_text)
    if pid != os.getpid() and not _pid_is_running(pid):
      try:
        os.remove(tmp)
        removed.append(tmp)
      except FileNotFoundError:
        pass
  return removed


_HELD_LOCKS: dict[str, int] = {}


def _remove_if_there(path: str) -> None:
  """Removes ``path`` if it is there (another process may have removed it first)."""
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _lock_owner(lock: str) -> tuple[str, int] | None:
  try:
    with open(lock) as f:
      host, pid = f.read().strip().rsplit(":", 1)
    return host, int(pid)
  except (OSError, ValueError):
    return None


@contextlib.contextmanager
def exclusive(path: str | os.PathLike):
  """Holds ``<path>.lock`` for the block: one writer per checkpoint path.

  Two runs saving to one path would overwrite each other's checkpoints, the last writer
  winning silently. The lock file (created with ``O_EXCL``) names its host and process;
  a lock left by a process of this host that no longer runs is taken over. Re-entrant
  within a process (:func:`dsgrad.fit` holds it for the run, each :func:`save` inside).

  Raises:
    RuntimeError: another live process holds the lock, naming it and the lock file.
  """
  path = os.path.abspath(os.fspath(path))
  lock = path + ".lock"
  if path in _HELD_LOCKS:
    _HELD_LOCKS[path] += 1
    try:
      yield
    finally:
      _HELD_LOCKS[path] -= 1
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  me = f"{socket.gethostname()}:{os.getpid()}"
  for _ in range(3):
    # The owner is written to a private file first and linked into place (atomic, and
    # refused if the lock exists), so a process killed while taking the lock never leaves
    # an empty lock file that no later run could attribute, and hence take over. The
    # private file is named as a save's temporary, so a killed process's is cleaned up.
    claim = os.path.join(os.path.dirname(lock), f"{temp_prefix(path)}{os.getpid()}-lock")
    with open(claim, "w") as f:
      f.write(me)
    try:
      os.link(claim, lock)
    except FileExistsError:
      owner = _lock_owner(lock)
      stale = (owner is not None and owner[0] == socket.gethostname()
               and not _pid_is_running(owner[1]))
      if stale:
        _remove_if_there(lock)  # the claim is written afresh on the next try
        continue
      _remove_if_there(claim)
      raise RuntimeError(
          f"checkpoint {path!r} is being written by another process "
          f"({'unknown' if owner is None else '%s, pid %d' % owner}; lock file {lock!r}). "
          "Two runs writing one checkpoint would overwrite each other: use another "
          "checkpoint path, or remove the lock file if that process is gone") from None
    _remove_if_there(claim)
    break
  else:
    raise RuntimeError(f"could not take the lock {lock!r} of checkpoint {path!r}")
  _HELD_LOCKS[path] = 1
  try:
    yield
  finally:
    del _HELD_LOCKS[path]
    _remove_if_there(lock)


def save(path: str | os.PathLike, tree: Any) -> None:
  """Writes a pytree of arrays (params, optimizer/estimator state, ...) to ``path``.

  The file is written to a temporary name and renamed, so an interrupted save never
  leaves a truncated checkpoint behind; its payload carries a SHA-256 checksum that
  :func:`restore` verifies.

  Args:
    path: destination file.
    tree: any pytree of arrays and NamedTuples (e.g. ``(params, opt_state, key)``).
      PRNG keys must be raw ``uint32`` arrays (``jax.random.key_data``).

  Raises:
    ValueError: ``path``, or the previous checkpoint's place beside it, holds something
      other than a regular file (a folder, a FIFO, a device).
  """
  path = os.fspath(path)
  for existing in (path, previous_path(path)):
    # The save moves what is at path aside (to previous_path): a folder would be moved,
    # contents and all, and the next save would fail on it.
    if os.path.exists(existing):
      checks.check_regular_file(existing, "checkpoint.save")
  for where, leaf in jax.tree_util.tree_leaves_with_path(tree):
    if not isinstance(leaf, (np.ndarray, np.generic, jax.Array, int, float, bool, complex)):
      # flax's serializer would say only "can not serialize 'function' object".
      raise TypeError(f"checkpoint.save: the leaf at {jax.tree_util.keystr(where) or 'the root'}"
                      f" is a {type(leaf).__name__}; a checkpoint holds arrays and numbers "
                      "(params, optimizer state, raw keys): save what the object computes "
                      "with, not the object")
  payload = serialization.to_bytes(jax.device_get(tree))
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with exclusive(path):
    _write(path, directory, payload)


def _write(path: str, directory: str, payload: bytes) -> None:
  remove_orphan_temp_files(path)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{temp_prefix(path)}{os.getpid()}-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(_TAG + hashlib.sha256(payload).digest() + payload)
      f.flush()
      os.fsync(f.fileno())
    _keep_previous(path)
    os.replace(tmp, path)
  except BaseException as error:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(error, OSError):
      # The OS error of a full disk or a lost mount names no file; the user needs the path
      # (the previous checkpoint there, if any, is intact: the write went to a temporary).
      raise OSError(error.errno, f"writing checkpoint {path!r} ({len(payload):,} bytes) "
                    f"failed: {error.strerror or error}; the previous checkpoint at that "
                    "path, if any, is unchanged", path) from error
    raise


def previous_path(path: str | os.PathLike) -> str:
  """``<path>.prev``: the checkpoint :func:`save` replaced last, kept so that a checkpoint
  damaged after it was written does not lose the run."""
  return os.fspath(path) + ".prev"


def _keep_previous(path: str) -> None:
  """Moves the checkpoint at ``path`` to :func:`previous_path` before the new one is
  renamed into place. Killed between the two renames, the newest complete checkpoint is
  the previous one, and :func:`latest` finds it."""
  if os.path.exists(path):
    os.replace(path, previous_path(path))


def latest(path: str | os.PathLike) -> str | None:
  """The newest complete checkpoint a save to ``path`` left: ``path``, or its previous
  one when a save was killed between moving it aside and renaming the new file into
  place; ``None`` when neither exists."""
  path = os.fspath(path)
  if os.path.exists(path):
    return path
  previous = previous_path(path)
  return previous if os.path.exists(previous) else None


def _damaged(path: str, why: str) -> ValueError:
  """The error for a damaged checkpoint, pointing at the previous one when it is good."""
  message = f"checkpoint {path!r} is corrupt: {why}"
  previous = previous_path(path)
  if os.path.exists(previous):
    try:
      _payload(previous)
      message += (f". The checkpoint it replaced is intact at {previous!r}: move it to "
                  f"{path!r} to resume from there")
    except (ValueError, OSError):
      pass
  return ValueError(message)


def _payload(path, allow_unverified: bool = False) -> bytes:
  """The verified payload of the checkpoint at ``path``."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no checkpoint at {path!r}")
  checks.check_regular_file(path, "checkpoint")
  with open(path, "rb") as f:
    data = f.read()
  if not data.startswith(_TAG):
    if _TAG.startswith(data[:len(_TAG)]) or os.path.exists(previous_path(path)):
      raise _damaged(path, f"it is truncated to {len(data)} bytes or its header is damaged")
    if not allow_unverified:
      raise ValueError(
          f"checkpoint {path!r} has no dsgrad header and checksum: it is corrupt, not a "
          "dsgrad checkpoint, or written by a dsgrad older than the checksum. "
          "It cannot be verified; to read an old file anyway, call "
          "dsgrad.training.checkpoint.restore(path, like, allow_unverified=True) and save it again")
    checks.warn_at_caller(f"checkpoint {path!r} has no checksum; it is read without "
                          "verification (allow_unverified=True)")
    return data
  digest = data[len(_TAG):len(_TAG) + _DIGEST_BYTES]
  payload = data[len(_TAG) + _DIGEST_BYTES:]
  if hashlib.sha256(payload).digest() != digest:
    raise _damaged(path, "its SHA-256 checksum does not match its contents (the file was "
                   "damaged, truncated or changed after it was written)")
  return payload


def restore_raw(path: str | os.PathLike, *, allow_unverified: bool = False) -> dict:
  """Reads a checkpoint written by :func:`save` as nested dicts of numpy arrays, without
  a template (NamedTuples come back as dicts keyed by position).

  Raises:
    FileNotFoundError: if ``path`` does not exist.
    ValueError: if the file is not a valid checkpoint or fails its checksum.
  """
  payload = _payload(path, allow_unverified)
  try:
    return serialization.msgpack_restore(payload)
  except Exception as err:  # msgpack raises several types
    raise _damaged(os.fspath(path), str(err)) from err


def _flat_keys(state) -> dict:
  """``{"a/b/c": leaf}`` for a nested state dict (``serialization.to_state_dict``); a
  state that is not a non-empty dict is the one entry ``""``."""
  if not (isinstance(state, dict) and state):
    return {"": state}
  return traverse_util.flatten_dict(state, keep_empty_nodes=True, sep="/")


def restore(path: str | os.PathLike, like: Any, *, allow_unverified: bool = False) -> Any:
  """Reads a checkpoint written by :func:`save` into the structure of ``like``.

  Args:
    path: the checkpoint file.
    like: a pytree with the structure, shapes and dtypes to restore (e.g. a freshly
      initialized ``(params, opt_state)``, or ``jax.eval_shape`` of one).
    allow_unverified: read a file without dsgrad's header and checksum (written before
      checkpoints had one), with a warning; refused otherwise.

  Returns:
    The restored pytree, bit-identical to what was saved.

  Raises:
    FileNotFoundError: if ``path`` does not exist.
    ValueError: if the file is not a valid checkpoint, fails its checksum, or differs
      from ``like`` in its entries (one saved that ``like`` lacks, or the reverse), in
      an array's shape or in its dtype; the message names the entry.
  """
  path = os.fspath(path)
  return restore_from_raw(restore_raw(path, allow_unverified=allow_unverified), like, path)


def _layout_hint(name: str, got, want) -> str:
  """Why a saved entry can have another shape than the template: a state layout that
  changed between dsgrad versions (named), else another model or optimizer."""
  if re.search(r"\.(weight|cross|control_sq)\b", name) and np.ndim(got) == 0 and np.ndim(want):
    return (": this checkpoint was written by an earlier dsgrad, whose adaptive control "
            "weight kept one scalar per parameter leaf (now one per coordinate). "
            "Restart the run, or restore it with the dsgrad that wrote it")
  return " (saved from another model, estimator or optimizer?)"


def restore_from_raw(raw: dict, like: Any, path: str | os.PathLike = "<raw>") -> Any:
  """:func:`restore` of a checkpoint already read by :func:`restore_raw` (to read its
  metadata first and restore the rest without reading the file twice)."""
  path = os.fspath(path)
  template = _flat_keys(serialization.to_state_dict(like))
  saved = _flat_keys(raw)
  extra = sorted(set(saved) - set(template))
  missing = sorted(set(template) - set(saved))
  if extra or missing:
    raise ValueError(
        f"checkpoint {path!r} does not match the template: "
        + (f"it holds {extra} which the template lacks" if extra else "")
        + ("; " if extra and missing else "")
        + (f"the template expects {missing} which it lacks" if missing else "")
        + " (saved from another model, estimator or optimizer?)")
  try:
    restored = serialization.from_state_dict(like, raw)
  except Exception as err:  # flax raises several types
    raise ValueError(f"checkpoint {path!r} is corrupt or does not match the expected "
                     f"structure: {err}") from err
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(like)[0]]
  for name, got, want in zip(paths, jax.tree.leaves(restored), jax.tree.leaves(like)):
    if np.shape(got) != np.shape(want):
      raise ValueError(f"checkpoint {path!r}: entry {name} has shape {np.shape(got)} where "
                       f"the template has {np.shape(want)}" + _layout_hint(name, got, want))
    want_dtype = getattr(want, "dtype", None)
    if want_dtype is not None and np.dtype(got.dtype) != np.dtype(want_dtype):
      raise ValueError(f"checkpoint {path!r}: entry {name} was saved as {np.dtype(got.dtype)} "
                       f"where the template has {np.dtype(want_dtype)}; cast after "
                       "restoring with a template of the saved dtype")
  return restored
