"""CPU latency per image of an exported student beside jitted JAX, measured with repeats.

Figures depend on the machine and on what else runs on it: `measure` returns them with the
1-minute load average and core count at the time, and the model card prints them in its
"measured" section only (never in code or docstrings). Each runtime gets one untimed warm-up
call per batch size (compilation, session set-up), then `repeats` timed calls; the median and
the minimum per image are reported.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax.release import export

BATCH_SIZES = (1, 256)


def per_image_ms(call: Callable[[np.ndarray], Any], images: np.ndarray, *,
                 repeats: int) -> dict[str, Any]:
  """Milliseconds per image of `call(images)` (which must block until its result is ready)."""
  call(images)  # warm-up: compilation / session set-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call(images)
    times.append(time.perf_counter() - start)
  batch = len(images)
  return {"batch": batch, "repeats": repeats,
          "median_ms_per_image": 1e3 * statistics.median(times) / batch,
          "min_ms_per_image": 1e3 * min(times) / batch}


def _runtimes(parts, onnx_path: str | None,
              stablehlo_path: str | None) -> dict[str, Callable[[np.ndarray], Any]]:
  """{name: images -> logits (blocking)} for jitted JAX and each exported file."""
  jitted = jax.jit(export.logits_fn(parts))
  runtimes = {"jax_jit": lambda x: jax.block_until_ready(jitted(x))}
  if onnx_path is not None:
    session = export.onnx_session(onnx_path)
    runtimes["onnxruntime"] = lambda x: session.run([export.OUTPUT_NAME], {export.INPUT_NAME: x})
  if stablehlo_path is not None:
    module = jax.jit(export.load_stablehlo(stablehlo_path).call)
    runtimes["stablehlo"] = lambda x: jax.block_until_ready(module(x))
  return runtimes


def measure(parts, info: data.DatasetInfo, *, onnx_path: str | None = None,
            stablehlo_path: str | None = None, batch_sizes: tuple[int, ...] = BATCH_SIZES,
            repeats: int = 5) -> dict[str, Any]:
  """CPU latency per image of jitted JAX and of the exported files, at each batch size.

  Returns:
    {"note", "load_average_1min" (before and after), "cpu_count", "backend", "results":
    {runtime: [per_image_ms(...) per batch size]}}.
  """
  load_before = os.getloadavg()[0]
  results: dict[str, list[dict[str, Any]]] = {}
  for name, call in _runtimes(parts, onnx_path, stablehlo_path).items():
    results[name] = []
    for batch in batch_sizes:
      images = export.pattern_images(info, batch)
      results[name].append(per_image_ms(call, images, repeats=repeats))
  return {"note": "measured under the load of the moment on this machine, not a benchmark",
          "load_average_1min": [load_before, os.getloadavg()[0]],
          "cpu_count": os.cpu_count(), "backend": jax.default_backend(), "results": results}
