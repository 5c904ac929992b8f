"""Prints the model zoo's markdown table: parameters and FLOPs per forward pass, 10 classes.

Run from the repository root:

  python -m benchmarks.model_table

Models are built abstractly (`nnx.eval_shape`: no parameters are allocated or initialised) and
only compiled for XLA's cost analysis, so the whole table takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import jax
from flax import nnx

from dpkd_jax.models import core, cost, registry

NUM_CLASSES = 10
INPUT_SHAPES = ((28, 28, 1), (32, 32, 3))


def model_cost(name: str, input_shape: tuple[int, int, int]) -> tuple[int, float]:
  """(trainable parameters, inference FLOPs per example) of a BatchNorm classifier."""
  model = nnx.eval_shape(lambda: registry.create_classifier(
      name, num_classes=NUM_CLASSES, input_shape=input_shape, norm="batch",
      rngs=nnx.Rngs(jax.random.key(0))))
  parts = core.split(model)
  return cost.count_params(parts.params), cost.flops_per_example(parts, input_shape)


def _format_flops(flops: float) -> str:
  return f"{flops / 1e9:.2f} G" if flops >= 1e9 else f"{flops / 1e6:.2f} M"


def main() -> None:
  header = ["model (`registry` name)"]
  for height, width, channels in INPUT_SHAPES:
    header += [f"params {height}×{width}×{channels}", f"FLOPs {height}×{width}×{channels}"]
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for name in registry.CLASSIFIERS:
    row = [f"`{name}`"]
    for input_shape in INPUT_SHAPES:
      try:
        params, flops = model_cost(name, input_shape)
      except ValueError:  # too small an input for it (torchvision's VGG needs 32×32)
        row += ["n/a", "n/a"]
        continue
      row += [f"{params:,}", _format_flops(flops)]
    print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
  main()
