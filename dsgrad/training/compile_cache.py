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


MAX_PROGRAMS = 64
"""The most programs kept; the least recently used is dropped first."""

_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_LOCK = threading.Lock()  # programs may be built in several threads at once


def get_or_build(key: Hashable, build: Callable[[], Any]) -> tuple[Any, float]:
  """The program cached under ``key``, or ``build()``'s, cached.

  Returns:
    ``(program, seconds)``: seconds spent in ``build`` (0.0 on a hit).
  """
  with _LOCK:
    if key in _PROGRAMS:
      _PROGRAMS.move_to_end(key)
      return _PROGRAMS[key], 0.0
  t0 = time.perf_counter()
  program = build()
  seconds = time.perf_counter() - t0
  with _LOCK:
    _PROGRAMS[key] = program
    while len(_PROGRAMS) > MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  return program, seconds


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
