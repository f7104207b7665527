"""Does ``dsgrad.recommend``'s advice hold? Held-out models, equal wall-clock, full runs.

Three models written here, outside dsgrad's catalogue (a hierarchical logistic regression
with 1,000 groups, a robust Student-t regression, a small MLP likelihood). For each, on
each reported seed:

1. the baseline users really run: a hand-written optax loop (``lax.scan``, Adam with a
   cosine schedule) whose peak rate is tuned on a seed that is not reported; its time
   for ``T`` steps is the wall-clock budget;
2. ``dsgrad.recommend`` with that tuned schedule as the user's optimizer and that budget,
   every candidate (the control variates, the path derivative, RQMC, and the equal-cost
   baselines: naive with ``K`` samples, naive with a ``K``-times batch);
3. every raced candidate's run continued to the end of its budget
   (``Recommendation.fit(name)``), so each full run, race included, spends the budget;
   and every candidate that call did not race (at a 10% share of a small budget, most
   cannot be compiled in time) from a second call given the whole budget as its share,
   each continued the same way, so that "the best contender" is over every candidate at
   equal wall-clock, not only over those the pick's call could afford (``--no-reference``
   skips them: they cost about one budget each);
4. the ELBO each reaches (one estimate with common random numbers), and whether the pick
   is the best dsgrad contender and beats the hand-written loop.

Also measured: the same steps timed twice (does the timing agree within 10%?), each noise
control's gradient variance per step at the baseline's final parameters, and the
prediction check: the race's time ratio for the pick against the full runs' (traced with
one noise key), and against the pick run again with its schedule over fractions of the
budget (:func:`_shorter_budgets`).
"""

from __future__ import annotations

import argparse
import functools
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from benchmarks import _report
from benchmarks.fit_overhead import _hierarchical, _mlp, _student_t, bbvi_loss, epoch_batches
from dsgrad.advice import admission
from dsgrad.advice import recommend as advice_lib
from dsgrad.advice import race as race_lib


MODELS = {
    "hierarchical": lambda key: _hierarchical(key, num_data=20_000),
    "student_t": _student_t,
    "mlp": lambda key: _mlp(key, num_data=10_000),
    "hierarchical_large": lambda key: _hierarchical(key, num_data=1_000_000, groups=10_000),
}
PEAKS = (3e-3, 1e-2, 3e-2)
MODEL_PEAKS = {"hierarchical_large": (1e-3, 3e-3, 1e-2)}
"""Peak grids other than :data:`PEAKS`: on the large hierarchical model the best of
:data:`PEAKS` was its smallest (at T = 250,000), so its grid reaches one step lower."""
STEPS = {"hierarchical": 100_000, "student_t": 300_000, "mlp": 60_000,
         "hierarchical_large": 600_000}
"""Each model's ``T``: a few seconds of the hand-written loop on a 2-core CPU; for the
large hierarchical model (10^6 data, 10,000 groups), about two minutes. That model is for
minute budgets that have not converged: at the minute scale's step counts the other two
end level with runs of a quarter of their budgets, while on it naive over 250,000 steps
(56 s on an Intel Xeon) ended 124 ± 5 nats below naive over 1,000,000 steps. At 250,000
steps (52 s) recommend could compile nothing beside naive within its 10% share (about
1.3 s per program on two cores), so its budget is about two minutes."""
SCALES = {
    "small": {"models": ["hierarchical", "student_t", "mlp"], "steps": STEPS,
              "seeds": dict.fromkeys(MODELS, [0, 1, 2, 3]), "section": ""},
    "minute": {"models": ["hierarchical", "mlp", "hierarchical_large"],
               "steps": {"hierarchical": 3_000_000, "mlp": 2_500_000,
                         "hierarchical_large": STEPS["hierarchical_large"]},
               "seeds": {"hierarchical": [0], "mlp": [0, 1, 2], "hierarchical_large": [0]},
               "section": "minute"},
}
"""The two scales the page reports, each its own section: budgets of a few seconds (four
seeds: the best contender is the best on average), and budgets of a minute or more on two
CPU cores, where users need the advice (the MLP over three seeds: one MLP run's final ELBO
varies from seed to seed by tens of nats; the hierarchical models over one; the large one
has not converged at its budget, the other two have)."""
TRACE_POINTS = 40
"""ELBO estimates along each full run: the prediction check's resolution."""


def _cosine(peak):
  return lambda steps: optax.adam(optax.cosine_decay_schedule(peak, steps, 0.01))


def _hand_loop(model, peak, steps, batch_size, key, runs: int = 2):
  """The hand-written baseline: ``(params, seconds)`` after ``steps`` steps (compile
  excluded), batches from epoch permutations, one noise draw per step; the seconds are
  the fastest of ``runs`` runs (tuning needs the parameters only: one run)."""
  adam = _cosine(peak)(steps)
  loss = bbvi_loss(model)

  def step(carry, xs):
    params, opt_state = carry
    idx, k = xs
    grads = jax.grad(loss)(params, idx, jax.random.normal(k, params["loc"].shape))
    updates, opt_state = adam.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  kb, kn = jax.random.split(key)
  batches = epoch_batches(kb, model.num_data, batch_size, steps)
  keys = jax.random.split(kn, steps)
  # The batches are an argument, not a constant: at minute-scale budgets they are
  # hundreds of MB, which XLA would otherwise fold into the program for minutes.
  run = jax.jit(lambda p, s, xs: jax.lax.scan(step, (p, s), xs)[0])
  params = dsgrad.meanfield_init(model)
  run = run.lower(params, adam.init(params), (batches, keys)).compile()
  best = np.inf
  for _ in range(runs):  # the fastest run: the loop's time is the budget
    start = time.perf_counter()
    out = jax.block_until_ready(run(params, adam.init(params), (batches, keys)))
    best = min(best, time.perf_counter() - start)
  return out[0], best


def _elbo(objective, params, key, samples):
  """``(estimate, se, draws)``: the full-data ELBO's draws at ``params``; every call with
  the same ``key`` uses the same noise, so two runs' draws can be differenced pairwise."""
  draws = race_lib.elbo_draws(objective, params, key, samples)
  return (*dsgrad.diagnostics.mean_and_standard_error(draws), draws.tolist())


def _variances(objective, params, key, batch_size, k):
  """Gradient variance per step (trace) of naive and of the noise controls at ``params``."""
  variants = {"naive": objective, f"naive, {k} MC samples": dsgrad.multi_sample(objective, k),
              f"naive, {k} RQMC samples": dsgrad.multi_sample(objective, k, sampler="rqmc")}
  if objective.source is not None:
    variants["naive, path derivative"] = dsgrad.meanfield_gaussian(objective.source[1],
                                                                   path_derivative=True)
  naive = dsgrad.naive()
  out = {}
  for name, variant in variants.items():
    draws = dsgrad.estimator_samples(naive, naive.init(params), params, variant, key, 100,
                                     batch_size)
    out[name] = dsgrad.total_variance(draws)[0]
  return out


def _prediction_check(rows, pick):
  """The pick's time to reach naive's final ELBO relative to naive's whole run, in the
  full runs (from their ELBO traces), beside the race's ratio (to naive's race ELBO)."""
  if pick == "naive" or "trace" not in rows.get(pick, {}):
    return None
  naive_trace, pick_trace = rows["naive"]["trace"], rows[pick]["trace"]
  target, naive_time = naive_trace[-1][1], naive_trace[-1][0]
  return {"race_time_ratio": rows[pick]["race_time_ratio"],
          "full_run_time_ratio": race_lib.time_to_reach(pick_trace, target) / naive_time}


def _shorter_budgets(objective, advice, params, eval_key, elbo_samples, rows) -> dict:
  """The prediction check where users act on it: the race predicts that the pick needs
  ``r`` times naive's time to reach naive's ELBO. Under a schedule stretched over the
  budget a run's ELBO reaches its final value only as the schedule decays, so the full
  run's time to reach naive's final ELBO is near its own end whatever its pace; what
  the prediction means for a user is that the pick given ``r`` budgets ends where naive
  ends with one. The pick is run from the start with its schedule over ``x`` budgets,
  ``x`` = ``r/2``, ``r`` and ``2r`` (the full run stands for ``x >= 1``), and its final
  ELBO compared with naive's full run (paired, common random numbers): the prediction
  holds within 2x where the pick is behind at ``r/2`` and level or ahead at ``2r``
  (:func:`_budget_verdict`).

  Returns:
    ``{"ratio": r, "runs": [[x, pick - naive, se], ...], "naive_at_half": [r/2, naive
    over r/2 budgets - naive, se]}`` (the verdict is derived when rendered), or ``{}``
    where the race gives no finite ratio.
  """
  pick = advice.best
  ratio = rows[pick]["race_time_ratio"]
  if not np.isfinite(ratio) or ratio <= 0:
    return {}
  naive_draws = rows["naive"]["draws"]

  def shorter(name, x):  # name's final ELBO minus naive's full run's, over x budgets
    lane = advice.runs[name]
    short = lane.restarted(lane.make_optimizer, max(1, round(x * lane.total_steps)),
                           params, advice.key)
    short.advance_to(1.0)
    draws = race_lib.elbo_draws(objective, short.params, eval_key, elbo_samples)
    return [x, *race_lib.paired_difference(draws, naive_draws)]

  runs = [shorter(pick, x) if x < 1 else [1.0, *race_lib.paired_difference(
      rows[pick]["draws"], naive_draws)] for x in (ratio / 2, ratio, 2 * ratio)]
  # The control: naive itself over r/2 budgets. Where it too ends level with its whole
  # run, the task has converged before its budget and no estimator can gain there.
  control = shorter("naive", ratio / 2) if ratio < 2 else None
  return {"ratio": ratio, "runs": runs, "naive_at_half": control}


def _budget_verdict(runs, control=None) -> str:
  """Where the budget the pick needs to end level with naive lies against the race's
  ratio ``r``, from the runs at ``r/2``, ``r``, ``2r`` budgets and naive's own at
  ``r/2`` (``control``, if run): "behind" and "level" are by more, and by less, than 2
  paired standard errors."""
  (_, half, half_se), (_, _, _), (_, double, double_se) = runs
  if control is not None and control[1] >= -2 * control[2]:
    return ("cannot tell: naive over r/2 budgets also ends level with its whole run "
            f"({control[1]:+.2f} ({control[2]:.2f})), the task converges before its budget")
  if half >= -2 * half_se:
    return "at most r/2: the race overstated the time it needs"
  if double < -2 * double_se:
    return "more than 2r: the race understated the time it needs"
  return "between r/2 and 2r: within 2x"


def _timing_agreement(advice) -> float:
  """The largest relative disagreement between two timings of the same raced steps."""
  lanes = list(advice.runs.values())
  first, second = race_lib.time_steps(lanes), race_lib.time_steps(lanes)
  return float(max(abs(a - b) / min(a, b) for a, b in zip(first, second)))


def _race_rounds(advice) -> dict:
  """``{name: [[fraction, gain, se], ...]}``: each raced candidate's gain over naive at
  equal wall-clock at the end of every race round it took part in (the fraction of its
  run, and of the budget), paired as the race pairs it (:func:`dsgrad.advice.race.race`)."""
  naive = advice.runs["naive"].trace
  return {name: [[points[-1][0], *race_lib.checkpoint_difference(points, naive[r])]
                 for r, points in enumerate(lane.trace) if r > 0]
          for name, lane in advice.runs.items() if name != "naive" and lane.trace}


def run_model(name, seeds, steps, batch_size, tune_seed, elbo_samples, reference=True):
  model = MODELS[name](jax.random.key(12345))
  objective = dsgrad.meanfield_gaussian(model)
  eval_key = jax.random.key(999)
  tuning = {}
  bar = _report.progress(MODEL_PEAKS.get(name, PEAKS), f"{name}: tuning the hand loop's peak")
  for peak in bar:
    params, _ = _hand_loop(model, peak, steps, batch_size, jax.random.key(tune_seed), runs=1)
    tuning[peak] = _elbo(objective, params, eval_key, elbo_samples)[0]
    bar.set_postfix_str(f"peak {peak:g}: ELBO {tuning[peak]:.2f}")
  peak = max(tuning, key=tuning.get)
  print(f"{name}: tuned peak {peak} on seed {tune_seed}", flush=True)
  out = {"latent_dim": model.latent_dim, "num_data": model.num_data, "peak": peak,
         "tuning": {str(k): v for k, v in tuning.items()}, "seeds": {}}
  bar = _report.progress(seeds, f"{name}: seeds")
  for seed in bar:
    hand_params, budget = _hand_loop(model, peak, steps, batch_size, jax.random.key(seed))
    hand = _elbo(objective, hand_params, eval_key, elbo_samples)
    bar.set_postfix_str(f"seed {seed}: hand loop ELBO {hand[0]:.2f}, recommend racing")
    started = time.perf_counter()
    advice = dsgrad.recommend(objective, _cosine(peak), dsgrad.meanfield_init(model),
                              jax.random.key(seed), batch_size=batch_size, budget=budget,
                              progress=False)
    advice_seconds = time.perf_counter() - started
    # Before the full runs continue the raced lanes.
    race_rounds, reference_rounds = _race_rounds(advice), {}
    rows = {c.name: _full_run(objective, advice, c, eval_key, elbo_samples)
            for c in advice.ranking}
    if reference:
      # The candidates the pick's call could not afford to race, each run to its budget
      # all the same. Compiling them may cost more than a small budget: they are timed
      # outside any share (a first call given step costs compiles every lane; its lanes
      # are then timed as recommend times them), and a second call given those costs
      # races them all with the whole budget as its share; each lane is then continued.
      bar.set_postfix_str(f"seed {seed}: every candidate to its budget")
      guess = dict.fromkeys(rows, rows["naive"]["seconds_per_step"])
      call = functools.partial(dsgrad.recommend, objective, _cosine(peak),
                               dsgrad.meanfield_init(model), jax.random.key(seed),
                               batch_size=batch_size, budget=budget, progress=False)
      probe = call(step_costs=guess)
      measured = dict(zip(probe.runs, race_lib.time_steps(
          list(probe.runs.values()), step_guess=rows["naive"]["seconds_per_step"])))
      # Each cost relative to naive's in the same interleaved rounds, at naive's rate as
      # the pick's call timed it: this CPU changes speed within minutes, and costs timed
      # at another moment would give these candidates more or fewer steps than naive's.
      scale = rows["naive"]["seconds_per_step"] / measured["naive"]
      # The race starts where the pick's did (naive alone before it), so that every
      # candidate's run is naive's to there and its own after.
      everyone = call(step_costs={**guess, **{n: c * scale for n, c in measured.items()}},
                      share=1.0, start_at=_race_start(advice))
      reference_rounds = _race_rounds(everyone)
      for c in everyone.ranking:
        if rows[c.name]["note"] and not c.note:
          rows[c.name] = {**_full_run(objective, everyone, c, eval_key, elbo_samples),
                          "not_raced_by_pick": rows[c.name]["note"]}
    # The equal-cost K: what a raced control-variate step costs in naive steps (2 when
    # recommend raced none, e.g. when the budget could not pay for compiling them).
    k = admission.equal_cost_k(rows, {n: r["seconds_per_step"] for n, r in rows.items()
                                      if not r["note"]})
    out["seeds"][str(seed)] = {
        "prediction": _prediction_check(rows, advice.best),
        "shorter_budgets": (_shorter_budgets(objective, advice, dsgrad.meanfield_init(model),
                                             eval_key, elbo_samples, rows)
                            if advice.best != "naive" else {}),
        "budget_seconds": budget, "hand_elbo": hand[0], "hand_elbo_se": hand[1],
        "hand_draws": hand[2],
        "pick": advice.best, "advice_seconds": advice_seconds, "reasons": list(advice.reasons),
        "candidates": rows, "timing_disagreement": _timing_agreement(advice),
        "race_rounds": race_rounds, "reference_race_rounds": reference_rounds,
        "variance_per_step": _variances(objective, hand_params, jax.random.key(7), batch_size, k)}
    print(f"  seed {seed}: pick {advice.best}, hand {hand[0]:.2f}, " + ", ".join(
        f"{n} {r.get('elbo', float('nan')):.2f}" for n, r in rows.items()), flush=True)
  return out


def _advice_time_cell(s) -> str:
  """recommend's wall-clock time and its share of the budget; where its race started
  after naive's start (its reasons say where), the part of that time that trained naive's
  start, which every candidate's run, the pick's too, continues."""
  seconds, budget = s["advice_seconds"], s["budget_seconds"]
  cell = f"{seconds:.1f} s ({100 * seconds / budget:.0f}%)"
  found = [re.search(r"the race started at ([0-9.e+-]+)% of the budget", line)
           for line in s["reasons"]]
  start = next((float(m.group(1)) / 100 for m in found if m), 0.0)
  if start > 0:
    rest = seconds - start * budget
    cell += (f": {rest:.1f} s ({100 * rest / budget:.0f}%) advice, {start * budget:.1f} s "
             "naive's start")
  return cell


def _race_start(advice) -> float:
  """Where ``advice``'s race started, as a fraction of the budget (0 where it raced
  nothing)."""
  trace = advice.runs["naive"].trace
  return trace[0][0][0] if trace else 0.0


def _full_run(objective, advice, c, eval_key, elbo_samples) -> dict:
  """Candidate ``c`` of ``advice``: what the race measured and, if it raced, its run
  continued to its budget, with the final ELBO's draws and its ELBO trace."""
  row = {"description": c.description, "seconds_per_step": c.seconds_per_step,
         "budget_steps": c.budget_steps, "race_gain": c.gain, "race_gain_se": c.gain_se,
         "race_time_ratio": c.time_ratio, "note": c.note}
  if c.note:
    return row
  lane = advice.runs[c.name]
  row["raced_steps"] = lane.steps
  params, row["trace"] = _continue_traced(objective, lane, advice.key, eval_key)
  row["elbo"], row["elbo_se"], row["draws"] = _elbo(objective, params, eval_key,
                                                    elbo_samples)
  return row


TRACE_SAMPLES = 30
"""Draws per ELBO estimate along a full run (the same noise at every point)."""


def _continue_traced(objective, lane, key, eval_key):
  """A raced lane's run continued to the end of its schedule in pieces (the run one
  :meth:`dsgrad.Recommendation.fit` call makes: same key, batches and schedule), its
  ELBO estimated at the race's end and after each piece with the same noise
  (``eval_key``): two points of a trace differ by the run's progress, not by the
  estimates' noise, so the time at which one run reaches another's ELBO is measured.
  The pieces end at :data:`TRACE_POINTS` steps spaced geometrically, since a fast
  candidate passes naive's final ELBO early in its run.

  Returns:
    ``(final params, [(seconds, ELBO), ...])``: seconds of steps only, the raced ones at
    the race's timed rate.
  """
  params, opt_state = race_lib.copy_tree(lane.params), race_lib.copy_tree(lane.opt_state)
  step, seconds = lane.steps, lane.steps * lane.seconds_per_step
  optimizer = lane.run_optimizer()

  def estimate(p):
    return float(race_lib.elbo_draws(objective, p, eval_key, TRACE_SAMPLES).mean())

  trace = [(seconds, estimate(params))]
  # Stops on multiples of one segment length, so that a few programs are compiled.
  segment = max(1, lane.total_steps // (10 * TRACE_POINTS))
  stops = np.geomspace(max(step, 1), lane.total_steps, TRACE_POINTS + 1)
  stops = np.unique(np.minimum(np.ceil(stops / segment) * segment, lane.total_steps))
  for stop in stops[stops > step].astype(int):
    result = dsgrad.fit(lane.contender.objective, optimizer, params, key,
                        num_steps=int(stop), batch_size=lane.contender.batch_size,
                        opt_state=opt_state, start_step=step, elbo_samples=0,
                        progress=False, eval_every=segment)
    params, opt_state, step = result.params, result.opt_state, int(stop)
    seconds += float(result.history.wall_time[-1])
    trace.append((seconds, estimate(params)))
  return params, trace


def _paired_cells(s, ran, best) -> str:
  """The pick's paired differences to the hand loop and to the best contender, and the
  targets' verdicts: the pick within 2 se of the best, and ahead of the hand loop by more
  than 2 se wherever any contender is."""
  pick = ran[s["pick"]]
  if "draws" not in pick or "hand_draws" not in s:  # records made before draws were kept
    return f"{pick['elbo'] - s['hand_elbo']:+.2f} (no draws) | n/a | n/a"
  # Each contender's paired difference to the hand loop, and whether it clears 2 se.
  to_hand = {n: race_lib.paired_difference(c["draws"], s["hand_draws"]) for n, c in ran.items()}
  ahead_of_hand = {n: gain > 2 * se for n, (gain, se) in to_hand.items()}
  pick_gain, pick_se = to_hand[s["pick"]]
  to_best, to_best_se = race_lib.paired_difference(pick["draws"], ran[best]["draws"])
  near_best = "met" if to_best >= -2 * to_best_se else "missed"
  ahead = ("no contender is" if not any(ahead_of_hand.values())
           else "met" if ahead_of_hand[s["pick"]] else "missed")
  return (f"{pick_gain:+.2f} ({pick_se:.2f}) | {to_best:+.2f} ({to_best_se:.2f}) | "
          f"within 2 se of best: {near_best}; ahead of hand where any is: {ahead}")


def _over_seeds(results) -> list:
  """Lines of a table over seeds, for the models run on several: one run's final ELBO
  varies from seed to seed by more than one estimate's error, so the best contender is the
  best on average, and the pick's differences to it and to the hand loop are averaged over
  the seeds, with their standard error over the seeds."""
  lines = []
  for name, r in results.items():
    seeds = list(r["seeds"].values())
    everyone = set.intersection(*({n for n, c in s["candidates"].items() if "elbo" in c}
                                  for s in seeds))
    if len(seeds) < 2 or not everyone:
      continue
    mean = {n: np.mean([s["candidates"][n]["elbo"] for s in seeds]) for n in everyone}
    best = max(mean, key=mean.get)
    picks = np.asarray([s["candidates"][s["pick"]]["elbo"] for s in seeds])
    to_best = dsgrad.diagnostics.mean_and_standard_error(
        picks - [s["candidates"][best]["elbo"] for s in seeds])
    to_hand = dsgrad.diagnostics.mean_and_standard_error(
        picks - [s["hand_elbo"] for s in seeds])
    cells = [f"{d:+.2f} ({se:.2f})" for d, se in (to_best, to_hand)]
    near = "met" if to_best[0] >= -2 * to_best[1] else "missed"
    if not lines:
      lines = ["", "Over the seeds (one run's final ELBO varies from seed to seed by more "
               "than one estimate's error: the best contender is the best on average, and "
               "the pick's differences are averaged over the seeds, with their standard "
               "error over the seeds):", "",
               "| model | seeds | picks | best on average (mean ELBO) | pick - best (se over "
               "seeds) | pick - hand (se over seeds) | pick within 2 se of best |",
               "| --- | ---: | --- | --- | ---: | ---: | --- |"]
    lines.append(f"| {name} | {len(seeds)} | {', '.join(s['pick'] for s in seeds)} | "
                 f"{best} ({mean[best]:.2f}) | {cells[0]} | {cells[1]} | {near} |")
  return lines


def _run_fraction(s) -> str:
  """Naive's run's time for its steps (raced at the timed rate, then continued), as a
  fraction of the budget: below 1 where recommend timed its step too slow and so gave it
  a schedule shorter than the budget affords."""
  trace = s["candidates"]["naive"].get("trace")
  return f"{trace[-1][0] / s['budget_seconds']:.2f}" if trace else "n/a"


def _rounds_cell(rounds) -> str:
  return ", ".join(f"{gain:+.3g} ({se:.2g}) at {100 * f:.2g}%" for f, gain, se in rounds)


def _race_lines(results) -> list:
  """Where a race could tell the best from naive: per model and seed, how far the pick's
  race went, and the best contender's (and the pick's) gain over naive at each round of
  the race given the whole budget (records made before the rounds were kept: none)."""
  lines = []
  for name, r in results.items():
    for seed, s in r["seeds"].items():
      if "race_rounds" not in s:
        continue
      ran = {n: c for n, c in s["candidates"].items() if "elbo" in c}
      best = max(ran, key=lambda n: ran[n]["elbo"])
      reached = max((f for rounds in s["race_rounds"].values() for f, _, _ in rounds),
                    default=0.0)
      cells = [f"the pick's race reached {100 * reached:.2g}% of the budget" if reached
               else "the pick's call raced nothing"]
      for n in dict.fromkeys([best, s["pick"]]):
        label = f"{ran[n]['description']} ({'best' if n == best else 'pick'})"
        rounds = s["reference_race_rounds"].get(n) or s["race_rounds"].get(n)
        if n != "naive" and rounds:
          cells.append(f"{label}: {_rounds_cell(rounds)}")
        elif n == "naive":
          cells.append(f"{label}: the reference")
      lines.append(f"* {name}, seed {seed}: " + "; ".join(cells) + ".")
  if lines:
    lines = ["", "Where a race can tell: the best contender's gain over naive at equal "
             "wall-clock (paired se) at the end of each round of the race given the whole "
             "budget, in % of the budget, beside how far the pick's own race went:", ""] + lines
  return lines


ALONG = (0.1, 0.3, 1.0)
"""Where along naive's run the prediction check also measures the pick's time ratio."""


def _ratio_along(naive_trace, pick_trace, fraction) -> float:
  """The pick's time to reach the ELBO naive had at ``fraction`` of its run, relative to
  naive's time to it, from the full runs' traces (``(seconds, ELBO)`` pairs)."""
  seconds = fraction * naive_trace[-1][0]
  times, elbos = zip(*naive_trace)
  target = float(np.interp(seconds, times, elbos))
  return race_lib.time_to_reach(list(pick_trace), target) / seconds


def _shorter_budgets_cell(check) -> str:
  """The shorter-budget check (:func:`_shorter_budgets`) in words; empty if not run."""
  if not check:
    return ""
  runs = "; ".join(f"{x:.2f} budgets: {d:+.2f} ({se:.2f})" for x, d, se in check["runs"])
  if check.get("naive_at_half"):
    x, d, se = check["naive_at_half"]
    runs += f"; naive itself over {x:.2f} budgets: {d:+.2f} ({se:.2f})"
  return (f" Given x budgets (schedule over x budgets), the pick's final ELBO minus naive's "
          f"with one: {runs}; the budget it needs to end level with naive, against the "
          f"race's r = {check['ratio']:.2f}: "
          f"{_budget_verdict(check['runs'], check.get('naive_at_half'))}.")


def _prediction_lines(results, common_noise: bool) -> list:
  """The prediction check, where the pick is not naive: the race's time ratio against the
  full runs' (their traces begin at the race's end), and the full runs' ratio at
  points along naive's run, which shows where the two part."""
  lines = []
  for name, r in results.items():
    for seed, s in r["seeds"].items():
      check = s.get("prediction")
      if not check:
        continue
      predicted, measured = check["race_time_ratio"], check["full_run_time_ratio"]
      if not np.isfinite(predicted) or predicted <= 0:
        lines.append(f"* {name}, seed {seed}: no prediction: naive did not gain over the "
                     "race, so the race measured no time to reach its ELBO.")
        continue
      within = np.isfinite(measured) and 0.5 <= measured / predicted <= 2
      rows = s["candidates"]
      along = ", ".join(
          f"{_ratio_along(rows['naive']['trace'], rows[s['pick']]['trace'], f):.2f}x at "
          f"{f:.0%}" for f in ALONG)
      lines.append(f"* {name}, seed {seed}: {s['pick']} reached naive's race ELBO in "
                   f"{predicted:.2f}x naive's time in the race, and naive's final ELBO in "
                   f"{measured:.2f}x naive's run in the full runs: "
                   f"{'within' if within else 'not within'} 2x. Along the full runs, the "
                   f"time to naive's ELBO at a point of its run: {along}." +
                   _shorter_budgets_cell(s.get("shorter_budgets")))
  if not lines:
    return lines
  traces = (f"their ELBO traces: {TRACE_SAMPLES} draws at the race's end and at "
            f"{TRACE_POINTS} points spaced geometrically to the run's end, the same noise "
            "at every point and in every run)." if common_noise else
            "their ELBO traces). The traces after the race are single estimates with "
            "fresh noise at each point (30 draws): where a run gains less than one "
            "estimate's error over its later part, the full runs' ratio is set by that "
            "noise, not by the pick.")
  return ["", "The prediction check: the time the pick takes to reach naive's final ELBO, "
          "relative to naive's, as the race predicted it and as the full runs measured it "
          f"(from {traces}", ""] + lines


def _peak_grids(results) -> str:
  """The peaks tuned over: one list where every model had the same grid."""
  grids = {name: [float(p) for p in r["tuning"]] for name, r in results.items()}
  if len({tuple(g) for g in grids.values()}) == 1:
    return str(next(iter(grids.values())))
  return "; ".join(f"{name}: {grid}" for name, grid in grids.items())


def render(record):
  """The advice section of one run record (``docs/data/advice-*.json``)."""
  results, config = record["results"]["results"], record["results"]["config"]
  lines = [f"Command: `{record['command']}` -- mean-field BBVI, B = "
           f"{config['batch_size']}; budget = a hand-written optax loop's time for T "
           f"steps ({', '.join(f'{k}: {v:,}' for k, v in config['steps'].items())}; Adam, cosine to 1% of a peak tuned on seed "
           f"{config['tune_seed']} among {_peak_grids(results)}); recommend gets that schedule and "
           "budget; every raced candidate's run is then continued to its budget" + (
               ", and so is every candidate it did not race (marked *), from a race "
               "given the whole budget" if config.get("reference") else "") + ". ELBO: "
           f"{config['elbo_samples']} draws, common random numbers.", "",
           f"Measured: {record['environment']}", "",
           "| model | seed | budget, s | pick | hand-written naive | best dsgrad (ELBO) | "
           "pick's ELBO | pick - hand (paired se) | pick - best (paired se) | targets | "
           "recommend's time | timing disagreement | naive's run / budget |",
           "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: "
           "| ---: |"]
  for name, r in results.items():
    for seed, s in r["seeds"].items():
      ran = {n: c for n, c in s["candidates"].items() if "elbo" in c}
      best = max(ran, key=lambda n: ran[n]["elbo"])
      pick = ran[s["pick"]]
      lines.append(
          f"| {name} | {seed} | {s['budget_seconds']:.2f} | {s['pick']} | "
          f"{s['hand_elbo']:.2f} | {best} ({ran[best]['elbo']:.2f}) | {pick['elbo']:.2f} | "
          f"{_paired_cells(s, ran, best)} | {_advice_time_cell(s)} | "
          f"{100 * s['timing_disagreement']:.0f}% | {_run_fraction(s)} |")
  lines += _over_seeds(results)
  lines += _race_lines(results)
  lines += _prediction_lines(results, config.get("trace_noise") == "common")
  lines += ["", "Every candidate at equal wall-clock (final ELBO; steps in the budget; "
            "gradient variance per step at the hand-written run's final parameters, "
            "relative to naive's):", ""]
  for name, r in results.items():
    for seed, s in r["seeds"].items():
      v = s["variance_per_step"]
      cells = [f"{c['description']}{'*' if 'not_raced_by_pick' in c else ''}: "
               f"{c['elbo']:.2f} ({c['budget_steps']:,} steps)"
               for c in s["candidates"].values() if "elbo" in c]
      # One cell per reason, naming the candidates it ruled out, as the advice says it.
      ruled_out = [advice_lib.Candidate(n, c["description"], note=c["note"])
                   for n, c in s["candidates"].items() if "elbo" not in c]
      cells += [line[:-1] for line in advice_lib._ruled_out_lines(ruled_out)]
      lines.append(f"* {name}, seed {seed}: " + "; ".join(cells) + ". Variance: " +
                   ", ".join(f"{k} {val / v['naive']:.3g}x" for k, val in v.items()
                             if k != "naive") + ".")
  return "\n".join(lines)


def _steps(parser, given: list, models: list, defaults: dict) -> dict:
  """``{model: T}`` from ``--steps``: one number for all, or ``name=T`` pairs (the
  models not named keep ``defaults``, the scale's)."""
  if len(given) == 1 and "=" not in given[0]:
    return {name: int(given[0]) for name in models}
  pairs = dict(item.split("=", 1) for item in given if "=" in item)
  if len(pairs) != len(given) or set(pairs) - set(models):
    parser.error(f"--steps takes one number or name=T pairs for the models {models}")
  return {name: int(pairs.get(name, defaults.get(name, STEPS[name]))) for name in models}


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks advice",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--scale", choices=[*SCALES, "both"],
                      help="the budgets to run (SCALES): a few seconds over four seeds, a "
                           "minute or more (the MLP over three seeds), or both, each in its "
                           "own section (default: both, about 95 minutes on two CPU cores; "
                           "'small' where --steps, --seeds, --models or --section is given)")
  parser.add_argument("--steps", nargs="*", default=[],
                      help="T for every model (one number) or per model (name=T pairs); "
                           "default: the scale's")
  parser.add_argument("--batch-size", type=int, default=100)
  parser.add_argument("--seeds", type=int, nargs="*", help="default: the scale's")
  parser.add_argument("--tune-seed", type=int, default=100)
  parser.add_argument("--elbo-samples", type=int, default=100)
  parser.add_argument("--models", nargs="*", choices=list(MODELS),
                      help="default: the scale's")
  parser.add_argument("--section", default=None,
                      help="a name for this run's own section of the page, instead of the "
                           "scale's (e.g. 'minute-student-t')")
  parser.add_argument("--no-reference", action="store_true",
                      help="do not run the candidates the pick's call did not race (they "
                           "cost about one budget each)")
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  one_run = args.steps or args.seeds is not None or args.models or args.section is not None
  if args.scale == "both" and one_run:
    parser.error("--steps, --seeds, --models and --section change one scale: name it")
  if args.scale in (None, "both") and not one_run:
    scales = list(SCALES)
  else:
    scales = [args.scale or "small"]
  for scale in scales:
    preset = SCALES[scale]
    models = args.models or preset["models"]
    # A model outside the scale keeps the small scale's seeds (and steps: _steps).
    seeds = {name: args.seeds if args.seeds is not None
             else preset["seeds"].get(name, SCALES["small"]["seeds"][name])
             for name in models}
    if any(args.tune_seed in s for s in seeds.values()):
      parser.error("the tuning seed must not be a reported seed")
    config = {"scale": scale, "steps": _steps(parser, args.steps, models, preset["steps"]),
              "batch_size": args.batch_size, "seeds": seeds, "tune_seed": args.tune_seed,
              "elbo_samples": args.elbo_samples, "reference": not args.no_reference,
              "trace_noise": "common"}
    suffix = preset["section"] if args.section is None else args.section
    section = f"advice-{jax.default_backend()}" + (f"-{suffix}" if suffix else "")
    results = {}
    for name in models:
      results[name] = run_model(name, seeds[name], config["steps"][name], args.batch_size,
                                args.tune_seed, args.elbo_samples, not args.no_reference)
      # Written after each model, so a long run stopped part-way keeps what it measured.
      _report.publish(section, None, not args.no_write,
                      render=render, data={"results": results, "config": config})


if __name__ == "__main__":
  main()
