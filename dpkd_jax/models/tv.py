"""Exact Flax twins of torchvision's ResNet-18/34, VGG-11/16-BN and MobileNetV2 (bring your own
teacher: `dpkd_jax.importers`).

Unlike the CIFAR variants of `resnet.py` and `mobilenet.py`, these follow torchvision
layer for layer, so a torchvision `state_dict` maps onto them one array to one array:

  * explicit symmetric padding as PyTorch's `padding=k // 2` (Flax's "SAME" pads a strided
    convolution asymmetrically: another function);
  * ResNet: 7×7 stride-2 stem → 3×3 stride-2 max-pool (pad 1) → 4 stages → global average pool;
  * VGG: 3×3 convolutions with BatchNorm, 2×2 max-pools, `adaptive_avg_pool` to 7×7 and the
    4096-wide classifier (25088 → 4096 → 4096 → classes), dropout left out (eval: identity);
  * MobileNetV2: torchvision's widths (32 → ... → 320 → 1280) and strides, dropout left out.

Any input side works that keeps every feature map non-empty (VGG needs at least 32 pixels, its
five pools): adaptive pooling makes the classifier independent of the input size, as in
torchvision. Convolutions run through `classifiers.ConvNorm`, so `norm` ("batch", "group",
"none") is honoured; the imported models are "batch" (torchvision's BatchNorm, eps 1e-5, the
default of `nnx.BatchNorm` too). Same keyword arguments and `core.ClassifierOutput` as every
classifier of `classifiers.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpkd_jax.models import core
from dpkd_jax.models import mobilenet
from dpkd_jax.models.classifiers import ConvNorm, validate_classifier_args, validate_norm


def _pad(kernel_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """PyTorch's symmetric `padding=kernel_size // 2` on both spatial axes."""
  p = kernel_size // 2
  return ((p, p), (p, p))


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
  """Side of a convolution / pool output, floored as PyTorch (and `lax`) do."""
  return (size + 2 * pad - kernel) // stride + 1


def _check_sides(name: str, input_shape: Sequence[int], sides: Sequence[int]) -> None:
  if min(sides) < 1:
    raise ValueError(f"{name} has an empty feature map at input_shape={tuple(input_shape)!r} "
                     "(too small an image); give larger inputs")


def _adaptive_matrix(size_in: int, size_out: int) -> np.ndarray:
  """(size_out, size_in) averaging weights of PyTorch's adaptive average pooling on one axis:
  output i averages inputs floor(i·n/m) .. ceil((i+1)·n/m) - 1."""
  matrix = np.zeros((size_out, size_in), np.float32)
  for i in range(size_out):
    start, end = (i * size_in) // size_out, -(-((i + 1) * size_in) // size_out)
    matrix[i, start:end] = 1.0 / (end - start)
  return matrix


def adaptive_avg_pool(x: jax.Array, output_size: tuple[int, int]) -> jax.Array:
  """`torch.nn.AdaptiveAvgPool2d(output_size)` on (B, H, W, C) maps -> (B, oh, ow, C)."""
  rows = _adaptive_matrix(x.shape[1], output_size[0])  # (oh, H), static
  cols = _adaptive_matrix(x.shape[2], output_size[1])  # (ow, W), static
  return jnp.einsum("oh,bhwc,pw->bopc", rows, x, cols)


def _max_pool_3x3_s2(x: jax.Array) -> jax.Array:
  """torchvision ResNet's `MaxPool2d(3, stride=2, padding=1)` (pads with -inf)."""
  return nnx.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))


class TVBasicBlock(nnx.Module):
  """torchvision's `BasicBlock`: conv3×3(stride) → norm → ReLU → conv3×3 → norm, + identity or
  `downsample` (1×1 conv(stride) → norm), ReLU."""

  def __init__(self, in_channels: int, out_channels: int, *, stride: int, norm: str,
               rngs: nnx.Rngs):
    self.conv1 = ConvNorm(in_channels, out_channels, 3, norm=norm, rngs=rngs, strides=stride,
                          padding=_pad(3))
    self.conv2 = ConvNorm(out_channels, out_channels, 3, norm=norm, rngs=rngs, padding=_pad(3))
    self.downsample = (ConvNorm(in_channels, out_channels, 1, norm=norm, rngs=rngs,
                                strides=stride, padding="VALID")
                       if stride != 1 or in_channels != out_channels else None)

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    y = self.conv2(nnx.relu(self.conv1(x, train=train)), train=train)
    identity = x if self.downsample is None else self.downsample(x, train=train)
    return nnx.relu(y + identity)


class TVResNet(nnx.Module):
  """torchvision's ResNet with basic blocks (`torchvision.models.resnet18/34`).

  conv7×7(64, stride 2, pad 3) → norm → ReLU → max-pool 3×3 (stride 2, pad 1) → 4 stages of
  `TVBasicBlock` (widths 64, 128, 256, 512; strides 1, 2, 2, 2) → global average pool → dense.

  Shapes: features (B, 512); hint = output of the second stage (B, h, w, 128), h = the input
  side / 8 rounded up (4 at 32×32).

  Args:
    stage_sizes: basic blocks per stage ((2, 2, 2, 2) ResNet-18, (3, 4, 6, 3) ResNet-34).
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, stage_sizes: Sequence[int] = (2, 2, 2, 2)):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if len(stage_sizes) != 4 or min(stage_sizes) < 1:
      raise ValueError(f"stage_sizes must be 4 positive block counts, got {stage_sizes!r}")
    sides = [_out(_out(s, 7, 2, 3), 3, 2, 1) for s in (height, width)]
    for _ in range(3):  # stages 2-4 halve the map (3×3, stride 2, pad 1)
      sides = [_out(s, 3, 2, 1) for s in sides]
    _check_sides(type(self).__name__, input_shape, sides)
    self.stem = ConvNorm(channels, 64, 7, norm=norm, rngs=rngs, strides=2, padding=_pad(7))
    stages, in_channels = [], 64
    for index, num_blocks in enumerate(stage_sizes):
      out_channels = 64 * 2**index
      blocks = []
      for block in range(num_blocks):
        stride = 2 if index > 0 and block == 0 else 1
        blocks.append(TVBasicBlock(in_channels, out_channels, stride=stride, norm=norm,
                                   rngs=rngs))
        in_channels = out_channels
      stages.append(nnx.List(blocks))
    self.stages = nnx.List(stages)
    self.head = nnx.Linear(in_channels, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = _max_pool_3x3_s2(nnx.relu(self.stem(x, train=train)))
    hint = x
    for index, stage in enumerate(self.stages):
      for block in stage:
        x = block(x, train=train)
      if index == 1:
        hint = x  # (B, 4, 4, 128) at 32×32
    features = jnp.mean(x, axis=(1, 2))  # (B, 512): AdaptiveAvgPool2d((1, 1)) + flatten
    return core.ClassifierOutput(self.head(features), features, hint)


class TVResNet18(TVResNet):
  """torchvision `resnet18`: (2, 2, 2, 2) basic blocks, 11.7M parameters at 1000 classes."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     stage_sizes=(2, 2, 2, 2))


class TVResNet34(TVResNet):
  """torchvision `resnet34`: (3, 4, 6, 3) basic blocks, 21.8M parameters at 1000 classes."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     stage_sizes=(3, 4, 6, 3))


# torchvision's VGG configurations: output channels of each 3×3 conv, "M" a 2×2 max-pool.
VGG_CONFIGS = {
    "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512,
          "M"),
}


class TVVGG(nnx.Module):
  """torchvision's VGG with BatchNorm (`torchvision.models.vgg11_bn` / `vgg16_bn`).

  [conv3×3 (pad 1) → norm → ReLU]* with 2×2 max-pools per `VGG_CONFIGS` → adaptive average
  pool to 7×7 → flatten (H, W, C order) → dense(4096) → ReLU → dense(4096) → ReLU → dense.
  torchvision's two Dropout(0.5) layers are identity in eval mode and left out.

  Shapes: features (B, classifier_width); hint = the map after the third max-pool,
  (B, side / 8, side / 8, 256) (4×4 at 32×32).

  Args:
    config: "A" (VGG-11) or "D" (VGG-16).
    classifier_width: width of the two hidden dense layers (torchvision: 4096).
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, config: str = "A", classifier_width: int = 4096):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if config not in VGG_CONFIGS:
      raise ValueError(f"config must be one of {sorted(VGG_CONFIGS)}, got {config!r}")
    layers, pools, in_channels = [], [], channels
    for item in VGG_CONFIGS[config]:
      if item == "M":
        pools.append(len(layers) - 1)  # pool after this conv
        continue
      layers.append(ConvNorm(in_channels, item, 3, norm=norm, rngs=rngs, padding=_pad(3)))
      in_channels = item
    _check_sides(type(self).__name__, input_shape,
                 [s // 2**len(pools) for s in (height, width)])
    self.convs = nnx.List(layers)
    self.pool_after = tuple(pools)  # static: indices of the convs followed by a max-pool
    self.fc1 = nnx.Linear(7 * 7 * in_channels, classifier_width, rngs=rngs)
    self.fc2 = nnx.Linear(classifier_width, classifier_width, rngs=rngs)
    self.head = nnx.Linear(classifier_width, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    hint = x
    for index, layer in enumerate(self.convs):
      x = nnx.relu(layer(x, train=train))
      if index in self.pool_after:
        x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))
        if index == self.pool_after[2]:
          hint = x  # (B, 4, 4, 256) at 32×32
    x = adaptive_avg_pool(x, (7, 7)).reshape(x.shape[0], -1)  # (B, 7·7·512), H, W, C order
    features = nnx.relu(self.fc2(nnx.relu(self.fc1(x))))  # (B, 4096)
    return core.ClassifierOutput(self.head(features), features, hint)


class TVVGG11BN(TVVGG):
  """torchvision `vgg11_bn`: configuration "A", 132.9M parameters at 1000 classes."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     config="A")


class TVVGG16BN(TVVGG):
  """torchvision `vgg16_bn`: configuration "D", 138.4M parameters at 1000 classes."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     config="D")


class TVInvertedResidual(nnx.Module):
  """torchvision's MobileNetV2 `InvertedResidual`: [1×1 expand → norm → ReLU6] → 3×3 depthwise
  (stride, pad 1) → norm → ReLU6 → 1×1 projection → norm, + input when stride 1 and same width."""

  def __init__(self, in_channels: int, out_channels: int, *, stride: int, expansion: int,
               norm: str, rngs: nnx.Rngs):
    hidden = int(round(in_channels * expansion))
    self.expand = (ConvNorm(in_channels, hidden, 1, norm=norm, rngs=rngs, padding="VALID")
                   if expansion != 1 else None)
    self.depthwise = ConvNorm(hidden, hidden, 3, norm=norm, rngs=rngs, strides=stride,
                              padding=_pad(3), feature_group_count=hidden)
    self.project = ConvNorm(hidden, out_channels, 1, norm=norm, rngs=rngs, padding="VALID")
    self.use_residual = stride == 1 and in_channels == out_channels

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    y = x if self.expand is None else nnx.relu6(self.expand(x, train=train))
    y = self.project(nnx.relu6(self.depthwise(y, train=train)), train=train)
    return x + y if self.use_residual else y


# torchvision's inverted residual settings: (expansion t, channels c, repeats n, stride s).
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class TVMobileNetV2(nnx.Module):
  """torchvision's `mobilenet_v2` (width multiplier 1.0).

  conv3×3(32, stride 2, pad 1) → norm → ReLU6 → 17 `TVInvertedResidual` blocks
  (`MOBILENET_V2_SETTINGS`) → 1×1 conv(1280) → norm → ReLU6 → global average pool → dense.
  torchvision's Dropout(0.2) before the dense layer is identity in eval mode and left out.

  Shapes: features (B, 1280); hint = output of the 32-channel group, (B, side / 8, side / 8,
  32) (4×4 at 32×32).
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    sides = [_out(s, 3, 2, 1) for s in (height, width)]
    for *_, stride in MOBILENET_V2_SETTINGS:
      sides = [_out(s, 3, stride, 1) for s in sides]
    _check_sides(type(self).__name__, input_shape, sides)
    self.stem = ConvNorm(channels, 32, 3, norm=norm, rngs=rngs, strides=2, padding=_pad(3))
    self.blocks, in_channels = mobilenet.inverted_residual_blocks(
        TVInvertedResidual, MOBILENET_V2_SETTINGS, 32, norm=norm, rngs=rngs)
    self.hint_block = sum(s[2] for s in MOBILENET_V2_SETTINGS[:3]) - 1  # last 32-channel block
    self.head_conv = ConvNorm(in_channels, 1280, 1, norm=norm, rngs=rngs, padding="VALID")
    self.head = nnx.Linear(1280, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = nnx.relu6(self.stem(x, train=train))
    hint = x
    for index, block in enumerate(self.blocks):
      x = block(x, train=train)
      if index == self.hint_block:
        hint = x  # (B, 4, 4, 32) at 32×32
    x = nnx.relu6(self.head_conv(x, train=train))
    features = jnp.mean(x, axis=(1, 2))  # (B, 1280)
    return core.ClassifierOutput(self.head(features), features, hint)
