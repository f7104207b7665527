"""Which estimator for this model? Measured on the user's own objective, in seconds.

What decides the choice is not the memory footprint alone but expected progress per
second: an estimator whose gradients have variance ``V`` and cost ``t`` seconds per step
makes, at a step size tuned for it, progress that scales with ``1 / (V t)`` in the
variance-dominated regime of SGD (halving the variance is worth as much as halving the
step's cost). :func:`recommend` runs about one epoch of naive steps from the user's
parameters (past the first transient, where nothing is representative) and half an epoch
more, in :func:`dsgrad.fit`'s compiled segments, and measures there

* the variance decomposition (``V_n`` from subsampling, ``V_eps`` from Monte Carlo noise,
  :func:`dsgrad.variance_decomposition`), which says which control variate can help;
* each candidate's gradient variance with a *fresh* state and with a *half-epoch-old*
  state (built at the parameters half an epoch earlier: the average age of a joint SAGA
  row, or of an SVRG snapshot refreshed every epoch), since in training a table or
  snapshot is always somewhat stale. The variance is taken at the control-variate weight
  that the default ``control_weight="adaptive"`` settles on (per parameter leaf, fitted
  to the same draws), which is what training with the default gets; the paper's ``c = 1``
  is reported beside it;
* each candidate's time per step (the user's update rule after it, steps in one
  compiled ``lax.scan``) and its state's memory;

and ranks the candidates by ``V_stale x seconds per step`` (lower is better), with the
reasons in plain words. Naive wins when no control variate pays for its cost; the advice
then is to stay with naive and a decaying step size.

Example::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> advice = dsgrad.recommend(objective, dsgrad.meanfield_init(model), jax.random.key(1),
    ...                           batch_size=10, candidates=("naive", "cv"), num_draws=16,
    ...                           timing_steps=5)
    >>> advice.best in {"naive", "cv"}, len(advice.ranking)
    (True, 2)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsgrad import checks
from dsgrad import diagnostics
from dsgrad import estimators
from dsgrad import segments
from dsgrad.objective import Objective

CANDIDATES = ("naive", "cv", "joint_svrg", "joint_saga")

DECOMPOSITION_DATA = 2048
"""The most data whose per-datum gradients enter the ``V_n`` estimate (a uniform sample
without replacement beyond it), and the scale of the full passes for ``V_eps``: a model
with many latent variables and many data would otherwise spend minutes on dense
per-datum gradients that only set the words of the advice."""


class Candidate(NamedTuple):
  """One estimator's measurements.

  Attributes:
    name: ``"naive"``, ``"cv"``, ``"joint_svrg"`` or ``"joint_saga"``.
    variance_fresh: trace of the gradient covariance with a state made at ``params``, at
      the control-variate weight the default adaptive rule settles on (per parameter
      leaf, ``c* = -tr Cov(g, control) / tr V[control]`` clipped to ``[0, 1]``, from the
      same draws).
    variance_stale: the same with a state made half an epoch earlier (equal to the fresh
      one for stateless estimators).
    variance_unweighted: ``(fresh, stale)`` at the paper's weight ``c = 1``.
    seconds_per_step: time of one step with Adam, in a compiled ``lax.scan``.
    state_bytes: memory of the estimator's state.
    score: ``variance_stale * seconds_per_step``, relative to naive's (lower is better;
      ``inf`` when the candidate cannot run, e.g. its table does not fit).
    note: why it cannot run, when it cannot.
  """

  name: str
  variance_fresh: float
  variance_stale: float
  seconds_per_step: float
  state_bytes: int
  score: float
  note: str = ""
  variance_unweighted: tuple = (np.nan, np.nan)


class Recommendation(NamedTuple):
  """What :func:`recommend` returns.

  Attributes:
    best: the name of the top-ranked estimator.
    ranking: the :class:`Candidate` s, best first.
    reasons: the reasons, in plain words, one per line.
    decomposition: :func:`dsgrad.variance_decomposition` where the variances were
      measured.
  """

  best: str
  ranking: tuple
  reasons: tuple
  decomposition: dict

  def __str__(self) -> str:
    lines = [f"recommended: {self.best}"] + [f"  {r}" for r in self.reasons]
    return "\n".join(lines)


def _make(name: str, objective: Objective, approx, every: int, max_table_bytes):
  if name == "naive":
    return estimators.naive(value_checks=False)
  off = dict(value_checks=False)
  if name == "cv":
    return estimators.cv(objective, approx, **off)
  if name == "joint_svrg":
    return estimators.joint_svrg(objective, approx, every=every, **off)
  return estimators.joint_saga(objective, approx, max_table_bytes=max_table_bytes,
                               **off)


def _weighted_variance(naive_draws, draws, leaf_sizes) -> float:
  """``tr V[g + c* control]`` with ``control = draws - naive_draws`` (paired draws made at
  weight 1) and, per leaf, the variance-minimizing ``c*`` clipped to ``[0, 1]``: what
  ``control_weight="adaptive"`` converges to."""
  g = np.asarray(naive_draws, np.float64)
  control = np.asarray(draws, np.float64) - g
  out, start = g.copy(), 0
  for size in leaf_sizes:
    leaf = slice(start, start + size)
    start += size
    gc = g[:, leaf] - g[:, leaf].mean(0)
    cc = control[:, leaf] - control[:, leaf].mean(0)
    v = float(np.sum(cc * cc))
    weight = 0.0 if v == 0 else float(np.clip(-np.sum(gc * cc) / v, 0.0, 1.0))
    out[:, leaf] += weight * control[:, leaf]
  return diagnostics.total_variance(out)[0]


def _copy(tree):
  """A strongly typed copy: the segments donate their carry."""
  return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.asarray(x).dtype), tree)


def _seconds_per_step(objective, estimator, rule, params, key, batch_size, steps) -> float:
  """Median over three timed runs of ``steps`` steps, in :func:`dsgrad.fit`'s compiled
  segments (a first run compiles and is not counted)."""
  optimizer = optax.with_extra_args_support(optax.chain(estimator, rule))
  runner = segments.SegmentRunner(objective, optimizer, batch_size, key)
  state = optimizer.init(params)
  times = []
  for round_ in range(4):
    before = runner.step_seconds
    runner.run(_copy(params), _copy(state), 0, steps)
    if round_:
      times.append(runner.step_seconds - before)
  return float(np.median(times)) / steps


def _half_an_epoch_apart(objective, params, key, batch_size, rule):
  """``(earlier, now)``: the parameters after about one epoch of naive steps of ``rule``
  from ``params`` (past the first transient; two half epochs), and half an epoch later:
  a state made at ``earlier`` is as old at ``now`` as a joint SAGA row or an SVRG
  snapshot refreshed every epoch is on average."""
  half = max(1, objective.num_data // batch_size // 2)
  optimizer = optax.with_extra_args_support(rule)
  runner = segments.SegmentRunner(objective, optimizer, batch_size, key)
  params = _copy(params)
  carry = (params, optimizer.init(params))
  for start in (0, half):
    carry = runner.run(*carry, start, half)
  earlier = _copy(carry[0])
  return earlier, runner.run(*carry, 2 * half, half)[0]


def _reasons(ranking, decomposition, naive) -> list:
  v_n, v_eps = decomposition["V_n"], decomposition["V_eps"]
  share = v_n / max(v_n + v_eps, 1e-300)
  lines = [f"subsampling variance V_n {v_n:.3g}, Monte Carlo noise variance V_eps "
           f"{v_eps:.3g} ({100 * share:.0f}% / {100 * (1 - share):.0f}% of their sum): cv "
           "can remove only the noise part, the joint estimators both."]
  for c in ranking:
    if c.note:
      lines.append(f"{c.name}: not an option here ({c.note}).")
      continue
    cost = c.seconds_per_step / naive.seconds_per_step
    variance = (f"variance {c.variance_stale / naive.variance_stale:.3g}x naive's with a "
                f"half-epoch-old state, {c.variance_fresh / naive.variance_fresh:.3g}x fresh")
    if c.name != "naive":
      variance += (f", at the adaptive weight (at the paper's c = 1: "
                   f"{c.variance_unweighted[1] / naive.variance_stale:.3g}x stale)")
    lines.append(f"{c.name}: {variance}; step {cost:.2f}x naive's, state "
                 f"{c.state_bytes / 2**20:.3g} MiB: {1 / c.score:.2f}x naive's progress per "
                 "second.")
  if ranking[0].name == "naive":
    lines.append("no control variate pays for its cost here: stay with naive and a decaying "
                 "step size (e.g. optax.cosine_decay_schedule), tuned.")
  return lines


@checks.arguments(key=checks.prng_key(), batch_size=checks.count(1),
                  num_draws=checks.count(2), timing_steps=checks.count(1),
                  max_table_bytes=checks.byte_budget())
def recommend(objective: Objective, params, key, *, batch_size: int, approx=None,
              candidates=CANDIDATES, num_draws: int = 200, timing_steps: int = 50,
              update_rule: optax.GradientTransformation | None = None,
              max_table_bytes: int | str | None = "auto") -> Recommendation:
  """Ranks gradient estimators for ``objective`` by expected progress per second.

  Args:
    objective: the user's objective, with its data.
    params: where training starts (e.g. the initial parameters, or a checkpoint's); the
      measurements are taken about one and a half epochs of naive steps later.
    key: PRNG key; the measurement is a deterministic function of it (timings aside).
    batch_size: the batch size training will use.
    approx: the approximation for ``cv`` and the joint estimators (default
      :func:`dsgrad.approx.linearize`).
    candidates: names among ``("naive", "cv", "joint_svrg", "joint_saga")``.
    num_draws: gradient draws per variance estimate (the full passes for ``V_eps``
      are fewer when ``N`` exceeds :data:`DECOMPOSITION_DATA`: at least 20).
    timing_steps: steps per timed run.
    update_rule: the optax rule chained after the estimator in training (default
      ``optax.adam(1e-2)``): it is timed with each estimator and runs the naive steps
      that lead to the measured parameters.
    max_table_bytes: joint SAGA's table limit (:func:`dsgrad.joint_saga`); a table
      that does not fit rules it out, with the reason.

  Returns:
    A :class:`Recommendation`; ``str()`` of it reads as advice.

  Raises:
    ValueError: on an unknown candidate, a candidate list without ``"naive"`` (the
      reference), or counts that are not positive integers.

  References:
    Wang, Geffner, Domke (2024), Sec. 3 and Table 1 (the variance decomposition).
  """
  unknown = set(candidates) - set(CANDIDATES)
  if unknown or "naive" not in candidates:
    raise ValueError(f"candidates must include 'naive' and be among {CANDIDATES}, got "
                     f"{tuple(candidates)}")
  checks.check_batch_size(batch_size, objective.num_data)
  rule = optax.adam(1e-2) if update_rule is None else update_rule
  k_dec, k_epoch, k_fresh, k_stale, k_time = jax.random.split(key, 5)
  earlier, now = _half_an_epoch_apart(objective, params, k_epoch, batch_size, rule)
  n = objective.num_data
  decomposition = diagnostics.variance_decomposition(
      objective, now, k_dec, batch_size, num_draws=num_draws,
      full_draws=min(num_draws, max(20, num_draws * DECOMPOSITION_DATA // n)),
      num_data_sampled=min(n, DECOMPOSITION_DATA))
  every = max(1, n // batch_size)
  rows = []
  leaf_sizes = [int(np.size(leaf)) for leaf in jax.tree.leaves(now)]
  # naive first: the others' weights are fitted against its draws.
  for name in sorted(candidates, key=lambda c: c != "naive"):
    try:
      estimator = _make(name, objective, approx, every, max_table_bytes)
      fresh_state = estimator.init(now)
      stateless = name in ("naive", "cv")
      stale_state = None if stateless else estimator.init(earlier)
    except MemoryError as error:
      rows.append(Candidate(name, np.inf, np.inf, np.inf, 0, np.inf,
                            str(error).split(". ")[0]))
      continue
    pairing = "fresh" if stateless else "stale"  # the draws the stale state's pair with
    fresh_draws = diagnostics.estimator_samples(estimator, fresh_state, now, objective,
                                                k_fresh, num_draws, batch_size)
    stale_draws = fresh_draws if stateless else diagnostics.estimator_samples(
        estimator, stale_state, now, objective, k_stale, num_draws, batch_size)
    if name == "naive":
      naive_draws, naive_at = {"fresh": fresh_draws}, (estimator, fresh_state)
      unweighted = (diagnostics.total_variance(fresh_draws)[0],) * 2
      fresh = stale = unweighted[0]
    else:
      # The same keys draw the same batches and noise: the draws pair with naive's. Naive's
      # draws at the stale key are made once, for the first stateful candidate.
      if pairing not in naive_draws:
        naive_draws[pairing] = diagnostics.estimator_samples(
            *naive_at, now, objective, k_stale, num_draws, batch_size)
      unweighted = (diagnostics.total_variance(fresh_draws)[0],
                    diagnostics.total_variance(stale_draws)[0])
      fresh = _weighted_variance(naive_draws["fresh"], fresh_draws, leaf_sizes)
      stale = _weighted_variance(naive_draws[pairing], stale_draws, leaf_sizes)
    seconds = _seconds_per_step(objective, estimator, rule, now, k_time, batch_size,
                                timing_steps)
    rows.append(Candidate(name, fresh, stale, seconds, diagnostics.state_bytes(fresh_state),
                          0.0, variance_unweighted=unweighted))
  naive = next(r for r in rows if r.name == "naive")
  reference = naive.variance_stale * naive.seconds_per_step
  rows = [r._replace(score=r.variance_stale * r.seconds_per_step / reference)
          if not r.note else r for r in rows]
  ranking = tuple(sorted(rows, key=lambda r: r.score))
  return Recommendation(ranking[0].name, ranking,
                        tuple(_reasons(ranking, decomposition, naive)), decomposition)
