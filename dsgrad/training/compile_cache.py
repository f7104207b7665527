"""One bounded cache of compiled programs, shared by every part of dsgrad that compiles
a program once and calls it many times (:func:`dsgrad.fit`'s training segments, the
ELBO evaluators, the variance diagnostics, the annealed and VAE evaluators).

Programs are keyed by what determines them (an objective's structure, sizes, settings),
never by data, so that objectives made by :meth:`~dsgrad.Objective.with_data` share them.
One least-recently-used rule bounds the total: at most :data:`MAX_PROGRAMS` programs are
kept, whatever made them, so a long session that builds many models does not keep every
executable (and the arrays its closures hold) alive. A program compiled by
:func:`compiled_as_text` is also kept under its text, which other Python objects that
trace to the same program find.

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
import contextlib
import functools
import hashlib
import inspect
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


def compiled_as_text(function: Callable, args: tuple, donate_first: bool = False,
                     tracing=contextlib.nullcontext()) -> Callable:
  """``function`` (jitted or not) compiled for ``args``, its executable kept under the
  program's text: two traces that lower to the same program share one executable, though
  they came from other Python objects (an optimizer made again with the same settings, a
  model built again from the same functions on arrays of the same shapes). The executable
  takes the arguments' leaves, so that objects whose static parts differ call it alike.

  A program that calls back into Python is compiled for itself: its text need not name
  which function it calls.

  Args:
    function: ``(*args) -> pytree``.
    args: example arguments (arrays or their ``jax.ShapeDtypeStruct``).
    donate_first: whether ``args[0]``'s buffers are donated.
    tracing: a context held while ``function`` is traced and lowered (not while XLA
      compiles).

  Returns:
    ``(*args) -> function(*args)``, compiled.

  Example::

    >>> import jax.numpy as jnp
    >>> from dsgrad.training.compile_cache import compiled_as_text
    >>> double = compiled_as_text(lambda x: 2 * x, (jnp.ones(3),))
    >>> again = compiled_as_text(lambda y: y * 2, (jnp.ones(3),))  # its executable, found
    >>> again(jnp.arange(3.0)).tolist()
    [0.0, 2.0, 4.0]
  """
  leaves, in_tree = jax.tree.flatten(args)
  out_trees = []

  def flat(*leaves):
    out_leaves, out_tree = jax.tree.flatten(function(*jax.tree.unflatten(in_tree, leaves)))
    out_trees.append(out_tree)
    return out_leaves

  flat.__name__ = _name_of(function)  # the program's name in profiles and compile logs

  donated = tuple(range(len(jax.tree.leaves(args[0])))) if donate_first else ()
  with tracing:
    # Every argument stays in the program's signature: pruned, ``(a, b) -> 2 b`` and
    # ``(a, b) -> 2 a`` lowered to the same text, and shared one executable.
    lowered = jax.jit(flat, donate_argnums=donated, keep_unused=True).lower(*leaves)
    text = lowered.as_text()
  # The text does not name the device it was lowered for.
  where = (jax.default_backend(), str(jax.config.jax_default_device))
  executable = (lowered.compile() if "callback" in text else get_or_build(
      ("program text", where, hashlib.sha256(text.encode()).hexdigest()), lowered.compile)[0])
  out_tree = out_trees[-1]

  def call(*args):
    return jax.tree.unflatten(out_tree, executable(*jax.tree.leaves(args)))
  return call


def jit_by_text(function: Callable | None = None, *, static_argnames=()) -> Callable:
  """``jax.jit(function, static_argnames=...)`` whose executables live in this cache,
  found by :func:`compiled_as_text`: a call with arguments of a new structure (a model
  built again from the same functions, whose static parts are other Python objects)
  traces and lowers its program again, and runs the executable of the same text where
  there is one instead of compiling it. For functions called outside ``jit``, with
  arrays (and pytrees of them) as their traced arguments.

  Example::

    >>> import jax.numpy as jnp
    >>> from dsgrad.training.compile_cache import jit_by_text
    >>> @jit_by_text(static_argnames="power")
    ... def raised(x, *, power):
    ...   return x ** power
    >>> raised(jnp.arange(3.0), power=2).tolist()
    [0.0, 1.0, 4.0]
  """
  if function is None:
    return functools.partial(jit_by_text, static_argnames=static_argnames)
  names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
  signature = inspect.signature(function)

  def program(args, kwargs):
    """``(executable, traced arguments)`` of a call, built or found; ``(None, None)`` for
    a call that does not fit (the function's own error names it) or runs inside a trace
    (inlined)."""
    try:
      bound = signature.bind(*args, **kwargs)
    except TypeError:
      return None, None
    static = tuple((name, bound.arguments.pop(name)) for name in names
                   if name in bound.arguments)
    traced = (bound.args, bound.kwargs)
    leaves, structure = jax.tree.flatten(traced)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
      return None, None
    key = ("jit by text", function, static, structure, tuple(map(jax.typeof, leaves)))
    return get_or_build(key, lambda: compiled_as_text(_with(function, static), traced))[0], traced

  @functools.wraps(function)
  def call(*args, **kwargs):
    compiled, traced = program(args, kwargs)
    return function(*args, **kwargs) if compiled is None else compiled(*traced)

  def compile(*args, **kwargs) -> None:
    """Builds (or finds) the executable for these arguments without running it: a
    caller that times its runs compiles before its clock starts."""
    program(args, kwargs)

  call.compile = compile
  # As jax.jit's: the program lowered for these arguments, to read (its text, its cost).
  call.lower = jax.jit(function, static_argnames=names).lower
  return call


def _with(function, static: tuple) -> Callable:
  """``(args, kwargs) -> function(*args, **kwargs, **static)``, named as ``function``."""
  def program(args, kwargs):
    return function(*args, **kwargs, **dict(static))

  program.__name__ = _name_of(function)
  return program


def _name_of(function) -> str:
  """The name of ``function``, or of the function a ``functools.partial`` wraps."""
  while isinstance(function, functools.partial):
    function = function.func
  return getattr(function, "__name__", "program")
