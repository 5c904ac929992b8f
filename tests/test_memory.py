"""Tests for dpkd_jax.train.memory: a step's lower bound against the machine's memory."""

import pytest

from dpkd_jax import errors
from dpkd_jax.train import memory


def test_a_step_beyond_the_memory_is_refused_naming_the_flag():
  assert memory.available_bytes() > 0
  memory.check_fits("--batch_size", 16, 16 * memory.per_example_bytes((28, 28, 1)))
  with pytest.raises(errors.UserError, match=r"--batch_size=1000000000: one step needs at "
                                             r"least .* GiB but this machine has"):
    memory.check_fits("--batch_size", 10**9, 10**9 * memory.per_example_bytes((28, 28, 1)))
