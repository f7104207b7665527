"""Arguments by kind: how every public entry point of dsgrad checks its numeric and key
settings, before its body runs.

A function declares the kind of each argument once with :func:`arguments` (a count, a
positive size, a probability, a PRNG key, ...); every kind refuses bad values with one
message shape (the function, the argument, the value received, what is accepted), and a
test enumerates the declarations (``fn.__dsgrad_arguments__``) to draw bad values of
every kind against every entry point. Re-exported by :mod:`dsgrad.checks`, where code
built on dsgrad finds them with the other checks.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def check_positive(value, name: str, *, allow_zero: bool = False) -> float:
  """A real, finite number ``> 0`` (``>= 0`` with ``allow_zero``), or a ``ValueError``
  naming ``name``: NaN passes comparisons such as ``value <= 0`` unnoticed, and inf
  freezes or blows up whatever it scales."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a positive number, got {value!r}") from None
  if isinstance(value, bool) or np.ndim(value) != 0:
    raise ValueError(f"{name} must be a positive number, got {value!r}")
  if not np.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
    bound = "non-negative" if allow_zero else "positive"
    raise ValueError(f"{name} must be {bound} and finite, got {value!r}")
  # JAX computes in float32: a larger value becomes inf, a smaller non-zero one 0 (or a
  # denormal whose reciprocal is inf), silently, inside the first step.
  info = np.finfo(np.float32)
  # Python floats against float32 bounds would be cast to float32 (1e300 to inf, warning).
  if number > float(info.max) or 0 < number < float(info.tiny):
    raise ValueError(f"{name} must be positive and finite within float32's range "
                     f"[{info.tiny:.3g}, {info.max:.3g}], got {value!r}")
  return number


def check_count(value, name: str, minimum: int = 0, maximum: int = 2 ** 31 - 1) -> int:
  """An integer in ``[minimum, maximum]``, or a ``ValueError`` naming ``name``: a float
  (even ``3.0``) or a bool is refused rather than truncated, and a count beyond the
  int32 indices JAX uses is refused rather than wrapped."""
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or int(value) < minimum):
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} "
                     f"({type(value).__name__})")
  if int(value) > maximum:
    raise ValueError(f"{name} must be an integer >= {minimum} and <= {maximum}, got "
                     f"{value!r}")
  return int(value)


class ArgumentError(TypeError, ValueError):
  """A public function's argument of the wrong kind (type) or out of its range: both a
  ``TypeError`` and a ``ValueError``, so either ``except`` clause catches it."""


class Kind(NamedTuple):
  """How one argument is checked: ``check(value, label)`` returns the value to use (e.g.
  a NumPy integer as ``int``) or raises a ``ValueError``/``TypeError`` whose message starts
  with ``label`` and says what is accepted. ``kind`` names the kind for tests and docs."""
  kind: str
  check: Callable[[Any, str], Any]
  description: str
  spec: dict = {}


def _received(value) -> str:
  text = repr(value)
  return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(value).__name__})"


def _is_traced(value) -> bool:
  # A value traced under jit, vmap or grad can only be checked statically; its kind is
  # the caller's to ensure (dsgrad's own entry points check their arguments before
  # tracing).
  return isinstance(value, jax.core.Tracer)


def _scalar_number(value, label: str, accepted: str):
  """``value`` as a Python number, refusing strings, bools, None and arrays of rank > 0
  (``float('5')`` would otherwise accept a string)."""
  if isinstance(value, (str, bytes, bool, np.bool_)) or value is None:
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}")
  if np.ndim(value) != 0:
    raise ArgumentError(f"{label} must be {accepted} (a scalar), got shape {np.shape(value)}")
  dtype = np.asarray(value).dtype if not hasattr(value, "dtype") else np.dtype(value.dtype)
  if dtype == np.bool_ or not (np.issubdtype(dtype, np.integer)
                               or np.issubdtype(dtype, np.floating)):
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}")
  return value, dtype


def count(minimum: int = 0, maximum: int = 2 ** 31 - 1, also: tuple = ()) -> Kind:
  """An integer in ``[minimum, maximum]`` (or one of ``also``, e.g. 0 for "off"). A float,
  even ``3.0``, is refused rather than truncated, a bool or a string by its type."""
  accepted = f"an integer >= {minimum}" + (f" (or {', '.join(map(str, also))})" if also else "")

  def check(value, label):
    if _is_traced(value):
      return value
    value, dtype = _scalar_number(value, label, accepted)
    if not np.issubdtype(dtype, np.integer):
      raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}: a count is "
                      "not truncated from a float")
    number = int(value)
    if number in also:
      return number
    if number < minimum or number > maximum:
      raise ArgumentError(f"{label} must be {accepted} and <= {maximum}, got {number}")
    return number

  return Kind("count", check, accepted, dict(minimum=minimum, maximum=maximum, also=also))


def positive(allow_zero: bool = False) -> Kind:
  """A real, finite number ``> 0`` (``>= 0`` with ``allow_zero``) within float32's range."""
  accepted = "a non-negative finite number" if allow_zero else "a positive finite number"

  def check(value, label):
    if _is_traced(value):
      return value
    _scalar_number(value, label, accepted)
    check_positive(value, label, allow_zero=allow_zero)
    return value

  return Kind("positive", check, accepted, dict(allow_zero=allow_zero))


def real() -> Kind:
  """A real, finite number (any sign)."""
  accepted = "a finite real number"

  def check(value, label):
    if _is_traced(value):
      return value
    _scalar_number(value, label, accepted)
    if not np.isfinite(float(value)):
      raise ArgumentError(f"{label} must be {accepted}, got {value!r}")
    return value

  return Kind("real", check, accepted)


def finite_values() -> Kind:
  """A number or a numeric array whose values are all finite (e.g. an initial location:
  one inf makes every objective value NaN)."""
  accepted = "a finite number or an array of finite numbers"

  def check(value, label):
    if _is_traced(value):
      return value
    if isinstance(value, (str, bytes, bool, np.bool_)) or value is None:
      raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}")
    try:
      array = np.asarray(value)
    except Exception:  # pylint: disable=broad-except
      raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}") from None
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
      raise ArgumentError(f"{label} must be {accepted}, got dtype {array.dtype}")
    if not np.all(np.isfinite(array)):
      raise ArgumentError(f"{label} must be {accepted}; it holds NaN or inf")
    return value

  return Kind("finite", check, accepted)


def parameters() -> Kind:
  """A pytree of floating arrays whose values are all finite: variational parameters or a
  start (one NaN makes every ELBO, gradient and draw computed from them NaN, silently)."""
  accepted = "a pytree of floating arrays with finite values"

  def check(value, label):
    leaves = jax.tree.leaves_with_path(value)
    if not leaves:
      raise ArgumentError(f"{label} must be {accepted}, got no array: {_received(value)}")
    for path, leaf in leaves:
      if _is_traced(leaf):
        continue
      where = f"{label}{jax.tree_util.keystr(path)}"
      dtype = getattr(leaf, "dtype", None)
      if isinstance(leaf, (str, bytes, bool, np.bool_)) or leaf is None or not (
          jnp.issubdtype(dtype if dtype is not None else np.asarray(leaf).dtype, jnp.floating)):
        raise ArgumentError(f"{where} must be a floating array, got {_received(leaf)} "
                            "(jnp.asarray(x, jnp.float32))")
      # On the device, so that a sharded leaf is not gathered to the host.
      if not bool(jnp.all(jnp.isfinite(leaf))):
        raise ArgumentError(f"{where} holds NaN or inf; {label.rsplit(': ', 1)[-1]} must "
                            "be finite")
    return value

  return Kind("parameters", check, accepted)


def probability(low_open: bool = False, high_open: bool = False) -> Kind:
  """A number in ``[0, 1]``; ``low_open``/``high_open`` exclude an end."""
  interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
  accepted = f"a probability in {interval}"

  def check(value, label):
    if _is_traced(value):
      return value
    _scalar_number(value, label, accepted)
    number = float(value)
    bad = (not np.isfinite(number) or number < 0 or number > 1
           or (low_open and number == 0) or (high_open and number == 1))
    if bad:
      raise ArgumentError(f"{label} must be {accepted}, got {value!r}")
    return value

  return Kind("probability", check, accepted, dict(low_open=low_open, high_open=high_open))


def prng_key() -> Kind:
  """A JAX PRNG key: ``jax.random.key(seed)`` or a legacy ``jax.random.PRNGKey(seed)``."""
  accepted = "a JAX PRNG key (jax.random.key(seed))"

  def check(value, label):
    if _is_traced(value):
      return value
    dtype = getattr(value, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      if np.ndim(value) != 0:
        raise ArgumentError(f"{label} must be one key, got an array of keys of shape "
                         f"{tuple(value.shape)}")
      return value
    if (isinstance(value, (jax.Array, np.ndarray)) and dtype == np.uint32
        and tuple(value.shape) == (2,)):
      return value  # a legacy raw key
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}")

  return Kind("key", check, accepted)


def byte_budget() -> Kind:
  """``"auto"``, ``None`` (no limit) or a positive number of bytes; a string such as
  ``"1GB"`` is refused rather than misread."""
  accepted = "'auto', None or a positive number of bytes"

  def check(value, label):
    if value is None or (isinstance(value, str) and value == "auto") or _is_traced(value):
      return value
    _scalar_number(value, label, accepted)
    check_positive(value, label)
    return value

  return Kind("bytes", check, accepted)


def floating_dtype() -> Kind:
  """A floating dtype (``jnp.float32``, ``jnp.bfloat16``, ...): a table or state stored in
  integers would truncate every gradient written to it."""
  accepted = "a floating dtype (e.g. jnp.float32 or jnp.bfloat16)"

  def check(value, label):
    try:
      dtype = jnp.dtype(value)
    except TypeError:
      raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}") from None
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ArgumentError(f"{label} must be {accepted}, got {dtype.name}")
    return value

  return Kind("dtype", check, accepted)


def approximation() -> Kind:
  """``None`` (the estimator's default) or an approximation ``f~``
  (:class:`dsgrad.Approximation`, e.g. ``dsgrad.approx.linearize()``): a name such as
  ``"taylor"`` or the factory itself would fail only inside the first step."""
  accepted = "None or a dsgrad.Approximation (e.g. dsgrad.approx.linearize())"

  def check(value, label):
    if value is None or all(callable(getattr(value, f, None))
                            for f in ("grad_and_expected", "expected_grad")):
      return value
    hint = (": call the factory, e.g. dsgrad.approx.linearize()"
            if callable(value) and not isinstance(value, type) else "")
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}{hint}")

  return Kind("approximation", check, accepted, dict(optional=True))


def _is_objective(value) -> bool:
  return all(hasattr(value, f) for f in ("loss_fn", "noise_fn", "num_data"))


def _is_model(value) -> bool:
  return all(hasattr(value, f) for f in ("log_prior", "latent_dim", "num_data"))


def objective() -> Kind:
  """A :class:`dsgrad.Objective` (what estimators, :func:`dsgrad.fit` and the diagnostics
  take); a model in its place is named, with how to make its objective."""
  accepted = "a dsgrad.Objective (e.g. dsgrad.meanfield_gaussian(model))"

  def check(value, label):
    if _is_objective(value):
      return value
    hint = (": a model; its objective is dsgrad.meanfield_gaussian(model) (or build both "
            "with dsgrad.objective_from_logdensity)" if _is_model(value) else "")
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}{hint}")

  return Kind("objective", check, accepted)


def model() -> Kind:
  """A :class:`dsgrad.models.Model` (what the families, samplers and proxies take); an
  objective in its place is named, with where its model comes from."""
  accepted = "a dsgrad.models.Model (e.g. dsgrad.model_from_logdensity(...))"

  def check(value, label):
    if _is_model(value):
      return value
    hint = (": an Objective; pass the model it was made from (dsgrad.model_from_logdensity "
            "takes the same log prior, log likelihood and data)" if _is_objective(value)
            else "")
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}{hint}")

  return Kind("model", check, accepted)


def _why_not_an_optimizer(value, factory: bool) -> str | None:
  """Why the callable ``value`` is no optimizer: a factory such as ``optax.adam`` (its first
  parameter is the learning rate), or with ``factory`` a function that cannot take the
  number of steps; None where it may be one (or Python cannot tell: a builtin)."""
  try:
    signature = inspect.signature(value)
  except (TypeError, ValueError):
    return None
  if next(iter(signature.parameters), None) in ("learning_rate", "lr", "step_size"):
    return " itself, a factory that takes a learning rate: call it, e.g. optax.adam(1e-2)"
  if factory:
    try:
      signature.bind(0)
    except TypeError:
      return f" with signature {signature}, which cannot take the number of steps"
  return None


def optimizer(factory: bool = False, estimator: bool = False) -> Kind:
  """An optax transformation (an object with ``init`` and ``update``); with ``factory``,
  also a function ``num_steps -> transformation``; with ``estimator``, the estimator
  first in a chain, whose output may be a gradient (``dsgrad.naive()``). ``optax.adam``
  itself is refused by name: called with a step count it would build Adam whose learning
  rate is that count."""
  accepted = ("an optax transformation (e.g. " + ("dsgrad.joint_svrg(objective))" if estimator
                                                 else "optax.adam(1e-2))") + (
      " or a function num_steps -> transformation (e.g. lambda n: "
      "optax.adam(optax.cosine_decay_schedule(1e-2, n)))" if factory else ""))

  def check(value, label):
    if not estimator and getattr(getattr(value, "update", None), "outputs_a_gradient", False):
      raise ArgumentError(f"{label} must be {accepted}, got dsgrad.naive() alone: its output "
                          "is a gradient, not a step; chain an update rule after it")
    if _is_transformation(value):
      return value
    if callable(value) and (why := _why_not_an_optimizer(value, factory)):
      name = getattr(value, "__qualname__", type(value).__name__)
      raise ArgumentError(f"{label} must be {accepted}, got {name}{why}")
    if factory and callable(value) and not isinstance(value, type):
      return value
    hint = (": a function num_steps -> transformation is taken by dsgrad.recommend; call it "
            "with the number of steps here" if callable(value) else "")
    raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}{hint}")

  return Kind("optimizer", check, accepted, dict(factory=factory, estimator=estimator))


def estimator() -> Kind:
  """A gradient estimator, first in a chain: :func:`optimizer` with ``estimator``."""
  return optimizer(estimator=True)


def _is_transformation(value) -> bool:
  return callable(getattr(value, "init", None)) and callable(getattr(value, "update", None))


def sizes(minimum: int = 1) -> Kind:
  """A sequence of integers ``>= minimum`` (layer widths, channel counts)."""
  element = count(minimum)
  accepted = f"a sequence of integers >= {minimum}"

  def check(value, label):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
      raise ArgumentError(f"{label} must be {accepted}, got {_received(value)}")
    return tuple(element.check(v, f"{label}[{i}]") for i, v in enumerate(value))

  return Kind("sizes", check, accepted, dict(minimum=minimum))


def or_word(kind: Kind, *words: str) -> Kind:
  """``kind``, or one of the strings ``words`` (e.g. ``"adaptive"``)."""
  names = " or ".join(repr(w) for w in words)

  def check(value, label):
    if isinstance(value, str) and value in words:
      return value
    if isinstance(value, str):
      raise ArgumentError(f"{label} must be {kind.description} or {names}, got {value!r}")
    return kind.check(value, label)

  return Kind(kind.kind, check, f"{kind.description} or {names}", {**kind.spec, "words": words})


def optional(kind: Kind) -> Kind:
  """``kind``, or ``None``."""
  def check(value, label):
    return None if value is None else kind.check(value, label)
  return Kind(kind.kind, check, f"{kind.description} or None", {**kind.spec, "optional": True})


def arguments(**kinds: Kind):
  """Declares the kind of each named argument of a public function (or of a class's
  constructor) and checks it on every call, before the body runs.

  Errors name the function and argument, the value received and what is accepted::

    @checks.arguments(num_steps=checks.count(1), step_size=checks.positive())
    def run(model, *, num_steps: int, step_size: float = 0.1): ...

    run(model, num_steps=2.5)
    # TypeError: dsgrad...run: num_steps must be an integer >= 1, got 2.5 (float): ...

  The declarations stay on the function as ``__dsgrad_arguments__``.
  """
  def decorate(target):
    if isinstance(target, type):
      target.__init__ = decorate(target.__init__)
      target.__dsgrad_arguments__ = kinds
      return target
    signature = inspect.signature(target)
    unknown = set(kinds) - set(signature.parameters)
    if unknown:
      raise TypeError(f"{target.__qualname__} has no argument {sorted(unknown)}")
    owner = target.__qualname__.removesuffix(".__init__")

    def bind(method, args, kwargs):  # named, with the signature, not a bare "got an ..."
      try:
        return method(*args, **kwargs)
      except TypeError as error:
        hints = [_REMOVED[k] for k in kwargs if k in _REMOVED and k not in signature.parameters]
        shown = signature.replace(return_annotation=inspect.Signature.empty)
        raise TypeError(f"{_called_as(target, owner)}{shown}: {error}"
                        + "".join(f". {h}" for h in hints)) from None

    @functools.wraps(target)
    def call(*args, **kwargs):
      bound = bind(signature.bind_partial, args, kwargs)
      for name, kind in kinds.items():
        if name in bound.arguments:
          bound.arguments[name] = kind.check(bound.arguments[name],
                                             f"{_called_as(target, owner)}: {name}")
      # Then a missing argument: Python's "fit() missing ..." named neither dsgrad nor the
      # others (a bad value given is named first, by its kind).
      bind(signature.bind, bound.args, bound.kwargs)
      return target(*bound.args, **bound.kwargs)

    call.__dsgrad_arguments__ = kinds
    return call

  return decorate


_REMOVED = {
    "value_checks": "The estimators no longer check each update; wrap the optimizer for "
                    "the checks of a loop of your own: dsgrad.checked(optimizer, objective)",
}
"""Keywords that dsgrad's functions took once, with what replaced them."""


def _called_as(target, owner: str) -> str:
  """The name users call ``target`` by: ``dsgrad.fit`` where the package re-exports it
  (not ``dsgrad.training.loop.fit``), else its module's package and its name
  (``dsgrad.mcmc.sample``, not ``dsgrad.mcmc.sample.sample``)."""
  top = sys.modules.get("dsgrad")
  if getattr(getattr(top, owner.split(".")[0], None), "__wrapped__", None) is target:
    return f"dsgrad.{owner}"
  return f"{target.__module__.rsplit('.', 1)[0]}.{owner}"
