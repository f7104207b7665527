"""Why ``dsgrad.gaussian_noise`` draws an even count of normals. With XLA free to use two
threads (these 2-core machines, not pinned), an odd count of ``jax.random.normal`` draws
inside a compiled loop ran about five times slower a number than an even count; pinned
to one core, both ran at the same speed. Printed, per number drawn in a ``fori_loop`` of
200 draws added to a vector: an even count, an odd count, and the odd count drawn as the
next even count and cut (what ``gaussian_noise`` does; the numbers are the same). Then
the scale suite's factorization model (92,001 latents) under ``dsgrad.fit`` with naive:
its step with dsgrad's noise and with a plain ``jax.random.normal`` of the odd count,
alternated in one process. Run from the project root, not pinned:

    PYTHONPATH=. python docs/scripts/odd_noise_draws.py
"""
import dataclasses
import time

import jax
import jax.numpy as jnp
import optax

import dsgrad
from benchmarks import scale_models


def per_number_ns(d, draw, loops=200):
  step = lambda t, z: z + 1e-3 * draw(jax.random.fold_in(jax.random.key(0), t), d)
  program = jax.jit(lambda z: jax.lax.fori_loop(0, loops, step, z))
  z = jnp.ones(d)
  program(z).block_until_ready()
  best = float("inf")
  for _ in range(3):
    started = time.perf_counter()
    program(z).block_until_ready()
    best = min(best, time.perf_counter() - started)
  return best / loops / d * 1e9


plain = lambda key, d: jax.random.normal(key, (d,))
cut = lambda key, d: jax.random.normal(key, (d + 1,))[:d]
print(f"even count (92,000): {per_number_ns(92_000, plain):.2f} ns a number")
print(f"odd count (92,001): {per_number_ns(92_001, plain):.2f} ns a number")
print(f"odd count drawn even and cut: {per_number_ns(92_001, cut):.2f} ns a number")

model = scale_models.factorization()
ours = model.objective
theirs = dataclasses.replace(ours, noise_fn=lambda key, batch_size: plain(key, model.dim))
params = dsgrad.families.by_name("meanfield", model.dim, log_scale=0.0).params()  # as published
optimizer = optax.chain(dsgrad.naive(), optax.adam(1e-3))
for objective in (ours, theirs):  # compile both first
  dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=200, batch_size=100,
             elbo_samples=0, progress=False)
times = {"dsgrad's noise": [], "jax.random.normal, odd count": []}
for _ in range(3):
  for (label, seconds), objective in zip(times.items(), (ours, theirs)):
    result = dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=3000,
                        batch_size=100, elbo_samples=0, progress=False)
    seconds.append(result.timing.steps / 3000 * 1e3)
for label, seconds in times.items():
  print(f"fit naive on the factorization model, {label}: "
        + ", ".join(f"{s:.3f}" for s in seconds) + " ms a step")
