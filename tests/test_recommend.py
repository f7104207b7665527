"""dsgrad.recommend on models where the right answer is known: all variance from the
Monte Carlo noise (a control variate over noise pays), all from subsampling (cv cannot
help, the joint estimators can), and a table that does not fit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad

N, D, BATCH = 200, 4, 10


def _model(identical_rows: bool):
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), N, D)
  if identical_rows:  # every datum the same: subsampling adds no variance
    x, y = np.repeat(np.asarray(x)[:1], N, 0), np.repeat(np.asarray(y)[:1], N, 0)
  return dsgrad.models.logistic_regression(x, y)


def _by_name(advice):
  return {c.name: c for c in advice.ranking}


def test_noise_dominated_model_gets_a_control_variate():
  model = _model(identical_rows=True)
  objective = dsgrad.meanfield_gaussian(model)
  advice = dsgrad.recommend(objective, dsgrad.meanfield_init(model, 0.0, 0.0),
                            jax.random.key(1), batch_size=BATCH, num_draws=64,
                            timing_steps=10, approx=dsgrad.approx.glm_taylor(model),
                            candidates=("naive", "cv"))
  d = advice.decomposition
  assert d["V_n"] < 0.01 * d["V_eps"], d
  rows = _by_name(advice)
  assert rows["cv"].variance_fresh < 0.3 * rows["naive"].variance_fresh
  assert advice.best != "naive", str(advice)
  assert "V_eps" in advice.reasons[0]


def test_subsampling_dominated_model_and_a_table_that_does_not_fit():
  model = _model(identical_rows=False)
  objective = dsgrad.meanfield_gaussian(model)
  # A tiny posterior scale: almost no Monte Carlo noise, all variance from subsampling.
  advice = dsgrad.recommend(objective, dsgrad.meanfield_init(model, 0.0, -8.0),
                            jax.random.key(2), batch_size=BATCH, num_draws=64,
                            timing_steps=10, max_table_bytes=1)
  d = advice.decomposition
  assert d["V_n"] > 100 * d["V_eps"], d
  rows = _by_name(advice)
  naive = rows["naive"].variance_fresh
  # cv removes only noise variance: none to remove here.
  assert 0.8 * naive < rows["cv"].variance_fresh < 1.2 * naive
  # joint SVRG with a fresh snapshot removes the subsampling variance.
  assert rows["joint_svrg"].variance_fresh < 0.2 * naive
  saga = rows["joint_saga"]
  assert saga.score == np.inf and "table" in saga.note
  assert advice.ranking[-1].name == "joint_saga"
  assert any(line.startswith("joint_saga: not an option") for line in advice.reasons)
  # At the weight the adaptive rule settles on (fitted to the same, paired draws) a
  # control variate is never worse than naive nor than its c = 1 self.
  for name in ("cv", "joint_svrg"):
    row = rows[name]
    assert row.variance_fresh <= min(naive, row.variance_unweighted[0]) * (1 + 1e-9), name
    assert row.variance_stale <= row.variance_unweighted[1] * (1 + 1e-9), name
  assert "c = 1" in "".join(advice.reasons)


@pytest.mark.parametrize("kwargs", [dict(candidates=("cv", "joint_svrg")),
                                    dict(candidates=("naive", "sgld")),
                                    dict(batch_size=0), dict(num_draws=1)])
def test_bad_settings_are_refused(kwargs):
  model = _model(identical_rows=False)
  objective = dsgrad.meanfield_gaussian(model)
  settings = dict(batch_size=BATCH) | kwargs
  with pytest.raises(ValueError):
    dsgrad.recommend(objective, dsgrad.meanfield_init(model), jax.random.key(0), **settings)
