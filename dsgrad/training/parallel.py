"""Data-parallel training on several devices with JAX's own sharding.

A one-axis device mesh (axis ``"data"``) splits each mini-batch across devices (every
device computes the gradient terms of ``B / n`` data) and splits every per-datum table
(estimator state fields named ``table``: SAGA, SMISO, inc) by datum index, so that table
memory per device is ``1 / n`` of the whole. Parameters, running means, snapshots and
optimizer moments are replicated. Nothing else changes: the estimators are the same
functions, and XLA's SPMD partitioner inserts the cross-device sums (the batch means,
the gathers and scatters of table rows), so a run on ``n`` devices computes the same
parameters as a run on one, up to float summation order.

Usage (one host, several GPUs; or CPU devices with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``)::

    mesh = dsgrad.training.parallel.data_mesh()              # all devices
    result = dsgrad.fit(objective, optimizer, params, key, num_steps=..., batch_size=...,
                        mesh=mesh)

Several hosts (processes): call ``jax.distributed.initialize()`` first in every process
(same program, same arguments), build the mesh over ``jax.devices()`` (all processes'
devices), and split the data by datum with :func:`shard_data`: each process then holds,
and reads from disk, only its devices' rows. This is JAX's multi-controller model; it is
tested with 2 CPU processes over loopback (``tests/multiprocess_check.py``) and with
virtual CPU devices in one process. See the how-to "Running on several devices".

References:
  JAX documentation, "Distributed arrays and automatic parallelization" and
  "Multi-host and multi-process environments".
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dsgrad import data as data_lib
from dsgrad.objective import Objective
from dsgrad.tables import tree_bytes

DATA_AXIS = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A one-axis mesh named ``"data"`` over ``devices`` (default: all devices).

  Args:
    devices: the devices, in order (e.g. ``jax.devices()[:4]``).

  Returns:
    A :class:`jax.sharding.Mesh` with axis ``"data"``.
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("data_mesh needs at least one device")
  not_devices = [d for d in devices if not isinstance(d, jax.Device)]
  if not_devices:
    raise TypeError(f"data_mesh takes jax devices (e.g. jax.devices()[:4]), got "
                    f"{not_devices[0]!r}")
  repeated = sorted({str(d) for d in devices if devices.count(d) > 1})
  if repeated:
    raise ValueError(f"data_mesh: the devices repeat ({', '.join(repeated)}); a mesh holds "
                     "each device once: pass distinct devices, e.g. jax.devices()[:4]")
  return Mesh(np.asarray(devices, dtype=object), (DATA_AXIS,))


def _check_mesh(mesh: Mesh) -> int:
  if not isinstance(mesh, Mesh) or DATA_AXIS not in mesh.axis_names:
    raise ValueError(f"expected a mesh from dsgrad.training.parallel.data_mesh (axis {DATA_AXIS!r}), "
                     f"got {mesh!r}")
  return mesh.shape[DATA_AXIS]


def _is_table(path) -> bool:
  return any(isinstance(k, jax.tree_util.GetAttrKey) and k.name == "table" for k in path)


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding that keeps a full copy on every device of ``mesh``."""
  return NamedSharding(mesh, PartitionSpec())


def place_data(mesh: Mesh, objective):
  """The objective a training program takes, its data placed for ``mesh``: arrays already
  split by :func:`shard_data` on this mesh stay where they are, host arrays on the host,
  the rest is replicated."""
  def place(value):
    if data_lib.is_host(value) or (isinstance(value, jax.Array)
                                   and isinstance(value.sharding, NamedSharding)
                                   and value.sharding.mesh == mesh):
      return value
    return jax.device_put(value, replicated(mesh))
  return jax.tree.map(place, objective, is_leaf=data_lib.is_host)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """The sharding that splits an array's leading (batch) axis across ``mesh``."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def state_shardings(mesh: Mesh, state: Any) -> Any:
  """Shardings for an optimizer state: tables split by datum, everything else replicated.

  Args:
    mesh: a mesh from :func:`data_mesh`.
    state: an estimator or ``optax.chain`` state (arrays or ``ShapeDtypeStruct``s).

  Returns:
    A tree of ``NamedSharding`` with the structure of ``state``.

  Raises:
    ValueError: if a table's number of rows is not a multiple of the number of devices
      (JAX shards only evenly).
  """
  devices = _check_mesh(mesh)

  def one(path, leaf):
    if _is_table(path) and np.ndim(leaf) >= 1 and np.shape(leaf)[0] > 0:
      rows = np.shape(leaf)[0]
      if rows % devices:
        raise ValueError(f"a per-datum table has {rows} rows, which {devices} devices cannot "
                         f"split evenly; use a number of devices that divides the number "
                         f"of data ({rows}), or drop {rows % devices} data")
      return batch_sharding(mesh)
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(one, state)


def shard_state(mesh: Mesh, state: Any) -> Any:
  """``state`` placed on ``mesh``: tables split by datum, the rest replicated."""
  return jax.device_put(state, state_shardings(mesh, state))


def init_sharded(optimizer, params, mesh: Mesh):
  """``optimizer.init(params)`` computed directly into its sharded layout.

  Tables are created shard by shard on their devices (never whole on one device); the
  estimators' full passes (SAGA's running mean, SVRG's snapshot mean) run at the first
  update, on all devices.

  Args:
    optimizer: the optax transformation.
    params: initial params.
    mesh: a mesh from :func:`data_mesh`.

  Returns:
    ``(params replicated on mesh, optimizer state with sharded tables)``.
  """
  params = jax.device_put(params, replicated(mesh))
  shardings = state_shardings(mesh, jax.eval_shape(optimizer.init, params))
  return params, jax.jit(optimizer.init, out_shardings=shardings)(params)


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
  """Raises ``ValueError`` unless the batch splits evenly across the mesh's devices."""
  devices = _check_mesh(mesh)
  if batch_size % devices:
    raise ValueError(f"batch_size={batch_size} does not split evenly across {devices} "
                     f"devices; use a multiple of {devices}")


def constrain_batch(objective: Objective, mesh: Mesh, indices, noise):
  """Inside ``jit``: ``indices`` (and per-datum noise) split across devices by datum.

  Shared noise (one draw for the batch) stays replicated.
  """
  spec = batch_sharding(mesh)
  indices = jax.lax.with_sharding_constraint(indices, spec)
  if not objective.shared_noise:
    noise = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec), noise)
  return indices, noise


def shard_data(objective: Objective, mesh: Mesh) -> Objective:
  """``objective`` on its data split by datum across ``mesh``'s devices (and processes).

  Every data leaf becomes a global ``jax.Array`` sharded along its first axis: device
  ``k`` of ``n`` holds rows ``[k N/n, (k+1) N/n)``. Each process builds only its own
  devices' rows (``jax.make_array_from_callback``): from a memory-mapped
  :class:`dsgrad.data.HostArray` it reads only those rows from disk. Gathers of a
  batch's rows then run where the rows live (XLA inserts the collectives), so no device
  holds all the data. Pass the result to :func:`dsgrad.fit` with the same ``mesh``.

  Args:
    objective: an objective with data handles (built from a dsgrad model).
    mesh: a mesh from :func:`data_mesh` (all processes' devices under
      ``jax.distributed``).

  Returns:
    ``objective.with_data(sharded leaves)``.

  Raises:
    ValueError: if the number of data is not a multiple of the number of devices
      (JAX shards evenly), or the objective declares no data.
  """
  devices = _check_mesh(mesh)
  if objective.data is None:
    raise ValueError(f"{objective.name} declares no data (objective.data); shard_data "
                     "needs an objective whose loss receives its data's rows")
  n = objective.num_data
  if n % devices:
    raise ValueError(f"{n} data do not split evenly across {devices} devices "
                     f"({jax.process_count()} processes); use a number of devices that "
                     f"divides {n}, or drop {n % devices} data")
  sharding = batch_sharding(mesh)

  def split(value):
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
      return value  # already global
    source = value.array if isinstance(value, data_lib.HostArray) else value
    return jax.make_array_from_callback(
        tuple(value.shape), sharding, lambda index: np.asarray(source[index]))

  return objective.with_data(jax.tree.map(split, objective.data, is_leaf=data_lib.is_host))


def bytes_per_device(tree: Any) -> dict:
  """``{device: bytes}`` that the arrays of ``tree`` occupy on each of their devices."""
  out: dict = {}
  for leaf in jax.tree.leaves(tree):
    if not isinstance(leaf, jax.Array):
      continue
    for shard in leaf.addressable_shards:
      out[shard.device] = out.get(shard.device, 0) + tree_bytes(shard.data)
  return out
