"""MkDocs hook: the build fails when a public name of dsgrad has no docstring."""

from mkdocs.exceptions import PluginError


def undocumented_public_names():
  """``module.name`` for every name in ``__all__`` of dsgrad's public modules that has no
  docstring of its own (constants and type aliases excepted)."""
  import importlib
  import inspect
  modules = ["dsgrad", "dsgrad.approx", "dsgrad.families", "dsgrad.models", "dsgrad.datasets",
             "dsgrad.training.checkpoint", "dsgrad.diagnostics", "dsgrad.training.parallel", "dsgrad.mcmc",
             "dsgrad.mcvae", "dsgrad.annealing"]
  missing = []
  for module_name in modules:
    module = importlib.import_module(module_name)
    if not inspect.getdoc(module):
      missing.append(module_name)
    names = getattr(module, "__all__", None)
    if names is None:  # no __all__: the public names the module defines itself
      names = [n for n, o in vars(module).items() if not n.startswith("_")
               and getattr(o, "__module__", None) == module_name]
    for name in names:
      obj = getattr(module, name)
      if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
        continue
      doc = (obj.__doc__ or "").strip()
      fields = getattr(obj, "_fields", None)
      if fields is not None and doc == f"{obj.__name__}({', '.join(fields)})":
        doc = ""  # the docstring NamedTuple writes when the class has none
      if not doc:
        missing.append(f"{module_name}.{name}")
  return missing


def on_pre_build(config, **kwargs):
  missing = undocumented_public_names()
  if missing:
    raise PluginError("public names without a docstring: " + ", ".join(missing))
