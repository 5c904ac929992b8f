"""Small image classifiers (LeNet-5, DataLens CNN, SmallCNN, VGG) and norm layers.

MobileNetV2 is in `mobilenet.py`, the ResNets in `resnet.py`; both build on the layers here.

Every classifier is an `nnx.Module` built from keyword arguments `num_classes` (>= 2),
`input_shape` ((H, W, C) of one image), `norm` and `rngs` (initialisation streams), plus the
model-specific ones listed on each class. It is called as `model(x, train=...)` on (B, H, W, C)
float32 images and returns a `core.ClassifierOutput`:
`logits` (B, num_classes), `features` (B, F), the input of the last dense layer, and `hint`, an
intermediate activation for RONA's hint learning whose shape each class documents.

`norm` picks the normalisation after every convolution:
  * "batch": BatchNorm, for non-private teachers. It reads `use_running_average=not train` at
    call time, so a single graphdef serves both modes (see `core.apply`).
  * "group": GroupNorm, for DP-SGD, where BatchNorm would mix examples and break per-example
    clipping; `group_count` picks the groups.
  * "none": no normalisation; the convolutions get a bias instead.
No model uses Dropout, so the forward pass needs no random state.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpkd_jax import kernels
from dpkd_jax.models import core

NORMS = ("batch", "group", "none")
# PyTorch's BatchNorm momentum 0.1 (the reference implementations are PyTorch): the running
# averages settle within a few hundred steps, which matters for teachers trained a few epochs.
BATCH_NORM_MOMENTUM = 0.9
# De et al. (2022) use 16 groups in their DP-SGD Wide-ResNets.
MAX_GROUPS = 16

NormLayer = nnx.BatchNorm | nnx.GroupNorm | None


def validate_norm(norm: str) -> None:
  """Raises ValueError unless `norm` is one of `NORMS`."""
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def _is_int(value: object) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def validate_image_shape(image_shape: Sequence[int], *, arg_name: str) -> tuple[int, int, int]:
  """Checks that `image_shape` is (height, width, channels) of positive ints and returns it.

  Args:
    image_shape: the shape to check.
    arg_name: the caller's argument name, for the error message.

  Returns:
    `image_shape` as a tuple of Python ints.
  """
  shape = tuple(image_shape)
  if len(shape) != 3 or not all(_is_int(d) and d >= 1 for d in shape):
    raise ValueError(f"{arg_name} must be (height, width, channels) of positive ints, "
                     f"got {image_shape!r}")
  return tuple(int(d) for d in shape)


def validate_classifier_args(num_classes: int, input_shape: Sequence[int]) -> tuple[int, int, int]:
  """Checks the arguments every classifier shares.

  Args:
    num_classes: number of output classes, at least 2.
    input_shape: (height, width, channels) of one image, positive integers.

  Returns:
    `input_shape` as a tuple of Python ints.
  """
  if not _is_int(num_classes) or num_classes < 2:
    raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
  return validate_image_shape(input_shape, arg_name="input_shape")


def group_count(num_channels: int, max_groups: int = MAX_GROUPS) -> int:
  """The largest divisor of `num_channels` not above `max_groups` (GroupNorm needs a divisor)."""
  return max(g for g in range(1, min(num_channels, max_groups) + 1) if num_channels % g == 0)


def make_norm(norm: str, num_features: int, *, rngs: nnx.Rngs) -> NormLayer:
  """Builds the norm layer named by `norm` for `num_features` channels (None for "none")."""
  validate_norm(norm)
  if norm == "batch":
    return nnx.BatchNorm(num_features, momentum=BATCH_NORM_MOMENTUM, rngs=rngs)
  if norm == "group":
    return nnx.GroupNorm(num_features, num_groups=group_count(num_features), rngs=rngs)
  return None


def apply_norm(layer: NormLayer, x: jax.Array, *, train: bool) -> jax.Array:
  """Applies a layer from `make_norm`; BatchNorm uses batch statistics only when training."""
  if layer is None:
    return x
  if isinstance(layer, nnx.BatchNorm):
    return layer(x, use_running_average=not train)
  return kernels.group_norm(layer, x)  # `layer(x)`, or the CPU kernels' fused form


class ConvNorm(nnx.Module):
  """A convolution followed by the chosen normalisation (no activation).

  The convolution has a bias only when `norm == "none"`: a following norm layer's shift makes it
  redundant. It runs through `kernels.conv_general_dilated`: `lax.conv_general_dilated`, or the
  opt-in CPU kernels' form of it.

  Args:
    in_channels, out_channels: input and output channels.
    kernel_size: side of the square kernel.
    norm: "batch", "group" or "none".
    rngs: initialisation streams.
    strides, padding, feature_group_count: as for `nnx.Conv` (groups = channels: depthwise).
  """

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, norm: str,
               rngs: nnx.Rngs, strides: int = 1, padding: str | Sequence[tuple[int, int]] = "SAME",
               feature_group_count: int = 1):
    self.conv = nnx.Conv(in_channels, out_channels, (kernel_size, kernel_size), strides=strides,
                         padding=padding, feature_group_count=feature_group_count,
                         use_bias=norm == "none", rngs=rngs,
                         conv_general_dilated=kernels.conv_general_dilated)
    self.norm = make_norm(norm, out_channels, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    return apply_norm(self.norm, self.conv(x), train=train)


def max_pool_2x2(x: jax.Array) -> jax.Array:
  """2×2 max-pool, stride 2, VALID (odd sizes are floored), as `nnx.max_pool`.

  Through `kernels.max_pool_2x2` (the CPU kernels' pool has equal values and gradients).
  """
  return kernels.max_pool_2x2(x)


def conv_norm_relu_pool(layer: ConvNorm, x: jax.Array, *, train: bool) -> jax.Array:
  """`max_pool_2x2(nnx.relu(layer(x, train=train)))`: a conv stage with its 2×2 max-pool.

  The active kernels may run the norm, ReLU and pool as one op (`kernels.norm_relu_max_pool`:
  the CPU kernels do for a plain GroupNorm, and a plain BatchNorm when training). A norm layer
  with a `fused_relu_max_pool(y)` method (ghost clipping's tapped GroupNorm, `ghost_taps`)
  computes the three itself, or returns None to decline. Otherwise the three layers run in
  turn.
  """
  y = layer.conv(x)
  norm = layer.norm
  out = kernels.norm_relu_max_pool(norm, y, train=train)
  if out is not None:
    return out
  fused = getattr(norm, "fused_relu_max_pool", None)
  out = None if fused is None else fused(y)
  return max_pool_2x2(nnx.relu(apply_norm(norm, y, train=train))) if out is None else out


def _flatten(x: jax.Array) -> jax.Array:
  return x.reshape(x.shape[0], -1)


class LeNet5(nnx.Module):
  """LeNet-5 (LeCun et al., 1998) as in DAFL's reference code: ReLU and max-pooling.

  conv5×5(6) → norm → ReLU → pool → conv5×5(16) → norm → ReLU → pool → flatten → dense(120)
  → ReLU → dense(84) → ReLU → dense(num_classes). LeCun et al. fed 28×28 digits centred in a
  32×32 field, so the first convolution pads inputs smaller than 32 up to it: 28×28 and 32×32
  inputs both reach the classic 5×5×16 map (61,706 parameters at 28×28×1 without norm). DAFL's
  third 5×5 convolution on that 5×5 map is the 400→120 dense layer here.

  Shapes: features (B, 84); hint = second conv stage after pooling, (B, 5, 5, 16) at 28×28 and
  32×32.

  Args:
    conv_widths: channels of the two convolutions.
    dense_widths: widths of the two hidden dense layers.
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, conv_widths: tuple[int, int] = (6, 16),
               dense_widths: tuple[int, int] = (120, 84)):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    # Padding per axis so a side below 32 is treated as if centred in 32 (28 → pad 2).
    pad_h, pad_w = max(0, (32 - height) // 2), max(0, (32 - width) // 2)
    self.conv1 = ConvNorm(channels, conv_widths[0], 5, norm=norm, rngs=rngs,
                          padding=((pad_h, pad_h), (pad_w, pad_w)))
    self.conv2 = ConvNorm(conv_widths[0], conv_widths[1], 5, norm=norm, rngs=rngs, padding="VALID")
    # Spatial size after conv5 (VALID) → pool → conv5 (VALID) → pool, floors included.
    out_h = ((height + 2 * pad_h - 4) // 2 - 4) // 2
    out_w = ((width + 2 * pad_w - 4) // 2 - 4) // 2
    self.fc1 = nnx.Linear(out_h * out_w * conv_widths[1], dense_widths[0], rngs=rngs)
    self.fc2 = nnx.Linear(dense_widths[0], dense_widths[1], rngs=rngs)
    self.head = nnx.Linear(dense_widths[1], num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = conv_norm_relu_pool(self.conv1, x, train=train)
    hint = conv_norm_relu_pool(self.conv2, x, train=train)  # (B, 5, 5, 16)
    features = nnx.relu(self.fc2(nnx.relu(self.fc1(_flatten(hint)))))  # (B, 84)
    return core.ClassifierOutput(self.head(features), features, hint)


class LeNet5Half(LeNet5):
  """DAFL's half-width student LeNet-5-Half: conv widths (3, 8), dense widths (60, 42).

  15,738 parameters at 28×28×1 without norm. Shapes: features (B, 42); hint (B, 5, 5, 8).
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs):
    super().__init__(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs,
                     conv_widths=(3, 8), dense_widths=(60, 42))


class _TwoConvCNN(nnx.Module):
  """conv3×3(32) → ReLU → pool → conv3×3(64) → ReLU [→ pool] → dense(hidden) → ReLU → dense.

  The common body of `DataLensCNN` (VALID convolutions, no second pool) and `SmallCNN` (SAME,
  pooled twice); the norm follows each convolution. Layers are created in the order conv1,
  conv2, fc, head (the order of the parameter initialisation keys).
  """

  padding: str  # "VALID" or "SAME", set by each subclass
  pool_second: bool
  default_hidden_width: int

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs, hidden_width: int | None = None):
    padding, pool_second = self.padding, self.pool_second
    hidden_width = self.default_hidden_width if hidden_width is None else hidden_width
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if padding == "VALID":
      out_h, out_w = (height - 2) // 2 - 2, (width - 2) // 2 - 2
    else:
      out_h, out_w = height // 2, width // 2
    if pool_second:
      out_h, out_w = out_h // 2, out_w // 2
    if min(out_h, out_w) < 1:
      smallest = 8 if padding == "VALID" else 4
      raise ValueError(f"{type(self).__name__} needs inputs of at least {smallest}×{smallest}, "
                       f"got input_shape={input_shape!r}")
    self.conv1 = ConvNorm(channels, 32, 3, norm=norm, rngs=rngs, padding=padding)
    self.conv2 = ConvNorm(32, 64, 3, norm=norm, rngs=rngs, padding=padding)
    self.fc = nnx.Linear(out_h * out_w * 64, hidden_width, rngs=rngs)
    self.head = nnx.Linear(hidden_width, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    x = conv_norm_relu_pool(self.conv1, x, train=train)
    if self.pool_second:
      hint = conv_norm_relu_pool(self.conv2, x, train=train)
    else:
      hint = nnx.relu(self.conv2(x, train=train))
    features = nnx.relu(self.fc(_flatten(hint)))  # (B, hidden_width)
    return core.ClassifierOutput(self.head(features), features, hint)


class DataLensCNN(_TwoConvCNN):
  """The classifier DataLens (Wang et al., CCS 2021) trains to evaluate MNIST-like data.

  From `evaluation/train-classifier-mnist.py` of AI-secure/DataLens (commit 3c0d7ab): conv3×3(32)
  VALID → ReLU → pool → conv3×3(64) VALID → ReLU → flatten → dense(64) → ReLU → dense(classes),
  with norm after each conv; its two Dropout layers (0.2, 0.25) are left out (no random state in
  the forward pass). 515,146 parameters at 28×28×1 without norm.

  Shapes: features (B, 64); hint = second conv output, (B, 11, 11, 64) at 28×28 and
  (B, 13, 13, 64) at 32×32.

  Args:
    hidden_width: width of the hidden dense layer (the feature size; default 64).
  """

  padding, pool_second, default_hidden_width = "VALID", False, 64


class SmallCNN(_TwoConvCNN):
  """A fast MNIST teacher: conv3×3(32) → pool → conv3×3(64) → pool → dense(128) → dense(classes).

  The model of `shared/bench/jax_cnn_step.py` (SAME convolutions, ReLU) with the chosen norm after
  each convolution. 421,642 parameters at 28×28×1 without norm.

  Shapes: features (B, 128); hint = second conv stage after pooling, (B, 7, 7, 64) at 28×28 and
  (B, 8, 8, 64) at 32×32.

  Args:
    hidden_width: width of the hidden dense layer (the feature size; default 128).
  """

  padding, pool_second, default_hidden_width = "SAME", True, 128


class VGG(nnx.Module):
  """VGG-style network: stages of 3×3 conv → norm → ReLU, each stage ending in a 2×2 max-pool.

  Global average pooling replaces VGG's large dense layers (as CIFAR variants do), so the width of
  the last stage is the feature size. The small default, stages (32, 32), (64, 64), (128, 128),
  has 287,722 parameters at 28×28×1 without norm.

  Shapes: features (B, stage_widths[-1][-1]); hint = output of stage `len(stage_widths) // 2`
  after pooling: (B, 7, 7, 64) at 28×28 and (B, 8, 8, 64) at 32×32 with the default stages.

  Args:
    stage_widths: per stage, the output channels of its convolutions; each stage halves the
      resolution, so 2**len(stage_widths) must not exceed the image side.
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "batch",
               rngs: nnx.Rngs,
               stage_widths: Sequence[Sequence[int]] = ((32, 32), (64, 64), (128, 128))):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    validate_norm(norm)
    if not stage_widths or any(not stage or min(stage) < 1 for stage in stage_widths):
      raise ValueError(
          f"stage_widths must be non-empty stages of positive widths, got {stage_widths!r}")
    if 2 ** len(stage_widths) > min(height, width):
      raise ValueError(f"{len(stage_widths)} pooling stages do not fit input_shape={input_shape!r}")
    stages = []
    in_channels = channels
    for stage in stage_widths:
      layers = []
      for out_channels in stage:
        layers.append(ConvNorm(in_channels, out_channels, 3, norm=norm, rngs=rngs))
        in_channels = out_channels
      stages.append(nnx.List(layers))
    self.stages = nnx.List(stages)
    self.hint_stage = len(stage_widths) // 2
    self.head = nnx.Linear(in_channels, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    hint = x
    for index, stage in enumerate(self.stages):
      for layer in stage:
        x = nnx.relu(layer(x, train=train))
      x = max_pool_2x2(x)
      if index == self.hint_stage:
        hint = x  # (B, 7, 7, 64) at 28×28 with the default stages
    features = jnp.mean(x, axis=(1, 2))  # (B, last width)
    return core.ClassifierOutput(self.head(features), features, hint)
