"""The layers of a twin of `lenet5` / `small_cnn`, whatever the source framework named them,
mapped onto the zoo model in order.

A twin is the same network written in PyTorch or Keras: two convolutions, each optionally
followed by a BatchNorm, then the dense layers (lenet5: 3, small_cnn: 2). Padding, pooling and
activations are the zoo model's (see `classifiers.LeNet5` / `SmallCNN`); a PyTorch state_dict
cannot show them, the Keras importer checks them. The norm is "batch" when every convolution
has a BatchNorm after it, "none" when none has (then the convolutions' biases are kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.importers import common

# Twin -> (zoo names of its convolutions, zoo names of its dense layers), in forward order.
TWINS = {
    "lenet5": (("conv1", "conv2"), ("fc1", "fc2", "head")),
    "small_cnn": (("conv1", "conv2"), ("fc", "head")),
}


@dataclasses.dataclass(frozen=True)
class Layer:
  """One source layer with parameters, in Flax layout.

  Attributes:
    kind: "conv" (arrays: kernel HWIO, bias or None), "norm" (arrays: a `common.conv_norm`
      bn dict) or "dense" (arrays: bias or None; `kernel_for`).
    name: the source's name of the layer, for messages.
    arrays: as above.
    kernel_for: dense only: (C, H, W) of the flattened map before it, or None -> its (in, out)
      kernel with inputs in Flax's H, W, C order.
  """

  kind: str
  name: str
  arrays: dict[str, Any]
  kernel_for: Callable[[tuple[int, int, int] | None], common.SourceArray] | None = None


def _group(layers: list[Layer], arch: str) -> tuple[list[tuple[Layer, Layer | None]], list[Layer]]:
  """(convolutions with their following norm, dense layers), checking conv* then dense*."""
  convs, denses, i = [], [], 0
  while i < len(layers):
    layer = layers[i]
    follower = layers[i + 1] if i + 1 < len(layers) else None
    if layer.kind == "conv" and not denses:
      norm = follower if follower is not None and follower.kind == "norm" else None
      convs.append((layer, norm))
      i += 2 if norm is not None else 1
    elif layer.kind == "dense":
      denses.append(layer)
      i += 1
    else:
      raise errors.UserError(f"--checkpoint: layer {layer.name!r} ({layer.kind}) is out of "
                             f"place for the {arch} twin (convolutions, each with an optional "
                             "BatchNorm, then dense layers)")
  return convs, denses


def convert(arch: str, layers: list[Layer], info: data.DatasetInfo) -> common.Converted:
  """The zoo model `arch` filled from the twin's `layers` (in forward order)."""
  conv_names, dense_names = TWINS[arch]
  convs, denses = _group(layers, arch)
  if len(convs) != len(conv_names) or len(denses) != len(dense_names):
    raise errors.UserError(
        f"--checkpoint: the {arch} twin has {len(conv_names)} convolutions and "
        f"{len(dense_names)} dense layers, the file {len(convs)} and {len(denses)} "
        f"({', '.join(layer.name for layer in layers)}); check --arch")
  with_norm = {norm is not None for _, norm in convs}
  if len(with_norm) > 1:
    raise errors.UserError(f"--checkpoint: only some convolutions of the {arch} twin have a "
                           "BatchNorm after them; the zoo model has one after each or none")
  norm = "batch" if with_norm == {True} else "none"
  height, width, channels = common.hint_shape(arch, info, norm)  # the flattened map
  sources: common.Sources = {}
  for (conv, bn), target in zip(convs, conv_names):
    sources.update(common.conv_norm((target,), norm, conv.arrays["kernel"], conv.arrays["bias"],
                                    None if bn is None else bn.arrays))
  for index, (layer, target) in enumerate(zip(denses, dense_names)):
    kernel = layer.kernel_for((channels, height, width) if index == 0 else None)
    sources.update(common.dense((target,), kernel, layer.arrays["bias"]))
  return common.Converted(arch, norm, sources)
