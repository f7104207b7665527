"""The six estimators, built on one objective, for the shared battery."""

import pytest

import dsgrad

# name -> (factory(objective, **settings) -> transform, is_optimizer)
CASES = {
    "naive": (lambda obj, **kw: dsgrad.naive(**kw), False),
    "cv": (lambda obj, **kw: dsgrad.cv(obj, **kw), False),
    "inc": (lambda obj, **kw: dsgrad.inc(obj, **kw), False),
    "smiso": (lambda obj, **kw: dsgrad.smiso(obj, 0.05, **kw), True),
    "joint_saga": (lambda obj, **kw: dsgrad.joint_saga(obj, **kw), False),
    "joint_svrg": (lambda obj, **kw: dsgrad.joint_svrg(obj, every=7, **kw), False),
    # The adaptive control-variate weight adds a state of moving averages.
    "cv_adaptive": (lambda obj, **kw: dsgrad.cv(obj, control_weight="adaptive", **kw), False),
    "joint_saga_adaptive": (lambda obj, **kw: dsgrad.joint_saga(
        obj, control_weight="adaptive", **kw), False),
    "joint_svrg_adaptive": (lambda obj, **kw: dsgrad.joint_svrg(
        obj, every=7, control_weight="adaptive", **kw), False),
}

# The adaptive weight's moving averages are one state whatever the estimator: joint SAGA
# carries them through every check of the default run, cv and joint SVRG through the
# slow run's (python -m pytest -m slow).
SLOW = ("cv_adaptive", "joint_svrg_adaptive")


def parametrized(names) -> list:
  """``names`` for ``pytest.mark.parametrize``, those in :data:`SLOW` marked slow."""
  return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]
