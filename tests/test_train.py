"""The fit loop: reshuffled epochs, ELBO history, every estimator, bit-identical resume."""

import os
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.training.batching import batch_indices
from conftest import BATCH, N_DATA, ctrl_c_at, run_python
from estimator_cases import CASES, parametrized


def test_batch_indices_are_reshuffled_epochs_and_windows_agree():
  key = jax.random.key(0)
  per_epoch = N_DATA // BATCH
  full = np.asarray(batch_indices(key, 0, 3 * per_epoch, N_DATA, BATCH))
  for e in range(3):
    epoch = full[e * per_epoch:(e + 1) * per_epoch].ravel()
    assert np.array_equal(np.sort(epoch), np.arange(N_DATA))  # each datum once per epoch
  assert not np.array_equal(full[:per_epoch], full[per_epoch:2 * per_epoch])
  for start, length in [(3, 4), (per_epoch - 1, per_epoch + 2), (2 * per_epoch, 1)]:
    window = np.asarray(batch_indices(key, start, length, N_DATA, BATCH))
    np.testing.assert_array_equal(window, full[start:start + length])


@pytest.mark.parametrize("name", parametrized(CASES))
def test_fit_improves_elbo_with_every_estimator(name, logreg_model, params0):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  factory, is_optimizer = CASES[name]
  est = factory(objective)
  opt = est if is_optimizer else optax.chain(est, optax.adam(2e-2))
  start = dsgrad.elbo(objective, params0, jax.random.key(1), 200)[0]
  result = dsgrad.fit(objective, opt, params0, jax.random.key(0), num_steps=60,
                      batch_size=BATCH, eval_every=20, elbo_samples=200, progress=False)
  h = result.history
  np.testing.assert_array_equal(h.step, [20, 40, 60])
  assert np.all(np.diff(h.wall_time) > 0)
  assert h.elbo[-1] > start + 10 * h.elbo_se[-1], (name, start, h.elbo)


def test_plain_optax_optimizer_and_progress_output(logreg_model, params0, capsys):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  result = dsgrad.fit(objective, optax.adam(1e-2), params0, jax.random.key(0),
                      num_steps=15, batch_size=BATCH, eval_every=10, elbo_samples=10)
  assert result.history.step.tolist() == [10, 15]
  assert np.all(np.isfinite(result.history.elbo))


def test_default_evaluations_are_one_per_epoch_and_at_most_a_hundred(logreg_model, params0):
  """Without eval_every, fit evaluates once per epoch (N / B = 10 steps here), or every
  num_steps / 100 steps (rounded up) where that is longer, so that a long run of cheap steps
  is not spent evaluating."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  kw = dict(batch_size=BATCH, elbo_samples=2, progress=False)
  short = dsgrad.fit(objective, optax.sgd(1e-3), params0, jax.random.key(0), num_steps=30, **kw)
  assert short.history.step.tolist() == [10, 20, 30]
  long = dsgrad.fit(objective, optax.sgd(1e-3), params0, jax.random.key(0), num_steps=2005, **kw)
  assert long.history.step.tolist() == list(range(21, 2005, 21)) + [2005]


def _joint_saga_run(model, params0):
  """``(objective, optimizer, fit settings, key, a whole run of 28 steps)``: the run that
  the resume tests interrupt."""
  objective = dsgrad.meanfield_gaussian(model)
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  kw = dict(batch_size=BATCH, eval_every=7, elbo_samples=5, progress=False)
  key = jax.random.key(3)
  return objective, opt, kw, key, dsgrad.fit(objective, opt, params0, key, num_steps=28, **kw)


def test_resume_from_checkpoint_is_bit_identical(logreg_model, params0, tmp_path):
  objective, opt, kw, key, whole = _joint_saga_run(logreg_model, params0)
  path = tmp_path / "fit.msgpack"
  dsgrad.fit(objective, opt, params0, key, num_steps=14, checkpoint_path=path, **kw)
  params, opt_state, step = dsgrad.restore_fit_checkpoint(path, params0, opt.init(params0))
  assert step == 14
  history = dsgrad.restore_fit_history(path)
  assert history.step.tolist() == [7, 14]
  # Steps are counts (they were float64 like the ELBO: 7.0, 14.0).
  assert history.step.dtype == np.int64 and whole.history.step.dtype == np.int64
  resumed = dsgrad.fit(objective, opt, params, key, num_steps=28, opt_state=opt_state,
                       start_step=step, history=history, **kw)
  chex.assert_trees_all_equal((resumed.params, resumed.opt_state),
                              (whole.params, whole.opt_state))
  # The resumed history is the uninterrupted one (wall-clock aside).
  np.testing.assert_array_equal(resumed.history.step, whole.history.step)
  np.testing.assert_array_equal(resumed.history.elbo, whole.history.elbo)
  np.testing.assert_array_equal(resumed.history.elbo_se, whole.history.elbo_se)
  assert np.all(np.diff(resumed.history.wall_time) > 0)
  # resume=True does the same from the checkpoint alone.
  again = dsgrad.fit(objective, opt, params0, key, num_steps=28, checkpoint_path=path,
                     resume=True, **kw)
  chex.assert_trees_all_equal(again.params, whole.params)
  np.testing.assert_array_equal(again.history.elbo, whole.history.elbo)
  assert dsgrad.restore_fit_checkpoint(path, params0, opt.init(params0))[2] == 28
  with pytest.raises(ValueError, match="history ends at step 14"):
    dsgrad.fit(objective, opt, params, key, num_steps=28, opt_state=opt_state,
               start_step=7, history=history, **kw)


@pytest.mark.parametrize("block", [1, 2])
def test_an_interrupted_fit_keeps_its_run_and_continues_it(logreg_model, params0, tmp_path,
                                                           monkeypatch, block):
  """Ctrl-C in fit used to lose every step trained (the state lives in the loop's locals).
  The run so far comes back in the exception, at the step reached, and continues, from
  it or from the checkpoint saved at the interrupt, to the uninterrupted run's parameters
  and evaluations (the one at the step reached, skipped by the interrupt, included)."""
  objective, opt, kw, key, whole = _joint_saga_run(logreg_model, params0)
  path = tmp_path / "fit.ckpt"
  ctrl_c_at(monkeypatch, block)
  with pytest.raises(dsgrad.Interrupted, match=f"step {7 * block} of 28.*resume=True"
                     ) as stop:
    dsgrad.fit(objective, opt, params0, key, num_steps=28, checkpoint_path=path, **kw)
  monkeypatch.undo()
  assert isinstance(stop.value, KeyboardInterrupt)  # a script still stops
  assert stop.value.step == 7 * block
  assert stop.value.result.history.step.tolist() == list(range(7, 7 * block, 7))
  part = dsgrad.fit(objective, opt, params0, key, num_steps=7 * block, **kw)
  chex.assert_trees_all_equal(stop.value.result.params, part.params)
  with pytest.raises(TypeError, match="not batch_size, key, which would not continue"):
    stop.value.resume(key=jax.random.key(4), batch_size=2)
  for continued in (stop.value.resume(), dsgrad.fit(objective, opt, params0, key, num_steps=28,
                                                    checkpoint_path=path, resume=True, **kw)):
    chex.assert_trees_all_equal((continued.params, continued.opt_state),
                                (whole.params, whole.opt_state))
    np.testing.assert_array_equal(continued.history.step, whole.history.step)
    np.testing.assert_array_equal(continued.history.elbo, whole.history.elbo)


def test_wall_time_counts_the_epoch_orders(logreg_model, params0, monkeypatch):
  """A block's epoch orders are part of the run's time (they were computed before its
  clock started): orders made 50 ms slower show in the history's wall-clock."""
  from dsgrad.training import batching
  window, calls = batching.EpochOrders.window, []

  def slow_window(self, *args):
    calls.append(None)
    time.sleep(0.05)
    return window(self, *args)

  monkeypatch.setattr(batching.EpochOrders, "window", slow_window)
  result = dsgrad.fit(dsgrad.meanfield_gaussian(logreg_model), optax.adam(1e-2), params0,
                      jax.random.key(0), num_steps=30, batch_size=BATCH, eval_every=10,
                      elbo_samples=0, progress=False)
  assert len(calls) >= 3 and result.history.wall_time[-1] >= 0.05 * len(calls)


@pytest.mark.parametrize("on_disk", [False, True])
def test_compiling_the_epoch_orders_is_compiling_not_the_steps_time(tmp_path, monkeypatch,
                                                                    on_disk):
  """The first run of a data size in a process compiles the programs that compute its
  epoch orders: that is compiling (``timing.compile``), not its steps' time (which
  counted it: a first run of 2,000 cheap steps took 0.39 s of steps against 0.02 s for
  the same run again). Here tracing them is made a second slower."""
  from dsgrad.training import batching
  real = batching._epoch_keys_program

  def slow_to_compile(num_data, count):
    program = real(num_data, count)

    def traced(key, first):
      time.sleep(1.0)  # once, while the program is traced
      return program(key, first)

    return jax.jit(traced)

  monkeypatch.setattr(batching, "_epoch_keys_program", slow_to_compile)
  rng = np.random.default_rng(0)
  data = {"x": rng.normal(size=(1237 + on_disk, 2)).astype(np.float32)}
  if on_disk:
    np.save(tmp_path / "x.npy", data["x"])
    data = {"x": dsgrad.data.open_memmap(tmp_path / "x.npy")}
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: -0.5 * jnp.sum((b["x"] - z) ** 2, -1),
      data, 2, reads=None)
  result = dsgrad.fit(objective, optax.adam(1e-2), dsgrad.families.by_name("meanfield", 2)
                      .params(), jax.random.key(0), num_steps=30, batch_size=10,
                      elbo_samples=0, progress=False)
  assert result.timing.compile >= 1.0
  assert result.timing.steps < 0.5 and result.history.wall_time[-1] < 0.5


def test_a_run_continued_between_evaluations_evaluates_where_the_whole_run_does(
    logreg_model, params0):
  """Segments end on multiples of ``eval_every`` counted from step 0, wherever a run
  continues (before: ``eval_every`` steps from ``start_step``)."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  kw = dict(batch_size=BATCH, eval_every=7, elbo_samples=5, progress=False)
  key, opt = jax.random.key(2), optax.adam(1e-2)
  whole = dsgrad.fit(objective, opt, params0, key, num_steps=21, **kw)
  part = dsgrad.fit(objective, opt, params0, key, num_steps=10, **kw)
  continued = dsgrad.fit(objective, opt, part.params, key, num_steps=21, start_step=10,
                         opt_state=part.opt_state, history=part.history, **kw)
  assert continued.history.step.tolist() == [7, 10, 14, 21]
  chex.assert_trees_all_equal(continued.params, whole.params)
  np.testing.assert_array_equal(continued.history.elbo[[0, 2, 3]], whole.history.elbo)


def test_one_segment_program_serves_a_run_s_shorter_segments(logreg_model, params0,
                                                              monkeypatch):
  """A run's last segment, and a continued run's first, were programs of their own length:
  a run whose steps were not a multiple of its segments compiled twice (joint SAGA on a
  200,000-row ordinal model: 7.1 s against 3.6 s). One program now runs any number of
  steps up to its length, with the batches and noise of the run in one-step segments."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  traced, real = [], dsgrad.training.segments.segment_program
  monkeypatch.setattr(dsgrad.training.segments, "segment_program",
                      lambda *args, **kw: traced.append(args[3]) or real(*args, **kw))
  kw = dict(batch_size=BATCH, eval_every=7, elbo_samples=0, progress=False)
  key = jax.random.key(2)
  optimizer = optax.chain(dsgrad.joint_svrg(objective, every=4), optax.adam(1e-2))
  whole = dsgrad.fit(objective, optimizer, params0, key, num_steps=19, **kw)  # 7 + 7 + 5
  part = dsgrad.fit(objective, optimizer, params0, key, num_steps=10, **kw)  # 7 + 3
  continued = dsgrad.fit(objective, optimizer, part.params, key, num_steps=19,  # 4 + 5
                         start_step=10, opt_state=part.opt_state, **kw)
  assert traced == [7]
  chex.assert_trees_all_equal(continued.params, whole.params)
  single = dsgrad.fit(objective, optimizer, params0, key, num_steps=19, **dict(kw, eval_every=1))
  chex.assert_trees_all_close(single.params, whole.params, rtol=1e-6, atol=1e-7)


def test_a_long_segment_settled_at_its_end_does_not_search_a_constant(logreg_model, params0):
  """A segment whose checks are settled at its end (a small carry) has no per-step check
  codes: their array is a constant, and searching it for the first failure, XLA folded
  the search at compile time: 2.3-3.0 s to compile a 10^5-step segment, 6.0-6.3 s at
  3 x 10^5, against 0.6-0.9 s for both now (naive on a small logistic regression, AMD
  EPYC, 2 cores). Checked on the program's text: no length-long comparison is left to
  fold; with per-step checks it is there."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-2))
  length = 100_000
  orders = dsgrad.training.batching.EpochOrders(jax.random.key(1), N_DATA, BATCH).window(
      0, length)
  texts = {}
  for at_end in (True, False):
    segment, _ = dsgrad.training.segments.segment_program(objective, optimizer, BATCH, length,
                                                          finite_at_end=at_end)
    texts[at_end] = segment.lower((params0, optimizer.init(params0)), jax.random.key(0),
                                  jnp.int32(0), jnp.int32(length), objective, orders,
                                  {}).as_text()
  searched = f"tensor<{length}xi1>"  # codes != 0, whose first True is the failure
  assert searched not in texts[True] and searched in texts[False]


def test_default_evaluations_cost_a_tenth_of_the_steps_and_the_last_is_in_full(
    monkeypatch):
  """With 250,000 data an evaluation of 100 draws reads 2.5e7 data-draws, against 2.5e5
  data in an epoch of steps: the default rhythm (100 draws an epoch) cost 9 times the
  steps on 200,000 data. The evaluations before the last now take 2 draws after the first
  and every third epoch (2 x 250,000 data-draws against 200,000 allowed, the floor), the
  last all ``elbo_samples`` (the ELBO fit reports), all on one compiled program; and a run
  interrupted at an evaluated segment's end, before its evaluation, continues to the same
  evaluations."""
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 250_000, 2)
  objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
  params = {"loc": jnp.zeros(2), "log_scale": jnp.full((2,), -1.0)}
  from dsgrad.training import evaluation_plan
  evaluated, evaluate = [], evaluation_plan._evaluate
  monkeypatch.setattr(evaluation_plan, "_evaluate",
                      lambda *a: evaluated.append(a[3:5]) or evaluate(*a))
  traced, elbo_run = [], dsgrad.elbo_estimates._elbo_run
  monkeypatch.setattr(dsgrad.elbo_estimates, "_elbo_run",
                      lambda *a, **kw: traced.append(kw["num_samples"]) or elbo_run(*a, **kw))
  kw = dict(num_steps=15_000, batch_size=100, elbo_samples=30, progress=False)
  key = jax.random.key(1)
  whole = dsgrad.fit(objective, optax.adam(1e-2), params, key, **kw)
  assert whole.history.step.tolist() == [2_500, 7_500, 15_000]
  # Draws (and the program's: the last evaluation's); (the program gives log q for the
  # ratios, the k-hat of this evaluation): the last's.
  assert evaluated == [((2, 30), (True, False)), ((2, 30), (True, False)),
                       ((30, 30), (True, True))]
  # One program: the evaluations of 2 draws run on the last's (of at least the default
  # draws, shared with other runs), which also gives PSIS's log ratios (a program of
  # their own compiled as long again).
  assert traced == [max(30, dsgrad.elbo_estimates.SHARED_PROGRAM_DRAWS)]
  value, se = dsgrad.elbo(objective, whole.params,
                          jax.random.fold_in(jax.random.split(key)[1], 15_000), 30)
  np.testing.assert_allclose([whole.history.elbo[-1], whole.history.elbo_se[-1]],
                             [value, se], rtol=1e-6)
  ctrl_c_at(monkeypatch, 3)  # as the segment that ends at step 7,500 ends
  with pytest.raises(dsgrad.Interrupted) as stop:
    dsgrad.fit(objective, optax.adam(1e-2), params, key, **kw)
  monkeypatch.undo()
  assert stop.value.step == 7_500 and stop.value.result.history.step.tolist() == [2_500]
  continued = stop.value.resume()
  np.testing.assert_array_equal(continued.history.step, whole.history.step)
  np.testing.assert_array_equal(continued.history.elbo, whole.history.elbo)


def test_a_run_limited_in_time_prices_no_compile_for_a_last_evaluation_it_shares(
    logreg_model, monkeypatch):
  """In memory the evaluations before the last run on the last one's ELBO program: a run
  limited in time keeps no room for compiling it again (it kept one compile's time), but
  still does for data on the host, whose evaluations compile a program per draw count."""
  from dsgrad.training import evaluation_plan
  plan = evaluation_plan.EvaluationPlan(10, 1, 2, 30)
  per_datum = dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)  # no k-hat
  evaluations = evaluation_plan.Evaluations(per_datum, plan, jax.random.key(0), None, None,
                                            timed=True)
  assert not evaluations.trust_check
  evaluations.compile_seconds, evaluations.warm_seconds, evaluations.draws = 1.0, 0.1, 2
  assert evaluations.last_seconds() == pytest.approx(1.5 * 0.1 / 2 * 30)
  monkeypatch.setattr(dsgrad.data, "host_leaves", lambda objective: {"x": None})  # on disk
  assert evaluations.last_seconds() == pytest.approx(1.0 + 1.5 * 0.1 / 2 * 30)


def test_a_first_fit_imports_arviz_stats_beside_its_first_compile(logreg_model, params0,
                                                                  monkeypatch):
  """k-hat's arviz-stats is imported (0.7 s, once a process) in a thread that runs beside
  the first segment's compile, not before it in the caller's: a first fit on 20,000 rows
  took 2.1-2.8 s against 2.6-3.5 s. Its k-hat is still computed. A stand-in import of
  0.5 s, in a process that has not imported it."""
  import sys
  import threading
  from dsgrad import psis
  from dsgrad.training import segments
  spans, real_stats, real_run = {}, psis.arviz_array_stats, segments.SegmentRunner.run
  imported = threading.Event()  # a later use waits, as on Python's lock of the module

  def stats(purpose):
    if "import" not in spans:
      spans["import"] = (time.perf_counter(), threading.current_thread().name)
      time.sleep(0.5)
      spans["import"] += (time.perf_counter(),)
      imported.set()
    imported.wait()
    return real_stats(purpose)

  def run(runner, *args, **kwargs):
    spans.setdefault("first segment", time.perf_counter())
    return real_run(runner, *args, **kwargs)

  monkeypatch.delitem(sys.modules, "arviz_stats.base", raising=False)  # as in a new process
  monkeypatch.setattr(psis, "arviz_array_stats", stats)
  monkeypatch.setattr(segments.SegmentRunner, "run", run)
  result = dsgrad.fit(dsgrad.meanfield_gaussian(logreg_model), optax.adam(1e-2), params0,
                      jax.random.key(1), num_steps=20, batch_size=BATCH, elbo_samples=30,
                      progress=False)
  (started, thread, done), segment = spans["import"], spans["first segment"]
  assert thread != threading.main_thread().name and started < segment < done, spans
  assert result.pareto_k is not None


def test_an_arviz_stats_that_fails_to_import_costs_k_hat_not_the_run(logreg_model, params0,
                                                                     monkeypatch):
  """Installed but broken (its import raises): found only at the last evaluation, now that
  the import runs beside the compile; the run and its ELBO are kept and the diagnosis
  says why k-hat is missing."""
  import sys
  from dsgrad import psis

  def broken(purpose):
    raise ImportError(f"{purpose}: arviz-stats is broken here")

  monkeypatch.delitem(sys.modules, "arviz_stats.base", raising=False)
  monkeypatch.setattr(psis, "arviz_array_stats", broken)
  result = dsgrad.fit(dsgrad.meanfield_gaussian(logreg_model), optax.adam(1e-2), params0,
                      jax.random.key(1), num_steps=20, batch_size=BATCH, elbo_samples=30,
                      progress=False)
  assert result.pareto_k is None and result.diagnosis.startswith("k-hat not computed") \
      and "arviz-stats is broken here" in result.diagnosis, result.diagnosis
  assert result.step == 20 and np.isfinite(result.history.elbo[-1])


def test_runs_of_fewer_draws_evaluate_on_the_default_runs_program(logreg_model, params0):
  """A run whose evaluations take two draws (the first part of a paced run) and a run of
  the default draws, on one objective in memory, share one ELBO program: the second
  compiled its own (0.6 s on 10^6 rows). The two-draw run's last estimate is dsgrad.elbo's
  for its key, as the default run's is."""
  from dsgrad.training import compile_cache
  objective = dsgrad.meanfield_gaussian(logreg_model)
  elbo_programs = lambda: sum(key[0] == "elbo_draws" for key in compile_cache._PROGRAMS)
  compile_cache.clear()
  settings = dict(num_steps=40, batch_size=BATCH, eval_every=20, progress=False)
  optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-2))
  key = jax.random.key(1)
  few = dsgrad.fit(objective, optimizer, params0, key, elbo_samples=2, **settings)
  assert elbo_programs() == 1
  default = dsgrad.fit(objective, optimizer, params0, key, **settings)
  assert elbo_programs() == 1, "the default run compiled an ELBO program of its own"
  evaluation_key = jax.random.fold_in(jax.random.split(key)[1], 40)  # fit's, at its end
  for result, draws in ((few, 2), (default, 100)):
    np.testing.assert_allclose(
        [result.history.elbo[-1], result.history.elbo_se[-1]],
        dsgrad.elbo(objective, result.params, evaluation_key, draws), rtol=1e-6)


def test_a_run_limited_in_time_keeps_the_last_evaluations_time_once_kept(logreg_model):
  """Steps that run into the time kept for the last evaluation in full end there. Before,
  the next piece found that evaluation no longer fit, handed its time to steps and left it
  the timed program's two draws (a 3 s run's 100 given draws were dropped so, on a busy
  machine, in three runs in a row)."""
  from dsgrad.training import evaluation_plan
  objective = dsgrad.meanfield_gaussian(logreg_model)

  def priced(warm_seconds):  # two draws timed warm; the last evaluation takes 100
    evaluations = evaluation_plan.Evaluations(
        objective, evaluation_plan.EvaluationPlan(10, 1, 2, 100), jax.random.key(0), None,
        None, timed=True)
    evaluations.warm_seconds, evaluations.draws = warm_seconds, 2
    return evaluations

  evaluations = priced(0.02)  # 15 ms a draw priced: 1.5 s kept of a 3 s run
  assert evaluations.last_seconds() == pytest.approx(1.5)
  piece = dict(length=1000, end=10 ** 6, step_seconds=1e-4)  # 0.1 s segments
  assert evaluations.end_within(3.0, 1.0, step=1000, **piece) == (10 ** 6, 1000)
  # 0.1 s past the time kept (a late segment, or an evaluation): the steps end now.
  assert evaluations.end_within(3.0, 1.6, step=6000, **piece) == (6000, 0)
  # A last evaluation in full that never fitted keeps nothing: steps take the time, the
  # timed program's draws end the run.
  assert priced(0.2).end_within(3.0, 1.0, step=1000, **piece) == (10 ** 6, 1000)


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0), "batch_size must be an integer >= 1"),
    (dict(batch_size=-3), "batch_size must be an integer >= 1"),
    (dict(batch_size=2.5), "batch_size must be an integer"),
    (dict(batch_size=N_DATA + 1), "dsgrad.fit: batch_size=.* exceeds"),
    (dict(eval_every=0), "eval_every must be an integer >= 1"),
    (dict(eval_every=-2), "eval_every must be an integer >= 1"),
    (dict(checkpoint_every=0), "checkpoint_every must be an integer >= 1"),
    (dict(num_steps=-1), "num_steps must be an integer >= 0"),
    (dict(checkpoint_path="/nonexistent-folder/run.ckpt"),
     "checkpoint_path .*: its folder '/nonexistent-folder' does not exist"),
    # os.access grants root /proc: the first save failed, after the first segment trained.
    pytest.param(dict(checkpoint_path="/proc/run.ckpt"),
                 "no file can be written in its folder '/proc'",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc")),
    # A run whose user thinks it is saved: before, nothing was, silently.
    (dict(checkpoint_every=5), "checkpoint_every needs a checkpoint_path"),
])
def test_fit_refuses_bad_arguments_by_name(logreg_model, params0, kwargs, match):
  """every bad count or path is refused before training, naming it
  (before: ZeroDivisionError, an obscure TypeError, a silent default, or an error only
  after the first segment had trained)."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  args = {**dict(num_steps=4, batch_size=BATCH, progress=False, elbo_samples=0), **kwargs}
  with pytest.raises(ValueError, match=match):
    dsgrad.fit(objective, optax.adam(1e-2), params0, jax.random.key(0), **args)


@pytest.mark.parametrize("change,match", [
    (dict(batch_size=BATCH // 2), f"with batch_size={BATCH}, but this call has "
                                  f"batch_size={BATCH // 2}"),
    (dict(key=jax.random.key(4)), "with another key than this call's"),
])
def test_resume_with_other_settings_is_refused(logreg_model, params0, tmp_path, change, match):
  """``fit(resume=True)`` with another batch size or key used to continue
  silently a run that is not the original one."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  opt = optax.adam(1e-2)
  kw = dict(num_steps=8, batch_size=BATCH, eval_every=4, elbo_samples=0, progress=False,
            checkpoint_path=tmp_path / "fit.ckpt", resume=True)
  dsgrad.fit(objective, opt, params0, jax.random.key(3), **kw)
  kw["num_steps"] = 12
  args = {**dict(key=jax.random.key(3)), **kw, **change}
  with pytest.raises(ValueError, match=match):
    dsgrad.fit(objective, opt, params0, **args)
  # The same settings resume (raw uint32 key data is the same key).
  again = dsgrad.fit(objective, opt, params0, **{**kw, "key": jax.random.key_data(
      jax.random.key(3))})
  assert int(again.history.step[-1]) == 12


_KILLED_CHILD = """
import sys, jax, optax, dsgrad
from dsgrad.models import logistic_regression, synthetic_logistic_data
x, y, _ = synthetic_logistic_data(jax.random.key(0), 50, 5)
objective = dsgrad.meanfield_gaussian(logistic_regression(x, y))
opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
params = dsgrad.meanfield_init(logistic_regression(x, y))
dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=10**7, batch_size=5,
           eval_every=10, elbo_samples=0, progress=False, checkpoint_path=sys.argv[1],
           resume=True)
"""


def _killed_child_problem():
  """The objective, optimizer, initial params and fit settings of _KILLED_CHILD."""
  from dsgrad.models import logistic_regression, synthetic_logistic_data
  x, y, _ = synthetic_logistic_data(jax.random.key(0), 50, 5)
  model = logistic_regression(x, y)
  objective = dsgrad.meanfield_gaussian(model)
  opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  kw = dict(batch_size=5, eval_every=10, elbo_samples=0, progress=False)
  return objective, opt, dsgrad.meanfield_init(model), kw


def _assert_resume_equals_whole_run(path, total):
  """Resuming _KILLED_CHILD's run from ``path`` to ``total`` steps ends bit for bit where
  an uninterrupted run does."""
  objective, opt, params, kw = _killed_child_problem()
  resumed = dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=total,
                       checkpoint_path=path, resume=True, **kw)
  whole = dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=total, **kw)
  chex.assert_trees_all_equal((resumed.params, resumed.opt_state),
                              (whole.params, whole.opt_state))


@pytest.mark.slow  # test_kills_during_checkpoint_writes_... kills three times, one mid-write
def test_kill_9_during_fit_loses_nothing(tmp_path):
  """A run killed with SIGKILL at an arbitrary moment (mid-segment or mid-save) resumes
  from its last checkpoint to the parameters and state of an uninterrupted run, bit for
  bit (docs/errors.md)."""
  import os
  import subprocess
  import sys
  import time
  path = tmp_path / "run.ckpt"
  child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(path)])
  try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
      if path.exists() and os.path.getsize(path) > 0:
        time.sleep(0.5)  # let it write a few more checkpoints
        break
      time.sleep(0.05)
  finally:
    child.kill()
    child.wait(timeout=30)
  # Killed between a save's two renames, the newest checkpoint is the previous one.
  newest = dsgrad.training.checkpoint.latest(path)
  assert newest is not None, "the child wrote no checkpoint within 120 s"
  objective, opt, params, kw = _killed_child_problem()
  saved_step = dsgrad.restore_fit_checkpoint(newest, params, opt.init(params))[2]
  assert saved_step >= 10
  _assert_resume_equals_whole_run(path, saved_step + 20)
  # The orphaned temporary was removed; the checkpoint replaced last is kept beside it.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt", "run.ckpt.prev"]


_INTERRUPTED_CHILD = """
import signal, sys, jax, numpy as np, optax, dsgrad
from dsgrad.models import logistic_regression, synthetic_logistic_data
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's Ctrl-C
x, y, _ = synthetic_logistic_data(jax.random.key(0), 50, 5)
objective = dsgrad.meanfield_gaussian(logistic_regression(x, y))
opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
params = dsgrad.meanfield_init(logistic_regression(x, y))
print("ready", flush=True)
try:
  dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=10**8, batch_size=5,
             eval_every=10, elbo_samples=0, progress=False)
except dsgrad.Interrupted as stop:
  np.savez(sys.argv[1], step=stop.step, **stop.result.params)
"""


@pytest.mark.slow  # test_an_interrupted_fit_keeps_its_run_... covers it without a signal
def test_ctrl_c_during_fit_keeps_the_run(tmp_path):
  """A real SIGINT, arriving wherever the loop is, gives back the state of an
  uninterrupted run at the step reached, bit for bit."""
  import signal
  import subprocess
  import sys
  import time
  path = tmp_path / "kept.npz"
  child = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_CHILD, str(path)],
                           stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline().strip() == "ready"
    time.sleep(4)  # its first segment compiled, thousands of steps run
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=60) == 0
  finally:
    child.kill()
  kept = np.load(path)
  step = int(kept["step"])
  assert step >= 10 and step % 10 == 0
  objective, opt, params, kw = _killed_child_problem()
  part = dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=step, **kw)
  chex.assert_trees_all_equal({k: kept[k] for k in part.params}, part.params)


def _size_or_zero(path) -> int:
  try:
    return path.stat().st_size
  except FileNotFoundError:
    return 0


def test_kills_during_checkpoint_writes_and_a_damaged_checkpoint_lose_nothing(tmp_path):
  """Three SIGKILLs, the second as soon as a checkpoint write is seen in progress (its
  temporary file exists), each followed by the same command; then the checkpoint is
  damaged on disk. The damage is refused naming the previous checkpoint, which is intact,
  and the run resumed from it ends bit for bit where an uninterrupted run does."""
  import os
  import shutil
  import subprocess
  import sys
  import time
  from dsgrad.training.checkpoint import previous_path, temp_prefix
  path = tmp_path / "run.ckpt"
  for attempt in range(3):
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(path)])
    try:
      deadline = time.monotonic() + 120
      saw_write = False
      while time.monotonic() < deadline and child.poll() is None:
        writing = any(p.name.startswith(temp_prefix(str(path))) for p in tmp_path.iterdir())
        if attempt == 1 and writing and path.exists():
          saw_write = True
          break  # kill now: mid-write
        # The write renames files: the checkpoint can vanish between two looks at it.
        if attempt != 1 and os.path.exists(path) and _size_or_zero(path) > 0:
          time.sleep(0.3)
          break
        time.sleep(0.001 if attempt == 1 else 0.05)
    finally:
      child.kill()
      child.wait(timeout=30)
    # A kill between a save's two renames leaves only the previous checkpoint: that is
    # the newest one, and the next command resumes from it.
    assert dsgrad.training.checkpoint.latest(path) is not None, (
        "the child wrote no checkpoint within 120 s")
    if attempt == 1:
      assert saw_write, "no checkpoint write was caught in progress within 120 s"
  objective, opt, params, kw = _killed_child_problem()
  # Resume once, so that both the newest checkpoint and the one it replaced exist.
  first = dsgrad.restore_fit_checkpoint(dsgrad.training.checkpoint.latest(path), params,
                                        opt.init(params))[2]
  dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=first + 20,
             checkpoint_path=path, resume=True, **kw)
  previous = previous_path(path)
  saved_step = dsgrad.restore_fit_checkpoint(previous, params, opt.init(params))[2]
  assert saved_step == first + 10
  # Damage the newest checkpoint: truncate it.
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match=r"corrupt.*intact at .*run\.ckpt\.prev"):
    dsgrad.fit(objective, opt, params, jax.random.key(3), num_steps=saved_step + 20,
               checkpoint_path=path, resume=True, **kw)
  shutil.move(previous, path)
  _assert_resume_equals_whole_run(path, saved_step + 20)


def test_the_time_split_adds_up_to_the_call(logreg_model, params0):
  """fit's timing: steps as the history counts them, compiling, evaluations and setup,
  each non-negative (no part counted twice), adding up to the call's wall-clock as timed
  outside it; evaluations cost next to nothing where none are made."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  optimizer = optax.chain(dsgrad.joint_svrg(objective), optax.adam(1e-2))
  for samples in (30, 0):
    started = time.perf_counter()
    result = dsgrad.fit(objective, optimizer, params0, jax.random.key(0), num_steps=60,
                        batch_size=BATCH, elbo_samples=samples, progress=False)
    outside = time.perf_counter() - started
    t = result.timing
    assert all(part >= 0 for part in t)
    np.testing.assert_allclose(t.steps + t.compile + t.evaluations + t.setup, t.total,
                               rtol=1e-9)
    assert t.total <= outside and t.total > 0.9 * outside - 0.01
    assert t.steps == pytest.approx(float(result.history.wall_time[-1]), rel=1e-6)
    assert t.compile == result.compile_seconds
    assert t.evaluations > 0 if samples else t.evaluations < 0.05


def test_a_run_limited_in_time_fills_its_progress_bar_as_the_time_runs_out(
    logreg_model, params0, monkeypatch):
  """With num_steps far beyond what max_seconds affords, the bar's total follows the steps
  the time is expected to allow (it stood at num_steps: a run that ended at its limit
  looked stopped at 4%) and the bar closes full."""
  import io
  import tqdm.auto
  bars = []

  class Recorded(tqdm.auto.tqdm):
    def __init__(self, *args, **kwargs):
      self.totals = []
      super().__init__(*args, **{**kwargs, "file": io.StringIO()})
      bars.append(self)

    def refresh(self, *args, **kwargs):
      self.totals.append(self.total)

  monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
  result = dsgrad.fit(dsgrad.meanfield_gaussian(logreg_model), optax.adam(1e-3), params0,
                      jax.random.key(0), num_steps=10**8, max_seconds=2.0, batch_size=BATCH,
                      elbo_samples=2, progress=True)
  (shown,) = bars
  assert result.step < 10**8 // 10
  assert shown.n == result.step and shown.totals[-1] == result.step, shown.totals
  # Before the step is timed, no total: num_steps showed an end hours away.
  assert 10**8 not in shown.totals and shown.totals[0] is None, shown.totals[:3]
  # Mid-run, once the step was timed, within a factor of two of where the run ended.
  middle = shown.totals[len(shown.totals) // 2]
  assert 0.5 * result.step < middle < 2 * result.step, (shown.totals, result.step)


def test_a_history_that_is_not_one_is_refused(logreg_model):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  fit = lambda history: dsgrad.fit(  # noqa: E731
      objective, optax.adam(1e-2), dsgrad.meanfield_init(logreg_model), jax.random.key(0),
      num_steps=4, batch_size=5, progress=False, start_step=2, history=history)
  # A list failed with "'list' object has no attribute 'step'"; fields of unequal lengths
  # were taken as they were.
  with pytest.raises(TypeError, match=r"history must be a dsgrad.History .*got list"):
    fit([1, 2])
  with pytest.raises(ValueError, match="history's fields have different lengths"):
    fit(dsgrad.History(np.arange(2.0), np.arange(1.0), np.zeros(2), np.zeros(2)))


_CACHED_CHILD = """
import jax, optax
events = []
jax.monitoring.register_event_listener(lambda name, **_: events.append(name))
import dsgrad
x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key({seed}), 500, 4)
objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
dsgrad.compile_fit(objective, optax.chain(dsgrad.cv(objective), optax.adam(1e-2)),
                   dsgrad.meanfield_init(objective), jax.random.key(0), num_steps=100,
                   batch_size=10, elbo_samples=0)
print(events.count("/jax/compilation_cache/compile_requests_use_cache"),
      events.count("/jax/compilation_cache/cache_hits"))
"""


@pytest.mark.slow
def test_a_second_process_on_other_data_of_the_same_shapes_compiles_nothing(tmp_path):
  """JAX's persistent compilation cache serves every program of a fit in the next process
  that builds the same model on other data of the same shapes: the data are the programs'
  arguments, not constants folded into them (which would make every key new)."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  counts = [tuple(map(int, run_python(_CACHED_CHILD.format(seed=seed), env=env).split()[-2:]))
            for seed in (1, 2)]
  (requests, hits_first), (requests_again, hits) = counts
  assert requests > 0 and hits_first == 0, counts
  assert requests_again == requests and hits == requests, counts
