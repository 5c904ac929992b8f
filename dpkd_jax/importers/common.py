"""What the PyTorch and Keras importers share: input normalisation, layout conversion of one
layer, filling a zoo model with the converted arrays (every shape checked), and writing the
teacher's checkpoint and card.

A converter (`torch.py`, `keras.py`) turns the source file into `Sources`: for every array of the
zoo model, keyed by ("params" | "batch_stats", *path in `core.split`'s pure dicts), the
`SourceArray` holding the value in Flax layout and the source name and shape it came from (for
the messages). `assemble` checks them against the model and builds its `core.ModelParts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax import traverse_util

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.models import adapter as adapter_lib
from dpkd_jax.models import core
from dpkd_jax.models import graph as graph_lib

# eps of every zoo BatchNorm (`nnx.BatchNorm`'s default, and PyTorch's): a source eps e is
# matched exactly by storing var + e - FLAX_BN_EPS as the running variance.
FLAX_BN_EPS = 1e-5
# What a teacher may expect its input to be, per channel, as (u / 255 - mean) / std of the
# pixel u in 0..255; "dataset" is `data.normalize`, what every model here is fed.
INPUT_NORMS = {
    "dataset": None,
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # torchvision's Normalize
    "unit": ((0.0,), (1.0,)),  # ToTensor() only / x / 255: pixels in [0, 1]
    "half": ((0.5,), (0.5,)),  # Normalize(0.5, 0.5): pixels in [-1, 1]
    "raw": ((0.0,), (1.0 / 255.0,)),  # the pixel values 0..255 themselves
}

Path = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class SourceArray:
  """One converted array: `value` in Flax layout, from source array `name` of `shape`."""

  value: np.ndarray
  name: str
  shape: tuple[int, ...]


Sources = dict[Path, SourceArray]


@dataclasses.dataclass(frozen=True)
class Converted:
  """A converter's result: which zoo model, its norm, and the arrays that fill it.

  Attributes:
    rescale: (a, b), per channel or scalar, of a source layer `a · x + b` applied to the
      teacher's input before its first layer (Keras `Rescaling`), or None.
    notes: what the conversion changed that a reader of the card should know.
    reference: the runnable source model (`verify.Reference`) the import is checked against,
      or None when the file cannot run (a bare PyTorch state_dict).
    program: for `model` "graph", the `models.graph` program the arrays fill (else None).
  """

  model: str
  norm: str
  sources: Sources
  rescale: tuple[np.ndarray, np.ndarray] | None = None
  notes: tuple[str, ...] = ()
  reference: Any = None
  program: dict[str, Any] | None = None


def source(value: Any, name: str, shape: Sequence[int] | None = None) -> SourceArray:
  value = np.asarray(value, np.float32)
  return SourceArray(value, name, tuple(value.shape if shape is None else shape))


def filled(value: float, like: SourceArray, name: str) -> SourceArray:
  """An array of `value` shaped as `like`, for a source layer without it (e.g. affine=False)."""
  return SourceArray(np.full(like.value.shape, value, np.float32), name, like.value.shape)


def input_norm(name: str, info: data.DatasetInfo, mean: Sequence[float] | None = None,
               std: Sequence[float] | None = None) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(mean, std) per channel the teacher expects, from a preset name or "custom" + mean/std.

  Raises:
    errors.UserError: unknown preset, missing or non-positive values, or a channel count that
      is not the dataset's.
  """
  channels = info.image_shape[-1]
  if name == "custom":
    if mean is None or std is None:
      raise errors.UserError("--input_norm=custom needs --input_mean and --input_std (comma "
                             "separated, one value per channel)")
  elif mean is not None or std is not None:
    raise errors.UserError(f"--input_mean / --input_std need --input_norm=custom, not {name!r}")
  elif name not in INPUT_NORMS:
    raise errors.UserError(f"--input_norm: unknown {name!r}; choose one of "
                           f"{sorted(INPUT_NORMS) + ['custom']}")
  elif INPUT_NORMS[name] is None:
    mean, std = info.mean, info.std
  else:
    mean, std = INPUT_NORMS[name]
  mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
  if len(mean) == 1 and len(std) == 1:  # one value for every channel
    mean, std = mean * channels, std * channels
  if len(mean) != channels or len(std) != channels:
    raise errors.UserError(f"--input_norm={name}: mean {mean} and std {std} need {channels} "
                           f"values, one per channel of {info.name}")
  if min(std) <= 0:
    raise errors.UserError(f"--input_norm: std must be positive, got {std}")
  return mean, std


def conv_norm(prefix: Path, norm: str, kernel: SourceArray, conv_bias: SourceArray | None,
              bn: dict[str, Any] | None) -> Sources:
  """The arrays of one `classifiers.ConvNorm` at `prefix`.

  Args:
    prefix: its path in the model (e.g. ("stages", 0, 1, "conv1")).
    norm: "batch" (needs `bn`) or "none" (needs no `bn`; the conv bias, zeros if absent).
    kernel: (kh, kw, in / groups, out), Flax's HWIO.
    conv_bias: the conv's bias, or None. Before a BatchNorm it is folded into the running
      mean (BN(conv + b) with mean μ is BN(conv) with mean μ - b): exact.
    bn: {"scale", "bias" (SourceArray or None: affine-free), "mean", "var", "eps"}.
  """
  out: Sources = {("params", *prefix, "conv", "kernel"): kernel}
  if norm == "none":
    out[("params", *prefix, "conv", "bias")] = (
        conv_bias if conv_bias is not None else
        SourceArray(np.zeros(kernel.value.shape[-1:], np.float32), "(zero bias)",
                    kernel.value.shape[-1:]))
    return out
  mean, var = bn["mean"], bn["var"]
  if conv_bias is not None:
    if conv_bias.value.shape == mean.value.shape:
      mean = SourceArray(mean.value - conv_bias.value, mean.name, mean.shape)
    else:  # let `assemble` report the misfit by name
      out[("params", *prefix, "conv", "bias")] = conv_bias
  var = SourceArray(var.value + np.float32(bn["eps"] - FLAX_BN_EPS), var.name, var.shape)
  scale, shift = bn["scale"], bn["bias"]  # None: a BatchNorm without affine parameters
  out[("params", *prefix, "norm", "scale")] = (filled(1.0, mean, "(unit scale)") if scale is None
                                               else scale)
  out[("params", *prefix, "norm", "bias")] = (filled(0.0, mean, "(zero shift)") if shift is None
                                              else shift)
  out[("batch_stats", *prefix, "norm", "mean")] = mean
  out[("batch_stats", *prefix, "norm", "var")] = var
  return out


def dense(prefix: Path, kernel: SourceArray, bias: SourceArray | None) -> Sources:
  """The arrays of one `nnx.Linear` at `prefix`; `kernel` is (in, out)."""
  if bias is None:
    bias = SourceArray(np.zeros(kernel.value.shape[-1:], np.float32), "(zero bias)",
                       kernel.value.shape[-1:])
  return {("params", *prefix, "kernel"): kernel, ("params", *prefix, "bias"): bias}


def abstract_model(model: str, info: data.DatasetInfo, norm: str,
                   program: dict[str, Any] | None = None) -> nnx.Module:
  """The zoo model for `info` (or the graph `program`), shapes only (nothing is allocated)."""
  if program is not None:
    return nnx.eval_shape(lambda: graph_lib.GraphClassifier(program))
  return nnx.eval_shape(lambda: models.create_classifier(
      model, num_classes=info.num_classes, input_shape=info.image_shape, norm=norm, seed=0))


def hint_shape(model: str, info: data.DatasetInfo, norm: str) -> tuple[int, ...]:
  """(H, W, C) of the model's `hint` for one input of `info` (no compute)."""
  def forward():
    built = models.create_classifier(model, num_classes=info.num_classes,
                                     input_shape=info.image_shape, norm=norm, seed=0)
    return built(jax.numpy.zeros((1, *info.image_shape)), train=False).hint
  return tuple(nnx.eval_shape(forward).shape[1:])


def _describe(model: str, info: data.DatasetInfo) -> str:
  return (f"{model} for {info.name} ({info.num_classes} classes, input "
          f"{'x'.join(map(str, info.image_shape))})")


def assemble(converted: Converted, info: data.DatasetInfo,
             affine: tuple[np.ndarray, np.ndarray] | None = None) -> core.ModelParts:
  """The zoo model filled with `converted.sources`, optionally behind an `InputAdapter`.

  Args:
    converted: the converter's model name, norm and arrays.
    info: the dataset (number of classes and input shape of the model).
    affine: (scale, shift) of the input adapter, or None for no adapter.

  Raises:
    errors.UserError: a source array whose shape does not fit the model (wrong number of
      classes, channels or input size: the message names the array), or one the model lacks.
  """
  model = abstract_model(converted.model, info, converted.norm, converted.program)
  sources = dict(converted.sources)
  if affine is not None:
    model = adapter_lib.InputAdapter(model, channels=info.image_shape[-1])
    sources = {(kind, "model", *path): array for (kind, *path), array in sources.items()}
    for name, value in zip(("scale", "shift"), affine):
      sources[("batch_stats", name)] = source(value, f"(input {name})")
  parts = core.split(model)
  trees, misfits = {}, []
  for kind, target in (("params", parts.params), ("batch_stats", parts.batch_stats)):
    flat = {}
    for path, leaf in traverse_util.flatten_dict(target).items():
      array = sources.pop((kind, *path), None)
      if array is None:
        raise RuntimeError(f"converter bug: nothing for {kind} {path} of {converted.model}")
      if array.value.shape != tuple(leaf.shape):
        # Kernels first: their shapes say most (classes, channels, input size).
        misfits.append((path[-1] != "kernel", array, tuple(leaf.shape)))
      flat[path] = array.value
    trees[kind] = traverse_util.unflatten_dict(flat)
  if misfits:
    _, array, want = min(misfits, key=lambda m: m[0])
    raise errors.UserError(
        f"--checkpoint: {array.name} has shape {array.shape} but "
        f"{_describe(converted.model, info)} needs {want} (Flax layout) there"
        f"{f' ({len(misfits) - 1} more arrays misfit)' if len(misfits) > 1 else ''}; import a "
        "teacher of this architecture trained for this dataset")
  if sources:
    names = sorted({array.name for array in sources.values()})
    raise errors.UserError(f"--checkpoint: {', '.join(names[:5])} have no place in "
                           f"{_describe(converted.model, info)}; check --arch")
  return core.ModelParts(parts.graphdef, trees["params"], trees["batch_stats"])
