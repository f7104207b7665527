"""The chain-order rule (dsgrad.estimators.chain): nothing may stand before an estimator
in an optax.chain, stateful or not; wrappers and vmapped ensembles that contain the whole
chain may."""

import jax
import jax.numpy as jnp
import optax
import pytest

import dsgrad


@pytest.fixture(scope="module")
def problem():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 200, 3)
  model = dsgrad.models.logistic_regression(x, y)
  return dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model)


@pytest.mark.parametrize("before", [optax.clip_by_global_norm(1e6), optax.clip(1e6),
                                    optax.scale(1.0), optax.scale_by_adam()],
                         ids=["clip_by_global_norm", "clip", "scale", "scale_by_adam"])
@pytest.mark.parametrize("estimator", ["cv_fixed_weight", "cv", "joint_saga"])
def test_any_transformation_before_an_estimator_is_refused(problem, before, estimator):
  objective, params = problem
  make = {"cv_fixed_weight": lambda: dsgrad.cv(objective, control_weight=1.0),
          "cv": lambda: dsgrad.cv(objective), "joint_saga": lambda: dsgrad.joint_saga(objective)}
  optimizer = optax.chain(before, make[estimator](), optax.adam(1e-2))
  # Clipping at 1e6 never acts on this problem's gradients: only the structure can tell.
  with pytest.raises(ValueError, match="before the dsgrad estimator"):
    dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=4, batch_size=10,
               elbo_samples=0, progress=False)
  state = optimizer.init(params)
  step = jax.jit(lambda o, p, s, i, k: dsgrad.train_step(o, optimizer, p, s, i, k))
  with pytest.raises(ValueError, match="before the dsgrad estimator"):
    step(objective, params, state, jnp.arange(10), jax.random.key(1))


def test_two_estimators_in_one_chain_are_refused_as_two_estimators(problem):
  objective, params = problem
  optimizer = optax.chain(dsgrad.cv(objective), dsgrad.joint_svrg(objective), optax.adam(1e-2))
  with pytest.raises(ValueError, match="chains two dsgrad estimators"):
    dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=4, batch_size=10,
               elbo_samples=0, progress=False)


@pytest.mark.parametrize("estimator", ["cv", "cv_fixed_weight", "joint_svrg", "chained_alone"])
def test_an_estimator_without_an_update_rule_after_it_is_refused(problem, estimator):
  # Its output, a gradient, applied as the step climbed the loss to a NaN update.
  objective, params = problem
  optimizer = {"cv": lambda: dsgrad.cv(objective),
               "cv_fixed_weight": lambda: dsgrad.cv(objective, control_weight=1.0),
               "joint_svrg": lambda: dsgrad.joint_svrg(objective),
               "chained_alone": lambda: optax.chain(dsgrad.joint_saga(objective))}[estimator]()
  with pytest.raises(ValueError, match="ends with a dsgrad estimator"):
    dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=4, batch_size=10,
               elbo_samples=0, progress=False)
  step = jax.jit(lambda o, p, s, i, k: dsgrad.train_step(o, optimizer, p, s, i, k))
  with pytest.raises(ValueError, match="ends with a dsgrad estimator"):
    step(objective, params, optimizer.init(params), jnp.arange(10), jax.random.key(1))


def test_naive_alone_is_refused_by_its_mark_and_chained_it_trains(problem):
  # Its state is optax's EmptyState: only the mark on its update tells it apart.
  objective, params = problem
  with pytest.raises(TypeError, match=r"got dsgrad.naive\(\) alone: its output is a "
                                      r"gradient, not a step"):
    dsgrad.fit(objective, dsgrad.naive(), params, jax.random.key(0), num_steps=4,
               batch_size=10, elbo_samples=0, progress=False)
  result = dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.adam(1e-2)), params,
                      jax.random.key(0), num_steps=4, batch_size=10, elbo_samples=0,
                      progress=False)
  assert result.step == 4


def test_every_estimator_takes_the_objective_first_so_one_word_swaps_them(problem):
  # naive needs no objective, but takes one, so that a loop over the factories (or a swap of
  # one word) calls each the same way; what it is given must still be an objective.
  objective, params = problem
  step = {}
  for name in ("naive", "cv", "inc", "joint_saga", "joint_svrg"):
    optimizer = optax.chain(getattr(dsgrad, name)(objective), optax.sgd(1e-2))
    result = dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=1,
                        batch_size=10, elbo_samples=0, progress=False)
    step[name] = result.params
  plain = dsgrad.fit(objective, optax.chain(dsgrad.naive(), optax.sgd(1e-2)), params,
                     jax.random.key(0), num_steps=1, batch_size=10, elbo_samples=0,
                     progress=False).params
  assert all(bool(jnp.all(a == b)) for a, b in zip(jax.tree.leaves(step["naive"]),
                                                    jax.tree.leaves(plain)))
  with pytest.raises(ValueError, match=r"dsgrad\.naive: objective must be a "
                                       r"dsgrad\.Objective.*a model"):
    dsgrad.naive(dsgrad.models.logistic_regression(*dsgrad.models.synthetic_logistic_data(
        jax.random.key(0), 20, 3)[:2]))


@pytest.mark.parametrize("rule", ["identity", "naive_chained_alone", "sgd_negative",
                                  "adam_negative", "scale_positive", "cv_then_adam_negative",
                                  "saga_then_sgd_negative_wrapped", "checked_cv_then_sgd_negative",
                                  "plain_transformation_positive", "masked_adam"])
def test_an_update_rule_that_steps_uphill_is_refused(problem, rule):
  """The update is added to the params: a rule along the gradient climbs the loss. SGD
  with a negative rate climbed to a NaN update blamed on "the gradient, the estimator's
  terms or the update rule"; Adam with one (bounded steps) trained to a far worse ELBO
  without an error, or, after a control variate, to a warning of a diverging run that
  advised a smaller step size."""
  objective, params = problem
  masks = {"loc": True, "log_scale": False}
  optimizer = {"identity": optax.identity, "naive_chained_alone": lambda: optax.chain(
      dsgrad.naive()), "sgd_negative": lambda: optax.sgd(-1e-2),
               "adam_negative": lambda: optax.adam(-1e-2),
               "scale_positive": lambda: optax.chain(dsgrad.naive(), optax.scale(1e-3)),
               "cv_then_adam_negative": lambda: optax.chain(dsgrad.cv(objective),
                                                            optax.adam(-1e-2)),
               "saga_then_sgd_negative_wrapped": lambda: optax.inject_hyperparams(
                   lambda learning_rate: optax.chain(dsgrad.joint_saga(objective),
                                                     optax.sgd(learning_rate)))(
                       learning_rate=-1e-2),
               "checked_cv_then_sgd_negative": lambda: dsgrad.checked(
                   optax.chain(dsgrad.cv(objective), optax.sgd(-1e-2)), objective),
               # optax's base class: an update without extra arguments.
               "plain_transformation_positive": lambda: optax.GradientTransformation(
                   lambda p: optax.EmptyState(), lambda g, s, p=None: (g, s)),
               # Adam on the means only: the scales get their gradient as it is.
               "masked_adam": lambda: optax.masked(optax.adam(1e-2), masks)}[rule]()
  named = (r".*Here params\['log_scale'\] climb while the rest descend.*multi_transform"
           if rule == "masked_adam" else "")
  with pytest.raises(ValueError, match=r"fit: the optimizer's first step climbs the loss" + named):
    dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=4, batch_size=10,
               elbo_samples=0, progress=False)
  if rule == "masked_adam":  # the remedy the message gives trains
    fixed = optax.multi_transform({"train": optax.adam(1e-2), "fixed": optax.set_to_zero()},
                                  {"loc": "train", "log_scale": "fixed"})
    assert dsgrad.fit(objective, fixed, params, jax.random.key(0), num_steps=4, batch_size=10,
                      elbo_samples=0, progress=False).step == 4
    return
  if rule in ("sgd_negative", "adam_negative"):  # recommend chains it after each estimator
    with pytest.raises(ValueError, match=r"recommend: the optimizer's first step climbs"):
      dsgrad.recommend(objective, optimizer, params, jax.random.key(0), batch_size=10,
                       budget=1.0, progress=False)
  # A schedule that starts at zero, a clip, weight decay: first steps that do not climb.
  for fine in (optax.adam(optax.linear_schedule(0.0, 1e-2, 10)),
               optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-2)),
               optax.adamw(1e-2, weight_decay=1e-4)):
    assert dsgrad.fit(objective, fine, params, jax.random.key(0), num_steps=4, batch_size=10,
                      elbo_samples=0, progress=False).step == 4


@pytest.mark.parametrize("rule", ["adam_nan", "sgd_inf", "cv_then_schedule_from_nan",
                                  "masked_sgd_nan"])
def test_an_update_rule_built_from_a_nan_or_inf_rate_is_refused_before_any_step(problem, rule):
  """A learning rate or schedule that is NaN or inf: its first step was refused as "the
  step's update contains non-finite values ... from the gradient, the estimator's terms or
  the update rule" (at step 0), naming three suspects where the rule alone is at fault."""
  objective, params = problem
  optimizer = {
      "adam_nan": lambda: optax.adam(float("nan")),
      "sgd_inf": lambda: optax.sgd(float("inf")),
      "cv_then_schedule_from_nan": lambda: optax.chain(
          dsgrad.cv(objective), optax.adam(optax.linear_schedule(1e-2, float("nan"), 5))),
      # Only the means' rule is broken: the message names them and not the scales.
      "masked_sgd_nan": lambda: optax.multi_transform(
          {"bad": optax.sgd(float("nan")), "good": optax.sgd(1e-2)},
          {"loc": "bad", "log_scale": "good"})}[rule]()
  where = (r"\['loc'\]: the update" if rule == "masked_sgd_nan"
           else r"\['loc'\], params\['log_scale'\]")
  with pytest.raises(ValueError, match=r"fit: the optimizer's first update of a finite gradient "
                     r".* is not finite \(NaN or inf\) in params" + where):
    dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=4, batch_size=10,
               elbo_samples=0, progress=False)
  if rule == "adam_nan":  # recommend probes the rule it chains after each estimator
    with pytest.raises(ValueError, match=r"recommend: the optimizer's first update of a finite"):
      dsgrad.recommend(objective, optimizer, params, jax.random.key(0), batch_size=10,
                       budget=1.0, progress=False)
  # A huge but finite rate passes the probe (its run's own checks judge its steps).
  assert dsgrad.fit(objective, optax.sgd(1e20), params, jax.random.key(0), num_steps=1,
                    batch_size=10, elbo_samples=0, progress=False).step == 1


def test_transformations_after_the_estimator_and_wrappers_around_the_chain_pass(problem):
  objective, params = problem
  for optimizer in [
      optax.chain(dsgrad.cv(objective), optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
      optax.inject_hyperparams(lambda learning_rate: optax.chain(
          dsgrad.joint_saga(objective), optax.adam(learning_rate)))(learning_rate=1e-2)]:
    result = dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=20,
                        batch_size=10, elbo_samples=0, progress=False)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(result.params))


def test_a_vmapped_ensemble_of_chains_passes_and_equals_its_members(problem):
  objective, params = problem
  optimizer = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
  models = 3
  ensemble = jax.tree.map(lambda p: jnp.stack([p + 0.1 * m for m in range(models)]), params)
  states = jax.vmap(optimizer.init)(ensemble)
  indices = jnp.stack([jnp.arange(10) + 10 * m for m in range(models)])
  keys = jax.random.split(jax.random.key(4), models)

  def member_step(p, s, i, k):
    return dsgrad.train_step(objective, optimizer, p, s, i, k)

  # Three steps, so the first-update gradient check and later steps both run.
  for _ in range(3):
    ensemble, states = jax.jit(jax.vmap(member_step))(ensemble, states, indices, keys)
  single = jax.tree.map(lambda p: p + 0.1, params)
  state = optimizer.init(single)
  for _ in range(3):
    single, state = jax.jit(member_step)(single, state, indices[1], keys[1])
  for leaf, expected in zip(jax.tree.leaves(ensemble), jax.tree.leaves(single)):
    assert jnp.allclose(leaf[1], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["lbfgs", "plateau", "multisteps"])
def test_an_update_that_needs_what_a_step_does_not_pass_is_named(case):
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 40, 3)
  objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
  params = dsgrad.meanfield_init(objective.source[1])
  optimizer, expected = {
      "lbfgs": (optax.lbfgs(), "update needs 'value', 'grad', and 'value_fn'"),
      "plateau": (optax.chain(optax.adam(1e-2), optax.contrib.reduce_on_plateau()),
                  "update needs 'value', which"),
      # MultiSteps calls what it wraps without the extra arguments: the estimator inside
      # got none ("missing 2 required keyword-only arguments: 'indices' and 'noise'").
      "multisteps": (optax.MultiSteps(optax.chain(dsgrad.cv(objective), optax.adam(1e-2)), 2),
                     "estimator received no indices and noise.*optax.MultiSteps"),
  }[case]
  with pytest.raises(TypeError, match=expected):
    dsgrad.fit(objective, optimizer, params, jax.random.key(1), num_steps=4, batch_size=5,
               progress=False)


def test_a_missing_keyword_in_the_users_own_code_is_not_blamed_on_the_optimizer():
  from dsgrad.estimators import chain as chain_lib

  def my_term(*, scale):
    return scale
  try:
    my_term()
  except TypeError as error:
    assert chain_lib.named_missing_arguments(error, "fit") is error
