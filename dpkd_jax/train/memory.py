"""Will a step fit? A lower bound on its bytes against the memory of the machine, checked before
a run charges anything (an allocation that fails after the first charge spends ε for nothing
and leaves the workdir's budget used).

    memory.check_fits("--batch_size", 16 * memory.per_example_bytes(info.image_shape))

The bound is deliberately low (inputs, one activation map and their gradients, float32): a
refused step would surely not fit; one that passes may still be too large for XLA, which then
fails before the first charge is released, in compilation.
"""

from __future__ import annotations

import math
import os

import jax

from dpkd_jax import errors

# Copies of a float32 input a step holds at least at once: the generated or loaded batch, the
# teacher's and the student's input, and a gradient of it.
_COPIES_PER_EXAMPLE = 4


def per_example_bytes(image_shape: tuple[int, ...]) -> int:
  """A lower bound on a training step's bytes per example of `image_shape` (H, W, C)."""
  return _COPIES_PER_EXAMPLE * 4 * math.prod(image_shape)


def available_bytes() -> int:
  """The memory one step may use: the accelerators' limits summed over the local devices (a
  sharded batch splits over them), else the host's physical memory."""
  try:
    stats = jax.local_devices()[0].memory_stats() or {}
  except (RuntimeError, NotImplementedError):  # CPU backends may have no statistics
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]) * jax.local_device_count()
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(flag: str, value: int, step_bytes: int) -> None:
  """UserError (one line naming `flag`) if a step of at least `step_bytes` exceeds the memory.

  Args:
    flag: the flag that sets the size (e.g. "--batch_size").
    value: its value.
    step_bytes: a lower bound on the step's bytes at that value.
  """
  limit = available_bytes()
  if step_bytes > limit:
    raise errors.UserError(
        f"{flag}={value}: one step needs at least {_gib(step_bytes)} but this machine has "
        f"{_gib(limit)}; give a smaller {flag}")


def check_batch(flag: str, batch: int, image_shape: tuple[int, ...]) -> None:
  """`check_fits` of a step on `batch` examples of `image_shape` (`per_example_bytes`)."""
  check_fits(flag, batch, batch * per_example_bytes(image_shape))


def _gib(count: int) -> str:
  return f"{count / 2**30:.3g} GiB"
