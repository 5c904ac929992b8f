"""Test configuration: 8 fake CPU devices for sharding tests, deterministic float32."""

import os
import sys

# Python bytecode. Where the environment forbids writing it (PYTHONDONTWRITEBYTECODE, set by
# some containers) and the packages were installed with `pip install --no-compile` (the README's
# CI command), every process compiles jax, flax, tensorflow, torch... from source again: the two
# pytest-xdist workers and every CLI subprocess, notebook kernel and distributed launch (about 7
# CPU-s more for each CLI process; docs/results/benchmarks/test_suite__cpu.json,
# `bytecode`). The suite writes it to `.cache/pycache/` instead (PYTHONPYCACHEPREFIX, inherited
# by every process it starts), leaving the source trees as they are. Bytecode is the same
# program, so nothing computed changes.
if sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
  os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
  os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "pycache"))
  sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
  sys.dont_write_bytecode = False

# Must happen before JAX initialises its backends.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the whole suite: both pytest-xdist workers and every
# CLI subprocess the tests start (they inherit these variables). Many tests build the same step
# anew (a new closure, a new process) and would otherwise compile the same program again; a hit
# loads the executable XLA compiled before, so values are those of a fresh compile. Keyed by the
# program, the jax version and the flags, so entries never go stale. A fresh clone (CI) starts
# empty; set JAX_COMPILATION_CACHE_DIR to place it elsewhere.
# No JAX_COMPILATION_CACHE_MAX_SIZE: with a cap, jax's LRUCache takes a file lock and scans the
# whole directory on every write, and the suite writes thousands of small programs, so the
# scans grew quadratically and serialised the workers (half a second per write by the end).
# `_prune_test_cache` bounds the default directory instead, once per session.
_DEFAULT_CACHE_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax_tests")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _DEFAULT_CACHE_DIR)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def _prune_test_cache(directory, max_bytes=2 * 2**30, keep_bytes=2**30):
  """Deletes the oldest-written entries of `directory` once it holds over `max_bytes`.

  Entries of programs that changed are never read again, so a working copy's cache only grows;
  the newest `keep_bytes` are kept. Runs in the controlling process before any worker starts.
  """
  try:
    entries = [(stat.st_mtime, stat.st_size, e.path)
               for e in os.scandir(directory) if e.is_file() for stat in [e.stat()]]
  except FileNotFoundError:
    return
  total = sum(size for _, size, _ in entries)
  if total <= max_bytes:
    return
  for _, size, path in sorted(entries):
    if total <= keep_bytes:
      break
    try:
      os.remove(path)
    except FileNotFoundError:
      pass
    total -= size


if ("PYTEST_XDIST_WORKER" not in os.environ
    and os.environ["JAX_COMPILATION_CACHE_DIR"] == _DEFAULT_CACHE_DIR):
  _prune_test_cache(_DEFAULT_CACHE_DIR)
# Compiling is most of the suite's time (tiny models, few steps), so the tests compile for speed
# of compiling: LLVM at -O0, without its expensive passes, and XLA CPU's older elemental
# emitters for fusions instead of the MLIR fusion emitters (together about 40% less time on the
# compile-heavy files, docs/PERFORMANCE.md "The test suite's compile time"). They change how
# fast the machine code runs, not what it computes: XLA's HLO passes and its IEEE float
# semantics (no fast math) are unchanged. Give XLA_FLAGS any of these flags to test another
# setting (e.g. the production --xla_backend_optimization_level=2).
_COMPILE_FAST_FLAGS = {"--xla_backend_optimization_level": "0",
                       "--xla_llvm_disable_expensive_passes": "true",
                       "--xla_cpu_use_fusion_emitters": "false"}
_xla_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(filter(None, [_xla_flags, *(
    f"{flag}={value}" for flag, value in _COMPILE_FAST_FLAGS.items() if flag not in _xla_flags)]))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


import pytest  # noqa: E402

# Fixtures shared by several test files: the DP-SGD ones (parts, batch, noisy_step_8_devices),
# the PyTorch ones (tv_models), the digits teacher of the DPDFD/SRR tests (teacher_dir) and the
# wheel installed into a virtualenv (installed_wheel); their helper functions are imported by name.
pytest_plugins = ("dpsgd_fixtures", "teacher_fixtures", "torch_fixtures", "wheel_fixtures")


@pytest.fixture
def isolated_data_sources(monkeypatch):
  """No cached arrays or ambient DPKD_DATA_DIR leak between the data-source tests."""
  from dpkd_jax.data import sources  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(sources.DATA_DIR_ENV_VAR, raising=False)
  sources.clear_cache()
  yield
  sources.clear_cache()


@pytest.fixture
def mock_tfds():
  """`with mock_tfds(num_examples=N):` tfds serves random images of each dataset's real shapes
  (`tfds.testing.mock_data`: CIFAR-10 and SVHN offline), with the library's array cache
  cleared before and after, so mock and real arrays never meet."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from dpkd_jax import data  # pylint: disable=g-import-not-at-top

  @contextlib.contextmanager
  def serve(num_examples: int):
    data.clear_cache()
    try:
      with tfds.testing.mock_data(num_examples=num_examples):
        yield
    finally:
      data.clear_cache()

  return serve


@pytest.fixture
def cpu_kernels():
  """The model zoo traced through the opt-in XLA CPU kernels (`dpkd_jax.kernels`) inside the
  test; every other test runs the default, the reference ops."""
  from dpkd_jax import kernels  # pylint: disable=g-import-not-at-top
  with kernels.using(kernels.xla_cpu_ops()) as ops:
    yield ops


@pytest.fixture(autouse=True)
def _reference_ops_after_each_test():
  """Every test starts and ends on the reference ops (what a library user gets): a test or a
  command that leaves the CPU kernels switched on fails here, and the next test is unaffected."""
  from dpkd_jax import kernels  # pylint: disable=g-import-not-at-top
  yield
  leaked = kernels.active()
  if leaked is not kernels.REFERENCE:
    kernels.use(kernels.REFERENCE)
    pytest.fail(f"the test left the {leaked.name} kernels active (use kernels.using or the "
                "cpu_kernels fixture)")
