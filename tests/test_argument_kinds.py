"""Every public entry point checks its numeric and key arguments by kind.

Two generated tests, not one per case:

* every numeric or key argument of every public function (by annotation, default or
  name) is declared with :func:`dsgrad.checks.arguments`, so a new public function with
  an unchecked count, size, probability or key fails here;
* for every declaration, hypothesis draws bad values of its kind (a float or a bool
  for a count, NaN, inf, zero or a string for a size, ...) and the call must raise a
  ``ValueError``/``TypeError`` naming the function's argument and the value received.

And two for array data: every public model factory (listed, so a new one fails until it
is) refuses values that the cast to float32 would change, and every catalogue model's
data with a meaning (signs, indices) refuse other values when swapped in.
"""

import importlib
import inspect
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dsgrad
from dsgrad import checks

MODULES = ["dsgrad", "dsgrad.annealing", "dsgrad.mcvae", "dsgrad.mcmc", "dsgrad.diagnostics",
           "dsgrad.datasets", "dsgrad.contrib.numpyro", "dsgrad.models", "dsgrad.families",
           "dsgrad.approx", "dsgrad.psis", "dsgrad.training.checkpoint"]

# Public functions whose numeric arguments are not entry points for users' settings, with
# the reason. Everything else must declare its kinds.
EXEMPT = {
    # Run inside jit on traced arrays: their callers check the settings they pass.
    "dsgrad.annealing.dais_log_weight", "dsgrad.mcvae.langevin_sis_bound",
    "dsgrad.mcvae.mala_ais_bound", "dsgrad.mcvae.langevin_kernel_log_density",
    "dsgrad.mcvae.amcvae_surrogate", "dsgrad.mcmc.dual_averaging_init",
    "dsgrad.train_step",
    # Reports a k-hat, including inf and NaN, in words.
    "dsgrad.psis.diagnose",
    # Exceptions raised by dsgrad that carry a run's results, not settings.
    "dsgrad.Interrupted", "dsgrad.mcmc.Diverged",
    # A NamedTuple or dataclass of results or state, not a setting.
    "dsgrad.FitResult", "dsgrad.History", "dsgrad.mcmc.MCMCResult",
    "dsgrad.mcmc.HMCParameters", "dsgrad.mcmc.DualAveraging", "dsgrad.annealing.Surrogate",
    "dsgrad.annealing.ChainSettings", "dsgrad.models.LinearPredictor",
    "dsgrad.models.SparseLikelihood", "dsgrad.models.DropoutGLM",
    "dsgrad.datasets.MovieLensData", "dsgrad.contrib.numpyro.NumpyroModel",
    "dsgrad.contrib.numpyro.Model", "dsgrad.models.Model",
    # The NumPyro bridge's objective class is built by dsgrad.contrib.numpyro.objective,
    # whose base Objective checks num_data.
    "dsgrad.contrib.numpyro.NumpyroObjective",
}
NUMERIC = re.compile(r"\b(int|float)\b")


def _public_callables():
  seen = {}
  for name in MODULES:
    module = importlib.import_module(name)
    for attr in getattr(module, "__all__", [a for a in dir(module) if not a.startswith("_")]):
      obj = getattr(module, attr, None)
      if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        continue
      if not (getattr(obj, "__module__", "") or "").startswith("dsgrad"):
        continue
      if id(obj) in seen:
        continue
      seen[id(obj)] = (f"{name}.{attr}", obj)
      if inspect.isclass(obj) and "__dsgrad_arguments__" in vars(obj):
        for method_name, method in vars(obj).items():
          if inspect.isfunction(method) and not method_name.startswith("_"):
            seen[id(method)] = (f"{name}.{attr}.{method_name}", method)
  return sorted(seen.values(), key=lambda item: item[0])


def _numeric_parameters(obj):
  try:
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
  except (TypeError, ValueError):
    return []
  found = []
  for p in signature.parameters.values():
    annotation = p.annotation if isinstance(p.annotation, str) else getattr(
        p.annotation, "__name__", str(p.annotation))
    default = p.default
    numeric_default = (isinstance(default, (int, float)) and not isinstance(default, bool)
                       and default is not inspect.Parameter.empty)
    if (p.name == "key" or NUMERIC.search(annotation or "") or numeric_default):
      found.append(p.name)
  return found


CALLABLES = _public_callables()


def test_every_numeric_argument_of_a_public_function_declares_its_kind():
  undeclared = []
  for name, obj in CALLABLES:
    if name in EXEMPT:
      continue
    declared = _declared(obj)
    missing = [p for p in _numeric_parameters(obj) if p not in declared]
    if missing:
      undeclared.append(f"{name}: {missing}")
  assert not undeclared, ("public arguments without a declared kind "
                          "(dsgrad.checks.arguments):\n" + "\n".join(undeclared))


def _declared(obj):
  # A class's own declarations only: a subclass inherits the attribute, not the check.
  if inspect.isclass(obj):
    return vars(obj).get("__dsgrad_arguments__", {})
  return getattr(obj, "__dsgrad_arguments__", {})


DECLARATIONS = sorted(
    {(name, argument, obj) for name, obj in CALLABLES for argument in _declared(obj)},
    key=lambda item: (item[0], item[1]))


def test_the_declarations_cover_the_entry_points_the_kinds_are_for():
  names = {name for name, _, _ in DECLARATIONS}
  for expected in ["dsgrad.fit", "dsgrad.mcmc.sample", "dsgrad.annealing.AnnealedVI",
                   "dsgrad.mcvae.MonteCarloVAE", "dsgrad.mcvae.MonteCarloVAE.ais_nll",
                   "dsgrad.elbo", "dsgrad.variance_decomposition", "dsgrad.joint_saga",
                   "dsgrad.importance_log_ratios", "dsgrad.recommend"]:
    assert expected in names
  assert len(DECLARATIONS) > 120


_TEXT = st.sampled_from(["5", "1GB", "auto ", "", "nan", "0.5"])
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def _a_model():
  x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 20, 2)
  return dsgrad.models.logistic_regression(x, y)


def _an_objective():
  return dsgrad.meanfield_gaussian(_a_model())


def _bad_values(kind):
  """A strategy of values the kind must refuse."""
  spec = kind.spec
  bad = [_TEXT.filter(lambda t: t not in spec.get("words", ())), st.just(True),
         st.just(False)]
  if not spec.get("optional"):
    bad.append(st.just(None))
  if kind.kind == "count":
    low, also = spec["minimum"], spec["also"]
    bad.append(st.floats(allow_nan=True, allow_infinity=True))  # even 3.0: not truncated
    bad.append(st.integers(-2 ** 40, low - 1).filter(lambda n: n not in also))
    bad.append(st.integers(2 ** 31, 2 ** 40))
    bad.append(st.just(np.ones(2, np.int32)))
  elif kind.kind == "positive":
    bad += [_NOT_FINITE, st.floats(max_value=-1e-30, allow_infinity=False),
            st.just(1e39), st.just(np.ones(2))]
    if not spec.get("allow_zero"):
      bad.append(st.just(0.0))
  elif kind.kind == "real":
    bad += [_NOT_FINITE, st.just(np.ones(2))]
  elif kind.kind == "finite":
    bad += [_NOT_FINITE, st.just(np.array([0.0, np.nan])), st.just(np.array([1 + 2j]))]
  elif kind.kind == "probability":
    bad += [_NOT_FINITE, st.floats(min_value=1.0, exclude_min=True, allow_infinity=False),
            st.floats(max_value=0.0, exclude_max=True, allow_infinity=False)]
    if spec.get("low_open"):
      bad.append(st.just(0.0))
    if spec.get("high_open"):
      bad.append(st.just(1.0))
  elif kind.kind == "key":
    bad = [st.integers(-5, 5), st.floats(allow_nan=False), _TEXT,
           st.just(np.zeros(2, np.float32)), st.just(jax.random.split(jax.random.key(0), 2))]
    if not spec.get("optional"):
      bad.append(st.just(None))
  elif kind.kind == "bytes":
    bad = [_TEXT, st.just(True), st.just(0), st.integers(max_value=-1), _NOT_FINITE]
  elif kind.kind == "sizes":
    bad = [_TEXT, st.just(3), st.just([2.5]), st.just([0]), st.just([True]), st.just(["8"])]
  elif kind.kind == "optimizer":
    bad += [st.just(optax.adam), st.just(3), st.just(optax.GradientTransformation)]
    if not spec.get("estimator"):  # an estimator's output may be a gradient
      bad.append(st.just(dsgrad.naive()))  # a gradient where a step belongs
    if not spec.get("factory"):
      bad.append(st.just(lambda steps: optax.adam(1e-2)))
  elif kind.kind == "dtype":
    bad = [st.sampled_from([jnp.int32, np.int8, "int64", bool, "not a dtype"])]
  elif kind.kind in ("objective", "model"):
    # A model where an objective belongs, and the reverse.
    bad += [st.just(3), st.just(_a_model() if kind.kind == "objective" else _an_objective())]
  elif kind.kind == "approximation":
    bad += [st.just(3), st.just(dsgrad.approx.linearize), st.just({"loc": np.zeros(2)})]
  elif kind.kind == "parameters":
    bad += [_NOT_FINITE, st.just({"loc": np.array([0.0, np.nan]), "log_scale": np.zeros(2)}),
            st.just({"loc": np.ones(2, np.int32)}), st.just({}), st.just([np.inf])]
  else:
    raise AssertionError(f"no bad values for kind {kind.kind!r}: add them here")
  return st.one_of(*bad)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bad_values_of_every_kind_are_refused_by_name(data):
  name, argument, obj = data.draw(st.sampled_from(DECLARATIONS), label="declaration")
  kind = obj.__dsgrad_arguments__[argument]
  bad = data.draw(_bad_values(kind), label=f"{name}({argument}=...)")
  call = obj
  with pytest.raises((ValueError, TypeError)) as error:
    call(**{argument: bad})
  message = str(error.value)
  assert re.search(rf"\b{argument}\b", message), message
  assert "must be" in message, message


@pytest.mark.parametrize("name,argument,obj", DECLARATIONS[::7],
                         ids=[f"{n}.{a}" for n, a, _ in DECLARATIONS[::7]])
def test_a_good_value_passes_the_check(name, argument, obj):
  # The checks refuse what they should and nothing else: a value of the kind passes.
  kind = obj.__dsgrad_arguments__[argument]
  good = {"count": max(kind.spec.get("minimum", 0), 2), "positive": 0.5, "real": -1.5,
          "finite": np.zeros(3), "probability": 0.5, "key": jax.random.key(0),
          "bytes": 2 ** 20, "dtype": jnp.bfloat16, "sizes": (4, 8),
          "parameters": {"loc": jnp.zeros(3), "log_scale": -np.ones(3)},
          "optimizer": optax.adam(1e-2), "approximation": dsgrad.approx.linearize(),
          "model": _a_model(), "objective": _an_objective()}.get(kind.kind)
  if good is None:  # a kind the table does not know yet
    raise AssertionError(f"no good value for kind {kind.kind!r}: add one here")
  assert kind.check(good, f"{name}: {argument}") is not None


def test_params_with_a_nan_or_of_another_model_are_refused_where_they_enter(logreg_model,
                                                                        params0):
  # Without the check the ELBO and the variances come back NaN, silently.
  objective = dsgrad.meanfield_gaussian(logreg_model)
  bad = {"loc": params0["loc"].at[1].set(jnp.nan), "log_scale": params0["log_scale"]}
  calls = {
      "elbo": lambda p: dsgrad.elbo(objective, p, jax.random.key(0), 4),
      "variance_decomposition": lambda p: dsgrad.variance_decomposition(
          objective, p, jax.random.key(0), 5, num_draws=4, full_draws=2,
          noise_draws_per_datum=2),
      "recommend": lambda p: dsgrad.recommend(
          objective, optax.adam(1e-2), p, jax.random.key(0), batch_size=5, budget=1.0,
          candidates=("naive",), progress=False)}
  for name, call in calls.items():
    with pytest.raises(ValueError, match=r"params\['loc'\] holds NaN or inf"):
      call(bad)
    value = call(params0)
    assert value is not None, name
    # Params of another model are refused by shape before anything compiles.
    with pytest.raises(ValueError, match=r"cannot be evaluated at these params \(shapes"):
      call({"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)})
  kind = checks.parameters()
  # A traced value is the caller's to check; an integer leaf is refused by its path.
  jax.jit(lambda p: kind.check(p, "f: params"))(bad)
  with pytest.raises(TypeError, match=r"params\['w'\] must be a floating array"):
    kind.check({"w": np.arange(3)}, "f: params")


# ------------------------------------------------------------ data values by kind
# What array data mean after they enter, checked by kind: floats that the cast to float32
# would change (beyond its range, NaN), and data that carry a meaning (signs, indices).
RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 3))
LABELS = np.arange(12) % 2

# Every public model factory of dsgrad.models that takes data, with a good call; a factory
# added without an entry here fails test_every_model_factory_is_listed.
FACTORIES = {
    "logistic_regression": lambda **kw: dsgrad.models.logistic_regression(
        kw.get("features", X), kw.get("labels", LABELS)),
    "softmax_regression": lambda **kw: dsgrad.models.softmax_regression(
        kw.get("features", X), kw.get("labels", LABELS), 2),
    "ppca": lambda **kw: dsgrad.models.ppca(kw.get("data", X), 2),
    "dropout_glm": lambda **kw: dsgrad.models.dropout_glm(
        kw.get("features", X), kw.get("labels", LABELS), 2),
    "bradley_terry": lambda **kw: dsgrad.models.bradley_terry(
        kw.get("player_a", np.array([0, 1, 2])), kw.get("player_b", np.array([1, 2, 0])), 3,
        kw.get("outcomes", np.array([1.0, 0.0, 1.0]))),
    "movielens": lambda **kw: dsgrad.models.movielens(
        kw.get("users", np.array([0, 1, 1])), kw.get("genres", np.eye(3, 2)),
        kw.get("ratings", np.array([0, 4, 2])), 2),
}
FLOATING_ARGUMENTS = {"logistic_regression": ["features"], "softmax_regression": ["features"],
                      "ppca": ["data"], "dropout_glm": ["features"], "bradley_terry": [],
                      "movielens": []}
NOT_FACTORIES = {"Model", "LinearPredictor", "SparseLikelihood", "with_coordinates",
                 "model_data", "check_sparse_likelihood", "DropoutGLM", "softmax_cross_entropy",
                 "movielens_latent", "MovieLensLatent"}


def test_every_model_factory_is_listed():
  public = {name for name in dsgrad.models.__all__ if not name.startswith("synthetic_")}
  assert public - NOT_FACTORIES == set(FACTORIES), "list the new factory in FACTORIES"


@pytest.mark.parametrize("factory", sorted(FACTORIES))
def test_factories_refuse_values_that_the_float32_cast_would_change(factory):
  FACTORIES[factory]()  # the good call passes
  for argument in FLOATING_ARGUMENTS[factory]:
    for bad, says in ((1e39, "float32"), (1e300, "float32"), (np.nan, "non-finite")):
      values = X.copy()
      values[1, 1] = bad
      with pytest.raises(ValueError, match=says):
        FACTORIES[factory](**{argument: values})


KINDS = {  # model, the data leaves with a meaning, a value each must refuse
    "logistic_regression": ({"signs": lambda v: (v > 0).astype(v.dtype)}),
    "softmax_regression": ({"y": lambda v: v + 2}),
    "bradley_terry": ({"a": lambda v: v + 3, "b": lambda v: -v - 1,
                       "signs": lambda v: (v > 0).astype(v.dtype)}),
    "movielens": ({"user": lambda v: v + 2, "rating": lambda v: v + 5}),
}


@pytest.mark.parametrize("factory", sorted(KINDS))
def test_data_with_a_meaning_refuse_other_values_when_swapped_in(factory):
  """0/1 labels where signs are meant, an index past the end: with_data refuses them by
  name (JAX would clamp the gather; a zero sign ignores the parameters)."""
  objective = dsgrad.meanfield_gaussian(FACTORIES[factory]())
  data = {k: np.asarray(v) for k, v in objective.data_tree().items()}
  objective.with_data(data)  # the same data pass
  declared = {k for k, _ in objective.kinds}
  assert declared == set(KINDS[factory]), declared
  for leaf, corrupt in KINDS[factory].items():
    with pytest.raises(ValueError, match=f"'{leaf}'"):
      objective.with_data(dict(data, **{leaf: corrupt(data[leaf])}))


def test_an_approximation_given_by_name_or_as_its_factory_is_refused_at_the_factory(
    logreg_model):
  # Before, the name reached the first step as an AttributeError inside optax.
  objective = dsgrad.meanfield_gaussian(logreg_model)
  for estimator in (dsgrad.cv, dsgrad.joint_svrg, dsgrad.joint_saga):
    with pytest.raises(TypeError, match="approx must be None or a dsgrad.Approximation"):
      estimator(objective, approx="taylor")
    with pytest.raises(TypeError, match="call the factory"):
      estimator(objective, approx=dsgrad.approx.linearize)
    estimator(objective, approx=dsgrad.approx.linearize())


def test_a_model_where_an_objective_belongs_and_the_reverse_are_named(logreg_model):
  # Before, each ended in a bare AttributeError ('Model' object has no attribute
  # 'zero_noise'; 'Objective' object has no attribute 'latent_dim'), or, for the
  # estimators, was accepted and failed inside the first step.
  objective = dsgrad.meanfield_gaussian(logreg_model)
  for call in (lambda: dsgrad.fit(logreg_model, optax.adam(1e-2), dsgrad.meanfield_init(
                   logreg_model), jax.random.key(0), num_steps=2, batch_size=2),
               lambda: dsgrad.elbo(logreg_model, dsgrad.meanfield_init(logreg_model),
                                   jax.random.key(0)),
               lambda: dsgrad.joint_saga(logreg_model), lambda: dsgrad.cv(logreg_model)):
    with pytest.raises(TypeError, match=r"objective must be a dsgrad.Objective .*\(Model\): "
                                        r"a model; its objective is dsgrad.meanfield_gaussian"):
      call()
  for call in (lambda: dsgrad.meanfield_gaussian(objective),
               lambda: dsgrad.mcmc.find_reference_point(objective, jax.random.key(0)),
               lambda: dsgrad.mcmc.sample(jax.random.key(0), objective, num_samples=2,
                                          subsample_size=10)):
    with pytest.raises(TypeError, match=r"model must be a dsgrad.models.Model .*\(Objective\): "
                                        r"an Objective; pass the model it was made from"):
      call()


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: it must be an integer >= 1"),
    (["--steps", "2.5"], "a count is not truncated from a float"),
    (["--seed", "-1"], "argument --seed: it must be an integer >= 0"),
    (["--budget", "-5"], "argument --budget: it must be positive and finite, got -5.0"),
    (["--budget", "nan"], "it must be positive and finite, got nan"),
    (["--holdout", "1"], "argument --holdout: it must be a probability in (0, 1)")])
def test_command_line_settings_are_refused_by_kind(argv, message, capsys):
  # The scale suite ran with --budget -5, and an example trained 0 steps to an IndexError.
  import argparse
  from dsgrad import command_line
  parser = argparse.ArgumentParser(prog="job")
  parser.add_argument("--steps", type=command_line.count(1), default=3)
  parser.add_argument("--seed", type=command_line.count(0), default=0)
  parser.add_argument("--budget", type=command_line.positive(), default=1.0)
  parser.add_argument("--holdout", type=command_line.fraction(), default=0.1)
  with pytest.raises(SystemExit):
    parser.parse_args(argv)
  assert message in capsys.readouterr().err
  assert parser.parse_args(["--steps", "7", "--budget", "0.5"]).steps == 7


def test_an_output_folder_that_is_a_file_is_refused_where_it_is_read(tmp_path, capsys):
  # It failed with os.makedirs's bare FileExistsError (an example checks it at its start;
  # had it written at its end, the run would have been lost).
  import argparse
  from dsgrad import command_line
  parser = argparse.ArgumentParser(prog="job")
  parser.add_argument("--out", type=command_line.folder(), default="results")
  afile = tmp_path / "results.json"
  afile.write_text("{}")
  for argv, message in ((["--out", str(afile)], "is a file, not a folder"),
                        (["--out", str(afile / "figures")], "cannot be made: ")):
    with pytest.raises(SystemExit):
      parser.parse_args(argv)
    assert message in capsys.readouterr().err
  # A folder no file can be written in: os.access says yes to root there.
  if os.path.isdir("/proc"):
    with pytest.raises(SystemExit):
      parser.parse_args(["--out", "/proc/results"])
    assert "is not writable" in capsys.readouterr().err
  fresh = tmp_path / "new" / "deeper"
  assert parser.parse_args(["--out", str(fresh)]).out == str(fresh)
  assert parser.parse_args(["--out", str(tmp_path)]).out == str(tmp_path)
