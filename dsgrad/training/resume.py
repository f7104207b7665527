"""Checkpoints of :func:`dsgrad.fit` runs and what a resume checks.

A :func:`dsgrad.fit` checkpoint holds ``(params, opt_state, step)``, the :class:`History`
so far and the run's settings: what decides its batches and noise (:func:`run_settings`)
and what decides its state besides them (:func:`state_fingerprints`: the data and the
optimizer's traced program). A resume with other settings is refused by name
(:func:`check_resume_settings`) instead of continuing a different run. The file format,
its checksum and the one-writer lock are :mod:`dsgrad.training.checkpoint`'s.
"""

from __future__ import annotations

import hashlib
import os
import re

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.training import checkpoint as checkpoint_lib
from dsgrad import data as data_lib
from dsgrad.objective import Objective

__all__ = ["History", "run_settings", "data_fingerprint", "optimizer_fingerprint",
           "state_fingerprints", "check_resume_settings", "save_fit_checkpoint",
           "restore_fit_checkpoint", "restore_fit_history", "history_from_raw",
           "restore_fit_tree"]


class History(NamedTuple):
  """What :func:`fit` records at each ELBO evaluation (:mod:`dsgrad.training.evaluation_plan`).

  Attributes:
    step: steps taken so far (int64).
    wall_time: seconds spent in training steps so far, their batches' epoch orders and
      host reads included (compilation and ELBO evaluation excluded), for
      ELBO-vs-wall-clock plots.
    elbo: full-data ELBO estimate (``nan`` when ``elbo_samples = 0``).
    elbo_se: its Monte Carlo standard error.
  """

  step: np.ndarray
  wall_time: np.ndarray
  elbo: np.ndarray
  elbo_se: np.ndarray



def run_settings(objective: Objective, key, batch_size: int, state_of=None) -> dict:
  """The settings that, with the step, determine every batch and noise draw of a
  :func:`fit` run; saved with its checkpoints so that a resume with other settings is
  refused rather than silently continuing a different run. ``state_of``: ``(optimizer,
  params)`` of a run that saves checkpoints: then also what determines its state besides
  the batches, the data themselves (not only N) and the optimizer's program (estimator,
  its settings, its approximation): :func:`state_fingerprints`."""
  key_data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) \
      else key
  settings = {"num_data": np.asarray(objective.num_data, np.int64),
              "batch_size": np.asarray(batch_size, np.int64),
              "key": np.asarray(jax.device_get(key_data))}
  if state_of is not None:
    settings.update(state_fingerprints(objective, *state_of, batch_size))
  return settings


def _digest(chunks) -> np.ndarray:
  h = hashlib.sha256()
  for chunk in chunks:
    h.update(chunk if isinstance(chunk, bytes) else str(chunk).encode())
  return np.frombuffer(h.digest(), np.uint8).copy()


def data_fingerprint(objective: Objective, rows: int = 257) -> np.ndarray:
  """SHA-256 of each data leaf's name, shape, dtype and ``rows`` evenly spaced rows
  (first and last included): another data set of the same size is told apart without
  reading all of a large (memory-mapped) array."""
  chunks = []
  leaves = jax.tree.leaves_with_path(objective.data_tree(), is_leaf=data_lib.is_host)
  # Named as before for a dict of arrays ("x", not "['x']"): older checkpoints still match.
  named = [(data_lib.leaf_name(path), leaf) for path, leaf in leaves]
  for name, leaf in sorted(named, key=lambda item: item[0]):
    shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
    chunks += [name, shape, dtype.str]
    if shape and shape[0]:
      at = np.unique(np.linspace(0, shape[0] - 1, min(rows, shape[0])).astype(np.int64))
      values = (leaf.rows(at) if isinstance(leaf, data_lib.HostArray)
                else np.asarray(jax.device_get(jnp.asarray(leaf)[at])))
      chunks.append(np.ascontiguousarray(values).tobytes())
  return _digest(chunks)


def optimizer_fingerprint(objective: Objective, optimizer, params, batch_size: int
                          ) -> np.ndarray:
  """SHA-256 of the traced program of one ``optimizer.update`` (estimator, its settings,
  approximation, control weight; then the optax rule), with memory addresses removed.
  A resume with another estimator or approximation whose state has the same shapes
  would otherwise continue with a table or running mean that belongs to another run."""
  abstract = jax.tree.map(lambda p: jax.ShapeDtypeStruct(jnp.shape(p), jnp.result_type(p)),
                          params)
  state = jax.eval_shape(optimizer.init, abstract)
  noise = jax.eval_shape(lambda k: objective.sample_noise(k, batch_size), jax.random.key(0))
  # The objective is an argument: its data are the data fingerprint's, not constants here.
  closed = jax.make_jaxpr(
      lambda o, g, st, p, i, e: optimizer.update(g, st, p, indices=i, noise=e, objective=o))(
          objective, abstract, state, abstract, jax.ShapeDtypeStruct((batch_size,), jnp.int32),
          noise)
  text = re.sub(r"0x[0-9a-fA-F]+", "", str(closed.jaxpr))
  consts = [np.ascontiguousarray(np.asarray(c)).tobytes()[:1 << 20] for c in closed.consts
            if hasattr(c, "shape")]
  return _digest([text] + consts)


def state_fingerprints(objective: Objective, optimizer, params, batch_size: int) -> dict:
  """``{"data": ..., "optimizer": ...}``: saved with :func:`fit`'s checkpoints and compared
  on resume (:func:`data_fingerprint`, :func:`optimizer_fingerprint`)."""
  return {"data": data_fingerprint(objective),
          "optimizer": optimizer_fingerprint(objective, optimizer, params, batch_size)}


_FINGERPRINT_MEANING = {
    "data": "other data (the same number of rows, other columns, shapes or values)",
    "optimizer": "another optimizer: another estimator, other estimator settings, "
                 "another approximation, or another optax rule or learning rate (or "
                 "another version of dsgrad or JAX)",
}


def check_resume_settings(path, raw: dict, settings: dict) -> None:
  saved = raw.get("settings")
  if saved is None:
    return  # a checkpoint written before settings were saved: nothing to compare
  for name, value in settings.items():
    if name in saved and not (np.shape(saved[name]) == np.shape(value)
                              and np.array_equal(saved[name], value)):
      if name in _FINGERPRINT_MEANING:
        raise ValueError(
            f"checkpoint_path {os.fspath(path)!r} was written by a run with other "
            f"{name}: this call has {_FINGERPRINT_MEANING[name]}. Its state (table, "
            "running mean, snapshot) belongs to that run, so resuming would continue with "
            "a wrong state. Pass the original data and optimizer, or a new "
            "checkpoint_path to start a new run (if only the JAX or dsgrad version "
            "changed, dsgrad.restore_fit_checkpoint reads the state without this check, "
            "and fit(opt_state=..., start_step=...) continues from it)")

      # A key's fingerprint means nothing to the user: say only that it differs.
      differs = ("another key than this call's" if name == "key" else
                 f"{name}={int(saved[name])}, but this call has {name}={int(value)}")
      raise ValueError(
          f"checkpoint_path {os.fspath(path)!r} was written by a run with {differs}: "
          "resuming would not continue that run. Pass the original setting, or a new "
          "checkpoint_path to start a new run")


def check_checkpoint_path(checkpoint_path, resume: bool, start_step: int, every) -> None:
  """Refuses, by name and before anything is trained, a :func:`dsgrad.fit`
  ``checkpoint_path`` it cannot write or would overwrite, and a ``checkpoint_every``
  without one."""
  if checkpoint_path is None and every is not None:  # a run its user thinks is saved
    raise ValueError("checkpoint_every needs a checkpoint_path: without one nothing is saved")
  if checkpoint_path is None:
    return
  path = os.fspath(checkpoint_path)
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise ValueError(f"checkpoint_path {path!r}: its folder {folder!r} does not exist")
  reason = checks.unwritable_reason(folder)
  if reason is not None:
    raise ValueError(f"checkpoint_path {path!r}: no file can be written in its folder "
                     f"{folder!r} ({reason})")
  if os.path.exists(path):  # a folder, a FIFO or a device would be moved aside by a save
    checks.check_regular_file(path, "checkpoint_path")
  # A fresh run's saves move what is there aside and then replace it: a user's file, or an
  # earlier run's checkpoint, would be lost by its second save. (A run continued from a
  # step, as an interrupted run's resume(), writes on its own checkpoint.)
  if not resume and start_step == 0 and checkpoint_lib.latest(path) is not None:
    raise ValueError(f"checkpoint_path {path!r} already holds a file (a checkpoint of an "
                     "earlier run?) and resume=False would replace it: pass resume=True to "
                     "continue that run, or another path (or delete the file) to start afresh")


@checks.arguments(step=checks.count(0))
def save_fit_checkpoint(path, params, opt_state, step: int,
                        history: History | None = None, *, settings: dict | None = None
                        ) -> None:
  """Saves ``(params, opt_state, step)``, optionally the history and the run's settings
  (:func:`run_settings`), atomically and with a checksum (what :func:`fit` writes).

  Raises:
    ValueError: ``params`` or ``opt_state`` hold NaN or inf: saved over an earlier
      checkpoint at ``path``, they would replace the last good state with one that no
      run can continue from.
  """
  for name, tree in (("params", params), ("opt_state", opt_state)):
    checks.value_checks(checks.finite_checks(tree, f"the {name} to save at {os.fspath(path)!r}"))
  tree = {"params": params, "opt_state": opt_state, "step": np.asarray(step, np.int64)}
  if history is not None:
    tree["history"] = {k: np.asarray(v, np.float64) for k, v in history._asdict().items()}
  if settings is not None:
    tree["settings"] = dict(settings)
  checkpoint_lib.save(path, tree)


def restore_fit_tree(path, raw: dict, params_like, opt_state_like):
  like = {"params": params_like, "step": np.asarray(0, np.int64)}
  if opt_state_like is None:  # the params and step only: the optimizer's state is left out
    raw = {k: v for k, v in raw.items() if k != "opt_state"}
  else:
    like["opt_state"] = opt_state_like
  for metadata in ("history", "settings"):  # free-form: restored as saved
    if metadata in raw:
      like[metadata] = raw[metadata]
  tree = checkpoint_lib.restore_from_raw(raw, like, path)
  return tree["params"], tree.get("opt_state"), int(tree["step"])


def restore_fit_checkpoint(path, params_like, opt_state_like):
  """Restores ``(params, opt_state, step)`` saved by :func:`fit`; pass ``step`` as
  ``start_step`` to continue. With ``opt_state_like=None``, the params and step alone
  (``opt_state`` ``None``): a run whose optimizer state you cannot rebuild, such as a paced
  one (:func:`dsgrad.fit_within`, :meth:`dsgrad.Recommendation.fit`), loses nothing trained.

  Raises:
    ValueError: a damaged file, or entries, shapes or dtypes other than the templates'
      (:func:`dsgrad.training.checkpoint.restore`).
  """
  return restore_fit_tree(path, checkpoint_lib.restore_raw(path), params_like,
                           opt_state_like)


def history_from_raw(raw: dict) -> History:
  saved = raw.get("history") or {}
  return History(*(np.asarray(saved.get(k, np.zeros(0)), _dtype(k)) for k in History._fields))


def _dtype(column: str):
  """A history column's dtype: the steps count, the rest are real numbers."""
  return np.int64 if column == "step" else np.float64


def restore_fit_history(path) -> History:
  """The :class:`History` saved with a :func:`fit` checkpoint (pass it back to ``fit`` as
  ``history`` when resuming); empty if the checkpoint has none."""
  return history_from_raw(checkpoint_lib.restore_raw(path))


class Recorder:
  """:func:`dsgrad.fit`'s history as one list per field, continuing a resumed run's ``history``."""

  def __init__(self, history: History | None, start_step: int):
    self.columns = {name: [] for name in History._fields}
    self.continued = history is not None
    if history is not None:
      if not isinstance(history, History):
        raise TypeError(f"history must be a dsgrad.History (a FitResult's .history, or "
                        f"restore_fit_history's), got {type(history).__name__}")
      lengths = {name: np.size(getattr(history, name)) for name in History._fields}
      if len(set(lengths.values())) > 1:  # one entry per evaluation in every field
        raise ValueError(f"history's fields have different lengths {lengths}: one entry "
                         "per evaluation in each")
      # An interrupted run's history ends at its last evaluation, which can be before
      # the step it stopped at (Interrupted); one past it belongs to another state.
      if len(history.step) and int(history.step[-1]) > start_step:
        raise ValueError(f"history ends at step {int(history.step[-1])} but start_step is "
                         f"{start_step}; pass the history saved with the checkpoint (or "
                         "the one of the Interrupted that stopped this run)")
      self.columns = {name: list(np.asarray(getattr(history, name), np.float64))
                      for name in History._fields}
    self.wall = float(self.columns["wall_time"][-1]) if self.columns["wall_time"] else 0.0

  def lacks(self, step: int) -> bool:
    """Whether a resumed run's history ends before its ``step``."""
    steps = self.columns["step"]
    return self.continued and step > 0 and (not steps or steps[-1] < step)

  def append(self, step: int, seconds: float, value: float, se: float) -> None:
    """Appends an evaluation; one at the step of the last replaces it (a run stopped by
    its time limit evaluates again, in full, where a cheaper evaluation was made)."""
    if self.columns["step"] and self.columns["step"][-1] == step:
      for column in self.columns.values():
        column.pop()
    for name, v in zip(History._fields, (step, self.wall + seconds, value, se)):
      self.columns[name].append(v)

  def history(self) -> History:
    return History(*(np.asarray(self.columns[k], _dtype(k)) for k in History._fields))
