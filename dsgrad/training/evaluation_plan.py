"""When :func:`dsgrad.fit` estimates the full-data ELBO, and with how many draws.

An evaluation reads every datum once per Monte Carlo draw, so its cost grows with
``elbo_samples x N`` while a segment's steps cost ``eval_every x B`` data. A run's
natural rhythm, one evaluation an epoch with 100 draws, then costs about 100 epochs of
forward passes per epoch of steps: with 200,000 data (logistic regression, batch 100,
100 epochs, two CPU cores) fit took 25.9 s, of which 2.4 s were steps. Where the user
leaves the rhythm to fit (``eval_every=None``), the evaluations between the first and the
last are therefore planned to cost about a tenth of the steps they follow: fewer draws
(at least two, for a standard error), and where two draws of every datum still cost
more, after the first and every ``k``-th segment only (the first checks early that the
ELBO is finite); where fewer draws would save at most half of each evaluation, they
keep all of them (up to a fifth of the steps: a second program would cost about as
much to compile). The last evaluation, which gives the run's ELBO and
the PSIS k-hat, always has ``elbo_samples`` draws. The evaluations before the last may
take :data:`CHEAP_EVALUATIONS` data-draws between them whatever the run (tens of
milliseconds), so a short run on small data evaluates every segment in full.

The plan depends on the run's sizes only (not on timings), so a resumed run evaluates
where the uninterrupted one does.
"""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_EVALUATIONS = 100
"""At most this many ELBO evaluations in a :func:`dsgrad.fit` run without ``eval_every``.

One every epoch is the natural rhythm of a short run, but an evaluation (a full pass with
``elbo_samples`` draws) can cost more than an epoch of steps: on 569 data at batch 5 one
took 0.7 ms against 0.37 ms for the epoch's 113 steps, and a 1.5-million-step run spent
28 s in fit for 4.8 s of steps. Counted from step 0 (not from ``start_step``), so a
resumed run has the segments of an uninterrupted one."""

CHEAP_EVALUATIONS = 1_000_000
"""Data-draws (``draws x N``, summed) that the evaluations before a run's last may take
whatever the run: 10-40 ms on two CPU cores for a GLM."""

EVALUATION_SHARE = 0.1
"""What the evaluations between a run's first and last segment may cost, as a fraction
of the steps they follow."""

DRAWS_PER_STEP_DATUM = 2
"""Data-draws of an evaluation (a forward pass) that cost about as much as one datum of a
training step (a gradient, the optimizer's update and the step's fixed cost), the least
measured on two CPU cores: 6-12 for logistic regression (a step of batch 100 costs about
6 us), 2.2 for a Student-t regression written in NumPyro (9 us a step, 40 ns a datum-draw
of its ELBO)."""


def default_eval_every(num_data: int, batch_size: int, num_steps: int) -> int:
  """:func:`dsgrad.fit`'s steps per segment when ``eval_every`` is not given: one epoch,
  or ``num_steps / DEFAULT_EVALUATIONS`` (rounded up) where that is longer."""
  return max(1, num_data // batch_size, -(-num_steps // DEFAULT_EVALUATIONS))


class EvaluationPlan(NamedTuple):
  """A run's segments and evaluations.

  Attributes:
    eval_every: steps per segment; segments end on its multiples counted from step 0.
    every_segments: segments between evaluations (``k``).
    draws: Monte Carlo draws of the evaluations before the last.
    last_draws: draws of the last evaluation (``elbo_samples``).
  """

  eval_every: int
  every_segments: int
  draws: int
  last_draws: int

  def evaluates(self, step: int, num_steps: int) -> bool:
    """Whether the segment that ends at ``step`` is followed by an evaluation: the first
    (an early check that the ELBO is finite, and a first value on the progress bar),
    every ``every_segments``-th and the last."""
    return step in (num_steps, self.eval_every) or (
        step % self.eval_every == 0 and (step // self.eval_every) % self.every_segments == 0)

  def draws_at(self, step: int, num_steps: int) -> int:
    """The Monte Carlo draws of the evaluation after ``step``."""
    return self.last_draws if step == num_steps else self.draws


def plan(num_data: int, batch_size: int, num_steps: int, eval_every: int | None,
         elbo_samples: int) -> EvaluationPlan:
  """The plan of a :func:`dsgrad.fit` call: ``eval_every`` as given (every segment
  evaluated with ``elbo_samples`` draws), or else the default segments with the
  evaluations before the last priced at :data:`EVALUATION_SHARE` of their steps.

  Args:
    num_data: ``N``.
    batch_size: ``B``.
    num_steps: the run's steps, counted from 0.
    eval_every: fit's argument (``None``: planned here).
    elbo_samples: fit's argument: the last evaluation's draws (0: no evaluation).

  Returns:
    An :class:`EvaluationPlan`.

  Example::

    >>> from dsgrad.training.evaluation_plan import plan
    >>> plan(200_000, 100, 200_000, None, 100)  # two draws every tenth epoch
    EvaluationPlan(eval_every=2000, every_segments=10, draws=2, last_draws=100)
    >>> plan(1_000, 10, 20_000, None, 100)  # ten draws a segment
    EvaluationPlan(eval_every=200, every_segments=1, draws=10, last_draws=100)
    >>> plan(20_000, 100, 6_000_000, None, 100)  # 100 draws would save under half
    EvaluationPlan(eval_every=60000, every_segments=1, draws=100, last_draws=100)
    >>> plan(50, 5, 30, None, 100)  # cheap evaluations: in full
    EvaluationPlan(eval_every=10, every_segments=1, draws=100, last_draws=100)
  """
  if eval_every is not None or elbo_samples == 0:
    every = eval_every or default_eval_every(num_data, batch_size, num_steps)
    return EvaluationPlan(every, 1, elbo_samples, elbo_samples)
  every = default_eval_every(num_data, batch_size, num_steps)
  before_last = max(1, -(-num_steps // every) - 1)
  allowance = max(CHEAP_EVALUATIONS / before_last,
                  EVALUATION_SHARE * DRAWS_PER_STEP_DATUM * every * batch_size)
  draws = min(elbo_samples, int(allowance // num_data))
  if 2 * draws >= elbo_samples:
    # At most half of each evaluation to save, of the order of what compiling a second
    # program costs (a NumPyro Student-t regression: 1.2 s to compile, 36 ms a 100-draw
    # evaluation of 20,000 data, so 99 halves save 1.8 s).
    return EvaluationPlan(every, 1, elbo_samples, elbo_samples)
  if draws >= 2:
    return EvaluationPlan(every, 1, draws, elbo_samples)
  return EvaluationPlan(every, -(-2 * num_data // int(allowance)), 2, elbo_samples)
