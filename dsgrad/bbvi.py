"""Mean-field Gaussian black-box variational inference as a doubly-stochastic objective.

``q_w(z) = N(loc, diag(exp(log_scale))^2)`` with ``w = {"loc", "log_scale"}`` and the
reparameterization ``z = T_w(eps) = loc + exp(log_scale) * eps``, ``eps ~ N(0, I)``.
The per-datum loss is Eq. 3 of the joint control variate paper:

    f(w; n, eps) = -N log p(x_n | z) - log p(z) - H(w),

whose mean over data and noise is the negative ELBO.

References:
  Wang, Geffner, Domke (2024), Eq. 1-3 and App. F.
  Kucukelbir et al. (2017). Automatic differentiation variational inference. JMLR.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dsgrad import checks
from dsgrad.families.gaussian import MeanFieldGaussian, initial_vector, bbvi_objective
from dsgrad.models.base import Model
from dsgrad.objective import Objective


def meanfield_entropy(log_scale: jax.Array) -> jax.Array:
  """Entropy ``H(w) = sum(log_scale) + d/2 (1 + log 2 pi)`` of a diagonal Gaussian."""
  d = log_scale.shape[-1]
  return jnp.sum(log_scale, axis=-1) + 0.5 * d * (1.0 + jnp.log(2.0 * jnp.pi))


@checks.arguments(loc=checks.finite_values(), log_scale=checks.finite_values())
def meanfield_init(model: Model, loc: float | jax.Array = 0.0,
                   log_scale: float | jax.Array = 0.0) -> dict:
  """Variational parameters ``{"loc": (d,), "log_scale": (d,)}`` filled with constants.

  Args:
    model: the model (gives ``d``).
    loc: the mean, a scalar or a ``(d,)`` vector.
    log_scale: the log standard deviation, a scalar or a ``(d,)`` vector.

  Returns:
    The params of :func:`meanfield_gaussian`'s objective, float32.

  Example::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> params = dsgrad.meanfield_init(dsgrad.models.logistic_regression(x, y), 0.0, -1.0)
    >>> params["log_scale"].tolist()
    [-1.0, -1.0, -1.0]
  """
  d = model.latent_dim
  return {"loc": initial_vector(loc, d, "loc"),
          "log_scale": initial_vector(log_scale, d, "log_scale")}


def meanfield_gaussian(model: Model, *, shared_noise: bool = True,
                       path_derivative: bool = False) -> Objective:
  """The mean-field Gaussian BBVI objective of a model (Eq. 3).

  Args:
    model: the model (log prior and per-datum log likelihood).
    shared_noise: if true (the default, as in the authors' code), one draw
      ``eps ~ N(0, I_d)`` serves the whole mini-batch; otherwise each datum has its own.
    path_derivative: "sticking the landing" (Roeder et al., 2017): the gradient drops the
      score term of ``log q``; unbiased, exact at a posterior inside the family, but it
      can raise the variance where ``q`` is far from the posterior, so it is off by
      default (:func:`dsgrad.families.bbvi_objective`).

  Returns:
    An :class:`dsgrad.Objective` with params ``{"loc", "log_scale"}``; its mean over data
    and noise is the negative ELBO. Cost per datum: one likelihood evaluation at one
    ``z``; with per-datum noise the likelihood is evaluated at ``B`` different ``z``.

  Example::

    >>> import jax, jax.numpy as jnp, numpy as np, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)}
    >>> noise = objective.sample_noise(jax.random.key(1), 4)
    >>> objective.loss(params, jnp.arange(4), noise).shape  # one loss per datum
    (4,)
  """
  return bbvi_objective(model, MeanFieldGaussian.transform, MeanFieldGaussian.entropy_at,
                        shared_noise=shared_noise, name="meanfield_gaussian",
                        source=("meanfield_gaussian", model),
                        path_derivative=path_derivative, log_prob=MeanFieldGaussian.log_prob_at,
                        inverse=MeanFieldGaussian.inverse_transform)
