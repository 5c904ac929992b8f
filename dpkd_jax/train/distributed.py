"""Multi-host (multi-process) runs: initialization, the coordinator, host <-> global arrays.

A multi-host run is one program started once per host (TPU pod slice, several GPU nodes),
all processes executing the same steps on one global mesh. The experiments call
`initialize_from_env()` first thing; it calls `jax.distributed.initialize` only when the
launch asks for it, so a single-host run is unchanged:

* `DPKD_DISTRIBUTED=auto`: let JAX detect the cluster (Cloud TPU pod slices, SLURM, ...).
* `DPKD_COORDINATOR_ADDRESS=host:port`, `DPKD_NUM_PROCESSES=n`, `DPKD_PROCESS_ID=i`:
  explicit (any cluster, and the two-process CPU test in tests/test_distributed.py).

On CPU, cross-process collectives need gloo, which is switched on here. Conventions the
methods follow (docs/DISTRIBUTED.md): every process holds the same host data (the datasets
here fit in host memory) and builds global arrays from it with `to_global`, each process
placing only its own devices' slices; random seeds are broadcast from process 0
(`privacy.seeds`), so noise is drawn once per step from one replicated key, never per host;
files (results, metrics, ledger, sample grids) are written by process 0 only
(`is_coordinator`), checkpoints by Orbax (which coordinates the processes itself).
"""

from __future__ import annotations

import os
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np

ENV_MODE = "DPKD_DISTRIBUTED"
ENV_COORDINATOR = "DPKD_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "DPKD_NUM_PROCESSES"
ENV_PROCESS_ID = "DPKD_PROCESS_ID"


def initialize_from_env(environ: dict[str, str] | None = None) -> bool:
  """Calls `jax.distributed.initialize` when the environment asks for a multi-host run.

  Args:
    environ: the environment (default `os.environ`).

  Returns:
    True if this call initialized the distributed runtime.

  Raises:
    ValueError: an incomplete or malformed explicit configuration.
  """
  env = os.environ if environ is None else environ
  mode = env.get(ENV_MODE, "").strip().lower()
  explicit = {name: env.get(name) for name in (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)}
  if mode in ("", "0", "off", "false") and not any(explicit.values()):
    return False
  if mode not in ("", "auto", "1", "on", "true"):
    raise ValueError(f"{ENV_MODE} must be 'auto' (or unset), got {env.get(ENV_MODE)!r}")
  if any(explicit.values()):
    missing = [name for name, value in explicit.items() if not value]
    if missing:
      raise ValueError(f"multi-host launch needs all of {sorted(explicit)}; missing {missing}")
    try:
      num_processes = int(explicit[ENV_NUM_PROCESSES])
      process_id = int(explicit[ENV_PROCESS_ID])
    except ValueError as err:
      raise ValueError(f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers") from err
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(f"need 0 <= {ENV_PROCESS_ID} < {ENV_NUM_PROCESSES}, got "
                       f"{process_id} and {num_processes}")
    kwargs = dict(coordinator_address=explicit[ENV_COORDINATOR],
                  num_processes=num_processes, process_id=process_id)
  else:
    kwargs = {}  # JAX's cluster auto-detection (TPU pods, SLURM, ...).
  # The CPU backend's default collectives are process-local; gloo spans processes. (Harmless
  # on TPU/GPU, whose collectives do not use it.)
  if jax.distributed.is_initialized():
    return False  # e.g. a second experiment's main() in the same process
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  return True


def is_coordinator() -> bool:
  """True on the process that writes files (process 0)."""
  return jax.process_index() == 0


def _leaf_to_global(leaf: Any, sharding: jax.sharding.Sharding) -> Any:
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    impl = jax.random.key_impl(leaf)
    return jax.random.wrap_key_data(_leaf_to_global(jax.random.key_data(leaf), sharding),
                                    impl=impl)
  host = np.asarray(leaf)  # A local array, or a global one that is fully replicated.
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_global(tree: Any, sharding: jax.sharding.Sharding) -> Any:
  """Places every leaf of `tree`, held identically by every process, with `sharding`.

  Single host: `jax.device_put`. Multi-host: `device_put` refuses shardings over other
  processes' devices, so each process builds its own devices' slices from its host copy.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)
  return jax.tree.map(lambda leaf: _leaf_to_global(leaf, sharding), tree)


def to_host(tree: Any) -> Any:
  """NumPy copies of every leaf on every process (gathers batch-sharded arrays across hosts)."""
  def fetch(leaf):
    if not isinstance(leaf, jax.Array):
      return np.asarray(leaf)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      raise TypeError("to_host: pass jax.random.key_data(key), not a key array")
    if leaf.is_fully_addressable or leaf.is_fully_replicated:
      return np.asarray(leaf)
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
  return jax.tree.map(fetch, tree)
