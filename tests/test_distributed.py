"""Multi-host support: env parsing, host <-> global arrays, and real two-process runs on CPU.

The end-to-end tests launch the experiments' CLIs as 2 processes × 2 fake CPU devices
(gloo collectives, coordinator on localhost) and as 1 process × 4 devices with the same seed:
the global mesh, the data placement and the noise must not depend on how the devices are
spread over processes, so the results must agree (tolerance: float32 reduction order across
processes, 1e-5 relative). Process 1 must write no file.
"""

import json
import os
import socket
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import seeds
from dpkd_jax.train import distributed
from dpkd_jax.train import sharding

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("env", [{}, {"DPKD_DISTRIBUTED": "off"}, {"DPKD_DISTRIBUTED": "0"}])
def test_single_host_launch_does_not_initialize(env):
  assert distributed.initialize_from_env(env) is False


@pytest.mark.parametrize("env,match", [
    ({"DPKD_COORDINATOR_ADDRESS": "localhost:1"}, "missing"),
    ({"DPKD_COORDINATOR_ADDRESS": "h:1", "DPKD_NUM_PROCESSES": "2", "DPKD_PROCESS_ID": "x"},
     "integers"),
    ({"DPKD_COORDINATOR_ADDRESS": "h:1", "DPKD_NUM_PROCESSES": "2", "DPKD_PROCESS_ID": "2"},
     "0 <= DPKD_PROCESS_ID"),
    ({"DPKD_DISTRIBUTED": "sometimes"}, "must be 'auto'"),
])
def test_bad_launch_environment_is_refused(env, match):
  with pytest.raises(ValueError, match=match):
    distributed.initialize_from_env(env)


def test_to_global_and_back_on_one_host():
  mesh = sharding.data_mesh()
  batch = {"x": np.arange(16.0).reshape(8, 2), "y": np.arange(8)}
  placed = sharding.shard_batch(batch, mesh)
  assert placed["x"].sharding == sharding.batch_sharding(mesh)
  chex.assert_trees_all_equal(distributed.to_host(placed), batch)
  key = sharding.replicate(jax.random.key(5), mesh)
  assert jnp.array_equal(jax.random.key_data(key), jax.random.key_data(jax.random.key(5)))
  with pytest.raises(TypeError, match="key_data"):
    distributed.to_host(key)


def test_seeds_are_unchanged_on_one_host():
  assert seeds.resolve_seed(7).value == 7


_GIVEN_PORTS = set()


def _free_port() -> int:
  """A free port not given before (launches started together bind theirs only later)."""
  while True:
    with socket.socket() as s:
      s.bind(("localhost", 0))
      port = s.getsockname()[1]
    if port not in _GIVEN_PORTS:
      _GIVEN_PORTS.add(port)
      return port


def _start(argv: list[str], *, num_processes: int, devices_per_process: int
           ) -> list[subprocess.Popen]:
  """Starts `python argv...` once per process (coordinator on localhost)."""
  port = _free_port()
  procs = []
  for pid in range(num_processes):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices_per_process),
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": _REPO}
    if num_processes > 1:
      env.update(DPKD_COORDINATOR_ADDRESS=f"localhost:{port}",
                 DPKD_NUM_PROCESSES=str(num_processes), DPKD_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen([sys.executable, *argv], env=env, cwd=_REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  return procs


def _wait(procs: list[subprocess.Popen]) -> list[str]:
  """Each process's output, once all exited 0."""
  outputs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  return outputs


def _results(workdir: str) -> dict:
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


_SEED_WORKER = """
from dpkd_jax.train import distributed
distributed.initialize_from_env()
from dpkd_jax.privacy import seeds
print("SEED", seeds.resolve_seed(None).value)
"""


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
  """(single, multi, seed_outputs): the DP-SGD run's workdirs as 1 process x 4 devices and as
  2 processes x 2 devices, and the outputs of 2 processes that each resolve a secret seed.
  The three launches are independent: started together, they overlap their start-up."""
  # One shared workdir, as on a cluster's shared filesystem; only process 0 writes files.
  flags = ["-m", "experiments.dpsgd", "--dataset=digits", "--model=lenet5_half",
           "--expected_batch_size=64", "--noise_multiplier=1.0", "--steps=3", "--seed=3",
           "--no_progress"]
  root = tmp_path_factory.mktemp("distributed")
  single, multi = str(root / "single"), str(root / "multi")
  seed_procs = _start(["-c", _SEED_WORKER], num_processes=2, devices_per_process=1)
  runs = (_start(flags + [f"--workdir={single}"], num_processes=1, devices_per_process=4)
          + _start(flags + [f"--workdir={multi}"], num_processes=2, devices_per_process=2))
  try:
    seed_outputs = _wait(seed_procs)
    _wait(runs)
  finally:  # a failed launch leaves no process behind
    for proc in seed_procs + runs:
      if proc.poll() is None:
        proc.kill()
  return single, multi, seed_outputs


def test_dpsgd_two_processes_equal_one_process(launched):
  single, multi, _ = launched
  ours, reference = _results(multi), _results(single)
  assert ours["epsilon"] == reference["epsilon"] and ours["steps"] == reference["steps"] == 3
  np.testing.assert_allclose(ours["test_loss"], reference["test_loss"], rtol=1e-5)
  assert ours["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=1e-3)
  with open(os.path.join(multi, "metrics.csv")) as f:
    rows = f.read().splitlines()
  with open(os.path.join(single, "metrics.csv")) as f:
    assert len(rows) == len(f.read().splitlines())  # one writer, not two


def test_secret_seed_is_process_zeros_on_every_process(launched):
  # Each process draws its own OS entropy; all must use process 0's, or the replicated noise
  # key would silently differ between hosts.
  values = [[line for line in out.splitlines() if line.startswith("SEED")][0]
            for out in launched[2]]
  assert values[0] == values[1]
