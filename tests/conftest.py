"""Test configuration: 8 fake CPU devices for sharding tests, deterministic float32."""

import os

# Must happen before JAX initialises its backends.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Convolutions take the static rule, not routes timed on this machine (models/conv_routes.py):
# no timing inside unit tests, and the same programs on every machine. Inherited by the CLI
# subprocesses the tests start.
os.environ.setdefault("DPKD_CONV_ROUTES", "static")
# One persistent XLA compilation cache for the whole suite: both pytest-xdist workers and every
# CLI subprocess the tests start (they inherit these variables). Many tests build the same step
# anew (a new closure, a new process) and would otherwise compile the same program again; a hit
# loads the executable XLA compiled before, so values are those of a fresh compile. Keyed by the
# program, the jax version and the flags, so entries never go stale; capped by LRU eviction. A
# fresh clone (CI) starts empty; set JAX_COMPILATION_CACHE_DIR to place it elsewhere.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax_tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 2**30))
# Compiling is most of the suite's time (tiny models, few steps): LLVM at -O0 compiles the CPU
# programs 2-3x faster. It changes how fast the machine code runs, not what it computes (XLA's
# HLO passes and its IEEE float semantics are unchanged). Give XLA_FLAGS an
# --xla_backend_optimization_level to test the production level (the default, 2).
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


import pytest  # noqa: E402

# Fixtures shared by several test files: the DP-SGD ones (parts, batch, noisy_step_8_devices),
# the PyTorch ones (tv_models) and the digits teacher of the DPDFD/SRR tests (teacher_dir);
# their helper functions are imported by name.
pytest_plugins = ("dpsgd_fixtures", "teacher_fixtures", "torch_fixtures")


@pytest.fixture
def isolated_data_sources(monkeypatch):
  """No cached arrays or ambient DPKD_DATA_DIR leak between the data-source tests."""
  from dpkd_jax.data import sources  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(sources.DATA_DIR_ENV_VAR, raising=False)
  sources.clear_cache()
  yield
  sources.clear_cache()
