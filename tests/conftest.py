"""Test configuration: 8 fake CPU devices for sharding tests, deterministic float32."""

import os

# Must happen before JAX initialises its backends.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Convolutions take the static rule, not routes timed on this machine (models/conv_routes.py):
# no timing inside unit tests, and the same programs on every machine. Inherited by the CLI
# subprocesses the tests start.
os.environ.setdefault("DPKD_CONV_ROUTES", "static")

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
