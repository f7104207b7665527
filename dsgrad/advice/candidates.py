"""The ways to train that :func:`dsgrad.recommend` races, built or ruled out with a reason."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from dsgrad import approx as approx_lib
from dsgrad import estimators
from dsgrad import noise as noise_lib
from dsgrad import tables
from dsgrad.training import host_data

CANDIDATES = ("naive", "joint_svrg", "cv", "naive_batch", "naive_samples", "path_derivative",
              "rqmc", "joint_saga")
"""What :func:`dsgrad.recommend` can race: naive (the reference); the control variates;
the equal-cost uses of naive's time (a batch, Monte Carlo samples or randomized QMC samples
:data:`EQUAL_COST_FACTOR` times more); naive with the path-derivative gradient."""

DEFAULT_CANDIDATES = ("naive", "joint_svrg", "cv", "naive_batch")
"""Raced unless told otherwise: few, since each shortens the others' race; the larger
batch is the equal-cost baseline that won most often on held-out models."""

EQUAL_COST_FACTOR = 2  # a control variate's step: 1.3-2.0 naive steps, two CPU cores


class Candidate(NamedTuple):
  """One way to train, as :class:`dsgrad.Recommendation` reports it.

  Attributes:
    name: a name from :data:`CANDIDATES`.
    batch_size: data per step.
    samples_per_datum: Monte Carlo (or QMC) samples per datum.
    approximation: the control variate's approximation (``None`` for naive's variants).
    steps_per_second: as raced (``None`` where not raced).
    gain: ELBO minus naive's at equal wall-clock, where the race ends (``None`` where
      not raced; 0 for naive).
    gain_se: its standard error.
    raced: whether it raced.
    why_not: why it did not race (empty where it did).
  """

  name: str
  batch_size: int
  samples_per_datum: int = 1
  approximation: str | None = None
  steps_per_second: float | None = None
  gain: float | None = None
  gain_se: float | None = None
  raced: bool = False
  why_not: str = ""

  def describe(self) -> str:
    """Its name and settings, in words."""
    settings = ([f"batch {self.batch_size}"]
                + [f"{self.samples_per_datum} samples per datum"] * (self.samples_per_datum > 1)
                + [f"approximation {self.approximation}"] * bool(self.approximation))
    return f"{self.name} ({', '.join(settings)})"


class Contender(NamedTuple):
  """A candidate ready to run: the objective its steps use and its estimator (a
  :class:`dsgrad.training.paced.Run` reads its ``name`` and ``batch_size`` too)."""

  candidate: Candidate
  objective: Any
  estimator: Any

  name = property(lambda self: self.candidate.name)
  batch_size = property(lambda self: self.candidate.batch_size)


def build(names, objective, params, batch_size: int, approx=None,
          max_table_bytes="auto", memory_share: float | None = 0.5) -> list:
  """A :class:`Contender` for each name, or a :class:`Candidate` whose ``why_not`` says
  why it cannot apply: an approximation or noise the objective lacks, more noise
  coordinates than the QMC generator has, a table that does not fit, a state larger than
  ``memory_share`` of the free memory (computed from shapes, nothing allocated; not
  computed with ``memory_share=None``, for candidates that will not run: tracing a
  state's initial full pass costs a tenth of a second)."""
  free, out = host_data.free_memory_bytes(), []
  for name in names:
    k = EQUAL_COST_FACTOR if name in ("naive_samples", "rqmc") else 1
    label = ((approx or approx_lib.linearize()).name
             if name in ("cv", "joint_svrg", "joint_saga") else None)
    batch = min(objective.num_data, EQUAL_COST_FACTOR * batch_size) if name == "naive_batch" \
        else batch_size
    candidate = Candidate(name, batch, k, label)
    try:
      if name == "naive_batch" and batch == batch_size:
        raise ValueError(f"the batch is already all {objective.num_data:,} data")
      contender = _contender(candidate, objective, approx, max_table_bytes)
      if memory_share is not None:
        needed = tables.tree_bytes(jax.eval_shape(contender.estimator.init, params))
        if free and needed > memory_share * free:
          raise MemoryError(f"its state needs {needed / 2**30:.3g} GiB, more than "
                            f"{memory_share:.0%} of the {free / 2**30:.3g} GiB free")
      out.append(contender)
    except (ValueError, MemoryError, TypeError) as error:  # the first sentence says why
      out.append(candidate._replace(why_not=str(error).split(". ")[0].split("; ")[0]))
  return out


def _contender(candidate: Candidate, objective, approx, max_table_bytes) -> Contender:
  """``candidate`` built on ``objective``; a ValueError says why it does not apply."""
  name, naive = candidate.name, estimators.naive()
  if name in ("naive", "naive_batch"):
    return Contender(candidate, objective, naive)
  if name in ("naive_samples", "rqmc"):
    if name == "rqmc" and getattr(objective.noise_fn, "gaussian", None) is None:
      raise ValueError("the noise is not dsgrad.gaussian_noise")
    return Contender(candidate, noise_lib.multi_sample(
        objective, candidate.samples_per_datum, sampler="rqmc" if name == "rqmc" else "mc"), naive)
  source = objective.source or ()
  if name == "path_derivative":
    from dsgrad.families.gaussian import PATH_DERIVATIVE, meanfield_gaussian
    if source[:1] == ("meanfield_gaussian" + PATH_DERIVATIVE,):
      raise ValueError("the objective has the path derivative already: it is naive")
    if source[:1] != ("meanfield_gaussian",):
      raise ValueError("only for objectives made by dsgrad.meanfield_gaussian")
    # On the objective's data (a with_data copy's), not those its source was built on.
    return Contender(candidate, meanfield_gaussian(
        source[1]._replace(data=objective.data), shared_noise=objective.shared_noise,
        path_derivative=True), naive)
  if name == "joint_saga" and approx is None and objective.table_approximation is not None:
    approx = objective.table_approximation(objective)  # e.g. of the coordinates a row reads
    candidate = candidate._replace(approximation=approx.name)
  # joint_svrg refreshes once an epoch of the updates' batch by default, as the paper does.
  extra = {"max_table_bytes": max_table_bytes} if name == "joint_saga" else {}
  return Contender(candidate, objective, getattr(estimators, name)(objective, approx, **extra))
