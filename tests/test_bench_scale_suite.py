"""The scale suite's models and its reading of traces, at small sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad

from benchmarks import scale_models, scale_suite

SMALL = {"hierarchical": dict(num_data=60, groups=7), "two_index": dict(num_data=60, users=9,
                                                                         items=5),
         "mlp": dict(num_data=60, hidden=4), "wide_glm": dict(num_data=60, dim=12, chunk=25),
         "item_response": dict(num_data=60, persons=11, items=4),
         "factorization": dict(num_data=60, users=8, items=6, rank=2)}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_models_agree_with_the_hand_written_loss(name):
  """dsgrad's objective on a few rows equals the loss a user writes by hand (mean-field
  BBVI, the entropy's constant aside): the estimators and the hand loop optimize one thing,
  and the ELBO the suite reports is that loss's."""
  model = scale_models.BUILDERS[name](**SMALL[name])
  d = model.dim
  params = {"loc": 0.3 * jax.random.normal(jax.random.key(0), (d,)),
            "log_scale": jnp.full(d, -1.5)}
  indices = jnp.array([0, 3, 17, 59])
  eps = jax.random.normal(jax.random.key(1), (d,))
  rows = jax.tree.map(lambda a: a[indices], model.data)
  hand = scale_models.hand_loss(model)(params, rows, eps)
  ours = model.objective.value(params, indices, eps)
  # The objective's entropy keeps its constant d/2 (1 + log 2 pi); the hand loss drops it.
  constant = 0.5 * d * (1 + np.log(2 * np.pi))
  np.testing.assert_allclose(float(ours), float(hand) - constant, rtol=2e-5)
  assert model.num_data == SMALL[name]["num_data"]


def test_time_to_reach_reads_the_trace():
  trace = [(0.0, -100.0), (1.0, -50.0), (3.0, -10.0)]
  assert scale_suite.time_to_reach(trace, -50.0) == 1.0
  assert scale_suite.time_to_reach(trace, -30.0) == pytest.approx(2.0)
  assert scale_suite.time_to_reach(trace, -5.0) == float("inf")


def test_a_slow_spell_of_the_machine_cancels_beside_the_plain_loop():
  # A spell slows pieces 1-4 (fully in 2-3) and the plain loop timed at their ends alike:
  # the raw spread shows it, the spread beside the plain loop does not; a slow piece the
  # plain loop does not share (the last, then) is what remains. The first piece is cold.
  class Draws:
    def draws(self, params, num):
      return np.zeros(num)

  def finish(rates):
    return scale_suite._finish({"trace": [(6.0, 0.0)], "piece_rates": list(rates),
                                "plain_rates": [1.0, 1.0, 1.3, 1.3, 1.3, 1.0, 1.0]},
                               Draws(), None, 6.0)

  row = finish([2.0, 1.15, 1.3, 1.3, 1.15, 1.0])
  assert row["step_spread"] == pytest.approx(0.3)
  assert row["step_spread_vs_plain"] == pytest.approx(0.0, abs=1e-12)
  assert finish([2.0, 1.15, 1.3, 1.3, 1.15, 1.2])["step_spread_vs_plain"] == pytest.approx(0.2)
  assert scale_suite._plain_spread(row) == pytest.approx(0.3)  # the table's column
  assert np.isnan(scale_suite._plain_spread({}))  # runs that predate it


def test_pieces_are_equal_and_end_at_the_run():
  assert scale_suite._piece_stops(120, 12) == list(range(10, 121, 10))
  assert scale_suite._steps_in(10.0, 0.001) % scale_suite.PIECES == 0


def _hand_row(monkeypatch, budget: float, probe_calls: tuple, piece_seconds: float) -> dict:
  """The hand loop on a small model with a stand-in clock: its probe's two calls (the
  compile, the timed one) take ``probe_calls`` seconds over its 2,000 steps, then each
  piece ``piece_seconds``."""

  class Clock:  # time passes at each timed call's end (every second reading)
    calls, now = 0, 0.0

    def perf_counter(self):
      self.calls += 1
      pair = self.calls // 2 if self.calls % 2 == 0 else 0
      if 1 <= pair <= 2:
        self.now += probe_calls[pair - 1]
      elif pair >= 4:  # pair 3: compiling the run
        self.now += piece_seconds
      return self.now

  class Evaluator:
    def mean(self, params):
      return 0.0

    def plain_rate(self):
      return 1.0

    def draws(self, params, num):
      return np.zeros(num)

  monkeypatch.setattr(scale_suite, "time", Clock())
  model = scale_models.BUILDERS["hierarchical"](**SMALL["hierarchical"])
  return scale_suite.run_hand(model, 1e-2, budget, 5, jax.random.key(0), Evaluator(),
                              probe_steps=2000)[0]


def test_the_hand_loop_stops_at_the_budget_like_the_others(monkeypatch):
  """The machine slows threefold after the hand loop's probe: its pieces take three times
  what the probe said, and the loop stops where the next piece would end past 1.05 budgets
  (after four of twelve), as dsgrad's contenders do, not at 3 budgets."""
  budget, probe = 12.0, scale_suite.PROBE_SECONDS
  row = _hand_row(monkeypatch, budget, (probe, probe), 3 * budget / scale_suite.PIECES)
  assert row["scheduled_steps"] == scale_suite._steps_in(budget, probe / 2000)
  assert row["steps"] == 4 * row["scheduled_steps"] // scale_suite.PIECES
  assert row["seconds"] == pytest.approx(budget)
  assert not scale_suite._next_piece_over(0.0, [1.0], 120, 120, 1.0)  # the last piece ran


@pytest.mark.parametrize("name, k", [("hierarchical", 3 + 8 + 3 + 3), ("two_index", 9),
                                     ("item_response", 3), ("factorization", 2 + 2 + 1)])
def test_joint_saga_keeps_only_the_rows_each_datum_reads(name, k):
  """The models with per-row latents declare their reads, so joint SAGA's table holds
  each row's ``k`` coordinates (loc and log-scale, float32), not the ``d`` latents."""
  model = scale_models.BUILDERS[name](**SMALL[name])
  params = {"loc": jnp.zeros(model.dim), "log_scale": jnp.zeros(model.dim)}
  estimator = scale_suite._estimator("joint_saga", model.objective)
  assert dsgrad.table_bytes(estimator.init(params)) == model.num_data * 2 * k * 4
  assert k < model.dim


def test_a_run_without_the_hand_loop_is_rendered_with_its_elbos(tmp_path):
  """A run of some contenders only (say, follow the advice again after a change): the
  table shows each one's ELBO, and the figure is drawn, where the hand loop's gaps and
  time to its ELBO cannot be (before: KeyError 'hand' after the runs had taken minutes)."""
  row = {"steps": 480, "seconds": 1.0, "budget_seconds": 1.0, "step_seconds": 2e-3,
         "compile_seconds": 1.9, "step_spread": 0.06, "draws": [-3533.0, -3534.0],
         "trace": [(0.2, -9000.0), (1.0, -3533.5)]}
  result = {"summary": "a model", "dim": 3, "peak": 3e-3, "tuning": {}, "num_data": 4000,
            "seeds": {"0": {"contenders": {"naive": row}, "equal_cost_k": 2}}}
  record = {"command": "python -m benchmarks scale-suite --contenders naive",
            "environment": "a machine", "results": {"results": {"m": result}, "code": "c",
                "config": {"budget": 1.0, "batch_size": 100, "tune_seed": 9, "peaks": [3e-3],
                           "seeds": [0], "section": "s"}}}
  table = scale_suite.render(record)
  assert "| dsgrad naive | 480 |" in table and "-3533.5 (ELBO) | - |" in table
  scale_suite.plot("m", result, tmp_path / "m.png")
  assert (tmp_path / "m.png").stat().st_size > 0
