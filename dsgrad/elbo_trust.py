"""Whether an ELBO estimate or trace can be believed.

An ELBO estimate is a Monte Carlo mean, and a run's trace a sequence of them: a numerical
failure (an ill-conditioned scale matrix, an overflow) or a step size too large can turn
both into numbers that read as progress. Two facts catch most of it: no ELBO exceeds the
log evidence, so it exceeds no upper bound on it that the model knows
(:attr:`dsgrad.models.Model.log_evidence_bound`: 0 for discrete data); and a run that
improves from a poor start shrinks ``|ELBO|``, while one that diverges grows it by orders
of magnitude. :func:`dsgrad.fit` reports what these checks find in its result's
``warnings``, :func:`dsgrad.elbo` as an :class:`ELBOWarning`; where a step turns
non-finite, :func:`note_divergence` says whether the run diverged or which data (or
which draw) are at fault.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.objective import Objective


class ELBOWarning(RuntimeWarning):
  """An ELBO estimate that cannot be right, or a trace that diverges
  (:func:`elbo_trace_warnings`)."""


# How far apart, in orders of magnitude, two successive ELBO evaluations may be before the
# trace counts as diverging: a run improving from a poor start shrinks |ELBO|; growing
# a thousandfold between two evaluations is a step size or a numerical failure.
JUMP_FACTOR = 1e3


def _above_bound(value: float, se: float, bound: float | None, where: str) -> str | None:
  """A sentence when the ELBO estimate ``value`` is more than three standard errors above
  ``bound`` (an upper bound on the log evidence), else ``None``."""
  if bound is None or not np.isfinite(value) or value - 3 * se <= bound:
    return None
  return (f"the ELBO estimate {value:.6g} (se {se:.2g}) {where} is above {bound:.6g}, an "
          "upper bound on the model's log evidence (Model.log_evidence_bound): no ELBO can "
          "exceed it, so the estimate is a numerical failure (an ill-conditioned scale, an "
          "overflow), not progress")


@checks.arguments(bound=checks.optional(checks.real()),
                  num_data=checks.optional(checks.count(1)))
def elbo_trace_warnings(history, bound: float | None = None, num_data: int | None = None,
                        start=None) -> tuple[str, ...]:
  """What makes an ELBO trace untrustworthy, one sentence each (empty when nothing does).

  Four checks on a :class:`dsgrad.History`:

  * an estimate more than three standard errors above ``bound``, an upper bound on the
    log evidence (``objective.log_evidence_bound``);
  * two successive finite estimates whose magnitudes differ by :data:`JUMP_FACTOR` or
    more, upward (|ELBO| growing): the run diverges, whether the values fall or rise;
  * where that finds nothing and ``num_data`` is given, an estimate whose magnitude is
    :data:`JUMP_FACTOR` times an earlier one's and ``num_data``'s (one nat per datum):
    a run diverging over many evaluations, or an ELBO without bound (a log density whose
    sign is flipped climbs through 10^19 by steps of 2-10x);
  * a last estimate below the run's best by more than ten combined standard errors and
    10% of the best's magnitude: the run moved away from its best point.

  Args:
    history: the trace (``step``, ``elbo``, ``elbo_se``).
    bound: upper bound on the log evidence, or ``None``.
    num_data: the model's number of data, or ``None``.
    start: ``(step, ELBO)`` where the run began, the ELBO a number or a function that
      returns it, or ``None``. Asked for only where the first estimate is already beyond
      :data:`JUMP_FACTOR` nats a datum (a run that diverged before its first
      evaluation, which no later estimate can show); it then heads the trace.

  Returns:
    A tuple of messages, naming steps and values.
  """
  steps = np.asarray(history.step)
  values = np.asarray(history.elbo, np.float64)
  errors = np.asarray(history.elbo_se, np.float64)
  found = np.isfinite(values)
  steps, values, errors = steps[found], values[found], errors[found]
  if start is not None and len(values) and abs(values[0]) >= JUMP_FACTOR * max(num_data or 1, 1):
    began = _finite_or_none(start[1])
    if began is not None:
      steps, values = np.insert(steps, 0, start[0]), np.insert(values, 0, began)
      errors = np.insert(errors, 0, 0.0)
  out = []
  for step, value, se in zip(steps, values, errors):
    message = _above_bound(value, se, bound, f"after step {int(step)}")
    if message is not None:
      out.append(message)
      break
  for k in range(1, len(values)):
    before, after = abs(values[k - 1]), abs(values[k])
    if after >= JUMP_FACTOR * max(before, 1.0):
      out.append(f"the ELBO went from {values[k - 1]:.6g} to {values[k]:.6g} between steps "
                 f"{int(steps[k - 1])} and {int(steps[k])}, {np.log10(after / max(before, 1.0)):.0f} "
                 "orders of magnitude: the run is diverging, not improving; lower the step "
                 "size (or check the family's scale for overflow)")
      break
  else:
    grown = _grown_without_bound(steps, values, num_data)
    if grown is not None:
      out.append(grown)
  if len(values) >= 2:
    best = int(np.argmax(values))
    drop = values[best] - values[-1]
    if drop > max(10 * (errors[best] + errors[-1]), 0.1 * abs(values[best])):
      out.append(f"the ELBO ended at {values[-1]:.6g}, {drop:.4g} below its best "
                 f"{values[best]:.6g} (step {int(steps[best])}): the run moved away from its "
                 "best point; lower the step size or let it decay (e.g. "
                 "optax.cosine_decay_schedule)")
  return tuple(out)


def _finite_or_none(value) -> float | None:
  """``value`` (or what it returns, when a function) where finite, else ``None``."""
  try:
    value = float(value() if callable(value) else value)
  except ValueError:  # an ELBO not finite at the start: nothing to compare with
    return None
  return value if np.isfinite(value) else None


def run_warnings(objective, history, start_params, key, start_step: int = 0) -> tuple[str, ...]:
  """:func:`elbo_trace_warnings` of a run of ``objective`` from ``start_params`` at
  ``start_step``: its ELBO there is estimated only where the trace's first estimate is
  already suspect, and roughly (4 draws on 4,096 rows: orders of magnitude are compared)."""
  from dsgrad import elbo_estimates  # it imports this module

  at_start = lambda: elbo_estimates.elbo_unchecked(
      objective, start_params, key, 4, num_data_sampled=min(objective.num_data, 4096))[0]
  return elbo_trace_warnings(history, objective.log_evidence_bound, objective.num_data,
                             start=(start_step, at_start))


def _grown_without_bound(steps, values, num_data: int | None) -> str | None:
  """A sentence where a finite ELBO estimate's magnitude is :data:`JUMP_FACTOR` times
  both an earlier estimate's and ``num_data``: a proper model's ELBO is bounded by its
  log evidence and a run from a poor start shrinks ``|ELBO|``, while the floor of one
  nat per datum spares a trace that passes near zero on its way to a large ELBO."""
  if num_data is None or len(values) < 2:
    return None
  smallest = np.minimum.accumulate(np.abs(values))[:-1]
  ratio = np.abs(values[1:]) / np.maximum(smallest, float(num_data))
  if not np.any(ratio >= JUMP_FACTOR):
    return None
  k = int(np.argmax(ratio >= JUMP_FACTOR)) + 1
  j = int(np.argmin(np.abs(values[:k])))
  return (f"the ELBO went from {values[j]:.6g} (step {int(steps[j])}) to {values[k]:.6g} "
          f"(step {int(steps[k])}), {np.log10(ratio[k - 1]):.0f} orders of magnitude beyond "
          f"it and one nat per datum (N = {num_data:,}): a proper model's ELBO is bounded by "
          "its log evidence, so the run diverges or the log density has no upper bound (a "
          "log_lik or log_prior whose sign is flipped, +0.5 (y - mu)^2 for -0.5 (y - mu)^2); "
          "check the signs, then lower the step size")


def warn_above_bound(value: float, se: float, bound: float | None, where: str) -> None:
  """Issues an :class:`ELBOWarning` when ``value`` is above ``bound`` beyond Monte Carlo
  error (three standard errors)."""
  message = _above_bound(value, se, bound, where)
  if message is not None:
    checks.warn_at_caller(message, ELBOWarning)


def note_divergence(error: Exception, objective, start_params, key, steps_run: int) -> None:
  """Adds a note to ``error`` (a non-finite step or ELBO that :func:`dsgrad.fit` met after
  ``steps_run`` steps) saying that the run diverged, where it did: where the failing
  step's rows (without them, the ELBO) are finite at the run's ``start_params``. Its own
  message names the usual causes of a model that is non-finite from the start (a datum
  the likelihood deems impossible, an overflow), which mislead here: a run that was
  finite and turns non-finite part-way has most often diverged. Where ``error`` holds the
  failing step's batch (``indices``), its rows whose term or gradient is not finite at
  ``start_params`` are named instead (:func:`rows_not_finite`)."""
  from dsgrad import elbo_estimates  # it imports this module

  batch, step_key = getattr(error, "indices", None), getattr(error, "noise_key", None)
  rows = None if batch is None else rows_not_finite(
      objective, start_params, batch, key if step_key is None else step_key)
  if rows:  # rows the model deems impossible at any params: the run need not have diverged
    error.add_note(rows)
    return
  if steps_run <= 0:
    return
  # The batch's rows finite at the start settle it; else a full ELBO, a pass over all the
  # data (seconds on 10^6 rows) that an error path cannot afford wherever it may be spared.
  where = "where each of the failing step's rows has a finite term and gradient"
  if rows is None:
    try:
      start, _ = elbo_estimates.elbo_unchecked(objective, start_params, key, num_samples=16)
    except elbo_estimates.NonFiniteELBO:
      return  # not finite at the start either: the message's causes are the ones to check
    where = f"whose ELBO is finite ({start:.6g})"
  error.add_note(
      f"dsgrad.fit ran {steps_run:,} steps before this, from params {where}: a run that "
      "turns non-finite part-way has most likely diverged. The "
      "first suspect is the update rule's step size, too large for this model (the ELBO's "
      f"gradient sums over the N = {objective.num_data:,} data, so its scale, and the rate "
      "that suits it, changes with N and the data's units): retry with one 3 to 10 times "
      "smaller or a decaying schedule (optax.cosine_decay_schedule); checkpoint_path keeps "
      "a long run's last good state.")


def rows_not_finite(objective: Objective, params, indices, key,
                    shown: int = 5) -> str | None:
  """A sentence naming the rows among ``indices`` (one step's batch) whose term, or its
  gradient, is not finite at ``params``, each row alone at one noise draw of ``key`` (the
  failing step's own, where the noise is one draw for the batch), or blaming that draw
  where every row's term fails at it and not at others; "" where every row's term and
  gradient are finite; ``None`` where they cannot be taken one at a time. The step's own
  error cannot say which datum: its update sums the batch, so one row's NaN or inf reaches
  every coordinate. One pass of per-row gradients over the batch (up to 16 rows at a time, at
  most 2^26 gradient numbers), on the error path only."""
  noise = objective.sample_noise(key, 1)
  at_once = max(1, min(16, 2 ** 26 // max(1, sum(np.size(x) for x in jax.tree.leaves(params)))))

  def row(o, p, index):
    value, grad = jax.value_and_grad(
        lambda q: o.loss(q, index[None], noise, validate=False)[0])(p)
    return jnp.isfinite(value), checks.all_finite(grad)

  rows = np.asarray(indices).reshape(-1)
  try:
    finite_value, finite_grad = map(np.asarray, jax.jit(
        lambda o, p, i: jax.lax.map(lambda n: row(o, p, n), i, batch_size=at_once))(
            objective, params, jnp.asarray(rows, jnp.int32)))
  except Exception:  # noqa: BLE001  (a diagnosis that fails must not hide the step's error)
    return None
  bad_value, bad_grad = rows[~finite_value], rows[finite_value & ~finite_grad]
  if rows.size > 1 and bad_value.size == rows.size and _finite_at_another_draw(
      objective, params, rows[0], key):  # one draw of z serves the whole batch
    return ("Of the failing step's batch, at the run's starting params, every row's term is "
            "not finite at one draw: the draw, not the data, is at fault: the latent it "
            "gives sends the likelihood out of range (an exp of a large value; a "
            "variational scale too wide at the start), or an annealed bound's chain "
            "diverges (dsgrad.annealing: step sizes too large for its mass; its elbo says "
            "which).")
  name = lambda found: ("data row " if found.size == 1 else "data rows ") + ", ".join(
      f"{n:,}" for n in found[:shown]) + (
      f" and {found.size - shown:,} more" if found.size > shown else "")
  said = []
  if bad_value.size:
    said.append(f"{name(bad_value)}: a term that is not finite there: check the values "
                "and what the likelihood does with them (log of 0 or of a negative number, "
                "a value outside its support)")
  if bad_grad.size:
    said.append(f"{name(bad_grad)}: a finite term whose gradient is not: the likelihood "
                "is at an edge of its domain there (the derivative of log or sqrt at 0, "
                "of x ** k at x = 0), or a jnp.where masks a branch that is not finite "
                "there, whose gradient is NaN all the same: mask its input too, "
                "jnp.where(t > 0, jnp.log(jnp.where(t > 0, t, 1.0)), 0.0)")
  return ("Of the failing step's batch, at the run's starting params, " + "; ".join(said)
          + ".") if said else ""


def _finite_at_another_draw(objective: Objective, params, row: int, key,
                            draws: int = 4) -> bool:
  """Whether datum ``row``'s term is finite at any of ``draws`` other noise draws: then a
  batch whose every term was not finite at one draw was failed by that draw, not by its
  data."""
  term = jax.jit(lambda o, p, n: o.loss(p, jnp.asarray([row], jnp.int32), n,
                                        validate=False)[0])
  return any(bool(jnp.isfinite(term(objective, params, objective.sample_noise(
      jax.random.fold_in(key, k), 1)))) for k in range(1, draws + 1))
