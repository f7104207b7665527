"""Every estimator is unbiased for the exact full-data gradient of E_eps f.

The estimator is evaluated at parameters different from those stored in its table or
snapshot (filled by training), for many fresh (indices, noise) draws. The exact gradient
comes from Gauss-Hermite quadrature (conftest), independent of dsgrad. Criterion: every
coordinate within 4.5 standard errors -- with 10 coordinates the chance of a false alarm
is below 1e-4 (Bonferroni), while a biased running mean or control variate shifts the
mean by many standard errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsgrad
from dsgrad.diagnostics import estimator_samples
from conftest import BATCH, N_DATA, exact_negative_elbo, fill_by_training

NUM_DRAWS = 20_000
Z = 4.5


def _assert_unbiased(samples, exact_flat, label):
  samples = np.asarray(samples, np.float64)
  mean = samples.mean(0)
  se = samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
  z = np.abs(mean - exact_flat) / np.maximum(se, 1e-12)
  assert np.all(z < Z), (f"{label}: estimator mean differs from the exact gradient by "
                         f"{z.max():.1f} standard errors\nmean={mean}\nexact={exact_flat}")


def _estimators(objective, model, which: str):
  # Not here, as their parts are tested elsewhere: a bfloat16 table (its running mean's
  # invariant, test_saga_invariant; unbiased with the logit table, test_compact_table)
  # and joint SAGA with the second-order approximation (its expectation,
  # test_second_order; the same approximation in cv and joint SVRG below).
  n_steps_per_epoch = N_DATA // BATCH
  taylor2 = dsgrad.approx.gaussian_taylor(model)
  out = {
      "naive": dsgrad.naive(),
      "cv": dsgrad.cv(objective),
      "joint_saga": dsgrad.joint_saga(objective),
      "joint_saga_masked": dsgrad.joint_saga(
          objective, dsgrad.approx.linearize({"loc": True, "log_scale": False})),
      "joint_svrg": dsgrad.joint_svrg(objective, every=10 * n_steps_per_epoch),
      # Second-order approximation (scales too) and adaptive control-variate weights.
      "cv_taylor2_adaptive": dsgrad.cv(objective, taylor2, control_weight="adaptive"),
      "joint_saga_glm_taylor_adaptive": dsgrad.joint_saga(
          objective, dsgrad.approx.glm_taylor(model), control_weight="adaptive"),
      # The probit-mixture approximation: stale (logit, sd) rows, current noise.
      "joint_saga_logistic_probit": dsgrad.joint_saga(
          objective, dsgrad.approx.logistic_probit(model)),
      "joint_svrg_logistic_probit": dsgrad.joint_svrg(
          objective, dsgrad.approx.logistic_probit(model), every=10 * n_steps_per_epoch),
      "joint_svrg_taylor2_adaptive": dsgrad.joint_svrg(
          objective, taylor2, every=10 * n_steps_per_epoch, control_weight="adaptive"),
  }
  if objective.shared_noise:
    out["inc"] = dsgrad.inc(objective)
  else:
    # One noise draw per datum changes how the noise reaches each estimator's terms, not
    # how the table, the mask or the table's precision do: one estimator per kind of
    # state and approximation.
    out = {k: out[k] for k in ("naive", "cv", "joint_saga", "joint_svrg",
                               "joint_saga_glm_taylor_adaptive", "joint_saga_logistic_probit",
                               "joint_svrg_taylor2_adaptive")}
  # Each estimator with its default approximation, and the probit mixture (the one
  # approximation whose stale rows meet current noise), run by default; the other
  # approximations, masks and adaptive weights compile a program each (20 s of the
  # suite) and run with -m slow.
  core = ("naive", "cv", "joint_saga", "joint_svrg", "inc", "joint_saga_logistic_probit")
  return {k: tx for k, tx in out.items() if (k in core) == (which == "core")}


@pytest.mark.parametrize("which", ["core", pytest.param("variants", marks=pytest.mark.slow)])
@pytest.mark.parametrize("shared_noise", [True, False])
def test_estimators_unbiased(logreg_model, logreg_data, params0, shared_noise, which):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  exact = exact_negative_elbo(logreg_data)
  for i, (name, tx) in enumerate(_estimators(objective, logreg_model, which).items()):
    state, params = fill_by_training(tx, objective, params0, jax.random.key(100 + i))
    # The table rows (or snapshot) now hold earlier iterates, not ``params``.
    exact_flat = np.asarray(jax.flatten_util.ravel_pytree(jax.grad(exact)(params))[0])
    samples = estimator_samples(tx, state, params, objective, jax.random.key(200 + i),
                                NUM_DRAWS, BATCH)
    _assert_unbiased(samples, exact_flat, f"{name} (shared_noise={shared_noise})")


def test_exact_gradient_reference_matches_monte_carlo(logreg_model, logreg_data, params0):
  """Sanity check of the quadrature reference against plain full-data Monte Carlo."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)
  exact_flat = np.asarray(jax.flatten_util.ravel_pytree(
      jax.grad(exact_negative_elbo(logreg_data))(params0))[0])
  idx = jnp.arange(N_DATA, dtype=jnp.int32)

  @jax.jit
  def draw(k):
    g = objective.grad(params0, idx, objective.sample_noise(k, N_DATA), validate=False)
    return jax.flatten_util.ravel_pytree(g)[0]

  samples = jax.lax.map(draw, jax.random.split(jax.random.key(3), 4000))
  _assert_unbiased(samples, exact_flat, "full-data Monte Carlo")


def test_smiso_implied_gradient_unbiased(logreg_model, logreg_data, params0):
  """SMISO's step is -(alpha |B| gamma / N) times an unbiased gradient (App. A, Eq. 25)."""
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=False)
  gamma, alpha = 0.02, 0.9
  tx = dsgrad.smiso(objective, gamma, alpha)
  state, params = fill_by_training(tx, objective, params0, jax.random.key(5),
                                   steps=40, is_optimizer=True)
  exact_flat = np.asarray(jax.flatten_util.ravel_pytree(
      jax.grad(exact_negative_elbo(logreg_data))(params))[0])
  steps = estimator_samples(tx, state, params, objective, jax.random.key(6), NUM_DRAWS,
                            BATCH, replace=False)
  implied = -np.asarray(steps) * N_DATA / (alpha * BATCH * gamma)
  _assert_unbiased(implied, exact_flat, "smiso")


def test_unbiasedness_check_has_power(logreg_model, logreg_data, params0):
  """The criterion above rejects an estimator with a small deliberate bias."""
  objective = dsgrad.meanfield_gaussian(logreg_model)
  tx = dsgrad.joint_saga(objective)
  state, params = fill_by_training(tx, objective, params0, jax.random.key(9))
  # Corrupt the running mean by 2% of the gradient's scale in one coordinate.
  exact_flat = np.asarray(jax.flatten_util.ravel_pytree(
      jax.grad(exact_negative_elbo(logreg_data))(params))[0])
  shift = 0.02 * np.abs(exact_flat).max()
  bad_state = state._replace(running_mean={
      "loc": state.running_mean["loc"].at[0].add(shift),
      "log_scale": state.running_mean["log_scale"]})
  samples = estimator_samples(tx, bad_state, params, objective, jax.random.key(10),
                              NUM_DRAWS, BATCH)
  with pytest.raises(AssertionError):
    _assert_unbiased(samples, exact_flat, "corrupted joint_saga")
