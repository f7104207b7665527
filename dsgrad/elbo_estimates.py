"""Monte Carlo estimates of the full-data ELBO: their draws, in one pass over the data
in bounded memory (or on a uniform sample of it), their mean and standard error, and
the paired gain of one run over another at common random numbers.

Every draw uses the same noise for the same key, so estimates at two parameter sets (two
runs, or a run and its start) differ by the parameters, not the noise.

References:
  Wang, Geffner, Domke (2024), Eq. 3 (the objective whose full-data mean is estimated).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dsgrad import checks
from dsgrad import data as data_lib
from dsgrad import elbo_trust
from dsgrad.draw_statistics import (  # noqa: F401  (dsgrad.elbo_estimates.paired_gain, ...)
    control_variate_mean, mean_and_standard_error, paired_gain)
from dsgrad.objective import Objective
from dsgrad.tables import full_pass_mean
from dsgrad.training import compile_cache, host_data


@checks.arguments(objective=checks.objective(), params=checks.parameters(), key=checks.prng_key(),
                  num_samples=checks.count(2), chunk_size=checks.count(1),
                  num_data_sampled=checks.optional(checks.count(1)))
def elbo(objective: Objective, params, key, num_samples: int = 1000,
         chunk_size: int = 4096, num_data_sampled: int | None = None):
  """Full-data ELBO ``-E_eps mean_n f(w; n, eps)`` by Monte Carlo, in bounded memory.

  For a BBVI objective (Eq. 3) this is the evidence lower bound; for other objectives
  it is minus the expected full-data loss. Each Monte Carlo sample draws fresh noise
  and sweeps all data in chunks of ``chunk_size`` (a shared-noise objective uses one
  draw for all data); data read from the host (memory-mapped files) are swept once, each
  chunk's rows evaluated for a group of draws at once (:data:`ELBO_DRAWS_AT_ONCE`).
  Compiled once per (objective structure, num_samples, chunk_size): objectives made by
  :meth:`~dsgrad.Objective.with_data` share it.

  With ``num_data_sampled`` below ``N``, each sample instead reads that many data (rounded
  up to whole chunks) drawn uniformly with replacement: still unbiased, its standard
  error holding the subsampling's spread too, at that fraction of a full pass's cost
  (:func:`sampled_elbo_draws`). On large data this buys more precision per second than
  fewer full passes only when the data's terms vary less than the noise's; on a
  hierarchical model with 10^6 data the two were even.

  Where the objective exposes ``log q`` with one ``z`` per draw (the Gaussian families with
  shared noise), each full pass's ``log q(z)`` serves as a control variate of known mean
  (:func:`control_variate_mean`): near the posterior the standard error shrinks towards
  that of ``log p - log q``, which is 0 where q is exact.

  Returns:
    ``(estimate, standard_error)`` as floats.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> value, standard_error = dsgrad.elbo(objective, params, jax.random.key(1), num_samples=50)
    >>> bool(standard_error > 0), bool(value < 0)
    (True, True)
  """
  checks.check_objective_evaluates(objective, params, "elbo")
  try:
    with host_data.reads_interruptible():  # a Ctrl-C in a host read: KeyboardInterrupt
      value, se = elbo_unchecked(objective, params, key, num_samples, chunk_size,
                                 num_data_sampled)
  except NonFiniteELBO as error:
    raise located(error, objective, params, key, chunk_size) from None
  elbo_trust.warn_above_bound(value, se, objective.log_evidence_bound, "from dsgrad.elbo")
  return value, se


@checks.arguments(key=checks.prng_key(), num_samples=checks.count(2),
                  chunk_size=checks.count(1), num_data_sampled=checks.optional(checks.count(1)),
                  program_samples=checks.optional(checks.count(1)))
def elbo_unchecked(objective: Objective, params, key, num_samples: int = 1000,
                   chunk_size: int = 4096, num_data_sampled: int | None = None,
                   program_samples: int | None = None, with_log_q: bool = False):
  """:func:`elbo` without its checks of ``params`` (finite values, the objective's
  shapes): for a caller that has checked them (:func:`dsgrad.fit` evaluates the ELBO of
  params it checks itself, many times a run). With ``program_samples`` (at least
  ``num_samples``; data in memory), on :func:`elbo_draws`' program of that many draws,
  running the first ``num_samples``: a run's smaller evaluations share its last one's
  program (their draws are :func:`elbo`'s for the key all the same). ``with_log_q``: on the
  program of :func:`elbo_draws_and_log_q` (the same draws), so that a run whose last
  evaluation gives PSIS's ratios compiles one program for all its evaluations."""
  if num_data_sampled is not None and num_data_sampled < objective.num_data:
    values = sampled_elbo_draws(objective, num_samples, chunk_size)(params, key,
                                                                    num_data_sampled)
  else:
    corrected = uses_log_q(objective)
    values = _full_pass_program(objective, num_samples, program_samples, with_log_q,
                                chunk_size)(objective, params, key, count=num_samples)
    if corrected:
      draws = finite_elbo_draws(np.asarray(values[0])[:num_samples], "dsgrad.elbo")
      return control_variate_mean(draws, np.asarray(values[1])[:num_samples])
    values = np.asarray(values[0] if with_log_q else values)[:num_samples]
  return mean_and_standard_error(finite_elbo_draws(values, "dsgrad.elbo"))


def compile_elbo_unchecked(objective: Objective, params, key, num_samples: int,
                           program_samples: int | None = None, with_log_q: bool = False,
                           chunk_size: int = 4096) -> None:
  """Compiles (or finds) the program :func:`elbo_unchecked` runs for these arguments (on
  all the data) without running it: a caller that prices an evaluation's draws times
  its compile apart and then runs it once, warm, where a second run would cost another
  full pass per draw."""
  _full_pass_program(objective, num_samples, program_samples, with_log_q, chunk_size).compile(
      objective, params, key, count=num_samples)


def _full_pass_program(objective: Objective, num_samples: int, program_samples, with_log_q,
                       chunk_size: int):
  """The program of :func:`elbo_unchecked`'s full passes (:func:`_elbo_draws_program`)."""
  size = program_size(objective, num_samples, program_samples)
  return _elbo_draws_program(objective, size, chunk_size, with_log_q or uses_log_q(objective))


def uses_log_q(objective: Objective) -> bool:
  """Whether :func:`elbo` estimates ``objective``'s ELBO with ``log q`` as a control
  variate (:func:`control_variate_mean`): it exposes ``log_q_offset`` and draws one ``z``
  for all data (with one noise per datum, a draw's ``log q`` is no single number)."""
  return objective.log_q_offset is not None and objective.shared_noise


class NonFiniteELBO(ValueError):
  """An ELBO estimate whose Monte Carlo draws are not all finite
  (:func:`finite_elbo_draws`): ``who`` estimated it, ``detail`` says what was found."""

  def __init__(self, who: str, detail: str):
    super().__init__(f"{who}: {detail}")
    self.who, self.detail = who, detail


def finite_elbo_draws(draws, who: str, locate: tuple | None = None) -> np.ndarray:
  """``draws`` (Monte Carlo draws of an ELBO) as float64, refusing them where any is not
  finite: their mean would be reported as -inf or NaN with a NaN standard error.
  ``locate``: ``(objective, params, key)`` of the draws: the error then also names the
  data whose terms are not finite (:func:`located`).

  Raises:
    NonFiniteELBO: a ``ValueError`` naming ``who``, how many draws are -inf, +inf or
      NaN, and the usual causes.
  """
  values = np.asarray(draws, np.float64)
  if np.all(np.isfinite(values)):
    return values
  counts = {"-inf": int(np.sum(values == -np.inf)), "+inf": int(np.sum(values == np.inf)),
            "NaN": int(np.sum(np.isnan(values)))}
  found = ", ".join(f"{count} {name}" for name, count in counts.items() if count)
  error = NonFiniteELBO(
      who, f"the ELBO is not finite at these params ({found} of {values.size} Monte Carlo "
      "draws): the log density is -inf or NaN where q puts mass, e.g. a datum the "
      "likelihood deems impossible (log 0), a latent outside the prior's support, or an "
      "overflow (exp of a large value).")
  raise error if locate is None else located(error, *locate)


def located(error: NonFiniteELBO, objective: Objective, params, key,
            chunk_size: int = 4096) -> NonFiniteELBO:
  """``error`` with the data whose terms are not finite at one draw of q: how many, and
  the first by row, so that a user finds the datum their likelihood deems impossible
  without a search of their own. One pass over the data, on the error path only; where
  every term is finite at that draw (the prior, or other draws, are at fault), ``error``
  says so."""
  n, chunk = objective.num_data, min(chunk_size, objective.num_data)
  terms = jax.jit(lambda o, p, i, e: o.loss(p, i, e, validate=False))
  noise = objective.sample_noise(key, chunk)
  count, first = 0, None
  for start in range(0, n, chunk):
    indices = jnp.minimum(jnp.arange(start, start + chunk, dtype=jnp.int32), n - 1)
    bad = ~np.isfinite(np.asarray(terms(objective, params, indices, noise)))[:n - start]
    count += int(bad.sum())
    if first is None and bad.any():
      first = start + int(np.argmax(bad))
  where = (f" At one draw of q, {count:,} of the {n:,} data have a term that is not finite; "
           f"the first is row {first:,}: check its values and what log_lik does with them."
           if 0 < count < n else " At one draw of q, every datum's term is not finite: the "
           "log prior, or a part of the likelihood all data share, is the likelier cause."
           if count else " At one draw of q every datum's term is finite: look at the "
           "log prior, or at draws further from q's mean.")
  return NonFiniteELBO(error.who, error.detail + where)


@checks.arguments(num_samples=checks.count(1), chunk_size=checks.count(1))
def elbo_draws(objective: Objective, num_samples: int = 1000, chunk_size: int = 4096):
  """The compiled function behind :func:`elbo`: ``(params, key) -> (num_samples,)`` draws
  of the full-data ELBO, whose mean :func:`elbo` reports (corrected by ``log q`` where
  the objective exposes it: :func:`control_variate_mean`). Use it to evaluate many
  parameter sets in one program (``jax.vmap`` over params) with the same noise.

  Shared by objectives of one structure: the objective (its data) is an argument of the
  compiled program, so :meth:`~dsgrad.Objective.with_data` copies reuse it.
  Chunks run in :func:`dsgrad.tables.full_pass_mean` (a program of constant size in
  ``N``).

  Args:
    objective: the objective.
    num_samples: Monte Carlo draws per call.
    chunk_size: data per chunk of the full pass (at most, for data on the host: see
      :func:`elbo`).

  Returns:
    A function ``(params, key) -> (num_samples,)`` array, computing with ``objective``'s
    data.

  Example::

    >>> import jax, jax.numpy as jnp, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 100, 3)
    >>> objective = dsgrad.meanfield_gaussian(dsgrad.models.logistic_regression(x, y))
    >>> params = {"loc": jnp.zeros(3), "log_scale": jnp.zeros(3)}
    >>> draws = dsgrad.diagnostics.elbo_draws(objective, 8)(params, jax.random.key(1))
    >>> draws.shape
    (8,)
  """
  program = _elbo_draws_program(objective, num_samples, chunk_size)
  return functools.partial(program, objective, count=num_samples)


def elbo_draws_and_log_q(objective: Objective, num_samples: int, chunk_size: int = 4096):
  """``(params, key) -> (draws, log_q_offsets)``: :func:`elbo_draws`' draws and, for the
  same ``z_s``, the objective's ``log_q_offset`` (``log q(z_s) + H(q)``), in one program.
  Their difference is PSIS's log ratios (:func:`dsgrad.psis.importance_log_ratios`); in
  one program, an ELBO evaluation and the ratios compile once (the offsets alone, a
  program drawing the noise again, compiled in as long as the pass over the data: 0.9 s
  against 0.8 s for logistic regression on two CPU cores).

  Args:
    objective: an objective with ``log_q_offset`` and shared noise.
    num_samples: Monte Carlo draws per call.
    chunk_size: data per chunk of the full pass.

  Returns:
    A function ``(params, key) -> ((num_samples,), (num_samples,))`` arrays.
  """
  program = _elbo_draws_program(objective, num_samples, chunk_size, True)
  return functools.partial(program, objective, count=num_samples)


def shares_programs(objective: Objective) -> bool:
  """Whether ELBO estimates of fewer draws can run on a program of more
  (``elbo_unchecked``'s ``program_samples``): for data in memory, whose draws run one
  after another; from the host they run in groups, a program per draw count."""
  return not data_lib.host_leaves(objective)


SHARED_PROGRAM_DRAWS = 100
"""The fewest draws of the program a run's evaluations share (:func:`program_size`):
:func:`dsgrad.fit`'s default last evaluation, so that runs of fewer draws on the same
objective (a paced run's first part evaluates with two) find that program compiled
instead of compiling their own (0.6 s a program on 10^6 rows, two CPU cores)."""


def program_size(objective: Objective, num_samples: int, program_samples: int | None) -> int:
  """The draws of the program that runs ``num_samples`` draws: with ``program_samples`` (a
  run's shared program) and :func:`shares_programs`, the largest of the two and
  :data:`SHARED_PROGRAM_DRAWS` (the loop runs only ``num_samples``), else ``num_samples``."""
  shared = program_samples and shares_programs(objective)
  return max(program_samples, num_samples, SHARED_PROGRAM_DRAWS) if shared else num_samples


def _elbo_draws_program(objective: Objective, num_samples: int, chunk_size: int,
                        with_log_q: bool = False):
  """``(objective, params, key, count=) -> (num_samples,)``: the first ``count`` draws of
  :func:`elbo_draws`' for ``key`` (the rest zero; all of them from the host), and
  ``with_log_q`` each draw's ``log_q_offset`` after them (a pair). Callers pass ``count``
  by keyword, so that they share one compiled program."""
  return compile_cache.get_or_build(
      ("elbo_draws", jax.tree.structure(objective), num_samples, chunk_size,
       SHARED_NOISE_AT_ONCE, with_log_q),
      lambda: compile_cache.jit_by_text(functools.partial(
          _elbo_run, num_samples=num_samples, chunk_size=chunk_size, with_log_q=with_log_q)))[0]


@checks.arguments(num_samples=checks.count(1), chunk_size=checks.count(1))
def sampled_elbo_draws(objective: Objective, num_samples: int = 64, chunk_size: int = 4096):
  """``(params, key, rows) -> (num_samples,)`` ELBO draws, each on ``rows`` data: with
  ``rows >= N`` the full passes :func:`elbo_draws` makes for ``key``, else ``rows``
  (rounded up to whole chunks) drawn uniformly with replacement, scaled to the full data
  (unbiased). ``rows`` is an argument of one compiled program, so a caller can time a
  chunk and then choose how many to read without compiling again (:func:`dsgrad.recommend`
  does).

  The same ``key`` draws the same rows and noise at any ``params``: differences between
  parameter sets keep common random numbers for the subsampling too.

  Args:
    objective: the objective.
    num_samples: Monte Carlo draws per call.
    chunk_size: data per chunk (at most ``N``).

  Returns:
    A function ``(params, key, rows) -> (num_samples,)`` array.

  Example::

    >>> import jax, dsgrad
    >>> x, y, _ = dsgrad.models.synthetic_logistic_data(jax.random.key(0), 1000, 3)
    >>> model = dsgrad.models.logistic_regression(x, y)
    >>> objective = dsgrad.meanfield_gaussian(model)
    >>> params = dsgrad.meanfield_init(model, 0.0, -1.0)
    >>> draws = dsgrad.diagnostics.sampled_elbo_draws(objective, 8, 100)(
    ...     params, jax.random.key(1), 200)  # two chunks of 100 data per draw
    >>> draws.shape
    (8,)
  """
  chunk = max(1, min(int(chunk_size), objective.num_data))
  program = compile_cache.get_or_build(
      ("sampled_elbo_draws", jax.tree.structure(objective), num_samples, chunk),
      lambda: compile_cache.jit_by_text(functools.partial(
          _sampled_elbo_run, num_samples=num_samples, chunk_size=chunk)))[0]
  return host_data.interruptible(functools.partial(program, objective))


def _sampled_elbo_run(objective: Objective, params, key, rows, *, num_samples: int,
                      chunk_size: int):
  n = objective.num_data
  num_chunks = jnp.maximum(1, -(-rows // chunk_size))
  dtype = jnp.result_type(float)

  def one(k):
    k_rows, k_noise = jax.random.split(k)
    # Shared noise, one z for every chunk, is drawn once (as _elbo_run draws it).
    shared = objective.sample_noise(k_noise, 1) if objective.shared_noise else None

    def body(j, total):
      idx = jax.random.randint(jax.random.fold_in(k_rows, j), (chunk_size,), 0, n)
      noise = (shared if objective.shared_noise else
               objective.sample_noise(jax.random.fold_in(k_noise, j), chunk_size))
      return total + jnp.sum(objective.loss(params, idx, noise, validate=False).astype(dtype))

    total = jax.lax.fori_loop(0, num_chunks, body, jnp.zeros((), dtype))
    return -total / (num_chunks * chunk_size).astype(dtype)

  # All the data: the passes elbo_draws makes for the key.
  return jax.lax.cond(
      rows >= n,
      lambda: _elbo_run(objective, params, key, num_samples=num_samples,
                        chunk_size=chunk_size).astype(dtype),
      lambda: jax.lax.map(one, jax.random.split(key, num_samples)))


ELBO_DRAWS_AT_ONCE = 2 ** 20
"""Numbers the ELBO's draws computed at once on data read from the host may hold: their
latents (about the params' size each), and, four times over, a chunk's rows and
per-datum noise for each draw (at most 2^16 of those row-draws, whatever their width:
the terms' own intermediates, a network's activations, are as many times wider)."""


def _draws_at_once(objective: Objective, params, num_samples: int, chunk_size: int):
  """``(draws, rows)`` that :func:`_elbo_run` evaluates at once (:data:`ELBO_DRAWS_AT_ONCE`)."""
  latents = sum(leaf.size for leaf in jax.tree.leaves(params))
  one_row = jax.eval_shape(objective.rows, jnp.zeros((1,), jnp.int32))
  width = 1 + sum(leaf.size for leaf in jax.tree.leaves(one_row)) + (
      0 if objective.shared_noise else sum(
          leaf.size for leaf in jax.tree.leaves(objective.noise_spec(1))))
  row_draws = min(2 ** 16, 4 * ELBO_DRAWS_AT_ONCE // width)
  draws = max(1, min(num_samples, ELBO_DRAWS_AT_ONCE // (256 + latents), row_draws // 64))
  return draws, max(1, min(chunk_size, objective.num_data, row_draws // draws))


SHARED_NOISE_AT_ONCE = 2 ** 25
"""Numbers of shared noise (one ``z`` per draw, for every datum) that a full pass from the
host draws before it starts, for all its draws (128 MiB); more, and each chunk draws its
draws' noise anew."""


def _elbo_run(objective: Objective, params, key, count=None, *, num_samples: int,
              chunk_size: int, with_log_q: bool = False):
  return _elbo_passes(objective, params, key, count, num_samples, chunk_size, with_log_q)


def _elbo_passes(objective: Objective, params, key, count, num_samples: int,
                 chunk_size: int, with_log_q: bool = False):
  """The draws, and ``with_log_q`` each draw's ``log_q_offset`` after them (a pair)."""
  keys = _draw_keys(key, num_samples)
  shared = objective.shared_noise

  def noise_of(k):
    # A shared-noise draw is one z for every chunk: its noise is drawn once per pass.
    # Drawn in every chunk, 100 draws of 20,000 latents over 2,000,000 rows drew 3 * 10^9
    # normals, most of the evaluation's time (PSIS's offsets draw it with a batch of 1).
    return objective.sample_noise(k, 1)

  def draw_on(rows, idx, draw):
    """The chunk's mean loss at one draw: its shared noise, or a key for per-datum noise."""
    noise = draw if shared else objective.sample_noise(jax.random.fold_in(draw, idx[0]),
                                                       idx.shape[0])
    return jnp.mean(objective.loss_fn(params, rows, noise))

  if not data_lib.host_leaves(objective):
    # In memory, one draw's pass at a time: passes of groups of draws in smaller chunks
    # cost as much again where the latents are many (each chunk reads every latent).
    # The first `count` of them, so that one program serves evaluations of fewer draws.
    def pass_of(k):
      draw = noise_of(k) if shared else k
      # A pass's chunks are ranges of rows: read as slices, not gathered row by row.
      chunk = lambda idx: draw_on(objective.rows(idx, contiguous=True), idx, draw)
      value = -full_pass_mean(chunk, objective.num_data, chunk_size)
      if not with_log_q:
        return value
      # The offset of the pass's own noise: drawn again, the sampler (a large part of
      # the program) compiled twice, 1.0 s against 0.4 s on two CPU cores.
      return value, objective.log_q_offset(params, draw if shared else noise_of(k))
    zeros = jax.tree.map(lambda a: jnp.zeros((num_samples,), a.dtype),
                         jax.eval_shape(pass_of, keys[0]))
    return jax.lax.fori_loop(
        0, num_samples if count is None else count,
        lambda i, out: jax.tree.map(lambda o, v: o.at[i].set(v), out, pass_of(keys[i])), zeros)
  # From the host, each chunk's rows are read once for a group of draws: one draw at a
  # time, 100 draws of 200,000 rows read from disk took 3.3 s (now 0.36 s). Draws past
  # num_samples that make the groups equal are dropped.
  size, chunk = _draws_at_once(objective, params, num_samples, chunk_size)
  groups = -(-num_samples // size)
  keys = _draw_keys(key, groups * size)
  noise_size = sum(leaf.size for leaf in jax.tree.leaves(objective.noise_spec(1)))
  drawn_first = shared and groups * size * noise_size <= SHARED_NOISE_AT_ONCE
  draws = jax.vmap(noise_of)(keys) if drawn_first else keys
  draws = jax.tree.map(lambda x: x.reshape((groups, size) + x.shape[1:]), draws)

  redraw = shared and not drawn_first  # too many draws' noise to keep: each chunk's own

  def chunk_means(idx):
    rows = objective.rows(idx, contiguous=True)  # a full pass's chunk
    means = jax.lax.map(jax.vmap(
        lambda draw: draw_on(rows, idx, noise_of(draw) if redraw else draw)), draws)
    return means.reshape(-1)[:num_samples]

  values = -full_pass_mean(chunk_means, objective.num_data, chunk)
  if not with_log_q:
    return values
  # The noise of each draw's pass (noise_of), drawn again: groups of draws read each chunk.
  offsets = jax.vmap(lambda k: objective.log_q_offset(params, noise_of(k)))(
      _draw_keys(key, num_samples))
  return values, offsets


def _draw_keys(key, count: int):
  """Draw ``i``'s key, ``fold_in(key, i)``, for ``i < count``: the same whatever
  ``count``, so that the first draws of a program of more are those of one of fewer."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(count, dtype=jnp.uint32))
