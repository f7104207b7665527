"""One bounded cache of compiled programs, shared by every part of dsgrad that compiles
a program once and calls it many times (:func:`dsgrad.fit`'s training segments, the
ELBO evaluators, the variance diagnostics, the annealed and VAE evaluators).

Programs are keyed by what determines them (an objective's structure, sizes, settings),
never by data, so that objectives made by :meth:`~dsgrad.Objective.with_data` share them.
One least-recently-used rule bounds the total: at most :data:`MAX_PROGRAMS` programs are
kept, whatever made them, so a long session that builds many models does not keep every
executable (and the arrays its closures hold) alive.

Example::

    >>> import jax, jax.numpy as jnp
    >>> from dsgrad.training import compile_cache
    >>> @compile_cache.cached
    ... def scaler(factor: float):
    ...   return jax.jit(lambda x: factor * x)
    >>> scaler(2.0) is scaler(2.0), float(scaler(3.0)(jnp.ones(())))
    (True, 3.0)
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Any, Callable, Hashable

import jax

MAX_PROGRAMS = 64
"""The most programs kept; the least recently used is dropped first."""

_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_LOCK = threading.Lock()  # programs may be built in several threads at once


def get_or_build(key: Hashable, build: Callable[[], Any]) -> tuple[Any, float]:
  """The program cached under ``key``, or ``build()``'s, cached.

  Returns:
    ``(program, seconds)``: seconds spent in ``build`` (0.0 on a hit).
  """
  return get_or_build_with_cost(key, build)[:2]


def get_or_build_with_cost(key: Hashable, build: Callable[[], Any]) -> tuple[Any, float, float]:
  """:func:`get_or_build`, and what the build would have cost without JAX's persistent
  compilation cache: ``(program, seconds, uncached_seconds)``.

  Where that cache (a ``jax_compilation_cache_dir``) serves a program, ``build`` is quick,
  but a program of other sizes still compiles in full: pricing one by the other ran the
  advice to 16% of a budget it was given 10% of. JAX stores a program's compile time
  with it, in whole seconds (truncated), and reports it on a hit; each hit's read is
  replaced by the middle of that second, and by at least the cache's
  ``jax_persistent_cache_min_compile_time_secs`` (a quicker compile is not stored)."""
  with _LOCK:
    if key in _PROGRAMS:
      _PROGRAMS.move_to_end(key)
      return _PROGRAMS[key], 0.0, 0.0
  _listen()
  _HITS.reads = []
  t0 = time.perf_counter()
  program = build()
  seconds = time.perf_counter() - t0
  floor = float(jax.config.jax_persistent_cache_min_compile_time_secs)
  uncached = seconds + sum(max(stored + 0.5, floor) - read for stored, read in _HITS.reads)
  with _LOCK:
    _PROGRAMS[key] = program
    while len(_PROGRAMS) > MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  return program, seconds, uncached


class _PersistentHits(threading.local):
  """Per thread (programs compile on several at once): ``(stored compile seconds, read
  seconds)`` of each program JAX's persistent cache served, from its monitoring events
  (on a hit it records the time saved, ``stored - read``, then the read)."""
  reads: list = []
  saved = 0.0


_HITS = _PersistentHits()


def _count_hit(event: str, duration: float, **kwargs) -> None:
  if event == "/jax/compilation_cache/compile_time_saved_sec":
    _HITS.saved = float(duration)
  elif event == "/jax/compilation_cache/cache_retrieval_time_sec":
    _HITS.reads = _HITS.reads + [(_HITS.saved + float(duration), float(duration))]


_LISTENING = []


def _listen() -> None:
  """Registers :func:`_count_hit` with JAX's monitoring, once, at the first compile this
  cache makes: importing dsgrad installs nothing."""
  with _LOCK:
    if not _LISTENING:
      jax.monitoring.register_event_duration_secs_listener(_count_hit)
      _LISTENING.append(True)


def cached(factory: Callable) -> Callable:
  """Decorates a factory of compiled programs so that its results live in the shared
  cache, keyed by the factory and its (hashable) arguments."""
  name = f"{factory.__module__}.{factory.__qualname__}"

  @functools.wraps(factory)
  def wrapper(*args, **kwargs):
    key = (name, args, tuple(sorted(kwargs.items())))
    return get_or_build(key, lambda: factory(*args, **kwargs))[0]

  return wrapper


def clear() -> None:
  """Drops every cached program."""
  with _LOCK:
    _PROGRAMS.clear()


def size() -> int:
  """How many programs are cached."""
  return len(_PROGRAMS)
