"""Device mesh helpers: one 1-D mesh over all devices, batches sharded on axis 'data'.

The mesh is built once by the entry point (JAX training cookbook style). Parameters are
replicated; batch-leading arrays are split over the 'data' axis. Per-example *parameter*
gradients must not rely on auto-sharded `jit(vmap(grad))` over convolutions (it returned zero
gradients for examples off device 0 on fake CPU devices with JAX 0.10.2); methods that need them
use `jax.shard_map` over this same mesh.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dpkd_jax import errors
from dpkd_jax.train import distributed

DATA_AXIS = "data"


def data_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named 'data' over `devices` (default: all devices of all processes)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def check_divisible(batch_size: int, mesh: Mesh) -> None:
  """Raises ValueError unless the batch splits evenly over the mesh's 'data' axis."""
  n = mesh.shape[DATA_AXIS]
  if batch_size % n:
    raise errors.UserError(
        f"batch_size={batch_size} is not divisible by the {n} devices of the 'data' mesh axis;"
        f" use a multiple of {n}."
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding for arrays whose leading axis is the batch."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """Sharding that keeps a full copy on every device."""
  return NamedSharding(mesh, P())


def shard_batch(batch: Any, mesh: Mesh) -> Any:
  """Places every leaf of `batch` (leading axis = examples) split over 'data'.

  Multi-host: every process passes the same global batch and places its own slices.
  """
  return distributed.to_global(batch, batch_sharding(mesh))


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places every leaf of `tree` fully on every device of `mesh` (of all processes)."""
  return distributed.to_global(tree, replicated(mesh))
