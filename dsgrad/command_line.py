"""Command-line settings checked by kind: ``argparse`` ``type=`` functions built on
:mod:`dsgrad.argument_kinds`, so that a command refuses ``--steps 0`` or ``--budget -5``
where it reads it, with the same words as the library, instead of failing (or running)
later. The examples and benchmarks use them; so may your scripts.

Example::

    >>> import argparse
    >>> from dsgrad import command_line
    >>> parser = argparse.ArgumentParser(prog="train")
    >>> _ = parser.add_argument("--steps", type=command_line.count(1), default=100)
    >>> parser.parse_args(["--steps", "250"]).steps
    250
"""

from __future__ import annotations

import argparse
import os

from dsgrad import argument_kinds, checks

__all__ = ["count", "positive", "fraction", "folder"]


def _parse(kind: argument_kinds.Kind, convert):
  def parse(text: str):
    try:
      return kind.check(convert(text), "it")
    except (TypeError, ValueError) as error:  # argparse prints it after the flag's name
      raise argparse.ArgumentTypeError(str(error)) from None
  parse.__name__ = kind.kind
  return parse


def _number(text: str):
  try:
    return int(text)
  except ValueError:  # "2.5" is refused as a float, by the count's own words
    return float(text)


def count(minimum: int = 1):
  """An integer ``>= minimum`` (steps, sizes; ``count(0)`` for seeds)."""
  return _parse(argument_kinds.count(minimum), _number)


def positive():
  """A finite number ``> 0`` (seconds, learning rates, scales)."""
  return _parse(argument_kinds.positive(), float)


def fraction():
  """A number in ``(0, 1)`` (a held-out share)."""
  return _parse(argument_kinds.probability(low_open=True, high_open=True), float)


def folder():
  """A folder to write into: one that exists and is writable, or one that can be made
  (its nearest existing parent is a writable folder). Refused where it is read, so that
  ``--out results.json`` (a file) stops before the work, not with ``os.makedirs``'s
  bare ``FileExistsError`` after it."""
  def parse(text: str):
    path = os.path.abspath(text)
    parent = path
    while not os.path.exists(parent):
      parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
      raise argparse.ArgumentTypeError(
          f"{text!r}: {parent!r} is a file, not a folder" if parent == path else
          f"{text!r} cannot be made: {parent!r} is a file, not a folder")
    reason = checks.unwritable_reason(parent)
    if reason is not None:
      raise argparse.ArgumentTypeError(f"{text!r}: the folder {parent!r} is not writable "
                                       f"({reason})")
    return text
  parse.__name__ = "folder"
  return parse
