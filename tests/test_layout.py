"""The layout shows the architecture: the estimators depend on the approximation protocol
(``dsgrad.approx.base``) only, and the protocol depends on the objective only, not on
models, families or Flax."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dsgrad"


def _parse(text: str) -> ast.Module:
  """``ast.parse``, again where CPython 3.11 raises "AST constructor recursion depth
  mismatch", an error in its AST state seen in threaded programs (CPython gh-106905): here
  in 2 of 3 runs of this file beside test_recommend's threads in the same workers."""
  for _ in range(4):
    try:
      return ast.parse(text)
    except SystemError:
      pass
  return ast.parse(text)


def _dsgrad_imports(path: pathlib.Path) -> set:
  """``module.name`` for every ``from dsgrad... import name`` and ``import dsgrad...``."""
  names = set()
  for node in ast.walk(_parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsgrad"):
      names.update(f"{node.module}.{a.name}" for a in node.names)
    elif isinstance(node, ast.Import):
      names.update(a.name for a in node.names if a.name.startswith("dsgrad"))
  return names


def test_estimators_import_only_the_approximation_protocol():
  for path in sorted((PACKAGE / "estimators").glob("*.py")):
    approx = {n for n in _dsgrad_imports(path) if n.startswith("dsgrad.approx")}
    assert all(n.startswith("dsgrad.approx.base") for n in approx), (path, approx)
    assert not {n for n in _dsgrad_imports(path)
                if n.startswith(("dsgrad.models", "dsgrad.families", "dsgrad.mcvae"))}, path


def test_the_approximation_protocol_depends_on_the_objective_only():
  imports = _dsgrad_imports(PACKAGE / "approx" / "base.py")
  # derivatives: jax's second derivatives, also through custom_vjp; it imports no dsgrad.
  assert {n.split(".")[1] for n in imports} <= {"objective", "checks", "data",
                                               "derivatives"}, imports
  assert not _dsgrad_imports(PACKAGE / "derivatives.py")
  assert "flax" not in (PACKAGE / "approx" / "base.py").read_text()


CORE_DEPENDENCIES = {"jax", "jaxlib", "numpy", "optax", "flax", "chex", "dsgrad", "__future__"}


def _module_level_imports(path: pathlib.Path) -> list:
  """Top-level package names a module imports when it is imported (not inside functions)."""
  names = []
  for node in _parse(path.read_text()).body:
    for statement in node.body if isinstance(node, ast.Try) else [node]:
      if isinstance(statement, ast.Import):
        names += [a.name.split(".")[0] for a in statement.names]
      elif isinstance(statement, ast.ImportFrom) and statement.level == 0:
        names.append(statement.module.split(".")[0])
  return names


def test_import_dsgrad_loads_only_the_core_dependencies():
  """``import dsgrad`` reads the standard library and the core dependencies only; scipy's
  QMC points, arviz-stats and the examples' extras are imported where they are used
  (scipy.stats alone took about 1.2 s of a 5 s ``import dsgrad``). ``contrib`` is imported
  by its users, with its extra."""
  import sys  # pylint: disable=import-outside-toplevel
  allowed = CORE_DEPENDENCIES | set(sys.stdlib_module_names)
  found = {f"{path.relative_to(PACKAGE.parent)}: {name}"
           for path in PACKAGE.rglob("*.py") if "contrib" not in path.parts
           for name in _module_level_imports(path) if name not in allowed}
  assert not found, sorted(found)


def test_benchmarks_live_outside_the_installed_package():
  root = PACKAGE.parent
  assert not (PACKAGE / "bench").exists()
  assert (root / "benchmarks" / "__main__.py").exists()
  pyproject = (root / "pyproject.toml").read_text()
  assert 'include = ["dsgrad*"]' in pyproject  # setuptools installs dsgrad* only
  for path in (root / "benchmarks").glob("*.py"):
    private = {n for n in _dsgrad_imports(path)
               if any(part.startswith("_") for part in n.split(".")[1:])}
    assert not private, (path.name, private)  # benchmarks use the public API


# One test per module, so that the two test workers share the examples' time.
_WITH_EXAMPLES = [".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
                  .removesuffix(".__init__")
                  for path in sorted(PACKAGE.rglob("*.py")) if ">>>" in path.read_text()]


@pytest.mark.parametrize("name", _WITH_EXAMPLES)
def test_docstring_examples_run(name):
  """Every ``>>>`` example in dsgrad's docstrings runs and prints what it shows."""
  import doctest
  import importlib
  result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
  assert result.attempted and not result.failed, name


def test_one_leapfrog_implementation():
  """HMC-ECS, the AIS bound and DAIS integrate with dsgrad.integrators; no module keeps a
  leapfrog of its own."""
  for relative in ("mcmc/hmc.py", "mcvae/bounds.py", "annealing/dais.py"):
    assert "dsgrad.integrators" in _dsgrad_imports(PACKAGE / relative) or any(
        n.startswith("dsgrad.integrators") for n in _dsgrad_imports(PACKAGE / relative)), \
        relative
  for path in PACKAGE.rglob("*.py"):
    if path.name != "integrators.py":
      assert "def leapfrog" not in path.read_text(), path


def test_annealing_does_not_reach_into_the_vae_package():
  """DAIS shares the tempered path with the Monte Carlo VAEs through dsgrad.tempering."""
  for path in (PACKAGE / "annealing").glob("*.py"):
    assert not any(n.startswith("dsgrad.mcvae") for n in _dsgrad_imports(path)), path


def _package_of(module: str) -> str:
  """``dsgrad.estimators`` for ``dsgrad.estimators.saga``; ``dsgrad`` for ``dsgrad.training.loop``."""
  parts = module.split(".")
  path = PACKAGE.parent.joinpath(*parts)
  return module if path.is_dir() else ".".join(parts[:-1])


def _private_imports(path: pathlib.Path, importer_package: str | None) -> list:
  """Imports of a private dsgrad name (a ``_x`` module or name) from a package other than
  ``importer_package`` (``None``: from any package)."""
  found = []
  for node in ast.walk(_parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsgrad"):
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        target = full if PACKAGE.parent.joinpath(*full.split(".")).is_dir() or \
            PACKAGE.parent.joinpath(*full.split(".")).with_suffix(".py").exists() else node.module
        private = [p for p in full.split(".")[1:] if p.startswith("_") and p != "__init__"]
        if private and _package_of(target) != importer_package:
          found.append(full)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("dsgrad") and any(
            p.startswith("_") for p in alias.name.split(".")[1:]):
          if _package_of(alias.name) != importer_package:
            found.append(alias.name)
  return found


def test_no_module_imports_a_private_name_from_another_package():
  """What several packages need is a public module; ``_x`` stays inside its package."""
  offenders = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    package = ".".join(path.parent.relative_to(PACKAGE.parent).parts)
    if found := _private_imports(path, package):
      offenders[str(path.relative_to(PACKAGE))] = found
  assert not offenders, offenders


def test_tests_use_the_public_api():
  offenders = {path.name: found for path in sorted(pathlib.Path(__file__).parent.glob("*.py"))
               if (found := _private_imports(path, None))}
  assert not offenders, offenders


def test_the_private_import_check_can_fail(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("from dsgrad.estimators import _common\nfrom dsgrad.checks import _x\n")
  assert _private_imports(bad, "dsgrad.models") == ["dsgrad.estimators._common", "dsgrad.checks._x"]
  assert _private_imports(bad, "dsgrad.estimators") == ["dsgrad.checks._x"]


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80  # of code: a docstring, however long, does not count


def test_modules_and_functions_fit_on_a_screen():
  long_modules, long_functions = {}, {}
  for path in sorted(PACKAGE.rglob("*.py")):
    text = path.read_text()
    if len(text.splitlines()) > MAX_MODULE_LINES:
      long_modules[str(path.relative_to(PACKAGE))] = len(text.splitlines())
    for node in ast.walk(_parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
          lines -= first.end_lineno - first.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long_functions[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
  assert not long_modules, long_modules
  assert not long_functions, long_functions


def test_one_batch_sampler_and_one_compile_cache():
  """Data indices are drawn by dsgrad.training.batching; compiled programs are kept by
  dsgrad.training.compile_cache, under one bound."""
  for path in PACKAGE.rglob("*.py"):
    text = path.read_text()
    if path.name != "compile_cache.py":
      assert "lru_cache" not in text and "functools.cache" not in text, path
    if path.name != "batching.py":
      assert "random.permutation(" not in text, path
  uses = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
          if "dsgrad.training.batching" in _dsgrad_imports(p) or any(
              n.startswith("dsgrad.training.batching") for n in _dsgrad_imports(p))}
  assert {"training/segments.py", "diagnostics.py", "mcmc/reference.py", "mcmc/sgmcmc.py",
          "mcmc/subsample.py"} <= uses, uses


def test_training_and_advice_are_subpackages_and_all_lists_no_internal_module():
  import types
  import dsgrad
  assert not [p.stem for p in PACKAGE.glob("*.py") if p.stem in {
      "train", "segments", "batching", "checkpoint", "resume", "evaluation_plan", "host_data",
      "parallel", "compile_cache", "progress", "advice", "race", "admission", "halving",
      "candidates", "race_elbo", "step_sizes"}]
  internal = {"checks", "argument_kinds", "data_kinds", "data_values", "objective", "tables",
              "logdensity", "diagnostics", "elbo_trust", "integrators", "tempering"}
  modules = {n for n in dsgrad.__all__ if isinstance(getattr(dsgrad, n), types.ModuleType)}
  assert not modules & internal, modules & internal
  assert all(getattr(dsgrad, n).__file__.endswith("__init__.py") or n in {"noise", "psis", "data"}
             for n in modules), modules


# The race, its verdict and the candidates; the pacing of a run to a budget of seconds
# (fit_within's, which Recommendation.fit continues the pick with) is training's
# (dsgrad/training/paced.py).
MAX_ADVICE_LINES = 600


def test_the_advice_is_one_small_subpackage_on_fits_public_surface():
  """recommend and its race fit in 600 lines, and reach training only through what fit
  offers a user (fit, compile_fit, the runs paced to a budget that fit_within is built
  on), not segments, batching or the compile cache."""
  advice = sorted((PACKAGE / "advice").glob("*.py"))
  lines = sum(len(p.read_text().splitlines()) for p in advice)
  assert lines <= MAX_ADVICE_LINES, lines
  for path in advice:
    imported = _dsgrad_imports(path)
    assert not [n for n in imported if n.startswith(("dsgrad.training.segments",
                                                      "dsgrad.training.batching",
                                                      "dsgrad.training.compile_cache"))], path


def test_the_concepts_map_names_the_modules_that_exist():
  """docs/concepts.md opens with a map of the package; it names every module and
  package of dsgrad, and nothing that is not there."""
  import re
  text = (PACKAGE.parent / "docs" / "concepts.md").read_text()
  block = re.search(r"## Map of the package\n\n```text\n(.*?)```", text, re.S).group(1)
  named = set(re.findall(r"([a-z_]+(?:\.py|/))", block)) - {"dsgrad/", "benchmarks/"}
  named = {n.rstrip("/").removesuffix(".py") for n in named}
  named |= set(re.findall(r"contrib/([a-z_]+)", block)) | {"contrib"}
  actual = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
  actual |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
  # What trains and what advises are subpackages whose every module the map names.
  actual |= {p.stem for sub in ("training", "advice") for p in (PACKAGE / sub).glob("*.py")
             if p.stem != "__init__"}
  assert {"base", "gaussian", "glm", "sparse", "dropout", "numpyro", "chain", "checked"} | actual >= named, named - actual
  assert not actual - named, actual - named


def test_the_estimators_updates_are_maths_and_read_alike():
  """Each estimator's ``update_fn`` holds its equations and its state update: it calls no
  validation (checks, check_*, validate) and takes the same arguments; the checks of a
  loop of one's own are dsgrad.checked's, and no factory takes a checks setting."""
  import inspect
  import dsgrad
  signatures = set()
  for name in ("naive", "cv", "inc", "smiso", "saga", "svrg"):
    tree = _parse((PACKAGE / "estimators" / f"{name}.py").read_text())
    update = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
              and n.name == "update_fn"]
    assert len(update) == 1, name
    called = {ast.unparse(c.func) for c in ast.walk(update[0]) if isinstance(c, ast.Call)}
    assert not [c for c in called if "check" in c or "validat" in c], (name, called)
    if name != "naive":
      signatures.add(ast.unparse(update[0].args))
  assert len(signatures) == 1, signatures
  for name in ("naive", "cv", "inc", "smiso", "joint_saga", "joint_svrg"):
    parameters = inspect.signature(getattr(dsgrad, name)).parameters
    assert not [p for p in parameters if "check" in p], name
  assert not hasattr(dsgrad.checks, "set_value_checks")


def test_nothing_in_dsgrad_rebuilds_functions_or_walks_closures():
  """Data reach a program as arguments (models and objectives are pytrees whose leaves
  are their data), so no module constructs functions or cells, reads a closure, or
  looks objects up by the name of the benchmarks package."""
  found = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(_parse(path.read_text())):
      named = (node.attr if isinstance(node, ast.Attribute) else
               node.id if isinstance(node, ast.Name) else None)
      if named in ("FunctionType", "CellType", "__closure__"):
        found.append(f"{path.name}: {named}")
      if isinstance(node, ast.Constant) and node.value == "benchmarks":
        found.append(f"{path.name}: 'benchmarks'")
  assert not found, found
