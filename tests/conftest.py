"""Shared fixtures: a small Bayesian logistic regression and an exact ELBO gradient.

Also: one JAX compilation cache for the whole test run (shared by the xdist workers,
removed at the end), so that tests compiling the same program -- an example run and its
resumed rerun -- compile it once. Nothing is kept between runs.
"""

import os
import shutil
import subprocess
import sys
import tempfile

# The suite is bound by compiling many small programs, where LLVM's optimizations cost
# more time than they save, and where XLA's newer CPU fusion emitters take about twice as
# long to compile a small program as the older ones (measured: 35 against 17 ms for one
# eager operation). Neither changes the programs' HLO. Set before JAX starts its backend;
# the xdist workers and subprocesses started by tests inherit them.
_FAST_COMPILE = "--xla_backend_optimization_level=0"
_OLDER_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flags: str) -> bool:
  # XLA aborts the process on a flag it does not know, and a later jaxlib may drop this
  # one: try it in a child process first.
  probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
  return subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, XLA_FLAGS=flags),
                        capture_output=True, timeout=120).returncode == 0


if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
  _flags = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()
  if _xla_accepts(_flags + " " + _OLDER_EMITTERS):
    _flags += " " + _OLDER_EMITTERS
  os.environ["XLA_FLAGS"] = _flags

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dsgrad.training.batching import sample_batch
from dsgrad.models import logistic_regression, synthetic_logistic_data

N_DATA, DIM, BATCH = 50, 5, 5


def _run_cache_dir() -> str:
  # xdist workers are children of the controlling process: key the folder on its pid.
  owner = os.getppid() if "PYTEST_XDIST_WORKER" in os.environ else os.getpid()
  return os.path.join(tempfile.gettempdir(), f"dsgrad-test-jax-cache-{owner}")


jax.config.update("jax_compilation_cache_dir", _run_cache_dir())
# Every program, not only those slower than 0.3 s to compile: many tests rebuild the same
# small programs from new closures (one compile each in every worker). Measured on the
# whole suite, 2 workers: 7:38 against 7:59 and 8:07 with 0.3 (Intel Xeon, 2026-11-30).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
# The Python processes tests start (a SIGKILLed run and its restarts, x64, several
# devices) read and write the same cache: a restart compiles nothing its killed run had.
os.environ["JAX_COMPILATION_CACHE_DIR"] = _run_cache_dir()
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


def pytest_sessionfinish(session, exitstatus):
  if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or a run without xdist)
    shutil.rmtree(_run_cache_dir(), ignore_errors=True)


@pytest.fixture(scope="session")
def logreg_data():
  x, y, _ = synthetic_logistic_data(jax.random.key(0), N_DATA, DIM)
  return x, y


@pytest.fixture(scope="session")
def logreg_model(logreg_data):
  return logistic_regression(*logreg_data)


@pytest.fixture(scope="session")
def params0():
  k1, _ = jax.random.split(jax.random.key(7))
  return {"loc": 0.5 * jax.random.normal(k1, (DIM,)),
          "log_scale": jnp.full((DIM,), -1.0, jnp.float32)}


def run_python(script: str, timeout: float = 300, env: dict | None = None) -> str:
  """``script`` run by a fresh Python (for what one process can set only once, such as
  ``jax_enable_x64``, or measure only from its start, such as its peak memory), in
  ``env`` (default: this process's); its stdout, after asserting that it exited cleanly
  (its stderr's tail as the message)."""
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=timeout, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def exact_negative_elbo(model_data, num_nodes: int = 80):
  """Negative ELBO of mean-field Gaussian logistic regression by Gauss-Hermite quadrature.

  Each likelihood term depends on z only through t = x_n . z ~ N(x_n . loc,
  sum_i x_ni^2 scale_i^2), a one-dimensional expectation; the prior and entropy terms
  are closed form. Independent of dsgrad's own code.
  """
  x, y = model_data
  x = jnp.asarray(x, jnp.float32)
  s = jnp.asarray(2.0 * np.asarray(y) - 1.0, jnp.float32)
  nodes, weights = np.polynomial.hermite_e.hermegauss(num_nodes)
  nodes = jnp.asarray(nodes, jnp.float32)
  weights = jnp.asarray(weights / np.sqrt(2 * np.pi), jnp.float32)
  n, d = x.shape

  def f(params):
    loc, scale = params["loc"], jnp.exp(params["log_scale"])
    m = x @ loc
    sd = jnp.sqrt((x ** 2) @ (scale ** 2))
    t = m[:, None] + sd[:, None] * nodes[None, :]
    exp_loglik = jnp.sum(weights * jax.nn.log_sigmoid(s[:, None] * t), axis=1)
    exp_logprior = -0.5 * jnp.sum(loc ** 2 + scale ** 2) - 0.5 * d * jnp.log(2 * jnp.pi)
    entropy = jnp.sum(params["log_scale"]) + 0.5 * d * (1 + jnp.log(2 * jnp.pi))
    return -n * jnp.mean(exp_loglik) - exp_logprior - entropy

  return f


def fill_by_training(tx, objective, params, key, steps=40, lr=2e-3, batch=BATCH,
                     is_optimizer=False):
  """Runs ``steps`` SGD steps with estimator ``tx`` so its table/snapshot holds
  parameters from different iterates. ``is_optimizer``: ``tx`` outputs steps (SMISO).
  Returns ``(state, params)``."""
  state = tx.init(params)

  @jax.jit
  def step(state, params, key):
    indices, noise = sample_batch(key, objective, batch, replace=False)
    grads = objective.grad(params, indices, noise)
    out, state = tx.update(grads, state, params, indices=indices, noise=noise)
    step_ = out if is_optimizer else optax.tree.scale(-lr, out)
    return state, optax.apply_updates(params, step_)

  for k in jax.random.split(key, steps):
    state, params = step(state, params, k)
  return state, params


def assert_drawn_mean_is_expected(draw, key, label: str, num_draws: int = 20_000,
                                  z_max: float = 4.5):
  """``draw(key) -> (drawn, expected)`` (dicts of arrays): the Monte Carlo mean of
  ``drawn`` over ``num_draws`` keys equals ``expected`` (the same in every draw) within
  ``z_max`` standard errors, coordinate by coordinate. Returns one draw's ``expected``."""
  drawn, expected = jax.lax.map(draw, jax.random.split(key, num_draws))
  for name in drawn:
    samples = np.asarray(drawn[name], np.float64)
    mean, se = samples.mean(0), samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
    # Coordinates with no noise (e.g. full-rank's unused upper triangle) match exactly.
    z = np.abs(mean - np.asarray(expected[name][0])) / np.maximum(se, 1e-6)
    assert np.all(z < z_max), f"{label} {name}: {z.max():.1f} se"
  return jax.tree.map(lambda a: a[0], expected)


@pytest.fixture
def counting_jit():
  """``counting_jit(fn) -> (jax.jit(fn), traces)``: ``len(traces)`` is how many times
  ``fn`` was traced."""
  def make(fn):
    traces = []

    def counted(*args):
      traces.append(None)
      return fn(*args)

    return jax.jit(counted), traces
  return make


def ctrl_c_at(monkeypatch, block: int) -> None:
  """An interrupt (Ctrl-C) as the ``block``-th block of fit's steps ends, where Python
  first runs after waiting for it (the block's result is out, its checks not yet read);
  ``monkeypatch`` (or one of its contexts) undoes it."""
  from dsgrad.training import segments
  settle, calls = segments.SegmentRunner._settle, []

  def interrupted(self, *args):
    calls.append(block)
    if len(calls) == block:
      raise KeyboardInterrupt
    return settle(self, *args)

  monkeypatch.setattr(segments.SegmentRunner, "_settle", interrupted)
