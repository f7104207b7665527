"""A log density holding a ``jax.custom_vjp`` function (JAX will not differentiate one
forward) trains with every control variate and samples with the Taylor proxy, with the
same numbers as the same density written without it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dsgrad
from dsgrad import derivatives


@jax.custom_vjp
def _softplus(x):
  return jnp.logaddexp(0.0, x)


_softplus.defvjp(lambda x: (_softplus(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))

N, D, G = 300, 3, 12


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, D)).astype(np.float32)
  g = rng.integers(0, G, N).astype(np.int32)
  eta = x @ np.array([1.0, -0.5, 0.3]) + rng.normal(size=G)[g]
  y = (rng.uniform(size=N) < 1 / (1 + np.exp(-eta))).astype(np.float32)
  return {"x": x, "y": y, "g": g}


def _flat_model(softplus):
  return dsgrad.model_from_logdensity(
      lambda z: -0.5 * jnp.sum(z ** 2),
      lambda z, b: b["y"] * (b["x"] @ z) - softplus(b["x"] @ z), _data(), D)


def _grouped_objective(softplus):
  def log_lik(z, b):
    eta = b["x"] @ z["w"] + z["b"][b["g"]]
    return b["y"] * eta - softplus(eta)

  return dsgrad.objective_from_logdensity(
      lambda z: -0.5 * (jnp.sum(z["w"] ** 2) + jnp.sum(z["b"] ** 2)), log_lik, _data(),
      {"w": jnp.zeros(D), "b": jnp.zeros(G)}, reads={"b": "g"})


def _run(name, softplus):
  """``(objective, estimator, params)`` of the control variate and approximation named."""
  model = _flat_model(softplus)
  meanfield, start = dsgrad.meanfield_gaussian(model), dsgrad.meanfield_init(model, 0.1, -1.0)
  if name == "joint_saga full rank":
    fullrank = dsgrad.families.objective_by_name("fullrank", model)
    return fullrank, dsgrad.joint_saga(fullrank), dsgrad.families.by_name("fullrank", D).params()
  if name == "joint_saga compact table":
    grouped = _grouped_objective(softplus)
    return grouped, dsgrad.joint_saga(grouped), dsgrad.meanfield_init(grouped, 0.1, -1.0)
  estimator = {"cv linearize": lambda: dsgrad.cv(meanfield),
               "joint_svrg gaussian_mean_taylor": lambda: dsgrad.joint_svrg(
                   meanfield, dsgrad.approx.gaussian_mean_taylor(model)),
               "cv gaussian_taylor": lambda: dsgrad.cv(
                   meanfield, dsgrad.approx.gaussian_taylor(model))}[name]()
  return meanfield, estimator, start


@pytest.mark.parametrize("name", ["cv linearize", "joint_svrg gaussian_mean_taylor",
                                  "cv gaussian_taylor", "joint_saga full rank",
                                  "joint_saga compact table"])
def test_control_variates_through_a_custom_vjp_equal_those_without(name):
  objective, estimator, params = _run(name, _softplus)
  plain = _run(name, lambda x: jnp.logaddexp(0.0, x))
  results = [dsgrad.fit(o, optax.chain(e, optax.sgd(1e-3)), p, jax.random.key(1), num_steps=30,
                        batch_size=10, elbo_samples=0, progress=False).params
             for o, e, p in ((objective, estimator, params), plain)]
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(results[0]),
                                                               jax.tree.leaves(params)))
  assert moved > 1e-3, name
  for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_taylor_proxy_through_a_custom_vjp_equals_the_one_without():
  theta = jnp.array([0.5, -0.2, 0.1])
  proxies = [dsgrad.mcmc.taylor_proxy(_flat_model(f), theta)
             for f in (_softplus, lambda x: jnp.logaddexp(0.0, x))]
  for a, b in zip(*(jax.tree.leaves(proxy) for proxy in proxies), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  rows = jnp.arange(20)
  np.testing.assert_allclose(
      dsgrad.mcmc.proxy_values(_flat_model(_softplus), proxies[0], theta + 0.1, rows),
      dsgrad.mcmc.proxy_values(_flat_model(lambda x: jnp.logaddexp(0.0, x)), proxies[1],
                               theta + 0.1, rows), rtol=1e-5, atol=1e-5)


def test_jvp_takes_forward_mode_where_it_applies_and_the_transpose_where_not():
  grad = jax.grad(lambda x: jnp.sum(_softplus(x) ** 2))
  plain = jax.grad(lambda x: jnp.sum(jnp.logaddexp(0.0, x) ** 2))
  x, v = jnp.array([0.3, -1.2]), jnp.array([1.0, 2.0])
  assert derivatives.forward_mode_applies(plain, x)
  assert not derivatives.forward_mode_applies(grad, x)
  assert not derivatives.forward_mode_applies(jax.jit(grad), x)  # inside a program too
  with pytest.raises(TypeError, match="custom_vjp"):  # what JAX does with it, lowered
    jax.jit(lambda t: jax.jvp(grad, (x,), (t,)))(v)
  got, expected = jax.jit(lambda t: derivatives.jvp(grad, (x,), (t,)))(v), jax.jvp(
      plain, (x,), (v,))
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  np.testing.assert_allclose(derivatives.hessian(lambda x: jnp.sum(_softplus(x) ** 2))(x),
                             jax.hessian(lambda x: jnp.sum(jnp.logaddexp(0.0, x) ** 2))(x),
                             rtol=1e-6)
