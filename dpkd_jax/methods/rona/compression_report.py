"""Teacher vs student: parameters, FLOPs, measured CPU latency per image, student accuracy.

RONA's compression report. Parameters and FLOPs come from `models.cost` (XLA's cost analysis
of the inference forward pass). Latency is measured, not estimated: the jitted eval-mode
forward pass on the first CPU device, compiled and warmed up, then timed (wall clock, including
`block_until_ready`) until at least `min_seconds` and `min_repeats` runs have passed; the
median run time divided by the batch size is reported in milliseconds per image. On a shared
machine other jobs inflate it: compare teacher and student from the same report. The teacher's
accuracy is not in the report: it is a noiseless function of the private data, which callers
keep among their private diagnostics (`train.outputs`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.models import core
from dpkd_jax import config_checks

LATENCY_BATCH_SIZES = (1, 256)


def latency_ms_per_image(parts: core.ModelParts, input_shape: Sequence[int], batch_size: int, *,
                         min_seconds: float = 1.0, min_repeats: int = 5) -> float:
  """Median wall-clock milliseconds per image of the eval forward pass at `batch_size` on CPU.

  Args:
    parts: the model.
    input_shape: (H, W, C) of one image.
    batch_size: images per forward pass.
    min_seconds, min_repeats: time at least this long and this many runs (after warm-up).

  Returns:
    median run time / batch_size, in milliseconds.
  """
  config_checks.integer("batch_size", batch_size, minimum=1)
  config_checks.integer("min_repeats", min_repeats, minimum=1)
  config_checks.number("min_seconds", min_seconds, positive=False)
  cpu = jax.devices("cpu")[0]
  params, batch_stats = jax.device_put((parts.params, parts.batch_stats), cpu)
  x = jax.device_put(jnp.zeros((batch_size, *input_shape), jnp.float32), cpu)
  forward = jax.jit(lambda p, s, x: core.apply(parts.graphdef, p, s, x, train=False)[0].logits)
  forward(params, batch_stats, x).block_until_ready()  # compile + warm-up
  run_times = []
  started = time.perf_counter()
  while len(run_times) < min_repeats or time.perf_counter() - started < min_seconds:
    tic = time.perf_counter()
    forward(params, batch_stats, x).block_until_ready()
    run_times.append(time.perf_counter() - tic)
  return 1e3 * float(np.median(run_times)) / batch_size


def model_costs(parts: core.ModelParts, input_shape: Sequence[int], *,
                batch_sizes: Sequence[int] = LATENCY_BATCH_SIZES,
                min_seconds: float = 1.0) -> dict[str, Any]:
  """params, flops_per_image and latency_ms_per_image_batch<b> for each b of one model."""
  costs = {"params": models.count_params(parts.params),
           "flops_per_image": models.flops_per_example(parts, input_shape)}
  for batch_size in batch_sizes:
    costs[f"latency_ms_per_image_batch{batch_size}"] = latency_ms_per_image(
        parts, input_shape, batch_size, min_seconds=min_seconds)
  return costs


def compression_report(teacher_parts: core.ModelParts, student_parts: core.ModelParts, *,
                       student_accuracy: float,
                       info: data.DatasetInfo, batch_sizes: Sequence[int] = LATENCY_BATCH_SIZES,
                       min_seconds: float = 1.0) -> dict[str, Any]:
  """The teacher and student side by side, with teacher/student ratios.

  Args:
    teacher_parts, student_parts: the two models (the student without adaptation layer).
    student_accuracy: the student's test accuracy.
    info: the dataset (input shape).
    batch_sizes: latency batch sizes.
    min_seconds: minimum timing per latency figure.

  Returns:
    {"teacher": {...}, "student": {...}, "param_ratio", "flops_ratio", "speedup_batch<b>",
    "latency_device"}: ratios are teacher / student.
  """
  report = {"teacher": model_costs(teacher_parts, info.image_shape, batch_sizes=batch_sizes,
                                   min_seconds=min_seconds),
            "student": model_costs(student_parts, info.image_shape, batch_sizes=batch_sizes,
                                   min_seconds=min_seconds)}
  report["student"]["test_accuracy"] = float(student_accuracy)
  teacher, student = report["teacher"], report["student"]
  report["param_ratio"] = teacher["params"] / student["params"]
  report["flops_ratio"] = teacher["flops_per_image"] / student["flops_per_image"]
  for batch_size in batch_sizes:
    name = f"latency_ms_per_image_batch{batch_size}"
    report[f"speedup_batch{batch_size}"] = teacher[name] / student[name]
  report["latency_device"] = str(jax.devices("cpu")[0].device_kind)
  return report
