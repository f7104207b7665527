"""XLA's CPU threads on a few cores, every core for the rest of the process.

JAX's CPU client sizes its thread pool by the cores the process may use when the client
starts, and XLA then splits large loops of a compiled program over that pool. On small
virtual machines the split can cost far more than it saves: on the 2-core machines of
dsgrad's benchmarks, a loop that assembles a flat gradient from a pytree's pieces (a
concatenate) ran several times slower split over two threads than on one ("Whether a
step repeats" in docs/benchmarks.md). Pinning the whole process to one core avoids it
but leaves the other cores idle while a step runs. Linux threads inherit the affinity of
the thread that creates them, so starting the client while this thread is narrowed gives
XLA a pool of that size on those cores. Then every thread but that pool gets its cores
back: this thread, and the client's others (left on the pool's core, a program compiled
beside a run took more than twice as long and slowed the run's steps).

A process that did not narrow the pool on such a machine is told so once, by the first
:func:`dsgrad.fit` (which :func:`dsgrad.recommend` and :func:`dsgrad.fit_within` run
before they time a step) or :func:`dsgrad.mcmc.run_chain` (:func:`warn_if_split`), at
the user's line: its steps are slower and their times uneven, which also misleads any
advice timed on them.
"""

from __future__ import annotations

import os

import jax

from dsgrad import checks

POOL_THREAD_NAME = "tf_XLAEigen"
"""The name XLA's CPU client gives the threads of its compute pool (TSL's ``XLAEigen``
pool), as Linux shows it in ``/proc/self/task/<id>/comm``."""
_TASKS = "/proc/self/task"
SMALL_MACHINE_CORES = 2
"""Processes on at most this many cores are warned of a split pool: measured on 2
(``python -m benchmarks two-threads``: the hierarchical model's gradient 41-47 ms a call
split over two threads, 0.43-0.71 ms with a pool of one). Whether a split pays on more
cores is not measured here."""
_warned = False  # once a process: its pool does not change after the client starts
_pinned: frozenset | None = None  # the cores pin_xla_threads gave XLA's pool, once it has


class SplitPoolWarning(UserWarning):
  """XLA's CPU compute pool spans every core of a small machine (see :func:`warn_if_split`)."""


def split_pool_message(pool_threads: int, cores: int, backend: str) -> str | None:
  """Why a process should narrow XLA's compute pool, or None: a CPU backend whose pool has
  more than one thread, on at most :data:`SMALL_MACHINE_CORES` cores."""
  if backend != "cpu" or pool_threads <= 1 or cores > SMALL_MACHINE_CORES:
    return None
  return (f"XLA's CPU compute pool has {pool_threads} threads on this {cores}-core machine "
          "and splits a step's large loops over them: on 2-core machines a compiled step then "
          "took several times its time on one thread, varying from call to call (dsgrad's "
          "docs/benchmarks.md, 'Whether a step repeats'), which also misleads what is timed on "
          "it (dsgrad.recommend's race, fit_within's pace). Call dsgrad.pin_xla_threads(1) "
          "first in your program, before any JAX array is created")


def warn_if_split() -> None:
  """Warns (:class:`SplitPoolWarning`), once a process, where :func:`split_pool_message`
  says so of this process's pool (not where :func:`pin_xla_threads` sized it), at the
  user's line that called into dsgrad (:func:`dsgrad.checks.warn_at_caller`)."""
  global _warned
  if _warned or not hasattr(os, "sched_getaffinity"):
    return
  _warned = True
  pool = sum(name == POOL_THREAD_NAME for name in _names(_threads()).values())
  if message := split_pool_message(pool, len(os.sched_getaffinity(0)), jax.default_backend()):
    checks.warn_at_caller(message, SplitPoolWarning)


def _names(thread_ids) -> dict:
  """``{thread id: its name}`` (a thread that ended meanwhile is left out)."""
  names = {}
  for tid in thread_ids:
    try:
      with open(os.path.join(_TASKS, tid, "comm")) as f:
        names[tid] = f.read().strip()
    except OSError:
      pass
  return names


def _threads() -> set:
  try:
    return set(os.listdir(_TASKS))
  except OSError:
    return set()


def _release(thread_ids, cores) -> None:
  """Gives every thread of ``thread_ids`` but the compute pool's ``cores`` (a thread that
  ends meanwhile is skipped); where no pool thread is named as expected, all stay where
  they are: narrowed is slower to compile but never split."""
  names = _names(thread_ids)
  if POOL_THREAD_NAME not in names.values():
    return
  for tid, name in names.items():
    if name != POOL_THREAD_NAME:
      try:
        os.sched_setaffinity(int(tid), cores)
      except OSError:
        pass


def _backends_started() -> bool:
  # JAX has no public query for this; the private one is guarded so that a JAX without it
  # skips the check rather than failing.
  try:
    from jax._src import xla_bridge
    return xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    return False


@checks.arguments(cores=checks.count(1))
def pin_xla_threads(cores: int = 1) -> frozenset:
  """Starts JAX's backends with XLA's compute threads on ``cores`` CPU cores; every other
  thread keeps every core the process had.

  Call it first, before anything creates a JAX array or asks for devices: the client's
  thread pool is sized once, when it starts. Every other thread, the caller's, the
  client's others and those started later (a compile in a background thread, a data
  reader), may run on any core of the process.

  Args:
    cores: how many of the process's cores XLA's compute threads may use (the
      lowest-numbered ones of its affinity mask): XLA sizes its pool, and so how far it
      splits a loop, by this number. A positive integer, at most the mask's size.

  Returns:
    The cores XLA's compute pool runs on.

  Raises:
    ValueError: ``cores`` is not a positive integer within the process's cores.
    RuntimeError: a JAX backend has already started (but a call as this process's
      first, once it has pinned, returns its cores: a script and a module it imports may
      both call it), or the platform cannot set a thread's affinity (Linux's
      ``sched_setaffinity``).

  Example::

      import dsgrad
      dsgrad.pin_xla_threads(1)   # first, before any JAX computation
      # ... build the objective and call dsgrad.fit as usual
  """
  if not hasattr(os, "sched_setaffinity"):
    raise RuntimeError("pin_xla_threads needs os.sched_setaffinity (Linux); on this "
                       "platform leave XLA's threads as they are")
  available = sorted(os.sched_getaffinity(0))
  if cores > len(available):
    raise ValueError(f"pin_xla_threads: cores must be an integer from 1 to "
                     f"{len(available)} (the cores this process may use), got {cores!r}")
  chosen = frozenset(available[:cores])
  global _warned, _pinned
  if _backends_started():
    if _pinned is not None and len(_pinned) == cores:  # as this process was pinned: done
      return _pinned
    raise RuntimeError("pin_xla_threads: JAX's backends have already started, so XLA's "
                       "thread pool is already sized" + (
                           f" (by pin_xla_threads({len(_pinned)}))" if _pinned else "") +
                       "; call it first in the program, before any JAX array is created")
  _warned = True  # the pool's size is the caller's choice
  before = _threads()
  os.sched_setaffinity(0, chosen)
  try:
    jax.devices()
  finally:
    os.sched_setaffinity(0, available)
    _release(_threads() - before, available)
  _pinned = chosen
  return chosen
