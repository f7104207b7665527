"""The layout shows the architecture: the estimators depend on the approximation protocol
(``dsgrad.approx.base``) only, and the protocol depends on the objective only, not on
models, families or Flax."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dsgrad"


def _dsgrad_imports(path: pathlib.Path) -> set:
  """``module.name`` for every ``from dsgrad... import name`` and ``import dsgrad...``."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
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
  assert {n.split(".")[1] for n in imports} <= {"objective", "_checks", "data"}, imports
  assert "flax" not in (PACKAGE / "approx" / "base.py").read_text()


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


def test_docstring_examples_run():
  """Every ``>>>`` example in dsgrad's docstrings runs and prints what it shows."""
  import doctest
  import importlib
  failures = []
  for path in sorted(PACKAGE.rglob("*.py")):
    if ">>>" not in path.read_text():
      continue
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    module = importlib.import_module(name.removesuffix(".__init__"))
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    if result.failed:
      failures.append(name)
  assert not failures, failures


def test_one_leapfrog_implementation():
  """HMC-ECS, the AIS bound and DAIS integrate with dsgrad.integrators; no module keeps a
  leapfrog of its own."""
  for relative in ("mcmc/hmcecs.py", "mcvae/bounds.py", "annealing/dais.py"):
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
