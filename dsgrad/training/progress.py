"""What dsgrad's long calls (:func:`dsgrad.fit`, :func:`dsgrad.mcmc.run_chain`,
:func:`dsgrad.mcmc.sample`) show and how they stop: the one progress display (a tqdm bar
where tqdm is installed, an optional extra; printed lines where it is not; nothing when
disabled) and the one exception of an interrupt, which keeps the work done."""

from __future__ import annotations

import math
from typing import Any, Callable


def bar(enabled: bool, total: int | None, unit: str, desc: str | None = None) -> Callable[..., None]:
  """``update(n, *, status=None, line=None, close=False, total=None)``.

  ``update`` advances the bar by ``n`` units, shows ``status`` (a dict, e.g. the current
  ELBO, or a string) beside it, sets the ``total`` once it is known, and closes it with
  ``close``. Without tqdm, ``line`` (a sentence for this update, e.g.
  ``"step 200: elbo -231.4"``) is printed instead, when given.

  Args:
    enabled: show anything at all.
    total: the units the call will run (``None``: not known yet).
    unit: their name (``"step"``, ``"draw"``, ``"s"``).
    desc: a label in front of the bar.
  """
  if not enabled:
    return lambda n=0, **_: None
  try:
    from tqdm.auto import tqdm
  except ImportError:
    def printed(n=0, *, status=None, line=None, close=False, total=None):
      del n, status, close, total
      if line is not None:
        print(line, flush=True)
    return printed
  # Seconds are fractional: shown to a tenth, and without a total as the time elapsed.
  timed = ("{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}"
           "{postfix}]") if unit == "s" else None
  shown = tqdm(total=total, unit=unit, desc=desc,
               bar_format=timed if total or not timed else "{desc}: {elapsed}{postfix}")

  def update(n=0, *, status=None, line=None, close=False, total=None):
    del line
    if total and math.isfinite(total) and total > 0:  # else: the bar of elapsed time
      shown.total = total
      if timed:
        shown.bar_format = timed
      shown.refresh()
    if n:
      shown.update(n)
    if isinstance(status, str):
      shown.set_postfix_str(status)
    elif status:
      shown.set_postfix(**status)
    if close:
      shown.close()
  return update


def elbo_bar(enabled: bool, total: int | None) -> Callable[..., None]:
  """``update(n_steps, step, elbo, se, close=False, left=None)`` on :func:`bar` for
  :func:`dsgrad.fit`: the ELBO beside the bar, or a printed line per evaluation without
  tqdm. ``total``: ``None`` for a run that trains until its time is up; ``left``: the
  steps a run limited in time is expected to run yet, which set the total afresh.
  ``enabled`` may be such a function already made: it is returned, so that several
  calls of ``fit`` (a paced run's pieces) show on one bar."""
  if callable(enabled):
    return enabled
  shown, done = bar(enabled, total, "step"), [0]

  def update(n, step, value, se, close=False, left=None):
    done[0] += n
    known = value is not None and math.isfinite(value)
    shown(n, status={"elbo": f"{value:.4g}", "se": f"{se:.2g}"} if known else None,
          line=f"step {step}: elbo {value:.6g} (se {se:.2g})" if n and value is not None
          else None, close=close, total=None if left is None else done[0] + left)
  return update


class Interrupted(KeyboardInterrupt):
  """Raised by a long call stopped by an interrupt (Ctrl-C): the work done is kept.

  A ``KeyboardInterrupt``, so a script still stops where nothing catches it. The state
  kept is the one after the last block of steps (or chunk of draws) that ran: an
  interrupt arriving while one runs is taken when it ends.

  Attributes:
    result: what the call returns, for the work done: :func:`dsgrad.fit`'s
      :class:`dsgrad.FitResult` at ``step`` (``pareto_k`` not computed),
      :func:`dsgrad.mcmc.run_chain`'s tuple or :func:`dsgrad.mcmc.sample`'s
      :class:`dsgrad.mcmc.MCMCResult` over the draws kept (its ``state`` continues the
      chain: ``run_chain`` from it with a new key); :func:`dsgrad.recommend`'s
      :class:`dsgrad.Recommendation` of naive, holding naive's run (its ``fit()`` goes on).
    step: the steps (or draws) done.
    num_steps: those the call asked for (``None`` where it asked for seconds).

  Example::

    try:
      result = dsgrad.fit(objective, optimizer, params, key, num_steps=10**6, batch_size=100)
    except dsgrad.Interrupted as stop:  # Ctrl-C
      result = stop.result              # or stop.resume() to go on to num_steps
  """

  def __init__(self, message: str, result: Any, step: int, num_steps: int,
               resume: Callable[..., Any] | None = None):
    super().__init__(message)
    self.result, self.step, self.num_steps, self._resume = result, step, num_steps, resume

  def resume(self, **changes):
    """Continues the call from :attr:`result` to ``num_steps``: for :func:`dsgrad.fit`, the
    same arguments but for ``changes`` among ``dsgrad.training.loop.RESUME_CHANGES``
    (``num_steps``, ``progress``, ...); a fit given ``max_seconds`` and no ``num_steps``
    trains ``max_seconds`` more. A chain continues with
    ``dsgrad.mcmc.run_chain`` from ``result``'s state instead."""
    if self._resume is None:
      raise TypeError("this interrupted call cannot be resumed by resume(): continue a chain "
                      "with dsgrad.mcmc.run_chain from the kept result's state and a new key")
    return self._resume(self, **changes)
