"""Compact students for private model compression (RONA), sized like the paper's MNIST students.

RONA (Wang et al., AAAI 2019) compresses a ~155K-parameter MNIST teacher into students of 4.97K
and 9.88K parameters. The zoo's smallest classifier (`lenet5_half`, 15.7K) is larger than both,
so this module adds one parametrised three-convolution network and two named sizes:

  conv3×3(c1) → norm → ReLU → pool → conv3×3(c2) → norm → ReLU → pool   (hint, (B, H/4, W/4, c2))
  → conv3×3(c3) → norm → ReLU → global average pool (features, (B, c3)) → dense(num_classes)

Global average pooling instead of a flattening dense layer keeps the parameter count almost
independent of the image size, which is what makes ~5K parameters reach ~99% on MNIST. The hint
sits at 1/4 resolution, like the hints of `small_cnn`, `vgg` and `mobilenet`, so RONA's adaptation
layer to those teachers is a 1×1 convolution.

| name | widths (c1, c2, c3) | params at 28×28×1, 10 classes, norm "none" / "batch" | hint |
|---|---|---|---|
| `compact_5k` | (8, 16, 24) | 4,978 / 5,026 | (7, 7, 16) |
| `compact_10k` | (12, 24, 32) | 10,010 / 10,078 | (7, 7, 24) |

(BatchNorm running statistics live in `batch_stats` and are not counted.) These constructors are
listed in `COMPACT_CLASSIFIERS` with the same keyword signature as every registry classifier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax.models import classifiers
from dpkd_jax.models import core


class CompactCNN(nnx.Module):
  """Three 3×3 convolutions, two 2×2 max-pools, global average pooling, one dense layer.

  Shapes at H×W input: hint (B, H // 4, W // 4, c2) (second stage after pooling); features
  (B, c3) (global average of the third convolution).

  Args:
    num_classes, input_shape, norm, rngs: as for every classifier (`classifiers` docstring).
    widths: output channels (c1, c2, c3) of the three convolutions.
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, widths: tuple[int, int, int] = (8, 16, 24)):
    height, width, channels = classifiers.validate_classifier_args(num_classes, input_shape)
    classifiers.validate_norm(norm)
    if len(widths) != 3 or any(not isinstance(w, int) or w < 1 for w in widths):
      raise ValueError(f"widths must be three positive ints (c1, c2, c3), got {widths!r}")
    if min(height, width) < 4:
      raise ValueError(f"CompactCNN needs inputs of at least 4×4, got input_shape={input_shape!r}")
    self.conv1 = classifiers.ConvNorm(channels, widths[0], 3, norm=norm, rngs=rngs)
    self.conv2 = classifiers.ConvNorm(widths[0], widths[1], 3, norm=norm, rngs=rngs)
    self.conv3 = classifiers.ConvNorm(widths[1], widths[2], 3, norm=norm, rngs=rngs)
    self.head = nnx.Linear(widths[2], num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = classifiers.conv_norm_relu_pool(self.conv1, x, train=train)
    hint = classifiers.conv_norm_relu_pool(self.conv2, x, train=train)  # (B, 7, 7, c2) at 28×28
    features = jnp.mean(nnx.relu(self.conv3(hint, train=train)), axis=(1, 2))  # (B, c3)
    return core.ClassifierOutput(self.head(features), features, hint)


def compact_5k(*, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs) -> CompactCNN:
  """`CompactCNN` with widths (8, 16, 24): 4,978 parameters at 28×28×1 without norm."""
  return CompactCNN(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                    widths=(8, 16, 24))


def compact_10k(*, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
                rngs: nnx.Rngs) -> CompactCNN:
  """`CompactCNN` with widths (12, 24, 32): 10,010 parameters at 28×28×1 without norm."""
  return CompactCNN(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                    widths=(12, 24, 32))


# Same keyword signature as `registry.CLASSIFIERS`' constructors, so the two tables can be merged.
COMPACT_CLASSIFIERS: dict[str, Callable[..., nnx.Module]] = {
    "compact_5k": compact_5k,
    "compact_10k": compact_10k,
}
