"""Bayesian logistic regression with a standard normal prior."""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad.data import HostArray
from dsgrad.models.base import LinearPredictor, Model, model_data


def _check_features_labels(features, labels):
  """Validates a ``(N, D)`` feature matrix and ``(N,)`` labels; returns numpy arrays (a
  :class:`dsgrad.data.HostArray` of features is returned as is, checked in chunks)."""
  x = features if isinstance(features, HostArray) else checks.numeric_array(features,
                                                                            "features")
  y = checks.numeric_array(labels, "labels")
  if x.ndim != 2:
    raise ValueError(f"features must be a 2-D (N, D) array, got shape {x.shape}")
  if y.shape != (x.shape[0],):
    raise ValueError(f"labels must have shape ({x.shape[0]},) to match features, got {y.shape}")
  chunk = 1 << 18
  if isinstance(x, HostArray):
    x.check_unchanged()
  for start in range(0, x.shape[0], chunk):
    block = x.array[start:start + chunk] if isinstance(x, HostArray) else x[start:start + chunk]
    # Checked before the float32 cast, where values beyond its range would become inf.
    checks.check_float32_range(np.asarray(block), "features", first_row=start)
  return x, y


def _features(x):
  """Device float32 features, or host features (memory-mapped) kept where they are."""
  if isinstance(x, HostArray):
    if x.dtype != np.float32:
      raise TypeError(f"host features must be float32 (no silent cast of {x.name}), got "
                      f"{x.dtype}")
    return x
  return jnp.asarray(x, jnp.float32)


def _x(rows):
  return rows["x"]


def _signs(rows):
  return rows["signs"]


def _isotropic_hessian_diag(prior_scale: float):
  """The Hessian diagonal ``-1 / s^2`` of an ``N(0, s^2 I)`` log prior."""
  def hessian_diag(z):
    return jnp.full(jnp.shape(z), -1.0 / prior_scale ** 2, jnp.result_type(z))
  return hessian_diag


@checks.arguments(prior_scale=checks.positive())
def logistic_regression(features, labels, prior_scale: float = 1.0,
                        name: str = "logistic_regression") -> Model:
  """Binary Bayesian logistic regression: ``z ~ N(0, s^2 I)``, ``y_n ~ Bern(sigmoid(x_n . z))``.

  Args:
    features: ``(N, D)`` float array (add a column of ones for an intercept), or a
      float32 :class:`dsgrad.data.HostArray` (e.g. :func:`dsgrad.data.open_memmap`) to keep
      the features on the host / on disk.
    labels: ``(N,)`` array of labels in ``{0, 1}`` (``{-1, 1}`` is accepted too).
    prior_scale: prior standard deviation ``s``.
    name: label.

  Returns:
    A :class:`dsgrad.models.Model` with ``latent_dim = D``.

  Raises:
    ValueError: on shape mismatch, non-finite features or labels outside the binary set.

  References:
    Wang, Geffner, Domke (2024), Sec. 7.1 (Sonar, Australian).

  Example::

    >>> import jax, jax.numpy as jnp, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y, prior_scale=2.0)
    >>> model.num_data, model.latent_dim
    (100, 3)
  """
  x, y = _check_features_labels(features, labels)
  values = set(np.unique(y).tolist())
  if values <= {0, 1}:
    signs = 2.0 * y - 1.0
  elif values <= {-1, 1}:
    signs = y.astype(np.float64)
  else:
    raise ValueError(f"labels must be in {{0, 1}} or {{-1, 1}}, got values {sorted(values)[:5]}")
  data = model_data(x=_features(x), signs=jnp.asarray(signs, jnp.float32))
  n, d = x.shape

  def log_prior(z):
    return (-0.5 * jnp.sum((z / prior_scale) ** 2)
            - d * (jnp.log(prior_scale) + 0.5 * jnp.log(2 * jnp.pi)))

  def log_likelihood(z, rows):
    return jax.nn.log_sigmoid(rows["signs"] * (rows["x"] @ z))

  def log_likelihood_of_logits(logits, rows):
    return jax.nn.log_sigmoid(rows["signs"] * logits[:, 0])

  return Model(log_prior, log_likelihood, n, d, name,
               LinearPredictor(_x, 1, log_likelihood_of_logits, logistic_signs=_signs),
               log_prior_hessian_diag=_isotropic_hessian_diag(prior_scale), data=data,
               log_evidence_bound=0.0,  # labels are discrete: p(x) <= 1
               kinds=(("signs", "signs"),))


@checks.arguments(key=checks.prng_key(), num_data=checks.count(1), dim=checks.count(1),
                  feature_correlation=checks.probability(high_open=True))
def synthetic_logistic_data(key, num_data: int, dim: int, *, intercept: bool = True,
                            feature_correlation: float = 0.0, intercept_value=None):
  """Seeded synthetic logistic-regression data with a known generating weight.

  Features are standard normal (plus a ones column when ``intercept``), the true weight
  is ``N(0, I)`` and labels are Bernoulli draws. With ``feature_correlation = rho`` the
  features form a stationary AR(1) sequence, ``x_j = rho x_{j-1} + sqrt(1 - rho^2) e_j``
  (still unit variance, correlation ``rho^|i-j|``), which makes the posterior strongly
  correlated; ``intercept_value`` fixes the intercept's true weight (e.g. ``-3`` for a
  rare positive class) instead of drawing it.

  Args:
    key: PRNG key.
    num_data: ``N``.
    dim: ``D``, including the intercept column when ``intercept``.
    intercept: append a ones column (the last one).
    feature_correlation: AR(1) coefficient in ``[0, 1)``.
    intercept_value: the intercept's true weight, or ``None`` to draw it as the others.

  Returns:
    ``(features (N, D), labels (N,) in {0,1}, true_weight (D,))`` as numpy arrays.
  """
  if not 0.0 <= feature_correlation < 1.0:
    raise ValueError(f"feature_correlation must be in [0, 1), got {feature_correlation}")
  if intercept_value is not None and not intercept:
    raise ValueError("intercept_value needs intercept=True")
  x, y, w = _draw_logistic_data(key, num_data, dim, intercept,
                                float(feature_correlation),
                                None if intercept_value is None else float(intercept_value))
  return np.asarray(x), np.asarray(y), np.asarray(w)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _draw_logistic_data(key, num_data, dim, intercept, feature_correlation, intercept_value):
  # One program per setting, not one per operation (a new shape compiled 6-37 of them).
  k1, k2, k3 = jax.random.split(key, 3)
  d_free = dim - 1 if intercept else dim
  x = jax.random.normal(k1, (num_data, d_free))
  if feature_correlation > 0.0:
    rho = feature_correlation
    x = jax.lax.associative_scan(  # x_j = rho x_{j-1} + sqrt(1 - rho^2) e_j, x_0 = e_0
        lambda a, b: (a[0] * b[0], b[0] * a[1] + b[1]),
        (jnp.full_like(x, rho), x * jnp.concatenate(
            [jnp.ones((num_data, 1)), jnp.full((num_data, d_free - 1), (1 - rho**2) ** 0.5)],
            axis=1)), axis=1)[1]
  if intercept:
    x = jnp.concatenate([x, jnp.ones((num_data, 1))], axis=1)
  w = jax.random.normal(k2, (dim,))
  if intercept_value is not None:
    w = w.at[-1].set(intercept_value)
  y = jax.random.bernoulli(k3, jax.nn.sigmoid(x @ w)).astype(jnp.int32)
  return x, y, w


@checks.arguments(num_classes=checks.count(2), prior_scale=checks.positive())
def softmax_regression(features, labels, num_classes: int, prior_scale: float = 1.0,
                       name: str = "softmax_regression") -> Model:
  """Multi-class Bayesian logistic regression with a flat latent of size ``D * K``.

  ``Z ~ N(0, s^2 I)`` with ``Z`` of shape ``(D, K)`` (flattened row-major into ``z``),
  ``y_n ~ Categorical(softmax(x_n^T Z))``.

  Args:
    features: ``(N, D)`` floats (include a ones column for intercepts).
    labels: ``(N,)`` integers in ``[0, num_classes)``.
    num_classes: ``K``.
    prior_scale: prior standard deviation.
    name: label.

  Returns:
    A :class:`dsgrad.models.Model` with ``latent_dim = D * K``.

  References:
    Wang, Geffner, Domke (2024), Sec. 7.1 (MNIST, D = 785 x 10).

  Example::

    >>> import numpy as np, dsgrad
    >>> x = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    >>> labels = np.arange(60) % 3
    >>> model = dsgrad.models.softmax_regression(x, labels, num_classes=3)
    >>> model.latent_dim  # D * K
    12
  """
  x, y = _check_features_labels(features, labels)
  if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_classes:
    raise ValueError(f"labels must be integers in [0, {num_classes})")
  data = model_data(x=jnp.asarray(x, jnp.float32), y=jnp.asarray(y, jnp.int32))
  n, d = x.shape
  k = num_classes

  def log_prior(z):
    return (-0.5 * jnp.sum((z / prior_scale) ** 2)
            - d * k * (jnp.log(prior_scale) + 0.5 * jnp.log(2 * jnp.pi)))

  def log_likelihood_of_logits(logits, rows):
    return jnp.take_along_axis(jax.nn.log_softmax(logits), rows["y"][:, None], axis=1)[:, 0]

  def log_likelihood(z, rows):
    return log_likelihood_of_logits(rows["x"] @ z.reshape(d, k), rows)

  return Model(log_prior, log_likelihood, n, d * k, name,
               LinearPredictor(_x, k, log_likelihood_of_logits),
               log_prior_hessian_diag=_isotropic_hessian_diag(prior_scale), data=data,
               log_evidence_bound=0.0,  # labels are discrete: p(x) <= 1
               kinds=(("y", ("index", int(num_classes))),))
