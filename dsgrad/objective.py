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
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad.training import compile_cache

Params = Any
Noise = Any
LossFn = Callable[[Params, jax.Array, Noise], jax.Array]
NoiseFn = Callable[[jax.Array, int], Noise]


@checks.arguments(num_data=checks.count(1), log_evidence_bound=checks.optional(checks.real()))
@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """A doubly-stochastic objective ``f(w; n, eps)`` over ``num_data`` data.

  A mini-batch is named by its datum indices; ``loss_fn`` receives their rows of ``data``
  (:meth:`rows`) as an argument, so that compiled programs (:func:`dsgrad.fit`, the
  estimators) take the data as arguments and one compilation serves every data set of
  the same shapes (:meth:`with_data`). An objective without ``data`` closes over its data
  as constants and its ``loss_fn`` receives the indices.

  Attributes:
    loss_fn: ``loss_fn(params, rows, noise) -> values`` of shape ``(B,)``: the per-datum
      loss ``f(params; n_b, noise_b)`` for each datum of the batch, from the batch's rows
      of ``data`` (its indices when ``data`` is ``None``). Its mean over uniformly drawn
      data and noise is the objective ``F(params)``.
    noise_fn: ``noise_fn(key, batch_size) -> noise``: draws the Monte Carlo noise for a
      batch. With ``shared_noise=False`` every leaf has leading axis ``batch_size``
      (one draw per datum); with ``shared_noise=True`` it has no batch axis and the
      whole batch uses one draw.
    num_data: ``N``, the number of data.
    shared_noise: whether one noise draw is shared by the batch (see ``noise_fn``).
    name: a label used in error messages and benchmark tables.
    data: the per-datum arrays ``loss_fn`` (and the model's approximations) read, a
      pytree whose every leading axis is ``num_data`` (a model's :attr:`~dsgrad.models.
      Model.data`); the objective's pytree leaves.
    log_q_offset: optional ``(params, noise) -> log q(z) + H(q)`` at the latent
      ``z`` the noise gives. An objective whose full-data ELBO draw is
      ``log p(x, z) + H(q)`` sets it, so that the draw minus the offset is the log
      importance ratio ``log p(x, z) - log q(z)`` of the PSIS diagnostic
      (:func:`dsgrad.psis.importance_log_ratios`). The Gaussian families set it.
    source: optional ``(family name, model)`` the objective was built from
      (:func:`dsgrad.meanfield_gaussian` sets ``("meanfield_gaussian", model)``, and
      ``("meanfield_gaussian[path derivative]", model)`` with the path derivative). Fused
      kernels (:class:`dsgrad.approx.FusedTerms`) compute the naive gradient of exactly
      that objective from it; an objective whose loss was changed afterwards clears it.
    table_approximation: optional ``objective -> Approximation`` that a per-datum table
      (:func:`dsgrad.joint_saga`) uses where none is given: :func:`dsgrad.meanfield_gaussian`
      sets :func:`dsgrad.approx.sparse_linearize` for a model that declares which
      coordinates each datum reads (``reads=``), whose table then holds those only. Cleared
      with ``source``.
    log_evidence_bound: optional upper bound on the log evidence that the ELBO
      (``-`` the mean loss) cannot exceed (:attr:`dsgrad.models.Model.log_evidence_bound`,
      which the BBVI objectives copy): an estimate above it is flagged.
    kinds: what data values mean (:attr:`dsgrad.models.Model.kinds`), checked by
      :meth:`with_data`.

  The noise must have mean zero for :func:`dsgrad.approx.linearize`: an objective whose
  natural noise is not centred (Gaussian dropout's ``eps ~ N(1, s^2)``) exposes the
  centred noise ``eps - 1`` instead.

  An objective is a pytree whose leaves are its data arrays (the functions and
  ``num_data`` are its static structure; a host array is an int32 handle), like an
  equinox module:
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
  data: Any = None
  log_q_offset: Callable[[Any, Noise], jax.Array] | None = None
  source: tuple | None = None
  table_approximation: Callable | None = None
  log_evidence_bound: float | None = None
  kinds: tuple = ()

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    data_lib.register_with_data(cls)

  def __post_init__(self):
    if not isinstance(self.num_data, int) or self.num_data < 1:
      raise ValueError(f"num_data must be a positive int, got {self.num_data!r}")
    for name in ("loss_fn", "noise_fn", "log_q_offset", "table_approximation"):
      value = getattr(self, name)
      if not callable(value) and not (name in ("log_q_offset", "table_approximation")
                                      and value is None):
        raise TypeError(f"dsgrad.Objective: {name} must be a function, got "
                        f"{type(value).__name__} {value!r:.60}")
    if self.data is not None:
      object.__setattr__(self, "data", data_lib.placed(self.data, f"{self.name}.data"))
      data_lib.check_data(self.data, self.num_data, f"{self.name}.data")
    self._check_noise_sharing()

  def _check_noise_sharing(self) -> None:
    """Refuses a noise function whose draws do not match ``shared_noise``: a per-datum
    objective given a shared draw (no batch axis) would broadcast one draw over the batch,
    or index into its coordinates as if they were data, without any error."""
    try:
      # The key made inside the trace: a concrete one would compile a program.
      specs = [jax.eval_shape(lambda b=b: self.noise_fn(jax.random.key(0), b)) for b in (2, 3)]
    except Exception:  # noqa: BLE001  (a noise_fn that needs more than this is checked later)
      return
    leaves = [jax.tree.leaves(spec) for spec in specs]
    for leaf in leaves[0] + leaves[1]:
      if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
        raise TypeError(f"{self.name}: noise_fn draws complex noise ({leaf.dtype}); the "
                        "gradients of a real objective need real noise")
    if self.shared_noise:
      # One draw for any batch: the full-data ELBO draws it once for all its chunks.
      shapes = [[leaf.shape for leaf in found] for found in leaves]
      if shapes[0] != shapes[1]:
        raise ValueError(
            f"{self.name}: shared_noise=True but noise_fn(key, batch_size) draws leaves of "
            f"shapes {shapes[0]} and {shapes[1]} for batches of 2 and 3: shared noise is one "
            "draw for the whole batch, with no batch axis. Pass shared_noise=False for one "
            "draw per datum")
      return
    for two, three in zip(*leaves):
      if two.shape[:1] != (2,) or three.shape[:1] != (3,):
        raise ValueError(
            f"{self.name}: shared_noise=False but noise_fn(key, batch_size) draws leaves of "
            f"shapes {two.shape} and {three.shape} for batches of 2 and 3: a per-datum "
            "objective needs one draw per datum (leading axis batch_size). Pass "
            "shared_noise=True for one draw shared by the batch, or a per-datum noise_fn "
            "(dsgrad.gaussian_noise(shape) rather than gaussian_noise(shape, shared=True))")

  # ------------------------------------------------------------------ data
  def data_tree(self):
    """The data this objective computes with (``{}`` if none)."""
    return {} if self.data is None else self.data

  def rows(self, indices, contiguous: bool = False):
    """The rows of :attr:`data` at ``indices``: what ``loss_fn`` receives (``indices``
    themselves for an objective without data). ``contiguous``: ``indices`` are a range,
    read as a slice (:func:`dsgrad.data.rows_of`)."""
    return data_lib.rows_of(self.data, indices, contiguous)

  def with_data(self, values) -> "Objective":
    """This objective on other data of the same shapes and dtypes.

    Only the pytree's leaves change, so every program compiled for this objective (a
    ``jax.jit`` taking it as an argument, :func:`dsgrad.fit`'s segments,
    :func:`dsgrad.elbo`) serves the copy; :func:`dsgrad.fit`'s segment also serves an
    optimizer made again with the same settings (``optax.adam(1e-2)`` twice).

    Args:
      values: a pytree like :meth:`data_tree` (``{name: array}`` for dsgrad's models):
        NumPy arrays, JAX arrays, or :class:`dsgrad.data.HostArray` (host/memory-mapped).

    Raises:
      ValueError/TypeError: a missing or extra key, leaves that disagree on ``N``, a leaf
        whose shape or dtype differs from this objective's, or values that do not mean
        what the model's data mean (:mod:`dsgrad.data_kinds`).
    """
    if self.data is None:
      raise ValueError(f"{self.name} declares no data (objective.data); build it from a "
                       "dsgrad model to swap its data")
    values = data_lib.replacement(self.data, values, self.kinds, f"{self.name}.with_data")
    return dataclasses.replace(self, data=values)

  # ----------------------------------------------------------------- noise
  @checks.arguments(key=checks.prng_key(), batch_size=checks.count(1))
  def sample_noise(self, key: jax.Array, batch_size: int) -> Noise:
    """Draws the Monte Carlo noise for a batch of ``batch_size`` data."""
    return self.noise_fn(key, batch_size)

  @checks.arguments(batch_size=checks.count(1))
  def noise_spec(self, batch_size: int):
    """Shapes and dtypes of the noise for a batch (a tree of ``ShapeDtypeStruct``)."""
    # The key made inside the trace: a concrete one would compile a program.
    return jax.eval_shape(lambda: self.noise_fn(jax.random.key(0), batch_size))

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
    values = self.loss_fn(params, self.rows(indices), noise)
    if jnp.shape(values) != jnp.shape(indices):
      raise ValueError(f"{self.name}.loss_fn returned shape {jnp.shape(values)}; it must "
                       f"return one value per datum, shape {jnp.shape(indices)}")
    return values

  def value(self, params, indices, noise, *, validate: bool = True) -> jax.Array:
    """Mini-batch estimate of the objective: mean of :meth:`loss` over the batch."""
    return jnp.mean(self.loss(params, indices, noise, validate=validate))

  def value_and_grad(self, params, indices, noise, *, validate: bool = True):
    """``(value, grad)`` of the mini-batch mean loss (the naive estimator, Eq. 4).

    Called outside ``jit`` on an objective that declares its data, it runs as one compiled
    program (reused for a model built again on arrays of the same shapes)."""
    if validate:
      self.validate(indices, noise)
    # Called outside jit, one compiled program with the data as its arguments, not one
    # small program per operation (a model's gradient is 20-80 of them); inside a trace
    # it inlines. Without declared data the closure's arrays would become constants.
    run = _value_and_grad if self.data is None else _value_and_grad_program
    return run(self, params, indices, noise)

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
    return self.loss_fn(params, self.rows(jnp.reshape(index, (1,))), noise_one)[0]


def _value_and_grad(objective: Objective, params, indices, noise):
  return jax.value_and_grad(objective.value)(params, indices, noise, validate=False)


_value_and_grad_program = compile_cache.jit_by_text(_value_and_grad)


data_lib.register_with_data(Objective)


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


def standard_normal(key, shape, dtype=jnp.float32):
  """``jax.random.normal(key, shape, dtype)``, the same numbers, drawn as an even count:
  for the noise a step draws (every objective's ``noise_fn``).

  With XLA free to use two threads, an odd count of threefry draws inside a compiled loop
  (as fit's steps are) took about 30 ns a number against 6 ns for an even count, and an
  even draw cut to the odd count about 15 ns (``docs/scripts/odd_noise_draws.py``). With
  JAX's partitionable threefry (its default) every number depends on its flat position
  only, so the first ``n`` of ``n + 1`` draws are the ``n`` draws."""
  n = math.prod(shape)
  if n % 2 == 0 or not jax.config.jax_threefry_partitionable:
    return jax.random.normal(key, shape, dtype)
  return jax.random.normal(key, (n + 1,), dtype)[:n].reshape(shape)


@checks.arguments(scale=checks.positive(), dtype=checks.floating_dtype())
def gaussian_noise(shape, dtype=jnp.float32, scale: float = 1.0,
                   shared: bool = False) -> NoiseFn:
  """A noise sampler drawing ``scale * N(0, I)`` of the given per-datum ``shape``.

  Args:
    shape: shape of one datum's noise (or of the shared draw): a tuple of sizes, or one
      size for a vector.
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
  # A number is the shape of a vector, as in NumPy (gaussian_noise(3) is (3,)).
  shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
  shape = checks.sizes(1).check(shape, "dsgrad.gaussian_noise: shape")

  def noise_fn(key, batch_size):
    full = shape if shared else (batch_size,) + shape
    return scale * standard_normal(key, full, dtype)

  # What the randomized QMC sampler (dsgrad.multi_sample) needs to know to replace it.
  noise_fn.gaussian = (shape, dtype, scale, shared)
  return noise_fn
