"""joint_saga with a table of per-datum statistics (``glm_mean_taylor``): the same
approximation as App. F, an unbiased estimator, the exact running-mean invariant, a
lower variance than naive and cv, and a state that checkpoints like any other."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad.training.batching import sample_batch
from dsgrad.diagnostics import estimator_samples, total_variance
from dsgrad.models import Model, softmax_regression
from conftest import BATCH, N_DATA, exact_negative_elbo, fill_by_training
from test_unbiased import NUM_DRAWS, _assert_unbiased


def _softmax_model(num_classes=3, seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  x = np.asarray(jax.random.normal(k1, (40, 4)))
  y = np.asarray(jax.random.randint(k2, (40,), 0, num_classes))
  return softmax_regression(x, y, num_classes)


def _tree_close(a, b, **kw):
  chex.assert_trees_all_close(a, b, **kw)


# Each kind of noise and each model in the default run; the other two pairs slow (6 s).
@pytest.mark.parametrize("which, shared_noise", [
    ("binary", True), ("softmax", False),
    *(pytest.param(*pair, marks=pytest.mark.slow) for pair in (("binary", False),
                                                               ("softmax", True)))])
def test_glm_mean_taylor_equals_app_f_at_current_params(logreg_model, shared_noise, which):
  model = logreg_model if which == "binary" else _softmax_model()
  objective = dsgrad.meanfield_gaussian(model, shared_noise=shared_noise)
  key = jax.random.key(3)
  params = {"loc": 0.4 * jax.random.normal(key, (model.latent_dim,)),
            "log_scale": jnp.full((model.latent_dim,), -0.7)}
  indices, noise = sample_batch(jax.random.key(4), objective, BATCH)
  app_f = dsgrad.approx.gaussian_mean_taylor(model)
  glm = dsgrad.approx.glm_mean_taylor(model)

  def of(approx):
    # With the table at the current params, joint_saga's first output is the same too.
    tx = dsgrad.joint_saga(objective, approx, control_weight=1.0)  # the paper's estimator

    @jax.jit  # one program, not one per operation
    def run(params, indices, noise):
      grads = objective.grad(params, indices, noise)
      first = tx.update(grads, tx.init(params), params, indices=indices, noise=noise)[0]
      return (approx.grad_and_expected(objective, params, indices, noise),
              approx.expected_grad(objective, params, indices), first)

    return run(params, indices, noise)

  (glm_pair, glm_expected, glm_first), (pair, expected, first) = map(of, (glm, app_f))
  _tree_close(glm_pair, pair, rtol=1e-5, atol=1e-4)
  _tree_close(glm_expected, expected, rtol=1e-5, atol=1e-4)
  _tree_close(first, glm_first, rtol=1e-4, atol=1e-3)


def test_logit_structure_matches_log_likelihood(logreg_model):
  for model in (logreg_model, _softmax_model()):
    z = jax.random.normal(jax.random.key(0), (model.latent_dim,))
    idx = jnp.arange(model.num_data, dtype=jnp.int32)
    lin = model.linear
    rows = model.rows(idx)
    x = lin.features(rows)
    logits = x @ z.reshape(x.shape[1], lin.num_outputs)
    np.testing.assert_allclose(lin.log_likelihood_of_logits(logits, rows),
                               model.log_likelihood_at(z, idx), rtol=1e-6)


def test_model_without_linear_structure_is_refused(logreg_model):
  bare = Model(logreg_model.log_prior, logreg_model.log_likelihood, N_DATA,
               logreg_model.latent_dim, "bare")
  with pytest.raises(ValueError, match="linear predictor"):
    dsgrad.approx.glm_mean_taylor(bare)
  objective = dsgrad.meanfield_gaussian(_softmax_model())
  wrong = {"loc": jnp.zeros(5), "log_scale": jnp.zeros(5)}
  with pytest.raises(ValueError, match="expected \\(12,\\)"):
    dsgrad.approx.glm_mean_taylor(_softmax_model()).expected_grad(
        objective, wrong, jnp.arange(3, dtype=jnp.int32))


# Each kind of noise and each table dtype in the default run; the other two pairs slow.
@pytest.mark.parametrize("table_dtype, shared_noise", [
    (None, True), (jnp.bfloat16, False),
    *(pytest.param(*pair, marks=pytest.mark.slow) for pair in ((None, False),
                                                               (jnp.bfloat16, True)))])
def test_unbiased_with_stale_table(logreg_model, logreg_data, params0, shared_noise,
                                   table_dtype):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  tx = dsgrad.joint_saga(objective, dsgrad.approx.glm_mean_taylor(logreg_model),
                         table_dtype=table_dtype)
  state, params = fill_by_training(tx, objective, params0, jax.random.key(41))
  assert state.table.shape == (N_DATA, 1)
  stored_loc_logits = logreg_model.data["x"] @ params["loc"]
  assert not np.allclose(np.asarray(state.table[:, 0], np.float32), stored_loc_logits,
                         atol=1e-3), "table should hold logits at earlier iterates"
  exact_flat = np.asarray(jax.flatten_util.ravel_pytree(
      jax.grad(exact_negative_elbo(logreg_data))(params))[0])
  samples = estimator_samples(tx, state, params, objective, jax.random.key(42),
                              NUM_DRAWS, BATCH)
  _assert_unbiased(samples, exact_flat, f"joint_saga logit table ({table_dtype})")


def test_running_mean_invariant_with_duplicates():
  model = _softmax_model()
  objective = dsgrad.meanfield_gaussian(model, shared_noise=False)
  approx = dsgrad.approx.glm_mean_taylor(model)
  tx = dsgrad.joint_saga(objective, approx)
  params = dsgrad.meanfield_init(model, 0.1, -1.0)
  state = tx.init(params)
  update = jax.jit(lambda g, s, p, i, e: tx.update(g, s, p, indices=i, noise=e))
  for t, idx in enumerate([[3, 3, 7, 1, 3], [7, 0, 0, 39, 12], [9, 9, 9, 9, 9]]):
    idx = jnp.array(idx, jnp.int32)
    noise = objective.sample_noise(jax.random.key(t), idx.shape[0])
    out, state = update(objective.grad(params, idx, noise), state, params, idx, noise)
    params = optax.apply_updates(params, jax.tree.map(lambda g: -3e-2 * g, out))
  everyone = jnp.arange(model.num_data, dtype=jnp.int32)
  want = approx.statistics.datum_expected(
      objective, params, state.table, model.rows(everyone),
      jnp.full((model.num_data,), 1.0 / model.num_data))
  _tree_close(state.running_mean, want, rtol=1e-4, atol=1e-4)
  # Rows of visited data hold the logits of their last visit, others the initial ones.
  init_logits = approx.statistics.statistics(dsgrad.meanfield_init(model, 0.1, -1.0),
                                             model.rows(everyone))
  assert not np.allclose(state.table[9], init_logits[9])
  np.testing.assert_allclose(state.table[20], init_logits[20], rtol=1e-6)


def test_variance_below_naive_and_cv_with_stale_table(logreg_model, params0):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=True)
  approx = dsgrad.approx.glm_mean_taylor(logreg_model)
  tx = dsgrad.joint_saga(objective, approx)
  state, params = fill_by_training(tx, objective, params0, jax.random.key(51),
                                   steps=2 * N_DATA // BATCH, lr=2e-3)

  def variance(t, s, seed):
    return total_variance(estimator_samples(t, s, params, objective, jax.random.key(seed),
                                            8000, BATCH))

  joint, joint_se = variance(tx, state, 52)
  naive, naive_se = variance(dsgrad.naive(), (), 53)
  cv, cv_se = variance(dsgrad.cv(objective, approx, control_weight=1.0), (), 54)
  assert joint + 4 * joint_se < naive - 4 * naive_se
  assert joint + 4 * joint_se < cv - 4 * cv_se


def test_checkpoint_round_trip(logreg_model, params0, tmp_path):
  objective = dsgrad.meanfield_gaussian(logreg_model)
  opt = optax.chain(dsgrad.joint_saga(objective, dsgrad.approx.glm_mean_taylor(logreg_model)),
                    optax.adam(1e-2))
  state = opt.init(params0)
  state, params = fill_by_training(opt, objective, params0, jax.random.key(61), steps=5,
                                   is_optimizer=True)
  dsgrad.training.checkpoint.save(tmp_path / "s.msgpack", (params, state))
  restored = dsgrad.training.checkpoint.restore(tmp_path / "s.msgpack", (params0, opt.init(params0)))
  chex.assert_trees_all_equal(restored, (params, state))


@pytest.mark.parametrize("which", ["glm_mean_taylor", "glm_taylor", "logistic_probit",
                                   "glm_taylor softmax"])
def test_expected_change_is_the_difference_of_two_expectations(logreg_model, which):
  """joint_saga adds ``expected_change(new, old)`` to its running mean; it must equal
  ``datum_expected(new) - datum_expected(old)`` with the same weights, duplicates too."""
  model = _softmax_model() if which.endswith("softmax") else logreg_model
  approx = getattr(dsgrad.approx, which.split()[0])(model)
  stats = approx.statistics
  objective = dsgrad.meanfield_gaussian(model)
  d = model.latent_dim
  new_params = {"loc": 0.3 * jax.random.normal(jax.random.key(1), (d,)),
                "log_scale": jnp.full((d,), -0.5)}
  old_params = {"loc": -0.2 * jax.random.normal(jax.random.key(2), (d,)),
                "log_scale": jnp.full((d,), -1.0)}
  indices = jnp.array([3, 7, 3, 11, 0], jnp.int32)
  weights = dsgrad.tables.first_occurrence(indices).astype(jnp.float32)
  rows = objective.rows(indices)
  new, old = stats.statistics(new_params, rows), stats.statistics(old_params, rows)
  change = stats.expected_change(objective, new_params, new, old, rows, weights)
  difference = jax.tree.map(
      jnp.subtract, stats.datum_expected(objective, new_params, new, rows, weights),
      stats.datum_expected(objective, new_params, old, rows, weights))
  _tree_close(change, difference, rtol=1e-5, atol=1e-4)
  assert float(jnp.abs(change["loc"]).max()) > 1e-3  # not trivially zero
