"""dsgrad.recommend races candidates at equal wall-clock. Step costs are passed in
(``step_costs``) so the races, and hence these tests, do not depend on this machine's
timings: a model where a control variate must win, one where nothing beats naive, the
memory rule, and the continuation of the winner's run."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.advice import recommend as advice_lib
from dsgrad.advice import race as race_lib

N, D, BATCH = 200, 4, 10


def _model():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), N, D)
  return dsgrad.models.logistic_regression(x, y)


def _schedule(steps):
  return optax.adam(optax.cosine_decay_schedule(5e-2, steps))


def _by_name(advice):
  return {c.name: c for c in advice.ranking}


def test_noise_dominated_run_gets_a_control_variate_and_its_run_continues():
  """All variance from Monte Carlo noise (the full data in every batch) and a constant
  step size, so naive stalls at its noise floor: cv with the GLM Taylor approximation
  removes the noise and wins at equal wall-clock although its step costs 1.5x.
  Continuing the winner (Recommendation.fit) is the very run fit makes from naive's state
  where the race started: naive to there, then cv, its schedule and step counts at that
  fraction of its own run."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), N, 10)
  model = dsgrad.models.logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model)
  rule = optax.adam(0.3)
  advice = dsgrad.recommend(objective, rule, params, jax.random.key(1), batch_size=N,
                            budget=3000, budget_in="naive_steps",
                            approx=dsgrad.approx.glm_taylor(model), candidates=("naive", "cv"),
                            share=0.25, progress=False,
                            step_costs={"naive": 1e-3, "cv": 1.5e-3})
  rows = _by_name(advice)
  assert advice.best == "cv", str(advice)
  assert rows["cv"].gain > 2 * rows["cv"].gain_se > 0
  assert rows["cv"].budget_steps == 2000 and rows["naive"].budget_steps == 3000
  # Equal wall-clock: the two raced to within a chunk of the same fraction of the budget.
  assert abs(rows["cv"].raced_fraction - rows["naive"].raced_fraction) < 0.02
  # Faster to naive's race ELBO, or none to compare: naive, at its noise floor after its
  # start, ended the race no higher than it began it.
  assert rows["cv"].time_ratio < 1.0 or (np.isnan(rows["cv"].time_ratio) and
                                         "naive did not gain" in str(advice))
  assert "beat naive" in advice.reasons[-1]

  lane = advice.runs["cv"]
  assert 0 < lane.steps < lane.total_steps
  continued = advice.fit(progress=False, elbo_samples=0)
  origin = lane.trace[0][0][0]
  assert 0 < origin < rows["cv"].raced_fraction
  settings = dict(batch_size=N, progress=False, elbo_samples=0)
  first = dsgrad.fit(objective, optax.chain(dsgrad.naive(), rule), params, jax.random.key(1),
                     num_steps=round(origin * 3000), **settings)
  cv = dsgrad.cv(objective, dsgrad.approx.glm_taylor(model))
  at = round(origin * lane.total_steps)
  adam = first.opt_state[1]
  adam = (adam[0]._replace(count=jnp.asarray(at, adam[0].count.dtype)), *adam[1:])
  scratch = dsgrad.fit(objective, optax.chain(cv, rule), first.params, jax.random.key(1),
                       num_steps=lane.total_steps, start_step=at,
                       opt_state=(cv.init(first.params), adam), **settings)
  for a, b in zip(jax.tree.leaves(continued.params), jax.tree.leaves(scratch.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_subsampling_dominated_run_gets_joint_svrg():
  """Near the optimum (a full-batch fit first), batches of 10 of 200 data and a constant
  SGD step: naive stalls at the floor its subsampling noise sets, which is most of its
  gradient's variance here (checked), and which cv, removing Monte Carlo noise only,
  cannot lower. Joint SVRG removes both and wins at equal wall-clock at 1.5x naive's
  step cost."""
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  start = dsgrad.fit(objective, optax.adam(optax.cosine_decay_schedule(3e-2, 3000)),
                     dsgrad.meanfield_init(model), jax.random.key(9), num_steps=3000,
                     batch_size=N, progress=False, elbo_samples=0).params
  parts = dsgrad.diagnostics.variance_decomposition(objective, start, jax.random.key(4),
                                                    BATCH, num_draws=500, full_draws=100)
  assert parts["V_n"] > 0.5 * parts["V_n_eps"], parts  # subsampling: most of naive's
  advice = dsgrad.recommend(objective, optax.sgd(1e-2), start, jax.random.key(2),
                            batch_size=BATCH, budget=3000, budget_in="naive_steps",
                            candidates=("naive", "cv", "joint_svrg"), share=0.25,
                            progress=False,
                            step_costs={"naive": 1e-3, "cv": 1.5e-3, "joint_svrg": 1.5e-3})
  rows = _by_name(advice)
  assert advice.best == "joint_svrg", str(advice)
  assert rows["joint_svrg"].gain > 2 * rows["joint_svrg"].gain_se > 0


def test_where_nothing_beats_naive_the_advice_says_naive(monkeypatch):
  """A narrow q (almost no Monte Carlo noise): cv cannot remove subsampling noise and costs
  three times as much, so naive stays. joint SAGA's table does not fit the (patched) free
  memory: ruled out from shapes, with the reason, before anything is allocated."""
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model, 0.0, -6.0)
  table = N * 2 * D * 4  # a parameter copy per datum
  monkeypatch.setattr(dsgrad.training.host_data, "free_memory_bytes", lambda: table)
  advice = dsgrad.recommend(objective, _schedule, params, jax.random.key(2),
                            batch_size=BATCH, budget=3000, budget_in="naive_steps",
                            candidates=("naive", "cv", "joint_saga"), share=0.25,
                            progress=False, step_costs={"naive": 1e-3, "cv": 3e-3})
  rows = _by_name(advice)
  assert advice.best == "naive", str(advice)
  assert "stay with naive" in advice.reasons[-1]
  saga = rows["joint_saga"]
  assert "MiB" in saga.note and saga.state_bytes > table // 2
  assert "joint_saga" not in advice.runs
  assert advice.ranking[-1].name == "joint_saga"


def test_the_candidates_each_objective_allows():
  """The path derivative is offered for mean-field objectives only; the equal-cost
  baselines take K from the control variates' given cost (here 3x: 3 samples, batch 30),
  else K = 2 (they compile beside the control variates, before any is timed)."""
  from dsgrad.advice import admission
  assert admission.equal_cost_k(("naive", "cv", "naive_batch"), None) == 2
  assert admission.equal_cost_k(("naive", "cv", "joint_svrg", "naive_batch"),
                                {"naive": 1.0, "cv": 2.2, "joint_svrg": 3.8}) == 3
  model = _model()
  objective = dsgrad.families.FullRankGaussian(D).objective(model)
  params = dsgrad.families.FullRankGaussian(D).params()
  advice = dsgrad.recommend(
      objective, optax.adam(1e-2), params, jax.random.key(3), batch_size=BATCH, budget=600,
      budget_in="naive_steps", candidates=("naive", "cv", "path_derivative", "rqmc",
                                           "naive_samples", "naive_batch"),
      share=0.5, progress=False, elbo_samples=16,
      step_costs={"naive": 1e-3, "cv": 3e-3, "rqmc": 2e-3, "naive_samples": 2e-3,
                  "naive_batch": 2e-3})
  rows = _by_name(advice)
  assert "meanfield_gaussian" in rows["path_derivative"].note
  assert rows["naive_samples"].description == "naive, 3 MC samples per datum"
  assert rows["rqmc"].description == "naive, 3 randomized QMC samples per datum"
  assert rows["naive_batch"].description == "naive, batch 30"
  assert all(np.isfinite(r.elbo) for r in advice.ranking if not r.note)
  # A batch of all the data has no larger batch to race (it raced itself, before).
  from dsgrad.advice import candidates
  (name, contender, _, note), = candidates.equal_cost_contenders(
      ("naive_batch",), objective, N, 3)
  assert contender is None and note == f"the batch is already all {N} data"


@pytest.mark.parametrize("kwargs", [dict(candidates=("cv", "joint_svrg")),
                                    dict(candidates=("naive", "sgld")),
                                    dict(batch_size=0), dict(budget=-1.0),
                                    dict(budget_in="epochs"), dict(share=1.5),
                                    dict(step_costs={"cv": 1.0}), dict(elbo_rows=0),
                                    dict(elbo_rows="half")])
def test_bad_settings_are_refused(kwargs):
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  settings = dict(batch_size=BATCH, budget=100.0, candidates=("naive", "cv"),
                  progress=False) | kwargs
  with pytest.raises(ValueError):
    dsgrad.recommend(objective, optax.adam(1e-2), dsgrad.meanfield_init(model),
                     jax.random.key(0), **settings)


@pytest.mark.parametrize("optimizer,match", [
    (optax.adam, r"adam itself, a factory that takes a learning rate"),
    (lambda steps: 1e-2, r"optimizer\(\d+\) must be an optax transformation, got the number"),
    (optax.cosine_decay_schedule(1e-2, 100), r"a learning-rate schedule\?"),
    (lambda steps: "adam", r"optimizer\(\d+\) must be an optax transformation")])
def test_an_optimizer_that_is_not_one_is_refused_before_anything_compiles(optimizer, match):
  # optax.adam itself would be called with the step count as its learning rate, and the
  # run would diverge at its first step with the blame on the gradient.
  model = _model()
  with pytest.raises(TypeError, match=match):
    dsgrad.recommend(dsgrad.meanfield_gaussian(model), optimizer, dsgrad.meanfield_init(model),
                     jax.random.key(0), batch_size=BATCH, budget=100.0, progress=False)
  with pytest.raises(TypeError, match=r"dsgrad.fit: optimizer must be an optax transformation"):
    dsgrad.fit(dsgrad.meanfield_gaussian(model), optimizer, dsgrad.meanfield_init(model),
               jax.random.key(0), num_steps=5, batch_size=BATCH, progress=False)


def test_the_race_estimates_on_sampled_data_where_full_passes_would_not_fit():
  """``elbo_rows="auto"``: full passes where the estimates fit their part of the share,
  else whole chunks of data drawn at random, and the advice's line says which; the same
  key gives every parameter set the same rows and noise (common random numbers)."""
  from dsgrad.advice import race_elbo
  model = _model()
  objective, params = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)
  choose = lambda allowed, rows="auto": race_elbo.choose(
      objective, params, jax.random.key(4), 8, rows, allowed, 6, 0.1, chunk_size=50)
  tight, ample, unpriced = choose(1e-9), choose(1e6), choose(None)
  assert tight.rows == 50 and "50 of the 200 data" in tight.describe()
  assert ample.rows == unpriced.rows == N and "full pass" in ample.describe()
  assert tight.seconds > 0 and unpriced.seconds == 0
  np.testing.assert_array_equal(tight.evaluate(params), tight.start)
  assert not np.allclose(tight.start, ample.start)  # a sample, not the full data
  # A sample reads whole chunks (here of 50 data), and says so.
  assert choose(1e6, rows=120).rows == 150 and choose(None, rows=10 ** 6).rows == N


def test_a_budget_too_small_to_race_in_gets_naive_without_a_race(capsys):
  """When compiling the candidates would take more than ``share`` of the budget, they are
  not raced, each says why, and naive's run is set up for the whole budget (its steps
  timed here), ready to continue. The progress bar counts the seconds of the share."""
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  advice = dsgrad.recommend(objective, _schedule, dsgrad.meanfield_init(model),
                            jax.random.key(1), batch_size=BATCH, budget=0.05,
                            progress=True)
  shown = capsys.readouterr().err
  assert "dsgrad.recommend" in shown and re.search(r"\d\.\d/\d+\.\d s", shown), shown
  rows = _by_name(advice)
  assert advice.best == "naive", str(advice)
  assert set(rows) == set(dsgrad.advice.recommend.CANDIDATES)
  assert all(rows[n].note.startswith("not raced") for n in rows if n != "naive")
  lane = advice.runs["naive"]
  assert lane.steps == 0 and lane.total_steps == rows["naive"].budget_steps >= 1
  assert rows["naive"].seconds_per_step * lane.total_steps == pytest.approx(0.05, rel=0.5)
  assert "not raced, as no other candidate is left" in str(advice)
  # The advice's own time, far past this budget, in plain digits.
  assert re.search(r"\(\d{1,3}(,\d{3})*% of it\)", advice.reasons[0]), advice.reasons[0]
  result = advice.fit(progress=False, elbo_samples=0)
  assert np.all(np.isfinite(jax.flatten_util.ravel_pytree(result.params)[0]))


@pytest.mark.parametrize("names, compile_seconds, allowed, admitted, released", [
    (("cv", "joint_svrg", "path_derivative"), dict(cv=1.0, joint_svrg=1.0, path_derivative=1.0),
     6.0, ["cv", "joint_svrg", "path_derivative"], []),
    (("cv", "joint_svrg", "path_derivative"), dict(joint_svrg=1.0, path_derivative=1.0), 3.0,
     ["joint_svrg", "path_derivative"], []),
    (("cv", "joint_svrg", "path_derivative"), dict(cv=1.0, joint_svrg=13.0), 6.0, [],
     ["joint_svrg", "cv"]),
    (("cv", "joint_svrg", "path_derivative"), dict(cv=1.0, joint_svrg=8.0), 6.0,
     ["cv", "joint_svrg"], []),
    (("cv", "joint_svrg", "joint_saga"), dict(cv=0.5, joint_svrg=0.5, joint_saga=0.5), 3.6,
     ["cv", "joint_svrg", "joint_saga"], [])])
def test_candidates_are_compiled_in_priority_order_while_the_share_lasts(
    monkeypatch, names, compile_seconds, allowed, admitted, released):
  """The share pays for candidates in their order, two compiled together, each priced by
  what it compiles (a stand-in compiler whose time runs on a stand-in clock): the path
  derivative, naive's program on a variant objective, at naive's 1 s; a control variate at
  the median compile time measured on those before it, or twice naive's before any.
  Naive owes its second compile (0.5 s with two compiles overlapping); the rest of the
  share, three quarters of it, pays. Share 6 s: the pair (cv, joint SVRG) at the prior
  price (1 s each, compiled together) fits, and so does the path derivative after it.
  Share 3 s: the pair does not fit, nor cv alone (2 s), which is passed over for the
  cheaper pair after it. Share 6 s, joint SVRG compiling for 13 s: the whole share is
  spent, both are let go (the last first), and the path derivative no longer fits. For
  8 s: the admitting three quarters are spent but the whole share is not, and the two
  compiled lanes are kept for the race (their compile is spent), the path derivative not
  admitted. Share 3.6 s: the
  first pair measured at 0.5 s prices joint SAGA at 0.5 s, which then fits where the prior
  price (2 s) would not."""
  import types
  from dsgrad.advice import admission

  clock = [0.0]

  class StandInClock:
    perf_counter = staticmethod(lambda: clock[0])

  def stand_in_compile(lanes, lengths):
    seconds = [compile_seconds[lane.contender.name] for lane in lanes]
    clock[0] += sum(seconds) / (2.0 if len(lanes) > 1 else 1.0)
    for lane, spent in zip(lanes, seconds):
      lane.runner.compile_seconds = lane.runner.compile_cost_seconds = spent

  monkeypatch.setattr(admission, "time", StandInClock)
  monkeypatch.setattr(admission, "compile_overlap", lambda: 2.0)
  monkeypatch.setattr(race_lib, "prepare_all", stand_in_compile)
  monkeypatch.setattr(admission, "LANE_OVERHEAD_SECONDS", 0.0)
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  naive = types.SimpleNamespace(runner=types.SimpleNamespace(compile_seconds=1.0,
                                                             compile_cost_seconds=1.0))
  ledger = admission.Share(allowed, 0.0, naive, dsgrad.advice.candidates.NAIVE_PROGRAMS)
  contenders = dsgrad.advice.candidates.base_contenders(names, objective, None, BATCH, "auto")
  lanes, out = admission.admit(contenders, ledger, 1e-3, lambda n: optax.adam(1e-2),
                                 dsgrad.meanfield_init(model), jax.random.key(0), np.inf,
                                 lambda name: 20, 0.1, lambda message: None)
  assert [lane.contender.name for lane in lanes] == admitted
  notes = {c.name: c.note for c in out}
  # Let go in reverse order of admission, as they are found not to fit.
  assert set(notes) == set(names) - set(admitted)
  assert [n for n in notes if n in released] == released
  assert ledger.measured == [compile_seconds[name] for name in names
                             if name in admitted + released
                             and name not in dsgrad.advice.candidates.NAIVE_PROGRAMS]
  assert all(note.startswith("not raced") for note in notes.values())
  if released:
    assert "took 13 s to compile" in notes["joint_svrg"]
  else:
    assert ledger.left(whole=True) >= 0


def test_naive_second_program_compiled_beside_the_candidates_is_paid_once(monkeypatch):
  """Naive's second program is owed (priced as overlapped) until it compiles beside the
  first candidates; then its time is spent and no longer owed. Counted twice, the share
  looked smaller than it was, and a lane compiled beside it could be let go."""
  import types
  from dsgrad.advice import admission

  clock = [0.0]

  class StandInClock:
    perf_counter = staticmethod(lambda: clock[0])

  def stand_in_compile(lanes, lengths):
    clock[0] += len(lanes) / 2.0  # 1 s each, two at a time
    for lane in lanes:
      lane.runner.compile_seconds = lane.runner.compile_cost_seconds = 1.0

  monkeypatch.setattr(admission, "time", StandInClock)
  monkeypatch.setattr(admission, "compile_overlap", lambda: 2.0)
  monkeypatch.setattr(race_lib, "prepare_all", stand_in_compile)
  monkeypatch.setattr(admission, "LANE_OVERHEAD_SECONDS", 0.0)
  model = _model()
  objective, params = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)
  naive = types.SimpleNamespace(runner=types.SimpleNamespace(compile_seconds=1.0,
                                                             compile_cost_seconds=1.0))
  ledger = admission.Share(4.0, 0.0, naive, dsgrad.advice.candidates.NAIVE_PROGRAMS)
  assert ledger.owed == 0.5  # naive's second program, overlapped
  restarted = race_lib.Lane(race_lib.Contender("naive", objective, dsgrad.naive(), BATCH),
                            lambda n: optax.adam(1e-2), 20, params, jax.random.key(0))
  contenders = dsgrad.advice.candidates.base_contenders(("cv",), objective, None, BATCH, "auto")
  lanes, _ = admission.admit(contenders, ledger, 1e-3, lambda n: optax.adam(1e-2), params,
                             jax.random.key(0), np.inf, lambda name: 20, 0.1,
                             lambda message: None, companion=restarted)
  assert [lane.contender.name for lane in lanes] == ["cv"]
  assert restarted.runner.compile_seconds == 1.0  # compiled beside cv
  assert ledger.owed == 0.0 and ledger.left(whole=True) == 4.0 - 1.0


def test_a_program_served_by_jax_persistent_cache_is_priced_at_its_compile_time():
  """The advice prices candidates by naive's compile: where JAX's persistent cache served
  naive's program, the price is the compile time JAX stored with it (whole seconds,
  truncated: the middle of that second, at least the cache's minimum compile time, here
  0), not the quick read (the other candidates, of other sizes, still compile in full)."""
  from dsgrad.training import compile_cache
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  optimizer = optax.with_extra_args_support(optax.adam(1e-2))
  params = dsgrad.meanfield_init(model)
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    runners = []
    for _ in range(2):
      compile_cache.clear()  # dsgrad's own cache; the second build reads JAX's from disk
      runner = dsgrad.training.segments.SegmentRunner(objective, optimizer, BATCH, jax.random.key(5))
      runner.prepare(params, optimizer.init(params), 0, 977)  # a length no other test uses
      runners.append(runner)
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
  first, second = runners
  assert first.compile_cost_seconds == first.compile_seconds > 0  # nothing was on disk
  # Read from disk: the cost puts back a compile in place of the read.
  assert second.compile_cost_seconds > second.compile_seconds
  assert second.compile_cost_seconds >= 0.5 * first.compile_seconds, (
      first.compile_seconds, second.compile_seconds, second.compile_cost_seconds)


def test_a_lane_keeps_its_program_where_its_schedule_sets_the_same_step_sizes_over_the_race():
  """A lane compiled with its schedule over a guessed length keeps that program for the
  length it affords where the two schedules' updates agree within 2.5% up to the race's
  reach: a cosine decay over 1.9 times the steps, raced to 4% of the run, does; raced to
  30%, or a warm-up over a tenth of the run raced to 4%, compiles again (and is priced
  so), as does one whose updates cannot be compared. A lane that has run keeps nothing:
  its schedule is under way."""
  model = _model()
  objective, params = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)
  cosine = lambda steps: optax.adam(optax.cosine_decay_schedule(1e-2, steps, 0.01))
  warm_up = lambda steps: optax.adam(optax.linear_schedule(0.0, 1e-2, steps // 10))
  contender = race_lib.Contender("naive", objective, dsgrad.naive(), BATCH)

  def lane(make):
    made = race_lib.Lane(contender, make, 19_000, params, jax.random.key(0))
    made.runner.compile_cost_seconds = 1.0
    return made

  assert lane(cosine).keeps_program(10_000, 0.04)
  assert not lane(cosine).keeps_program(10_000, 0.3)
  assert not lane(warm_up).keeps_program(10_000, 0.04)
  assert lane(warm_up).keeps_program(19_000, 0.3)  # built for that very length
  # An update that needs more than gradients cannot be compared: compiled again.
  plateau = lambda steps: optax.chain(optax.adam(1e-2), optax.contrib.reduce_on_plateau())
  assert not lane(plateau).keeps_program(10_000, 0.04)
  # Nor one whose probed updates are all zero (accumulating steps: nothing to compare).
  accumulating = lambda steps: optax.MultiSteps(cosine(steps), 4)
  assert not lane(accumulating).keeps_program(10_000, 0.04)
  overlap = dsgrad.advice.admission.compile_overlap()
  lanes = [lane(cosine), lane(warm_up), lane(cosine)]
  assert advice_lib._compile_again(lanes, [10_000] * 3, 0.04) * overlap == 1.0  # the warm-up
  assert advice_lib._compile_again(lanes, [10_000] * 3, 0.3) * overlap == 3.0
  kept = lanes[0].stretched(10_000, params, jax.random.key(0), 0.04)
  assert kept is lanes[0] and kept.total_steps == 10_000 and kept.schedule_steps == 19_000
  assert lanes[1].stretched(10_000, params, jax.random.key(0), 0.04).schedule_steps == 10_000
  lanes[2].steps = 10
  assert not lanes[2].keeps_program(10_000, 0.04)


def test_naive_races_the_program_its_timing_rounds_compiled(monkeypatch):
  """Naive's first schedule, an epoch's, only serves the first rough time of its step;
  its run is then restarted on the steps that time affords, before its timing rounds, so
  that the race runs the very program those rounds compiled (a compile fewer: naive's
  restart used to compile once for the timing and once more for the race). The share
  leaves the race about 3% of the budget, over which a schedule guessed even 3 times off
  sets the same step sizes as the timed one."""
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)

  class RaceReached(Exception):
    pass

  def stop(lanes, reference, *args, **kwargs):
    raise RaceReached(lanes[reference])

  monkeypatch.setattr(race_lib, "race", stop)
  with pytest.raises(RaceReached) as reached:
    dsgrad.recommend(objective, _schedule, dsgrad.meanfield_init(model), jax.random.key(1),
                     batch_size=BATCH, budget=500.0, candidates=("naive", "cv"), share=0.02,
                     progress=False)
  naive = reached.value.args[0]
  assert naive.contender.name == "naive" and naive.steps == 0
  assert list(naive.runner.executables) == [naive.chunk]  # compiled, and only that one


def test_the_cores_counted_are_those_the_process_may_use(monkeypatch, tmp_path):
  """Compiles are priced as overlapping only where the process may use several cores:
  its affinity mask (``taskset -c 0``: one) and a cgroup quota (``docker --cpus=1.5``:
  two) bound the count, not the machine's cores."""
  import os
  quota = tmp_path / "cpu.max"
  quota.write_text("max 100000\n")
  monkeypatch.setattr(os, "cpu_count", lambda: 8)
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
  assert race_lib.usable_cpus(str(quota)) == 3
  quota.write_text("150000 100000\n")
  assert race_lib.usable_cpus(str(quota)) == 2
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
  assert race_lib.usable_cpus(str(tmp_path / "absent")) == 1
  assert dsgrad.advice.admission.compile_overlap() == 1.0


def test_checkpoint_difference_holds_the_runs_jitter():
  """The gain's standard error is the estimates' own when the paired differences agree
  across checkpoints, and the spread's when one run jitters between them (three nats
  apart here, against estimates precise to 0.1)."""
  rng = np.random.default_rng(0)
  common = rng.normal(0.0, 5.0, 64)  # common random numbers: cancel in the differences
  jitter = rng.normal(0.0, 0.8, 64)
  naive = [(f, common + 0.1 * rng.normal(size=64)) for f in (0.1, 0.2, 0.3, 0.4)]
  steady = [(f, d + 1.0) for f, d in naive]
  gain, se = race_lib.checkpoint_difference(steady, naive)
  assert gain == pytest.approx(1.0) and se == pytest.approx(0.0, abs=1e-12)
  noisy = [(f, d + 1.0 + 0.1 * jitter + offset)
           for (f, d), offset in zip(naive, (-3.0, 3.0, -3.0, 3.0))]
  gain, se = race_lib.checkpoint_difference(noisy, naive)
  eval_se = race_lib.paired_difference(noisy[0][1], naive[0][1])[1]
  assert gain == pytest.approx(1.0, abs=3 * eval_se)
  assert se == pytest.approx(np.std([-3.0, 3.0, -3.0, 3.0], ddof=1) / 2, rel=0.05)
  assert se > 10 * eval_se
  one = race_lib.checkpoint_difference(noisy[:1], naive[:1])
  assert one == pytest.approx(race_lib.paired_difference(noisy[0][1], naive[0][1]))
  # Where the error comes from four checkpoints' spread, a win needs Student-t's margin
  # for three degrees of freedom, not 2 (an 86% interval); else 2.
  assert race_lib.gain_factor(noisy, naive) == pytest.approx(3.182, abs=1e-3)
  assert race_lib.gain_factor(steady, naive) == 2.0
  assert race_lib.gain_factor(noisy[:1], naive[:1]) == 2.0
  rows = [dsgrad.advice.candidates.Candidate("naive", "naive", rounds=1),
          dsgrad.advice.candidates.Candidate("cv", "cv", gain=2.5, gain_se=1.0, rounds=1,
                                      gain_factor=race_lib.gain_factor(noisy, naive))]
  assert advice_lib._pick(rows).name == "naive"
  assert advice_lib._pick([rows[0], rows[1]._replace(gain_factor=2.0)]).name == "cv"


def test_timing_dispatches_segments_back_to_back_and_still_checks_them():
  """SegmentRunner.seconds_per_step, which recommend times with, and run_calls, which it
  races with, run their calls without waiting between them, yet a value check that fails
  in any of them still raises."""
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  optimizer = optax.chain(dsgrad.naive(), optax.sgd(1e-3))
  runner = dsgrad.training.segments.SegmentRunner(objective, optimizer, BATCH, jax.random.key(0))
  params = dsgrad.meanfield_init(model)
  seconds = runner.seconds_per_step(params, optimizer.init(params), 16, 3)
  # The calls took the first segment's batches over and over (no orders computed between
  # them), and what the epochs' orders cost a run per step is added, measured apart.
  assert runner.orders.stacked[0][0] == 0
  orders = runner.orders.seconds_per_step()
  assert 0 < orders < seconds and np.isclose(runner.step_seconds / 48 + orders, seconds)
  bad = jax.tree.map(lambda x: x.at[0].set(np.nan), dsgrad.meanfield_init(model))
  with pytest.raises(ValueError, match="non-finite|NaN"):
    runner.seconds_per_step(bad, optimizer.init(bad), 8, 3)
  # The race's calls (run_calls) advance the run: three 8-step calls are the 24 steps
  # that one 24-step segment takes from the same start, and a failed check still raises.
  params = dsgrad.meanfield_init(model)
  three = runner.run_calls(params, optimizer.init(params), 0, 8, 3)
  other = dsgrad.training.segments.SegmentRunner(objective, optimizer, BATCH, jax.random.key(0))
  params = dsgrad.meanfield_init(model)
  one = other.run(params, optimizer.init(params), 0, 24)
  for a, b in zip(jax.tree.leaves(three), jax.tree.leaves(one)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  bad = jax.tree.map(lambda x: x.at[0].set(np.nan), dsgrad.meanfield_init(model))
  with pytest.raises(ValueError, match="non-finite|NaN"):
    runner.run_calls(bad, optimizer.init(bad), 0, 8, 3)


def test_a_lane_advances_in_whole_chunks_and_ends_with_the_rest():
  """A raced run advances in whole chunks (dispatched back to back) up to the fraction
  asked, then its last, shorter segment: the steps one segment of the whole run takes."""
  model = _model()
  objective = dsgrad.meanfield_gaussian(model)
  contender = race_lib.Contender("naive", objective, dsgrad.naive(), BATCH)
  params = dsgrad.meanfield_init(model)
  lane = race_lib.Lane(contender, lambda n: optax.sgd(1e-3), 50, params, jax.random.key(0))
  lane.chunk = 16
  lane.advance_to(0.5)
  assert lane.steps == 32  # round(25 / 16) = 2 chunks
  lane.advance_to(1.0)
  assert lane.steps == 48
  lane.advance_to(1.0)
  assert lane.steps == 50 and lane.fraction == 1.0
  whole = race_lib.Lane(contender, lambda n: optax.sgd(1e-3), 50, params, jax.random.key(0))
  once = whole.runner.run(whole.params, whole.opt_state, 0, 50)
  for a, b in zip(jax.tree.leaves((lane.params, lane.opt_state)), jax.tree.leaves(once)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Asked for the end in one call (round(44 / 16) = 3 chunks, two whole ones), a run of
  # 44 steps takes two chunks and then the 12 steps left.
  short = race_lib.Lane(contender, lambda n: optax.sgd(1e-3), 44, params, jax.random.key(0))
  short.chunk = 16
  short.advance_to(1.0)
  assert short.steps == 44


class _SharedCpu:
  """A stand-in for a shared CPU's clock: every timed call costs its step's seconds,
  times the machine's speed (it halves after ``switch_at`` calls, as this machine's
  cores do without warning), times 2 on every fifth call (another process), with 3%
  jitter."""

  def __init__(self, switch_at=None):
    self.calls, self.switch_at = 0, switch_at
    self.jitter = np.random.default_rng(0)

  def seconds(self, cost):
    self.calls += 1
    slow = 2.0 if self.switch_at is not None and self.calls > self.switch_at else 1.0
    disturbed = 2.0 if self.calls % 5 == 0 else 1.0
    return cost * slow * disturbed * (1 + 0.03 * self.jitter.uniform(-1, 1))


class _TimedLane:
  """What time_steps reads of a lane; its runner's timed calls go to the stand-in clock."""

  def __init__(self, cpu, cost):
    self.params, self.opt_state = {"w": np.zeros(2)}, ()
    self.chunk, self.seconds_per_step = None, np.nan
    self.runner = type("Runner", (), {"seconds_per_step": lambda _, *a: cpu.seconds(cost)})()

  def prepare(self, length):
    del length


def test_step_times_repeat_within_ten_percent_on_a_disturbed_machine():
  """time_steps' medians of interleaved rounds: the same step timed twice agrees within
  10% although one call in five is disturbed 2x, and where the machine halves its speed
  between rounds the lanes' ratio (what the race's step counts rest on) holds within 10%.
  A mean over the rounds, or lanes timed one after the other, fails both."""
  cpu = _SharedCpu()
  lanes = [_TimedLane(cpu, 1e-5), _TimedLane(cpu, 2.6e-5)]
  first, second = race_lib.time_steps(lanes, step_guess=1e-5), race_lib.time_steps(lanes)
  for a, b, cost in zip(first, second, (1e-5, 2.6e-5)):
    assert abs(a / b - 1) < 0.1 and abs(a / cost - 1) < 0.1, (a, b, cost)
  cpu = _SharedCpu(switch_at=9)  # during the rounds of the first call
  lanes = [_TimedLane(cpu, 1e-5), _TimedLane(cpu, 2.6e-5)]
  for fast, slow in (race_lib.time_steps(lanes, step_guess=1e-5), race_lib.time_steps(lanes)):
    assert abs(slow / fast / 2.6 - 1) < 0.1, (fast, slow)
