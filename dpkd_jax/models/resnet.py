"""Residual networks for 28×28 and 32×32 images: ResNet-18/34 (CIFAR variant) and Wide-ResNet.

All follow the conventions of `classifiers.py`: `model(x, train=...)` on (B, H, W, C) float32
images returns a `core.ClassifierOutput`, and `norm` ∈ {"batch", "group", "none"} selects the
normalisation after (ResNet) or before (Wide-ResNet) every convolution.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax import kernels
from dpkd_jax.models import core
from dpkd_jax.models.classifiers import (ConvNorm, apply_norm, make_norm, validate_classifier_args,
                                         validate_norm)


class BasicBlock(nnx.Module):
  """ResNet basic block (He et al., 2016): conv3×3 → norm → ReLU → conv3×3 → norm, + shortcut, ReLU.

  The shortcut is a strided 1×1 conv + norm when the block changes resolution or width.
  """

  def __init__(self, in_channels: int, out_channels: int, *, stride: int, norm: str,
               rngs: nnx.Rngs):
    self.conv1 = ConvNorm(in_channels, out_channels, 3, norm=norm, rngs=rngs, strides=stride)
    self.conv2 = ConvNorm(out_channels, out_channels, 3, norm=norm, rngs=rngs)
    self.shortcut = (ConvNorm(in_channels, out_channels, 1, norm=norm, rngs=rngs, strides=stride)
                     if stride != 1 or in_channels != out_channels else None)

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    y = self.conv2(nnx.relu(self.conv1(x, train=train)), train=train)
    residual = x if self.shortcut is None else self.shortcut(x, train=train)
    return nnx.relu(y + residual)


class ResNet(nnx.Module):
  """CIFAR-style ResNet: 3×3 stem at stride 1 and no max-pool, so 28×28 inputs keep detail.

  stem conv3×3(w) → norm → ReLU → 4 stages of `BasicBlock`s with widths w, 2w, 4w, 8w and
  strides 1, 2, 2, 2 → global average pool → dense.

  Shapes: features (B, 8w); hint = output of the second stage, (B, ⌈H/2⌉, ⌈W/2⌉, 2w):
  (B, 14, 14, 128) at 28×28 and (B, 16, 16, 128) at 32×32 for w = 64.

  Args:
    num_classes, input_shape, norm, rngs: as for every classifier (see `classifiers`).
    stage_sizes: basic blocks in each of the 4 stages.
    base_width: width w of the first stage.
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, stage_sizes: Sequence[int], base_width: int = 64):
    _, _, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if len(stage_sizes) != 4 or min(stage_sizes) < 1:
      raise ValueError(f"stage_sizes must be 4 positive block counts, got {stage_sizes!r}")
    if base_width < 1:
      raise ValueError(f"base_width must be positive, got {base_width!r}")
    self.stem = ConvNorm(channels, base_width, 3, norm=norm, rngs=rngs)
    stages = []
    in_channels = base_width
    for index, num_blocks in enumerate(stage_sizes):
      out_channels = base_width * 2**index
      blocks = []
      for block in range(num_blocks):
        stride = 2 if index > 0 and block == 0 else 1
        blocks.append(BasicBlock(in_channels, out_channels, stride=stride, norm=norm, rngs=rngs))
        in_channels = out_channels
      stages.append(nnx.List(blocks))
    self.stages = nnx.List(stages)
    self.head = nnx.Linear(in_channels, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = nnx.relu(self.stem(x, train=train))
    hint = x
    for index, stage in enumerate(self.stages):
      for block in stage:
        x = block(x, train=train)
      if index == 1:
        hint = x  # (B, 14, 14, 128) at 28×28
    features = jnp.mean(x, axis=(1, 2))  # (B, 512)
    return core.ClassifierOutput(self.head(features), features, hint)


class ResNet18(ResNet):
  """ResNet-18, CIFAR variant: [2, 2, 2, 2] basic blocks; 11.17M parameters (10 classes, RGB)."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, base_width: int = 64):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     stage_sizes=(2, 2, 2, 2), base_width=base_width)


class ResNet34(ResNet):
  """ResNet-34, CIFAR variant: [3, 4, 6, 3] basic blocks; 21.28M parameters (10 classes, RGB)."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, base_width: int = 64):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     stage_sizes=(3, 4, 6, 3), base_width=base_width)


class WideBasicBlock(nnx.Module):
  """Pre-activation wide block (Zagoruyko & Komodakis, 2016).

  norm → ReLU → conv3×3 → norm → ReLU → conv3×3, plus the input; when the block changes width or
  resolution the shortcut is a strided 1×1 conv of the pre-activated input, as in the reference.
  """

  def __init__(self, in_channels: int, out_channels: int, *, stride: int, norm: str,
               rngs: nnx.Rngs):
    use_bias = norm == "none"
    conv = kernels.conv_general_dilated  # lax's, or the opt-in CPU kernels'
    self.norm1 = make_norm(norm, in_channels, rngs=rngs)
    self.conv1 = nnx.Conv(in_channels, out_channels, (3, 3), strides=stride, use_bias=use_bias,
                          rngs=rngs, conv_general_dilated=conv)
    self.norm2 = make_norm(norm, out_channels, rngs=rngs)
    self.conv2 = nnx.Conv(out_channels, out_channels, (3, 3), use_bias=use_bias, rngs=rngs,
                          conv_general_dilated=conv)
    self.shortcut = (nnx.Conv(in_channels, out_channels, (1, 1), strides=stride,
                              use_bias=use_bias, rngs=rngs, conv_general_dilated=conv)
                     if stride != 1 or in_channels != out_channels else None)

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    activated = nnx.relu(apply_norm(self.norm1, x, train=train))
    y = self.conv1(activated)
    y = self.conv2(nnx.relu(apply_norm(self.norm2, y, train=train)))
    residual = x if self.shortcut is None else self.shortcut(activated)
    return y + residual


class WideResNet(nnx.Module):
  """WRN-depth-k (Zagoruyko & Komodakis, 2016); the default WRN-16-4 has 2.75M parameters.

  stem conv3×3(16) → 3 stages of (depth − 4) / 6 `WideBasicBlock`s with widths 16k, 32k, 64k and
  strides 1, 2, 2 → norm → ReLU → global average pool → dense.

  Shapes: features (B, 64k); hint = output of the second stage, (B, ⌈H/2⌉, ⌈W/2⌉, 32k):
  (B, 14, 14, 128) at 28×28 and (B, 16, 16, 128) at 32×32 for WRN-16-4.

  Args:
    num_classes, input_shape, norm, rngs: as for every classifier (see `classifiers`).
    depth: total depth 6n + 4 (n blocks per stage).
    widen_factor: width multiplier k.
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, depth: int = 16, widen_factor: int = 4):
    _, _, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if depth < 10 or (depth - 4) % 6 != 0:
      raise ValueError(f"depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {depth!r}")
    if widen_factor < 1:
      raise ValueError(f"widen_factor must be a positive integer, got {widen_factor!r}")
    blocks_per_stage = (depth - 4) // 6
    self.stem = nnx.Conv(channels, 16, (3, 3), use_bias=norm == "none", rngs=rngs,
                         conv_general_dilated=kernels.conv_general_dilated)
    stages = []
    in_channels = 16
    for index in range(3):
      out_channels = 16 * widen_factor * 2**index
      blocks = []
      for block in range(blocks_per_stage):
        stride = 2 if index > 0 and block == 0 else 1
        blocks.append(WideBasicBlock(in_channels, out_channels, stride=stride, norm=norm,
                                     rngs=rngs))
        in_channels = out_channels
      stages.append(nnx.List(blocks))
    self.stages = nnx.List(stages)
    self.final_norm = make_norm(norm, in_channels, rngs=rngs)
    self.head = nnx.Linear(in_channels, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = self.stem(x)
    hint = x
    for index, stage in enumerate(self.stages):
      for block in stage:
        x = block(x, train=train)
      if index == 1:
        hint = x  # (B, 14, 14, 128) at 28×28 for WRN-16-4
    x = nnx.relu(apply_norm(self.final_norm, x, train=train))
    features = jnp.mean(x, axis=(1, 2))  # (B, 256) for WRN-16-4
    return core.ClassifierOutput(self.head(features), features, hint)
