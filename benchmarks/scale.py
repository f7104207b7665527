"""Per-step cost against the number of data N, from 10^3 rows on device to 10^7 rows
memory-mapped from disk: the estimators' steps must not grow with N.

Mean-field Gaussian BBVI for binary logistic regression on synthetic data with D features,
batch B, Adam. The data are arguments of the compiled programs (:mod:`dsgrad.data`), either
device arrays or, for the ``--memmap-sizes``, a ``.npy`` feature matrix memory-mapped
from disk whose rows are read on the host and handed to the steps on the device (in
``fit``, a block of steps ahead, by a thread; here before the timed run, and the host read
is timed alone, from the page cache and from disk). Every estimator is timed as in ``step-cost`` (a
jitted ``lax.scan`` over steps with the state donated, interleaved rounds, median);
compile time is measured per runner. joint_svrg runs with a refresh period longer than the
timed window, so its figure is the cost of a step between refreshes; the refresh itself is
a full pass, O(N) by design, reported separately. The batch's row gather is timed alone in
the same kind of scan and subtracted.

The criterion: step time minus gather time grows at most 1.3x from N = 10^3 to
10^7 for naive, cv and joint SAGA. A 10^7-row memory-mapped data set then trains with
joint SAGA under :func:`dsgrad.fit`, peak memory reported.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dsgrad
from dsgrad import command_line
from dsgrad import data as data_lib
from dsgrad.training import segments
from benchmarks import _report, _timing
from dsgrad.training import batching
from dsgrad.training.batching import epoch_batches
from dsgrad import tables
from dsgrad.models import logistic_regression, synthetic_logistic_data

CRITERION = 1.3
ELBO_SAMPLES = 4
FLAT = ("naive", "cv (App. F)", "joint_saga (logit table)")
GATHER = "batch row gather alone"


def _estimators(objective, model, never):
  taylor = dsgrad.approx.gaussian_mean_taylor(model)
  return {
      "naive": dsgrad.naive(),
      "cv (App. F)": dsgrad.cv(objective, taylor, control_weight=1.0),
      "joint_saga (logit table)": dsgrad.joint_saga(
          objective, dsgrad.approx.glm_mean_taylor(model), control_weight=1.0),
      "joint_svrg (App. F), between refreshes": dsgrad.joint_svrg(
          objective, taylor, every=never, control_weight=1.0),
  }


def _memory(*names):
  """This process's ``/proc/self/status`` memory fields in bytes (default: current and
  peak RSS), or Nones off Linux."""
  names = names or ("VmRSS", "VmHWM")
  try:
    with open("/proc/self/status") as f:
      fields = dict(line.split(":", 1) for line in f if ":" in line)
    return tuple(int(fields[k].split()[0]) * 1024 for k in names)
  except (OSError, KeyError, ValueError):
    return (None,) * len(names)


def _device_peak():
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def memmap_logistic_data(folder, num_data: int, dim: int, seed: int = 0,
                         chunk: int = 500_000):
  """Synthetic logistic-regression data with the features written to
  ``folder/logistic_{N}x{D}_seed{seed}.npy`` chunk by chunk (never whole in memory),
  reused when present. Rows as :func:`synthetic_logistic_data` draws them (standard normal
  features, a ones column last, labels Bernoulli of ``sigmoid(x . w)``, ``w ~ N(0, I)``),
  each chunk from its own key.

  Returns:
    ``(features HostArray, signs (N,) float32 in {-1, +1})``.
  """
  path = os.path.join(folder, f"logistic_{num_data}x{dim}_seed{seed}.npy")
  signs_path = path[:-4] + "_signs.npy"
  if not (os.path.exists(path) and os.path.exists(signs_path)):
    key_w, key_x = jax.random.split(jax.random.key(seed))
    w = jax.random.normal(key_w, (dim,))
    out = np.lib.format.open_memmap(path + ".tmp", mode="w+", dtype=np.float32,
                                    shape=(num_data, dim))
    signs = np.empty(num_data, np.float32)
    draw = jax.jit(lambda k, m: _chunk(k, m, dim, w), static_argnums=1)
    for c, start in enumerate(range(0, num_data, chunk)):
      m = min(chunk, num_data - start)
      x, s = draw(jax.random.fold_in(key_x, c), m)
      out[start:start + m] = np.asarray(x)
      signs[start:start + m] = np.asarray(s)
    out.flush()
    del out
    os.replace(path + ".tmp", path)
    np.save(signs_path, signs)
  return (data_lib.open_memmap(path, dtype=np.float32, shape=(num_data, dim)),
          np.load(signs_path))


def _chunk(key, m, dim, w):
  k1, k2 = jax.random.split(key)
  x = jnp.concatenate([jax.random.normal(k1, (m, dim - 1)), jnp.ones((m, 1))], axis=1)
  y = jax.random.bernoulli(k2, jax.nn.sigmoid(x @ w))
  return x, 2.0 * y.astype(jnp.float32) - 1.0


def _problem(n, num_features, memmap_folder=None):
  """``(model, objective)``; with ``memmap_folder`` the features are memory-mapped."""
  if memmap_folder is None:
    x, y, _ = synthetic_logistic_data(jax.random.key(0), n, num_features)
    model = logistic_regression(x, y, name=f"logistic N={n}")
    return model, dsgrad.meanfield_gaussian(model)
  host, signs = memmap_logistic_data(memmap_folder, n, num_features)
  model = logistic_regression(host, signs, name=f"logistic N={n} (memmap)")
  return model, dsgrad.meanfield_gaussian(model)


def _full_pass_seconds(objective, params, repeats=3):
  """Seconds for one full-data gradient pass (what an SVRG refresh or an inc step costs),
  in the estimators' own chunked pass."""
  noise = objective.sample_noise(jax.random.key(0), 1)  # shared noise: one draw

  def full_grad(objective, params):
    return tables.full_pass_mean(
        lambda idx: objective.grad(params, idx, noise, validate=False), objective.num_data,
        4096)

  return _median_seconds(jax.jit(full_grad), (objective, params), repeats)


def _median_seconds(fn, args, repeats):
  """Median wall-clock of ``fn(*args)`` over ``repeats`` calls after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _order_seconds(n, batch_size, rounds):
  """Seconds for one epoch's order of ``n`` data: ``{"dsgrad": fit's epoch permutation,
  "jax.random.permutation": the same key through JAX's permutation}`` (the latter
  timed once after a warm-up call: it is slow at large N)."""
  ours = jax.jit(lambda k: batching.epoch_permutation(k, 1, n, batch_size))
  theirs = jax.jit(lambda k: jax.random.permutation(jax.random.fold_in(k, 1), n))
  key = jax.random.key(0)
  return {"dsgrad": _median_seconds(ours, (key,), rounds),
          "jax.random.permutation": _median_seconds(theirs, (key,), 1)}


def _gather_seconds(objective, batch_size, steps, rounds=3, index_range=None):
  """``(in-step seconds, host seconds)`` per step of reading the batch's rows alone.

  In-step: every data leaf at the batch indices, summed so that it is not optimized away,
  in a jitted scan with the data as arguments, as the timed steps read them (a device
  gather; memory-mapped rows arrive read, as ``fit`` passes them). Host: reading the
  memory-mapped rows on the host (``fit``'s reader thread, overlapped with the steps).
  ``index_range``: batches from the first ``index_range`` data only."""
  batches = epoch_batches(jax.random.key(2), index_range or objective.num_data, batch_size,
                          steps)
  host = data_lib.host_leaves(objective)
  rows = jax.device_put(data_lib.read_rows(host, batches))  # as fit's reader does

  @jax.jit
  def run(batches, objective, rows):
    def body(acc, xs):
      idx, rows_t = xs
      step = data_lib.with_batch_rows(objective, idx, rows_t)
      return acc + sum(jnp.sum(r) for r in jax.tree.leaves(step.rows(idx))), None

    return jax.lax.scan(body, jnp.zeros(()), (batches, rows))[0]

  return (_median_seconds(run, (batches, objective, rows), rounds) / steps,
          _timing.host_read_seconds(objective, batches, rounds))


def run(sizes, memmap_sizes=(), num_features=100, batch_size=100, steps=2000, rounds=3,
        memmap_folder=None):
  """Per (N, storage): ``{estimator: seconds per step}``, compile seconds, table bytes,
  gather and full-pass seconds, and RSS after the size."""
  out = {}
  cases = [(n, "device") for n in sizes] + [(n, "memmap") for n in memmap_sizes]
  for n, storage in cases:
    model, objective = _problem(n, num_features,
                                memmap_folder if storage == "memmap" else None)
    params0 = dsgrad.meanfield_init(model, 0.0, -2.0)
    never = 10 * (steps + 1)
    optimizers = {name: optax.chain(est, optax.adam(1e-3))
                  for name, est in _estimators(objective, model, never).items()}
    print(f"N = {n:,} ({storage})", flush=True)
    compile_s = {}
    times, memory = _timing.time_per_step(objective, optimizers, params0, batch_size, steps,
                                          rounds=rounds, log=False, compile_seconds=compile_s)
    gather, host_read = _gather_seconds(objective, batch_size, steps, rounds)
    full = _full_pass_seconds(objective, params0)
    order = _order_seconds(n, batch_size, rounds)
    rss, peak = _memory()
    out[(n, storage)] = dict(times=times, compile=compile_s,
                             table={k: m[0] for k, m in memory.items()}, gather=gather,
                             host_read=host_read, order=order,
                             full=full, rss=rss)
    for name in optimizers:
      print(f"  {name:<40} {1e3 * times[name]:8.3f} ms/step  compile {compile_s[name]:6.2f} s"
            f"  table {memory[name][0] / 2**20:8.1f} MiB", flush=True)
    print(f"  {GATHER:<40} {1e3 * gather:8.3f} ms; host read {1e3 * host_read:8.3f} ms",
          flush=True)
    print(f"  {'one full pass':<40} {1e3 * full:8.3f} ms;  RSS {rss / 2**30:.2f} GiB",
          flush=True)
    print(f"  {'one epoch order':<40} " + ", ".join(
        f"{k} {1e3 * v:.3f} ms" for k, v in order.items()), flush=True)
    del model, objective, optimizers
  return out


def cold_read_seconds(n, num_features, batch_size, steps, folder, seed=3):
  """Seconds per step to read one block of ``steps`` batches' rows of the memory-mapped
  features after asking the kernel to drop the file's cached pages
  (``posix_fadvise(DONTNEED)``): reads from disk, as when the data do not fit in memory.
  Run it in a process that has not read the file; ``None`` where unsupported."""
  if not hasattr(os, "posix_fadvise"):
    return None
  host, _ = memmap_logistic_data(folder, n, num_features)
  fd = os.open(host.array.filename, os.O_RDONLY)
  try:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
  finally:
    os.close(fd)
  batches = np.asarray(epoch_batches(jax.random.key(seed), n, batch_size, steps))
  start = time.perf_counter()
  data_lib.read_rows({"x": host}, batches)
  return (time.perf_counter() - start) / steps


def _split_gathers(objective, batch_size) -> int:
  """How many of a batch's row gathers XLA's CPU compiler splits across threads (its
  ``outer_dimension_partitions``; its cost model counts the whole gathered-from array,
  so a gather of 100 rows from an array over 512 KiB is split): 0 elsewhere."""
  def gather(idx, objective):
    return objective.rows(idx)

  idx = jnp.arange(batch_size, dtype=jnp.int32)
  text = jax.jit(gather).lower(idx, objective).compile().as_text()
  return sum("outer_dimension_partitions" in line for line in text.splitlines()
             if "gather" in line and "fusion(" in line)


def residual_controls(small, large, num_features=100, batch_size=100, steps=4000,
                      rounds=7):
  """What makes a step minus the gather alone grow from ``small`` to ``large`` data.

  The estimators of the criterion, on device arrays, timed as in :func:`run` in three
  cases: ``small`` data; ``large`` data with batches over all of them (as in the main
  table); and ``large`` data with every batch drawn from their first ``small`` rows --
  the same compiled program on the same arrays, but rows (and table entries) that stay in
  cache. If the third case costs what the first does, nothing in a step grows with N but
  the reading of random rows.

  Returns:
    ``{case: {"times": {estimator: s per step}, "gather": s per step, "split": gathers
    split across threads}}`` and
    ``"cores"``: the CPU cores this process may use (XLA sizes its threads by it).
  """
  out = {"cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
  for case, n, index_range in (("small", small, None), ("large", large, None),
                               ("large, first rows", large, small)):
    model, objective = _problem(n, num_features)
    params0 = dsgrad.meanfield_init(model, 0.0, -2.0)
    optimizers = {name: optax.chain(est, optax.adam(1e-3))
                  for name, est in _estimators(objective, model, 10 * (steps + 1)).items()
                  if name in FLAT}
    times, _ = _timing.time_per_step(objective, optimizers, params0, batch_size, steps,
                                     rounds=rounds, log=False, index_range=index_range)
    gather, _ = _gather_seconds(objective, batch_size, steps, rounds, index_range)
    out[case] = dict(times=times, gather=gather, split=_split_gathers(objective, batch_size),
                     leaves=len(objective.data))
    del model, objective, optimizers
  return out


def train_memmap(n, num_features, batch_size, steps, folder, lr=1e-3):
  """Trains joint SAGA (compact logit table, probit approximation) with :func:`dsgrad.fit`
  on the memory-mapped data set; returns a dict of what it measured."""
  model, objective = _problem(n, num_features, folder)
  optimizer = optax.chain(dsgrad.joint_saga(objective, dsgrad.approx.logistic_probit(model)),
                          optax.adam(lr))
  params = dsgrad.meanfield_init(model, 0.0, -2.0)
  rss0, _ = _memory()
  start_elbo = dsgrad.elbo(objective, params, jax.random.key(5), ELBO_SAMPLES)
  start = time.perf_counter()
  result = dsgrad.fit(objective, optimizer, params, jax.random.key(0), num_steps=steps,
                      batch_size=batch_size, eval_every=steps // 2, elbo_samples=ELBO_SAMPLES,
                      progress=False)
  total = time.perf_counter() - start
  rss, peak, anon, file_pages = _memory("VmRSS", "VmHWM", "RssAnon", "RssFile")
  return dict(n=n, steps=steps, total=total, train=float(result.history.wall_time[-1]),
              compile=result.compile_seconds,
              elbo=[start_elbo] + list(zip(result.history.elbo.tolist(),
                                           result.history.elbo_se.tolist())),
              table=dsgrad.table_bytes(result.opt_state), rss_before=rss0, rss=rss, peak=peak,
              anon=anon, file_pages=file_pages, device_peak=_device_peak(),
              file_bytes=os.path.getsize(objective.data_tree()["x"].array.filename))


def _in_fresh_process(call: str, one_core: bool = False):
  """``call`` (an expression on this module, e.g. ``"train_memmap(...)"``) evaluated in a
  child process, so that its peak memory is its own; with ``one_core`` the child may run
  on one CPU core only, set before JAX starts (XLA then uses no intra-op threads)."""
  import json
  import subprocess
  import sys
  pin = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
         if one_core else "")
  code = (f"{pin}import json; from benchmarks import scale; "
          f"print('RESULT' + json.dumps(scale.{call}))")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=True)
  line = [l for l in done.stdout.splitlines() if l.startswith("RESULT")][-1]
  return json.loads(line[len("RESULT"):])


def _label(case):
  n, storage = case
  return f"N = {n:,}" + (" (memmap)" if storage == "memmap" else "")


def format_table(out, config, figure=None, trained=None, cold=None):
  cases = list(out)
  names = list(out[cases[0]]["times"])
  ms = lambda v: f"{1e3 * v:.3f}"  # noqa: E731
  lines = [
      f"Command: `python -m benchmarks scale steps {config['argv']}`"
      if config.get("argv") else "Command: `python -m benchmarks scale steps`",
      "",
      f"Binary logistic regression, synthetic, D = {config['num_features']} (intercept "
      f"included), mean-field Gaussian BBVI, B = {config['batch_size']}, Adam; "
      f"{config['steps']} steps per timed run inside one jitted `lax.scan` with the data as "
      f"arguments, median of {config['rounds']} interleaved rounds. \"(memmap)\": the "
      "features are a float32 `.npy` memory-mapped from disk (`dsgrad.data.open_memmap`): "
      "their rows are read on the host (the host-read row) and passed to the compiled "
      "steps, as `dsgrad.fit` does on a thread one block of steps ahead; otherwise device "
      "arrays. "
      "joint_svrg's refresh period is longer than the timed run (its refresh is the full "
      "pass row). Cells: ms per step, and in brackets step minus the gather row.",
      "",
      f"Measured: {_report.environment()}",
      "",
  ]
  if figure:
    lines += [f"![step time vs N]({figure})", ""]
  lines += ["| estimator | " + " | ".join(_label(c) for c in cases) + " |",
            "| --- |" + " ---: |" * len(cases)]
  for name in names:
    cells = [f"{ms(out[c]['times'][name])} ({ms(out[c]['times'][name] - out[c]['gather'])})"
             for c in cases]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines.append(f"| {GATHER} (every data leaf at the batch, inside the step) | "
               + " | ".join(ms(out[c]["gather"]) for c in cases) + " |")
  lines.append("| host read of the rows (memmap; fit's reader thread, overlapped) | "
               + " | ".join(ms(out[c]["host_read"]) if c[1] == "memmap" else "" for c in cases)
               + " |")
  if cold:
    lines.append("| host read from disk (the file's cached pages dropped first; one "
                 "block of fit's 1,000 steps, fresh process) | " + " | ".join(
                     ms(cold[c]) if c in cold else "" for c in cases) + " |")
  lines.append("| one full pass (SVRG refresh, an inc step) | "
               + " | ".join(ms(out[c]["full"]) for c in cases) + " |")
  for name in ("dsgrad", "jax.random.permutation"):
    label = ("one epoch's order (fit draws one per epoch)" if name == "dsgrad" else
             "the same by jax.random.permutation (fit's until now)")
    lines.append(f"| {label} | " + " | ".join(
        ms(out[c]["order"][name]) for c in cases) + " |")
  lines.append("| compile, slowest estimator (s) | " + " | ".join(
      f"{max(out[c]['compile'].values()):.2f}" for c in cases) + " |")
  lines.append("| joint_saga table (MiB) | " + " | ".join(
      f"{out[c]['table']['joint_saga (logit table)'] / 2**20:,.1f}" for c in cases) + " |")
  lines.append("| process RSS after this N (GiB) | " + " | ".join(
      f"{out[c]['rss'] / 2**30:.2f}" if out[c]["rss"] else "n/a" for c in cases) + " |")
  lines += ["", "Compile seconds per estimator:", "",
            "| estimator | " + " | ".join(_label(c) for c in cases) + " |",
            "| --- |" + " ---: |" * len(cases)]
  for name in names:
    lines.append(f"| {name} | " + " | ".join(f"{out[c]['compile'][name]:.2f}" for c in cases)
                 + " |")
  # The criterion, within each storage: smallest N to largest N.
  lines += ["", f"Criterion (step minus gather grows at most {CRITERION}x):", "",
            "| estimator | storage | from | to | (step - gather) ratio | criterion |",
            "| --- | --- | ---: | ---: | ---: | --- |"]
  for storage in ("device", "memmap"):
    ns = sorted(n for n, s in cases if s == storage)
    if len(ns) < 2:
      continue
    lo, hi = (ns[0], storage), (ns[-1], storage)
    for name in FLAT:
      a = out[lo]["times"][name] - out[lo]["gather"]
      b = out[hi]["times"][name] - out[hi]["gather"]
      ratio = b / a
      verdict = "met" if ratio <= CRITERION else "**missed**"
      lines.append(f"| {name} | {storage} | {ns[0]:,} | {ns[-1]:,} | {ratio:.2f}x | "
                   f"{verdict} |")
  if trained:
    t = trained
    gib = lambda v: f"{v / 2**30:.2f} GiB" if v else "n/a"  # noqa: E731
    first, *after = t["elbo"]
    lines += ["", f"Training on the memory-mapped N = {t['n']:,} data set in a fresh process "
              "(joint SAGA, logit table, `logistic_probit`, Adam 1e-3, B = "
              f"{config['batch_size']}, `dsgrad.fit`; ELBO by {ELBO_SAMPLES} Monte Carlo "
              "samples over all data, at the start and after each half, ± se). RSS counts "
              "the memory map's pages that the process has touched (`RssFile`; the kernel "
              "can drop them) besides its own memory (`RssAnon`):", "",
              "| steps | training s | compile s | whole fit s (init full pass, ELBO passes) | "
              "ELBO: start; after each half | table | file | RSS before fit | RSS after "
              "(anon + file) | peak RSS | device peak |",
              "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
              f"| {t['steps']:,} | {t['train']:.1f} | {t['compile']:.1f} | {t['total']:.1f} | "
              f"{first[0]:,.0f} ± {first[1]:,.0f}; "
              + ", ".join(f"{v:,.0f} ± {se:,.0f}" for v, se in after)
              + f" | {t['table'] / 2**20:,.1f} MiB | {gib(t['file_bytes'])} | "
              f"{gib(t['rss_before'])} | {gib(t['rss'])} ({gib(t['anon'])} + "
              f"{gib(t['file_pages'])}) | {gib(t['peak'])} | "
              f"{gib(t['device_peak']) if t['device_peak'] else 'n/a (CPU: device is host)'} |"]
  return "\n".join(lines)


def format_controls(controls, small, large, steps, rounds):
  """The table of :func:`residual_controls`, one block of rows per process."""
  us = lambda v: f"{1e6 * v:.2f}"  # noqa: E731
  lines = [f"Where a step minus the gather alone grows: the criterion's estimators on "
           f"device arrays, N = {small:,} and N = {large:,}, {steps} steps per run, median "
           f"of {rounds} interleaved rounds, each process fresh; \"first rows\": N = "
           f"{large:,} arrays, every batch drawn from their first {small:,} rows (the same "
           "compiled program, rows that stay in cache). Cells: us per step, in brackets "
           "step minus the gather alone.", "",
           f"| estimator | cores | N = {small:,} | N = {large:,} | (step - gather) ratio | "
           f"N = {large:,}, first rows | step ratio, first rows / N = {small:,} |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for label, c in controls:
    lo, hi, first = c["small"], c["large"], c["large, first rows"]
    for name in lo["times"]:
      cell = lambda case: (f"{us(case['times'][name])} "  # noqa: E731
                           f"({us(case['times'][name] - case['gather'])})")
      ratio = ((hi["times"][name] - hi["gather"]) / (lo["times"][name] - lo["gather"]))
      lines.append(f"| {name} | {label} | {cell(lo)} | {cell(hi)} | {ratio:.2f}x | "
                   f"{cell(first)} | {first['times'][name] / lo['times'][name]:.2f}x |")
    lines.append(f"| {GATHER} | {label} | {us(lo['gather'])} | {us(hi['gather'])} | | "
                 f"{us(first['gather'])} | {first['gather'] / lo['gather']:.2f}x |")
    lines.append(f"| data leaves whose row gather XLA splits across threads (of "
                 f"{lo['leaves']}) | {label} | {lo['split']} | {hi['split']} | | "
                 f"{first['split']} | |")
  return "\n".join(lines)


def _figure(out, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  names = list(next(iter(out.values()))["times"])
  for storage, style in (("device", "-"), ("memmap", ":")):
    ns = sorted(n for n, s in out if s == storage)
    if not ns:
      continue
    for k, name in enumerate(names):
      ax.plot(ns, [1e3 * (out[(n, storage)]["times"][name] - out[(n, storage)]["gather"])
                   for n in ns], marker="o", linestyle=style, color=f"C{k}",
              label=f"{name} ({storage})")
    ax.plot(ns, [1e3 * out[(n, storage)]["gather"] for n in ns], marker="x", linestyle=style,
            color="gray", label=f"gather alone ({storage})")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("N (number of data)")
  ax.set_ylabel("ms per step minus gather")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None):
  """``scale [steps|movielens] [options]``; without a part, both with their defaults."""
  import sys
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] == "movielens":
    from benchmarks import scale_movielens
    return scale_movielens.main(argv[1:])
  if argv and argv[0] == "steps":
    return main_steps(argv[1:])
  if argv and argv[0] in ("-h", "--help"):
    print("usage: python -m benchmarks scale [steps|movielens] [options]\n"
          "  steps      per-step time against N (synthetic logistic regression)\n"
          "  movielens  joint SAGA on a sparse table vs SVRG, naive, cv on MovieLens\n"
          "  (no part)  both, with their default options")
    return 0
  if argv:
    return main_steps(argv)
  from benchmarks import scale_movielens
  return main_steps([]) or scale_movielens.main([])


def main_steps(argv=None):
  import sys
  argv = list(sys.argv[2:] if argv is None else argv)
  parser = argparse.ArgumentParser(prog="python -m benchmarks scale steps",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", default="1000,10000,100000,1000000",
                      help="comma-separated N with device data")
  parser.add_argument("--memmap-sizes", default="1000,10000000",
                      help="comma-separated N with memory-mapped features ('' for none)")
  parser.add_argument("--memmap-folder", default=os.path.join(
      os.environ.get("TMPDIR", "/tmp"), "dsgrad-scale"),
                      help="where the memory-mapped files are written (and reused)")
  parser.add_argument("--train-steps", type=command_line.count(1), default=20000,
                      help="fit steps on the largest memory-mapped N (0: skip)")
  parser.add_argument("--num-features", type=command_line.count(1), default=100,
                      help="D, the intercept included")
  parser.add_argument("--batch-size", type=command_line.count(1), default=100)
  parser.add_argument("--steps", type=command_line.count(1),
                      default=2000, help="steps per timed run")
  parser.add_argument("--rounds", type=command_line.count(1),
                      default=5, help="timed rounds (median)")
  parser.add_argument("--control-steps", type=command_line.count(1), default=4000,
                      help="steps per run of the residual controls (0: skip them)")
  parser.add_argument("--control-rounds", type=command_line.count(1), default=7)
  parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
  args = parser.parse_args(argv)
  parse = lambda text: [int(float(v)) for v in text.split(",") if v.strip()]  # noqa: E731
  sizes, memmap_sizes = parse(args.sizes), parse(args.memmap_sizes)
  if memmap_sizes:
    os.makedirs(args.memmap_folder, exist_ok=True)
  config = dict(num_features=args.num_features, batch_size=args.batch_size, steps=args.steps,
                rounds=args.rounds, argv=" ".join(argv))
  cold = {}
  if memmap_sizes:  # first, before this process maps the file and the reads cache it
    n = max(memmap_sizes)
    memmap_logistic_data(args.memmap_folder, n, args.num_features)  # written if missing
    seconds = _in_fresh_process(
        f"cold_read_seconds({n}, {args.num_features}, {args.batch_size}, "
        f"{segments.HOST_BLOCK_STEPS}, {args.memmap_folder!r})")
    if seconds is not None:
      cold[(n, "memmap")] = seconds
      print(f"host read from disk, N = {n:,}: {1e3 * seconds:.3f} ms per step", flush=True)
  out = run(sizes, memmap_sizes, args.num_features, args.batch_size, args.steps, args.rounds,
            args.memmap_folder)
  trained = None
  if memmap_sizes and args.train_steps:
    trained = _in_fresh_process(
        f"train_memmap({max(memmap_sizes)}, {args.num_features}, {args.batch_size}, "
        f"{args.train_steps}, {args.memmap_folder!r})")
    print(trained, flush=True)
  controls = None
  if len(sizes) >= 2 and args.control_steps:
    call = (f"residual_controls({min(sizes)}, {max(sizes)}, {args.num_features}, "
            f"{args.batch_size}, {args.control_steps}, {args.control_rounds})")
    controls = []
    for one_core in (False, True):
      result = _in_fresh_process(call, one_core=one_core)
      label = (f"{result['cores']} (pinned)" if one_core else str(result["cores"]))
      controls.append((label, result))
      print(label, result, flush=True)
  figure = None
  if not args.no_write:
    name = f"figures/scale_steps_{jax.default_backend()}.png"
    try:
      _figure(out, _report.docs_path(name))
      figure = name
    except ImportError:
      pass
  table = format_table(out, config, figure, trained, cold)
  if controls:
    table += "\n\n" + format_controls(controls, min(sizes), max(sizes), args.control_steps,
                                       args.control_rounds)
  print(table)
  _report.publish(f"scale-steps-{jax.default_backend()}", table, not args.no_write)
  return 0
