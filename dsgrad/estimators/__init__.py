"""Gradient estimators for doubly-stochastic objectives, as optax transformations."""

from dsgrad.estimators._weights import AdaptiveWeightState
from dsgrad.estimators.cv import cv
from dsgrad.estimators.inc import IncState, inc
from dsgrad.estimators.naive import naive
from dsgrad.estimators.saga import JointSagaState, joint_saga
from dsgrad.estimators.smiso import SmisoState, smiso
from dsgrad.estimators.svrg import JointSvrgState, joint_svrg

__all__ = ["naive", "cv", "inc", "smiso", "joint_saga", "joint_svrg",
           "IncState", "SmisoState", "JointSagaState", "JointSvrgState",
           "AdaptiveWeightState"]
