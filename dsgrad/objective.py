"""The doubly-stochastic objective protocol.

A doubly-stochastic objective is ``F(w) = E_n E_eps f(w; n, eps)`` with ``n`` a datum and
``eps`` Monte Carlo noise. Every inference method in dsgrad produces one, and every
gradient estimator consumes one; nothing else needs to know about both.

References:
  Wang, Geffner, Domke (2024). Joint control variate for faster black-box variational
  inference. AISTATS. https://arxiv.org/abs/2210.07290 (Eq. 2-4).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad import data_kinds

Params = Any
Noise = Any
LossFn = Callable[[Params, jax.Array, Noise], jax.Array]
NoiseFn = Callable[[jax.Array, int], Noise]


@checks.arguments(num_data=checks.count(1), log_evidence_bound=checks.optional(checks.real()))
@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """A doubly-stochastic objective ``f(w; n, eps)`` over ``num_data`` data.

  A mini-batch is named by its datum indices alone. ``loss_fn`` reads the data through
  the :class:`dsgrad.data.DataArray` handles listed in ``data``, so that compiled programs
  (:func:`dsgrad.fit`, the estimators) take the data as an argument and one compilation
  serves every data set of the same shapes (:meth:`with_data`). An objective without
  ``data`` closes over its data as constants.

  Attributes:
    loss_fn: ``loss_fn(params, indices, noise) -> values`` of shape ``(B,)``: the
      per-datum loss ``f(params; indices[b], noise_b)`` for each datum of the batch.
      Its mean over uniformly drawn data and noise is the objective ``F(params)``.
    noise_fn: ``noise_fn(key, batch_size) -> noise``: draws the Monte Carlo noise for a
      batch. With ``shared_noise=False`` every leaf has leading axis ``batch_size``
      (one draw per datum); with ``shared_noise=True`` it has no batch axis and the
      whole batch uses one draw.
    num_data: ``N``, the number of data.
    shared_noise: whether one noise draw is shared by the batch (see ``noise_fn``).
    name: a label used in error messages and benchmark tables.
    data: ``{name: DataArray}``, the per-datum arrays ``loss_fn`` (and the model's
      approximations) read; every leading axis is ``num_data``.
    log_q_offset: optional ``(params, noise) -> log q(z) + H(q)`` at the latent
      ``z`` the noise gives. An objective whose full-data ELBO draw is
      ``log p(x, z) + H(q)`` sets it, so that the draw minus the offset is the log
      importance ratio ``log p(x, z) - log q(z)`` of the PSIS diagnostic
      (:func:`dsgrad.psis.importance_log_ratios`). The Gaussian families set it.
    source: optional ``(family name, model)`` the objective was built from
      (:func:`dsgrad.meanfield_gaussian` sets ``("meanfield_gaussian", model)``). Fused
      kernels (:class:`dsgrad.approx.FusedTerms`) compute the naive gradient of exactly
      that objective from it; an objective whose loss was changed afterwards clears it.
    log_evidence_bound: optional upper bound on the log evidence that the ELBO
      (``-`` the mean loss) cannot exceed (:attr:`dsgrad.models.Model.log_evidence_bound`,
      which the BBVI objectives copy): an estimate above it is flagged.

  The noise must have mean zero for :func:`dsgrad.approx.linearize`: an objective whose
  natural noise is not centred (Gaussian dropout's ``eps ~ N(1, s^2)``) exposes the
  centred noise ``eps - 1`` instead.

  An objective is a pytree whose leaves are its in-memory data arrays (the functions,
  ``num_data`` and the host arrays are its static structure), like an equinox module:
  ``jax.jit(step)(objective, params, indices, noise)`` takes the data as arguments of
  the compiled program, and :meth:`with_data` copies share the tree structure, so one
  compilation serves them all::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 50, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> [leaf.shape for leaf in jax.tree.leaves(objective)]
    [(50,), (50, 3)]
    >>> other = objective.with_data({"x": -x, "signs": objective.data_tree()["signs"]})
    >>> jax.tree.structure(other) == jax.tree.structure(objective)
    True
  """

  loss_fn: LossFn
  noise_fn: NoiseFn
  num_data: int
  shared_noise: bool = False
  name: str = "objective"
  data: Mapping[str, data_lib.DataArray] | None = None
  log_q_offset: Callable[[Any, Noise], jax.Array] | None = None
  source: tuple | None = None
  log_evidence_bound: float | None = None

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    _register_pytree(cls)

  def __post_init__(self):
    if not isinstance(self.num_data, int) or self.num_data < 1:
      raise ValueError(f"num_data must be a positive int, got {self.num_data!r}")
    if self.data:
      data_lib.check_data(self.data, self.num_data, f"{self.name}.data")
    self._check_noise_sharing()

  def _check_noise_sharing(self) -> None:
    """Refuses a noise function whose draws do not match ``shared_noise``: a per-datum
    objective given a shared draw (no batch axis) would broadcast one draw over the batch,
    or index into its coordinates as if they were data, without any error."""
    try:
      specs = [jax.eval_shape(lambda key, b=b: self.noise_fn(key, b), jax.random.key(0))
               for b in (2, 3)]
    except Exception:  # noqa: BLE001  (a noise_fn that needs more than this is checked later)
      return
    leaves = [jax.tree.leaves(spec) for spec in specs]
    for leaf in leaves[0] + leaves[1]:
      if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
        raise TypeError(f"{self.name}: noise_fn draws complex noise ({leaf.dtype}); the "
                        "gradients of a real objective need real noise")
    if self.shared_noise:
      return
    for two, three in zip(*leaves):
      if two.shape[:1] != (2,) or three.shape[:1] != (3,):
        raise ValueError(
            f"{self.name}: shared_noise=False but noise_fn(key, batch_size) draws leaves of "
            f"shapes {two.shape} and {three.shape} for batches of 2 and 3: a per-datum "
            "objective needs one draw per datum (leading axis batch_size). Pass "
            "shared_noise=True for one draw shared by the batch, or a per-datum noise_fn "
            "(dsgrad.gaussian_noise(shape) rather than gaussian_noise(shape, shared=True))")

  def _after_substitute(self):
    # A copy on other data (dsgrad.data.substitute) works out its own pytree structure.
    self.__dict__.pop("_cached_pytree_structure", None)

  # ------------------------------------------------------------------ data
  def data_tree(self) -> dict:
    """``{name: array}``: the data this objective computes with (empty if none)."""
    return data_lib.values_of(self.data)

  def computing_with(self, thing):
    """``thing`` (an optax transformation, an approximation, a function: anything that
    reads this objective's model's data handles) on this objective's data: a
    :func:`dsgrad.data.substitute` copy, or ``thing`` itself when it already reads them.

    An estimator built for ``objective`` and handed ``objective.with_data(new)`` computes
    with ``new`` through this."""
    return data_lib.substitute(thing, self.data, self.data_tree())

  def with_data(self, values: Mapping[str, Any]) -> "Objective":
    """This objective on other data of the same shapes and dtypes.

    The returned objective is a copy whose data handles hold ``values``
    (:func:`dsgrad.data.substitute`); it counts as the same model, so every compiled
    program (:func:`dsgrad.fit`'s segments, :func:`dsgrad.elbo`) is reused: one
    compilation serves both data sets. Pass the same optimizer object to ``fit`` to reuse
    its compilation.

    Args:
      values: ``{name: array}`` with the keys of :meth:`data_tree`; NumPy arrays,
        JAX arrays, or :class:`dsgrad.data.HostArray` (host/memory-mapped).

    Raises:
      ValueError/TypeError: a missing or extra key, leaves that disagree on ``N``, or a
        leaf whose shape or dtype differs from this objective's.
    """
    if not self.data:
      raise ValueError(f"{self.name} declares no data handles (objective.data); build it "
                       "from a dsgrad model to swap its data")
    values = dict(values)
    if set(values) != set(self.data):
      raise ValueError(f"{self.name}.with_data: expected the keys {sorted(self.data)}, got "
                       f"{sorted(values)}")
    data_lib.check_data(values, None, f"{self.name}.with_data")
    out = {}
    for key, ref in self.data.items():
      value = values[key]
      if isinstance(value, np.memmap):
        value = data_lib.HostArray(value, key)
      elif not isinstance(value, (data_lib.HostArray, jax.Array)):
        value = jnp.asarray(value)
      if tuple(value.shape) != ref.shape:
        raise ValueError(f"{self.name}.with_data: data {key!r} has shape {tuple(value.shape)}, "
                         f"expected {ref.shape} (same shapes as the objective's data)")
      if np.dtype(value.dtype) != np.dtype(ref.dtype):
        raise TypeError(f"{self.name}.with_data: data {key!r} has dtype {value.dtype}, "
                        f"expected {ref.dtype}")
      data_kinds.check_kind(ref, value, f"{self.name}.with_data: data {key!r}")
      out[key] = value
    return data_lib.substitute(self, self.data, out, new_data=True)

  def model_key(self):
    """What makes this objective the same model as another, whatever its data: the loss
    and noise functions (or the keys their constructor gave them,
    :func:`with_function_key`), ``N``, the noise sharing and the data handles. Every
    :meth:`with_data` copy shares it, in memory or on the host, and so does the same
    constructor called twice on the same model."""
    refs = tuple((k, id(r.origin)) for k, r in sorted((self.data or {}).items()))
    return (function_key(self.loss_fn), function_key(self.noise_fn), self.num_data,
            self.shared_noise, refs)

  def structure_key(self):
    """What determines this objective's compiled programs apart from its data values:
    :meth:`model_key` and which data are host arrays. Objectives made from one another
    by :meth:`with_data` with data of the same kinds share it."""
    host = tuple(sorted(k for k, v in self.data_tree().items() if data_lib.is_host(v)))
    return self.model_key() + (host,)

  # ----------------------------------------------------------------- noise
  @checks.arguments(key=checks.prng_key(), batch_size=checks.count(1))
  def sample_noise(self, key: jax.Array, batch_size: int) -> Noise:
    """Draws the Monte Carlo noise for a batch of ``batch_size`` data."""
    return self.noise_fn(key, batch_size)

  @checks.arguments(batch_size=checks.count(1))
  def noise_spec(self, batch_size: int):
    """Shapes and dtypes of the noise for a batch (a tree of ``ShapeDtypeStruct``)."""
    return jax.eval_shape(lambda key: self.noise_fn(key, batch_size), jax.random.key(0))

  @checks.arguments(batch_size=checks.count(1))
  def zero_noise(self, batch_size: int) -> Noise:
    """The noise value zero (the noise mean), shaped for a batch."""
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self.noise_spec(batch_size))

  # ------------------------------------------------------------ validation
  def check_batch(self, indices, noise) -> int:
    """Static checks of a batch; returns its size.

    Raises:
      TypeError/ValueError: naming ``indices`` or ``noise`` when the dtype, rank or
        shapes are wrong.
    """
    batch_size = checks.check_indices_static(indices)
    for leaf in jax.tree.leaves(noise):
      if jnp.issubdtype(jnp.result_type(leaf), jnp.complexfloating):
        raise TypeError(f"noise passed to {self.name} is complex ({jnp.result_type(leaf)}); "
                        f"draw it with {self.name}.sample_noise(key, batch_size)")
    checks.check_same_structure(
        noise, self.noise_spec(batch_size), "noise",
        f"{self.name}.sample_noise(key, batch_size={batch_size})")
    return batch_size

  def value_checks(self, indices, noise=None, **trees):
    """Value checks for a batch: index range and finite noise and ``trees``."""
    pending = checks.index_checks(indices, self.num_data)
    if noise is not None:
      pending += checks.finite_checks(noise, "noise")
    for name, tree in trees.items():
      pending += checks.finite_checks(tree, name)
    return pending

  def validate(self, indices, noise, **trees) -> int:
    """Static and value checks of a batch (see :meth:`check_batch`)."""
    batch_size = self.check_batch(indices, noise)
    checks.value_checks(self.value_checks(indices, noise, **trees))
    return batch_size

  # -------------------------------------------------------------- values
  def loss(self, params: Params, indices: jax.Array, noise: Noise, *,
           validate: bool = True) -> jax.Array:
    """Per-datum losses ``f(params; n, eps_n)`` for the batch, shape ``(B,)``."""
    if validate:
      self.validate(indices, noise)
    values = self.loss_fn(params, indices, noise)
    if jnp.shape(values) != jnp.shape(indices):
      raise ValueError(f"{self.name}.loss_fn returned shape {jnp.shape(values)}; it must "
                       f"return one value per datum, shape {jnp.shape(indices)}")
    return values

  def value(self, params, indices, noise, *, validate: bool = True) -> jax.Array:
    """Mini-batch estimate of the objective: mean of :meth:`loss` over the batch."""
    return jnp.mean(self.loss(params, indices, noise, validate=validate))

  def value_and_grad(self, params, indices, noise, *, validate: bool = True):
    """``(value, grad)`` of the mini-batch mean loss (the naive estimator, Eq. 4)."""
    if validate:
      self.validate(indices, noise)
    return jax.value_and_grad(self.value)(params, indices, noise, validate=False)

  def grad(self, params, indices, noise, *, validate: bool = True) -> Params:
    """Naive mini-batch gradient ``mean_b grad f(params; n_b, eps_b)`` (Eq. 4).

    Cost: one reverse-mode pass over the batch.
    """
    return self.value_and_grad(params, indices, noise, validate=validate)[1]

  def per_datum_grads(self, params, indices, noise, *, validate: bool = True) -> Params:
    """Per-datum gradients ``grad f(params; n_b, eps_b)``, leaves with leading axis B."""
    if validate:
      self.validate(indices, noise)
    return per_datum(lambda p, i, e: self.grad(p, i, e, validate=False), self,
                     params_axis=None)(params, indices, noise)

  def datum_loss(self, params, index, noise_one) -> jax.Array:
    """Scalar loss of one datum; ``noise_one`` has no batch axis."""
    if not self.shared_noise:
      noise_one = jax.tree.map(lambda x: x[None], noise_one)
    return self.loss_fn(params, jnp.reshape(index, (1,)), noise_one)[0]


class _Structure:
  """The static part of an objective's pytree: everything but its in-memory data.

  Two objectives share a structure (and hence every compiled program taking them as an
  argument) when :meth:`Objective.structure_key` agrees and they hold the same data keys:
  exactly the copies :meth:`Objective.with_data` makes with in-memory arrays.
  """

  __slots__ = ("template", "keys", "host", "_key")

  def __init__(self, template: Objective, keys: tuple, host: dict):
    self.template, self.keys, self.host = template, keys, host
    self._key = (template.structure_key(), keys,
                 tuple((k, id(v)) for k, v in sorted(host.items())))

  def __eq__(self, other):
    return isinstance(other, _Structure) and self._key == other._key

  def __hash__(self):
    return hash(self._key)

  def __repr__(self):
    return f"Objective structure of {self.template.name!r} (data {list(self.keys)})"


def with_function_key(fn: Callable, key: Hashable) -> Callable:
  """Marks ``fn`` as computing what every function marked with an equal ``key`` computes.

  A constructor that builds its loss or noise function as a fresh closure marks it with
  what determines it (the model's functions, the family, the settings), so that an
  objective built twice from the same model -- ``dsgrad.meanfield_gaussian(model)``
  handed to an estimator and again to :func:`dsgrad.fit` -- is recognised as one model
  and shares its compiled programs. A function whose key omits something it depends on
  would be confused with another, so keys list every input of the closure; an input that
  is unhashable or compares by value goes in as :class:`by_identity` ``(obj)``. A
  function derived from a marked one is a new function, unmarked until its maker marks it.
  """
  fn._dsgrad_function_key = key
  return fn


class by_identity:  # noqa: N801  (used like a function: by_identity(obj))
  """``obj`` as a part of a :func:`with_function_key` key, equal only to itself.

  For objects that are unhashable or compare by value (a model holding arrays). It keeps
  ``obj`` alive: a key holding a bare ``id(obj)`` could, once ``obj`` is collected, match a
  new object at the same address, and with it a compiled program cached for the old one.
  """

  __slots__ = ("obj",)

  def __init__(self, obj):
    self.obj = obj

  def __eq__(self, other):
    return isinstance(other, by_identity) and other.obj is self.obj

  def __hash__(self):
    return id(self.obj)


def function_key(fn: Callable) -> Hashable:
  """``fn``'s key from :func:`with_function_key`, else ``fn`` itself (identity)."""
  return getattr(fn, "_dsgrad_function_key", fn)


def _copy(objective: Objective, **changes) -> Objective:
  """A field-by-field copy with ``changes``, without ``__post_init__``'s validation."""
  out = object.__new__(type(objective))
  for field in dataclasses.fields(objective):
    object.__setattr__(out, field.name, changes.get(field.name, getattr(objective, field.name)))
  return out


def _flatten_objective(objective: Objective):
  values = objective.data_tree()
  # jit flattens its arguments at every call: the static part is built once per objective.
  structure = objective.__dict__.get("_cached_pytree_structure")
  if structure is None:
    host = {k: v for k, v in values.items() if data_lib.is_host(v)}
    keys = tuple(sorted(k for k in values if k not in host))
    # The template holds shapes, not the data, so that a compilation cache keyed by the
    # structure does not keep a data set alive.
    template = data_lib.substitute(objective, objective.data, {
        k: (v if k in host else jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)))
        for k, v in values.items()})
    structure = _Structure(template, keys, host)
    object.__setattr__(objective, "_cached_pytree_structure", structure)
  children = tuple((jax.tree_util.DictKey(k), values[k]) for k in structure.keys)
  return children, structure


def _unflatten_objective(structure: _Structure, leaves) -> Objective:
  # No validation here: JAX unflattens with placeholders (tracers, None, shardings) too.
  template = structure.template
  if not template.data:
    return _copy(template)
  return data_lib.substitute(template, template.data,
                             {**structure.host, **dict(zip(structure.keys, leaves))})


def _flatten_objective_fast(objective: Objective):
  children, structure = _flatten_objective(objective)
  return tuple(value for _, value in children), structure


def _register_pytree(cls) -> None:
  jax.tree_util.register_pytree_with_keys(
      cls, _flatten_objective, _unflatten_objective, flatten_func=_flatten_objective_fast)


_register_pytree(Objective)


def per_datum(batch_fn: Callable, objective: Objective, params_axis) -> Callable:
  """Vectorizes a batch-mean function over the data of a batch.

  Args:
    batch_fn: ``batch_fn(params, indices, noise) -> tree`` computing a mean over a batch.
    objective: the objective (tells whether the noise has a batch axis).
    params_axis: ``None`` when all data share ``params``; ``0`` when ``params`` leaves
      carry one row per datum (table rows).

  Returns:
    ``fn(params, indices, noise)`` whose output leaves have leading axis ``B``: entry
    ``b`` is ``batch_fn`` on the batch of size one ``[indices[b]]``.
  """
  noise_axis = None if objective.shared_noise else 0

  def one(p, i, e):
    if not objective.shared_noise:
      e = jax.tree.map(lambda x: x[None], e)
    return batch_fn(p, i[None], e)

  return jax.vmap(one, in_axes=(params_axis, 0, noise_axis))


@checks.arguments(scale=checks.positive())
def gaussian_noise(shape, dtype=jnp.float32, scale: float = 1.0,
                   shared: bool = False) -> NoiseFn:
  """A noise sampler drawing ``scale * N(0, I)`` of the given per-datum ``shape``.

  Args:
    shape: shape of one datum's noise (or of the shared draw).
    dtype: floating dtype.
    scale: standard deviation.
    shared: if true, one draw for the whole batch (no batch axis).

  Returns:
    ``noise_fn(key, batch_size)``.

  Example::

    >>> import jax, dsgrad
    >>> per_datum = dsgrad.gaussian_noise((3,))
    >>> per_datum(jax.random.key(0), 5).shape, dsgrad.gaussian_noise((3,), shared=True)(
    ...     jax.random.key(0), 5).shape
    ((5, 3), (3,))
  """
  shape = tuple(shape)

  def noise_fn(key, batch_size):
    full = shape if shared else (batch_size,) + shape
    return scale * jax.random.normal(key, full, dtype)

  # What the randomized QMC sampler (dsgrad.multi_sample) needs to know to replace it.
  noise_fn.gaussian = (shape, dtype, scale, shared)
  return with_function_key(noise_fn, ("gaussian_noise", shape, jnp.dtype(dtype), float(scale),
                                      bool(shared)))
