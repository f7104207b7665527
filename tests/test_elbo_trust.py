"""An ELBO that cannot be wrong silently: estimates above a bound on the log evidence, and
traces that diverge, are flagged in fit's result and by dsgrad.elbo."""

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.elbo_trust import ELBOWarning, elbo_trace_warnings
from dsgrad.models.base import Model, model_data
from dsgrad.training.resume import History


def _history(values, errors=None):
  values = np.asarray(values, np.float64)
  errors = np.full_like(values, 1.0) if errors is None else np.asarray(errors, np.float64)
  steps = np.arange(1, len(values) + 1) * 100.0
  return History(steps, steps * 1e-3, values, errors)


def test_trace_warnings_name_each_kind_and_spare_a_healthy_trace():
  healthy = _history([-5e5, -2e4, -3000.0, -2100.0, -2050.0, -2060.0, -2040.0])
  assert elbo_trace_warnings(healthy) == ()
  assert elbo_trace_warnings(healthy, bound=0.0) == ()
  # -44,417 -> +9.0e8: the full-rank path-derivative failure once reported as progress.
  (jump,) = elbo_trace_warnings(_history([-50000.0, -44417.0, 9.0e8]))[:1]
  assert "from -44417 to 9e+08 between steps 200 and 300" in jump and "diverging" in jump
  falls = elbo_trace_warnings(_history([-3000.0, -2000.0, -1900.0, -2600.0]))
  assert len(falls) == 1 and "below its best -1900 (step 300)" in falls[0]
  # A fall within ten standard errors is noise, not a divergence.
  assert elbo_trace_warnings(_history([-3000.0, -1900.0, -2600.0], [10, 10, 80])) == ()
  above = elbo_trace_warnings(_history([-10.0, -2.0, 0.5], [0.1, 0.1, 0.1]), bound=0.0)
  assert len(above) == 1 and "0.5" in above[0] and "after step 300" in above[0]
  # Within three standard errors of the bound: Monte Carlo error, not a failure.
  assert elbo_trace_warnings(_history([-10.0, 0.2], [0.1, 0.1]), bound=0.0) == ()


def test_an_elbo_that_grows_without_bound_by_small_factors_is_flagged():
  # Successive ratios of 2-10x: no jump between two evaluations reaches 10^3.
  climbing = _history([1686.0, 2853.0, 7195.0, 2.9e4, 2.6e5, 2.6e6, 7.0e7, 1.7e9, 4.9e10])
  assert elbo_trace_warnings(climbing) == ()
  (grown,) = elbo_trace_warnings(climbing, num_data=300)
  assert "from 1686 (step 100) to 2.6e+06 (step 600)" in grown and "sign" in grown
  falling = _history([-900.0, -5000.0, -3.0e4, -2.0e5, -1.5e6])
  assert "orders of magnitude" in elbo_trace_warnings(falling, num_data=300)[0]
  # Through zero to a large positive ELBO (precise continuous data): below 10^3 nats a
  # datum, where a proper model's log density stays.
  healthy = _history([-5.0e5, -2.0e4, -40.0, 0.5, 900.0, 2100.0, 2300.0, 2310.0])
  assert elbo_trace_warnings(healthy, num_data=1000) == ()


def test_a_run_diverged_before_its_first_estimate_is_judged_from_where_it_began():
  # A Poisson regression with Adam too fast (held-out probe) went from -1.2e6 at its start
  # to -2.6e17 by its first evaluation and stayed there: a trace with nothing to compare.
  diverged = _history([-2.6e17, -3.3e17, -2.5e17])
  assert elbo_trace_warnings(diverged, num_data=100_000) == ()
  jump, *_ = elbo_trace_warnings(diverged, num_data=100_000, start=(0, lambda: -1.2e6))
  assert "from -1.2e+06 to -2.6e+17 between steps 0 and 100" in jump and "diverging" in jump
  # A start as poor, or one not finite, gives nothing to flag; and where the first estimate
  # is within a thousand nats a datum the start is not estimated at all.
  assert elbo_trace_warnings(diverged, num_data=100_000, start=(0, -5e17)) == ()
  assert elbo_trace_warnings(diverged, num_data=100_000, start=(0, float("-inf"))) == ()
  never = lambda: pytest.fail("the start was estimated for a trace that is not suspect")
  assert elbo_trace_warnings(_history([-5e7, -2e5]), num_data=100_000, start=(0, never)) == ()


class _Leap(NamedTuple):
  leapt: jax.Array


def _leap_once(_steps=None, size=1e6):
  """An update rule that moves the means ``size``-fold along the gradient at its first
  step and then stays: the ELBO leaps by orders of magnitude and is steady after."""
  def update(grads, state, params=None):
    loc = jnp.where(state.leapt, 0.0, -size * grads["loc"])
    return {"loc": loc, "log_scale": jnp.zeros_like(grads["log_scale"])}, _Leap(jnp.array(True))

  return optax.GradientTransformation(lambda params: _Leap(jnp.array(False)), update)


def test_fit_and_the_advices_fit_flag_a_run_that_diverged_before_any_estimate():
  model, _ = _conjugate_regression()
  objective = dsgrad.meanfield_gaussian(model)
  params = dsgrad.meanfield_init(model)
  result = dsgrad.fit(objective, _leap_once(), params, jax.random.key(0), num_steps=50,
                      batch_size=50, eval_every=50, progress=False)
  assert np.isfinite(result.history.elbo[-1]) and result.history.elbo[-1] < -1e9
  assert any("between steps 0 and 50" in w and "diverging" in w for w in result.warnings), \
      result.warnings
  # recommend's naive run leapt before the fit that follows it began: its trace is judged
  # from your params, not from fit's.
  advice = dsgrad.recommend(objective, _leap_once, params, jax.random.key(0), batch_size=50,
                            budget=1.0, progress=False)
  followed = advice.fit(progress=False, elbo_samples=10)
  assert any("between steps 0 and" in w and "diverging" in w for w in followed.warnings), \
      followed.warnings


@pytest.mark.slow  # 13 s: each race begins once cv is compiled
def test_a_race_from_a_diverged_naive_run_says_so_instead_of_advising_naive():
  """Every candidate races from naive's run: where naive itself diverged, the race
  compares nothing, and the advice says so instead of "stay with naive"."""
  model, _ = _conjugate_regression()
  advice = dsgrad.recommend(dsgrad.meanfield_gaussian(model), _leap_once,
                            dsgrad.meanfield_init(model), jax.random.key(0), batch_size=50,
                            budget=30.0, share=0.1, race_at=0.05, candidates=("naive", "cv"),
                            progress=False)
  assert "nats over naive at equal time" in advice.reasons[-2], advice.reasons  # cv raced
  assert advice.best == "naive"
  assert advice.reasons[-1].startswith("naive's own run cannot be trusted: the ELBO went "
                                       "from"), advice.reasons
  assert "diverging" in advice.reasons[-1] and "stay with naive" not in str(advice)
  # Leapt past float32's range, naive's ELBO is -inf: the error blames the run, not the
  # model (finite at your params).
  with pytest.raises(dsgrad.diagnostics.NonFiniteELBO, match=r"dsgrad.recommend, at naive's "
                     r"params [\d,]+ steps from yours \(where it is finite: a step size too "
                     r"large diverges so\): the ELBO is not finite"):
    dsgrad.recommend(dsgrad.meanfield_gaussian(model), lambda n: _leap_once(n, size=1e25),
                     dsgrad.meanfield_init(model), jax.random.key(0), batch_size=50,
                     budget=30.0, share=0.1, race_at=0.05, candidates=("naive", "cv"),
                     progress=False)


def test_a_log_likelihood_with_its_sign_flipped_is_flagged_by_fit():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(300, 3)).astype(np.float32)
  y = (x @ np.ones(3) + rng.normal(size=300)).astype(np.float32)
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2), lambda z, b: 0.5 * (b["y"] - b["x"] @ z) ** 2,
      {"x": x, "y": y}, 3)
  # It ended at an ELBO of 3e19 with q's scales near e^19 and no warning. From the default
  # start (sd 0.1) the ELBO crosses the warning's 1,000-fold growth after about 700 steps.
  result = dsgrad.fit(objective, optax.adam(0.05), dsgrad.meanfield_init(objective),
                      jax.random.key(0), num_steps=1000, batch_size=30, progress=False)
  assert any("no upper bound" in w for w in result.warnings), result.warnings


def _conjugate_regression(bound_shift=None):
  """y_n ~ N(x_n . z, 1), z ~ N(0, I): the log evidence in closed form."""
  rng = np.random.default_rng(0)
  n, d = 200, 3
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = (x @ np.ones(d) + rng.normal(size=n)).astype(np.float32)
  data = model_data(x=x, y=y)
  log_2pi = np.log(2 * np.pi)
  x64, y64 = x.astype(np.float64), y.astype(np.float64)
  precision = x64.T @ x64 + np.eye(d)
  mean = np.linalg.solve(precision, x64.T @ y64)
  log_z = float(-0.5 * n * log_2pi - 0.5 * np.linalg.slogdet(precision)[1]
                - 0.5 * (y64 @ y64 - mean @ precision @ mean))
  bound = None if bound_shift is None else log_z + bound_shift
  return Model(lambda z: -0.5 * jnp.sum(z ** 2) - 0.5 * d * log_2pi,
               lambda z, i: -0.5 * (i["y"] - i["x"] @ z) ** 2 - 0.5 * log_2pi,
               n, d, name="regression", data=data, log_evidence_bound=bound), precision


def test_fit_flags_a_diverging_run_and_not_a_converging_one():
  model, precision = _conjugate_regression()
  objective = dsgrad.meanfield_gaussian(model)
  largest = float(np.linalg.eigvalsh(precision).max())
  runs = {}
  for name, step_size in (("diverging", 2.1 / largest), ("converging", 0.5 / largest)):
    runs[name] = dsgrad.fit(objective, optax.sgd(step_size), dsgrad.meanfield_init(model, 0.0, -2.0),
                            jax.random.key(0), num_steps=200, batch_size=200, eval_every=40,
                            progress=False)
  assert runs["converging"].warnings == ()
  assert any("diverging" in w for w in runs["diverging"].warnings), runs["diverging"].warnings
  assert np.all(np.isfinite(runs["diverging"].history.elbo))


def test_an_elbo_above_the_models_evidence_bound_is_flagged():
  """With the exact log evidence as the bound nothing is flagged; with a bound set 50 nats
  below it (a wrong bound stands in for a wrong estimate), fit's result and dsgrad.elbo
  both say so."""
  key = jax.random.key(0)
  flagged = {}
  for shift in (0.0, -50.0):
    model, _ = _conjugate_regression(bound_shift=shift)
    objective = dsgrad.meanfield_gaussian(model)
    assert objective.log_evidence_bound == model.log_evidence_bound
    result = dsgrad.fit(objective, optax.adam(0.05), dsgrad.meanfield_init(model), key,
                        num_steps=400, batch_size=50, progress=False)
    flagged[shift] = result.warnings
  assert flagged[0.0] == ()
  assert any("above" in w and "log_evidence_bound" in w for w in flagged[-50.0]), flagged
  with pytest.warns(ELBOWarning, match="above"):
    dsgrad.elbo(objective, result.params, key, 100)


def test_discrete_data_models_bound_the_elbo_by_zero():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 50, 3)
  players = dsgrad.models.synthetic_bradley_terry_data(jax.random.key(1), 5, 40)
  for model in (dsgrad.models.logistic_regression(x, y),
                dsgrad.models.softmax_regression(x, (y > 0).astype(jnp.int32), 2),
                dsgrad.models.bradley_terry(*players[:2], 5)):
    assert model.log_evidence_bound == 0.0
    assert dsgrad.meanfield_gaussian(model).log_evidence_bound == 0.0


def test_a_run_too_large_to_keep_a_copy_of_keeps_its_params_where_the_failing_block_began(
    monkeypatch):
  """A carry above CHECK_AT_END_BYTES (a big SAGA table) is donated to its program: the
  params alone are copied at each block's start, and a divergence keeps those."""
  from dsgrad.training import segments
  monkeypatch.setattr(segments, "CHECK_AT_END_BYTES", 0)  # this small carry counts as large
  model, precision = _conjugate_regression()
  objective = dsgrad.meanfield_gaussian(model)
  settings = dict(batch_size=200, eval_every=5, progress=False)  # it fails at step 13
  rate = 4.0 / float(np.linalg.eigvalsh(precision).max())
  with pytest.raises(ValueError, match="non-finite|not finite") as caught:
    dsgrad.fit(objective, optax.sgd(rate), dsgrad.meanfield_init(model, 0.0, -2.0),
               jax.random.key(0), num_steps=2000, **settings)
  failed = caught.value.step
  result = caught.value.result
  assert result.opt_state is None and result.step == failed // 5 * 5 > 0, (result.step, failed)
  assert "optimizer state, too large to copy, is not" in caught.value.__notes__[-1]
  again = dsgrad.fit(objective, optax.sgd(rate), dsgrad.meanfield_init(model, 0.0, -2.0),
                     jax.random.key(0), num_steps=result.step, **settings).params
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(result.params)):
    np.testing.assert_array_equal(a, b)


def test_a_run_that_turns_non_finite_part_way_is_named_a_divergence_and_one_from_the_start_not():
  model, precision = _conjugate_regression()
  objective = dsgrad.meanfield_gaussian(model)
  largest = float(np.linalg.eigvalsh(precision).max())
  # Its message alone names a datum the likelihood deems impossible or an overflow in the
  # model: causes of a model that is non-finite from the start, not of a step too large.
  with pytest.raises(ValueError, match="non-finite|not finite") as caught:
    dsgrad.fit(objective, optax.sgd(4.0 / largest), dsgrad.meanfield_init(model, 0.0, -2.0),
               jax.random.key(0), num_steps=2000, batch_size=200, eval_every=500,
               progress=False)
  note, kept = caught.value.__notes__
  assert "most likely diverged" in note and "step size" in note and "N = 200 data" in note
  # Judged by the failing step's rows at the start, not by a pass over all the data (four
  # seconds of 16 draws on 100,000 rows of 2,000 features, in the advice's race too).
  assert "each of the failing step's rows has a finite term and gradient" in note, note
  ran = int(note.split("dsgrad.fit ran ")[1].split(" steps")[0].replace(",", ""))
  assert 0 < ran < 2000
  # Nothing trained is lost: the state after the last finite step, the same as a run of
  # that many steps (whose own ELBO, after it, is not finite: kept on its error too).
  result = caught.value.result
  assert result.step == ran and f"state after step {ran} (its last finite one)" in kept
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves((result.params,
                                                                     result.opt_state)))
  assert np.all(result.history.step <= ran) and np.all(np.isfinite(result.history.elbo))
  try:
    again = dsgrad.fit(objective, optax.sgd(4.0 / largest), dsgrad.meanfield_init(model, 0.0,
                       -2.0), jax.random.key(0), num_steps=ran, batch_size=200,
                       eval_every=500, progress=False).params
  except ValueError as error:
    again = error.result.params
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(result.params)):
    np.testing.assert_array_equal(a, b)

  impossible = Model(model.log_prior, lambda z, i: jnp.where(i["y"] > 4.0, -jnp.inf, 0.0),
                     model.num_data, model.latent_dim, data=model.data)
  with pytest.raises(ValueError, match="non-finite|not finite") as caught:
    dsgrad.fit(dsgrad.meanfield_gaussian(impossible), optax.sgd(1e-3),
               dsgrad.meanfield_init(model), jax.random.key(0), num_steps=20, batch_size=200,
               progress=False)
  # Not a divergence; the step it trained is kept all the same (a datum fixed, it continues).
  notes = getattr(caught.value, "__notes__", [])
  assert not any("diverged" in note for note in notes) and caught.value.result.step == 1, notes


def test_a_where_that_masks_a_non_finite_branch_is_named_with_the_fix_that_trains():
  """jnp.where(t > 0, log(t) ..., 0) is finite at t = 0 but its gradient is NaN (the
  masked branch's -inf times the mask's zero): the error names the row and the masked
  input, and the form it gives trains."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 2)).astype(np.float32)
  t = np.abs(rng.normal(size=40)).astype(np.float32)
  t[9] = 0.0
  prior = lambda z: -0.5 * jnp.sum(z ** 2)
  trap = lambda z, b: jnp.where(b["t"] > 0, -0.5 * (jnp.log(b["t"]) - b["x"] @ z) ** 2, 0.0)
  safe_log = lambda t: jnp.log(jnp.where(t > 0, t, 1.0))  # the message's form
  fixed = lambda z, b: jnp.where(b["t"] > 0, -0.5 * (safe_log(b["t"]) - b["x"] @ z) ** 2, 0.0)
  settings = dict(num_steps=20, batch_size=40, progress=False)
  with pytest.raises(ValueError, match="non-finite") as caught:
    dsgrad.fit(dsgrad.objective_from_logdensity(prior, trap, {"x": x, "t": t}, 2),
               optax.adam(1e-2), dsgrad.families.by_name("meanfield", 2).params(),
               jax.random.key(0), **settings)
  (note,) = caught.value.__notes__
  assert "data row 9: a finite term whose gradient is not" in note, note
  assert "jnp.where(t > 0, jnp.log(jnp.where(t > 0, t, 1.0)), 0.0)" in note, note
  result = dsgrad.fit(dsgrad.objective_from_logdensity(prior, fixed, {"x": x, "t": t}, 2),
                      optax.adam(1e-2), dsgrad.families.by_name("meanfield", 2).params(),
                      jax.random.key(0), **settings)
  assert np.all(np.isfinite(result.history.elbo))


def test_a_step_that_fails_on_some_rows_names_them_and_what_is_not_finite():
  """A datum whose term (log of 0) or only its gradient (sqrt at 0) is not finite makes
  the first step's update non-finite; the error names those rows of its batch, each with
  which of the two it is, and no divergence."""
  t = np.ones(64, np.float32)
  t[[17, 41]] = 0.0
  ok = np.ones(64, np.float32)
  ok[41] = 0.0  # row 41's log term reads a 1, its sqrt term a 0
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: (-0.5 * (1.0 - z[0] * jnp.log(jnp.where(b["ok"] > 0, b["t"], 1.0))) ** 2
                    - jnp.sqrt(b["t"] * z[1] ** 2 + 0.0)),
      {"t": t, "ok": ok}, latent=2)
  params = dsgrad.families.by_name("meanfield", 2).params()
  with pytest.raises(ValueError, match="non-finite|not finite") as caught:
    dsgrad.fit(objective, optax.sgd(1e-3), params, jax.random.key(0), num_steps=5,
               batch_size=64, progress=False)
  (note,) = caught.value.__notes__
  assert "data row 17: a term that is not finite" in note, note
  assert "data row 41: a finite term whose gradient is not" in note, note
  assert "diverged" not in note
  named = re.findall(r"data rows? ([\d, ]+):", note)
  assert named == ["17", "41"], named  # the batch's 62 other rows are finite


def test_a_batch_whose_every_term_fails_at_one_draw_blames_the_draw_not_the_data():
  """sqrt(1 - z) is finite for z <= 1 only: a draw of q above 1 makes every row's term
  and gradient NaN at once. The note named all 32 rows of the batch as data to check; it
  says the draw is at fault. Data impossible in every row (a negative variance) are still
  named as data."""
  y = np.linspace(-1.0, 1.0, 32).astype(np.float32)
  objective = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: -0.5 * (b["y"] - z[0]) ** 2 + jnp.sqrt(1.0 - z[0]), {"y": y}, latent=1)
  # q centred at 0.9 with scale 0.1: one draw in six lies past 1.
  params = {"loc": jnp.array([0.9]), "log_scale": jnp.log(jnp.array([0.1]))}
  with pytest.raises(ValueError, match="non-finite|not finite") as caught:
    dsgrad.fit(objective, optax.sgd(1e-6), params, jax.random.key(0), num_steps=200,
               batch_size=32, elbo_samples=0, progress=False)
  note = caught.value.__notes__[0]
  assert "every row's term is not finite at one draw: the draw, not the data" in note, note
  assert "data row" not in note
  variances = np.full(32, -1.0, np.float32)  # a negative variance in every row
  impossible = dsgrad.objective_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: -0.5 * (z[0] - jnp.sqrt(b["v"])) ** 2, {"v": variances}, latent=1)
  with pytest.raises(ValueError, match="not finite|non-finite") as caught:
    dsgrad.fit(impossible, optax.sgd(1e-3), dsgrad.families.by_name("meanfield", 1).params(),
               jax.random.key(0), num_steps=5, batch_size=32, elbo_samples=0, progress=False)
  assert re.search(r"data rows [\d, ]+ and 27 more: a term that is not finite",
                   caught.value.__notes__[0]), caught.value.__notes__
