"""MobileNetV2-style classifier (Sandler et al., 2018), scaled down for 28×28 and 32×32 images.

Built from `classifiers.ConvNorm`; the same keyword arguments and `core.ClassifierOutput` as
every classifier of `classifiers.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax.models import core
from dpkd_jax.models.classifiers import ConvNorm, validate_classifier_args, validate_norm


class InvertedResidual(nnx.Module):
  """MobileNetV2 block: 1×1 expand → ReLU6 → 3×3 depthwise → ReLU6 → 1×1 linear projection.

  The residual is added when the block keeps the shape (stride 1, same width).
  """

  def __init__(self, in_channels: int, out_channels: int, *, stride: int, expansion: int,
               norm: str, rngs: nnx.Rngs):
    hidden = in_channels * expansion
    self.expand = (ConvNorm(in_channels, hidden, 1, norm=norm, rngs=rngs)
                   if expansion != 1 else None)
    self.depthwise = ConvNorm(hidden, hidden, 3, norm=norm, rngs=rngs, strides=stride,
                              feature_group_count=hidden)
    self.project = ConvNorm(hidden, out_channels, 1, norm=norm, rngs=rngs)
    self.use_residual = stride == 1 and in_channels == out_channels

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    y = x if self.expand is None else nnx.relu6(self.expand(x, train=train))
    y = nnx.relu6(self.depthwise(y, train=train))
    # Linear bottleneck: no activation after the projection (Sandler et al., 2018).
    y = self.project(y, train=train)
    return x + y if self.use_residual else y


# (expansion t, output channels c, repeats n, first stride s) per group, as in MobileNetV2's table.
MOBILENET_SMALL_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 2, 2))


def inverted_residual_blocks(block: type[nnx.Module],
                             settings: Sequence[tuple[int, int, int, int]], in_channels: int, *,
                             norm: str, rngs: nnx.Rngs) -> tuple[nnx.List, int]:
  """MobileNetV2's body: for each (expansion t, channels c, repeats n, first stride s) group, n
  `block`s (the first at stride s); returns (the blocks, the last block's channels). The blocks
  are created in order, so parameter initialisation follows the table."""
  blocks = []
  for expansion, out_channels, repeats, stride in settings:
    for repeat in range(repeats):
      blocks.append(block(in_channels, out_channels, stride=stride if repeat == 0 else 1,
                          expansion=expansion, norm=norm, rngs=rngs))
      in_channels = out_channels
  return nnx.List(blocks), in_channels


class MobileNet(nnx.Module):
  """MobileNetV2-style network (Sandler et al., 2018), scaled down for 28×28 and 32×32 images.

  3×3 stem at stride 1 (no early downsampling at this resolution) → groups of `InvertedResidual`
  blocks → 1×1 conv to `head_channels` → ReLU6 → global average pool → dense. The small default
  has 131,978 parameters at 28×28×1 without norm.

  Shapes: features (B, head_channels); hint = output of block group `len(block_settings) // 2`:
  (B, 7, 7, 32) at 28×28 and (B, 8, 8, 32) at 32×32 with the default settings.

  Args:
    stem_channels: channels of the stem convolution.
    block_settings: (expansion t, channels c, repeats n, first stride s) per block group.
    head_channels: channels of the final 1×1 convolution (the feature size).
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, stem_channels: int = 32,
               block_settings: Sequence[tuple[int, int, int, int]] = MOBILENET_SMALL_BLOCKS,
               head_channels: int = 256):
    _, _, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if not block_settings or any(len(s) != 4 or min(s) < 1 for s in block_settings):
      raise ValueError(f"block_settings must be non-empty (t, c, n, s) tuples of positive ints, "
                       f"got {block_settings!r}")
    self.stem = ConvNorm(channels, stem_channels, 3, norm=norm, rngs=rngs)
    self.blocks, in_channels = inverted_residual_blocks(InvertedResidual, block_settings,
                                                        stem_channels, norm=norm, rngs=rngs)
    # Index of the last block of group len(block_settings) // 2.
    self.hint_block = sum(s[2] for s in block_settings[:len(block_settings) // 2 + 1]) - 1
    self.head_conv = ConvNorm(in_channels, head_channels, 1, norm=norm, rngs=rngs)
    self.head = nnx.Linear(head_channels, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = nnx.relu6(self.stem(x, train=train))
    hint = x
    for index, block in enumerate(self.blocks):
      x = block(x, train=train)
      if index == self.hint_block:
        hint = x  # (B, 7, 7, 32) at 28×28 with the default settings
    x = nnx.relu6(self.head_conv(x, train=train))
    features = jnp.mean(x, axis=(1, 2))  # (B, head_channels)
    return core.ClassifierOutput(self.head(features), features, hint)
