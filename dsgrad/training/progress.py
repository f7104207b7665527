"""The one progress display of dsgrad's long calls (:func:`dsgrad.fit`,
:func:`dsgrad.mcmc.run_chain` and :func:`dsgrad.mcmc.sample`): a tqdm bar where tqdm is
installed (an optional extra), printed lines where it is not, nothing when disabled."""

from __future__ import annotations

from typing import Callable


def bar(enabled: bool, total: int, unit: str) -> Callable[..., None]:
  """``update(n, *, status=None, line=None, close=False)``.

  ``update`` advances the bar by ``n`` units, shows ``status`` (a dict, e.g. the current
  ELBO) beside it, and closes it with ``close``. Without tqdm, ``line`` (a sentence for
  this update, e.g. ``"step 200: elbo -231.4"``) is printed instead, when given.

  Args:
    enabled: show anything at all.
    total: the units the call will run.
    unit: their name (``"step"``, ``"draw"``).
  """
  if not enabled:
    return lambda n=0, **_: None
  try:
    from tqdm.auto import tqdm
  except ImportError:
    def printed(n=0, *, status=None, line=None, close=False):
      del n, status, close
      if line is not None:
        print(line, flush=True)
    return printed
  shown = tqdm(total=total, unit=unit)

  def update(n=0, *, status=None, line=None, close=False):
    del line
    if n:
      shown.update(n)
    if status:
      shown.set_postfix(**status)
    if close:
      shown.close()
  return update
