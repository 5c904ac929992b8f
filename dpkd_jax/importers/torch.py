"""PyTorch model (a torch.export program, TorchScript or a state_dict; `torch_source`) -> zoo
model: torchvision ResNet-18/34, VGG-11/16-BN, MobileNetV2 and the twins of `lenet5` /
`small_cnn`.

Layouts: NCHW -> NHWC. Conv weights (O, I/groups, kh, kw) -> Flax (kh, kw, I/groups, O);
linear weights (out, in) -> (in, out), and the first linear layer after a flatten of a
(C, H, W) map gets its inputs permuted from PyTorch's C, H, W order to Flax's H, W, C order;
BatchNorm weight/bias -> scale/bias, running_mean/var -> batch_stats (eval mode; PyTorch's
eps 1e-5 is the zoo's, a state_dict does not record eps so the default is assumed);
`num_batches_tracked` is dropped. torchvision's names are mapped one by one (`_resnet`,
`_vgg`, `_mobilenet_v2`); a twin's layers, whatever their names, are taken in state_dict
order (`twins.py`); a runnable file is then checked against them (`verify.py`). torch is
imported only when a file is read.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.importers import common
from dpkd_jax.importers import torch_source
from dpkd_jax.importers import twins
from dpkd_jax.models import tv

# --arch names (torchvision's) -> zoo model.
TORCHVISION = {"resnet18": "tv_resnet18", "resnet34": "tv_resnet34", "vgg11_bn": "tv_vgg11_bn",
               "vgg16_bn": "tv_vgg16_bn", "mobilenet_v2": "tv_mobilenet_v2"}
ARCHS = tuple(TORCHVISION) + tuple(twins.TWINS)


def framework_version() -> str:
  import torch  # pylint: disable=import-outside-toplevel
  return torch.__version__


load_state_dict = torch_source.load_state_dict


def conv_kernel(state: dict[str, np.ndarray], key: str) -> common.SourceArray:
  """(O, I/groups, kh, kw) -> (kh, kw, I/groups, O)."""
  w = state[key]
  value = w.transpose(2, 3, 1, 0) if w.ndim == 4 else w
  return common.SourceArray(np.ascontiguousarray(value), key, w.shape)


def dense_kernel(state: dict[str, np.ndarray], key: str,
                 chw: tuple[int, int, int] | None = None) -> common.SourceArray:
  """(out, in) -> (in, out); with `chw`, inputs reordered from (C, H, W) to (H, W, C)."""
  w = state[key]
  if chw is not None and w.ndim == 2 and w.shape[1] == int(np.prod(chw)):
    w2 = w.reshape(w.shape[0], *chw).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)
  else:
    w2 = w
  return common.SourceArray(np.ascontiguousarray(w2.T), key, w.shape)


def batch_norm(state: dict[str, np.ndarray], prefix: str) -> dict[str, Any]:
  get = lambda name: (common.source(state[f"{prefix}.{name}"], f"{prefix}.{name}")  # noqa: E731
                      if f"{prefix}.{name}" in state else None)
  return {"scale": get("weight"), "bias": get("bias"), "mean": get("running_mean"),
          "var": get("running_var"), "eps": 1e-5}


class _Mapper:
  """Collects Sources from named torch keys, remembering which keys were used."""

  def __init__(self, state: dict[str, np.ndarray], arch: str):
    self.state, self.arch, self.used = state, arch, set()
    self.sources: common.Sources = {}

  def _need(self, *keys: str) -> None:
    missing = [k for k in keys if k not in self.state]
    if missing:
      raise errors.UserError(f"--checkpoint: no {missing[0]} in the state_dict: not a "
                             f"torchvision {self.arch} (check --arch)")
    self.used.update(keys)

  def conv_bn(self, prefix: tuple[Any, ...], conv: str, bn: str) -> None:
    self._need(f"{conv}.weight", f"{bn}.weight", f"{bn}.bias", f"{bn}.running_mean",
               f"{bn}.running_var")
    bias = None
    if f"{conv}.bias" in self.state:  # VGG's convolutions have one: folded into the mean
      self.used.add(f"{conv}.bias")
      bias = common.source(self.state[f"{conv}.bias"], f"{conv}.bias")
    self.sources.update(common.conv_norm(prefix, "batch", conv_kernel(self.state,
                                                                      f"{conv}.weight"),
                                         bias, batch_norm(self.state, bn)))

  def linear(self, prefix: tuple[Any, ...], key: str, chw=None) -> None:
    self._need(f"{key}.weight", f"{key}.bias")
    self.sources.update(common.dense(prefix, dense_kernel(self.state, f"{key}.weight", chw),
                                     common.source(self.state[f"{key}.bias"], f"{key}.bias")))

  def done(self) -> common.Sources:
    unused = [k for k in self.state if k not in self.used]
    if unused:
      raise errors.UserError(f"--checkpoint: unsupported layer(s) for torchvision "
                             f"{self.arch}: {', '.join(unused[:5])}; check --arch")
    return self.sources


def _resnet(m: _Mapper, stage_sizes: tuple[int, ...]) -> None:
  m.conv_bn(("stem",), "conv1", "bn1")
  for i, blocks in enumerate(stage_sizes):
    for b in range(blocks):
      p, t = f"layer{i + 1}.{b}", ("stages", i, b)
      m.conv_bn((*t, "conv1"), f"{p}.conv1", f"{p}.bn1")
      m.conv_bn((*t, "conv2"), f"{p}.conv2", f"{p}.bn2")
      if i > 0 and b == 0:
        m.conv_bn((*t, "downsample"), f"{p}.downsample.0", f"{p}.downsample.1")
  m.linear(("head",), "fc")


def _vgg(m: _Mapper, config: str) -> None:
  index, conv = 0, 0  # torch index in `features`: conv, BN, ReLU (3 modules) or a pool (1)
  for item in tv.VGG_CONFIGS[config]:
    if item == "M":
      index += 1
      continue
    m.conv_bn(("convs", conv), f"features.{index}", f"features.{index + 1}")
    index, conv = index + 3, conv + 1
  last = [c for c in tv.VGG_CONFIGS[config] if c != "M"][-1]
  m.linear(("fc1",), "classifier.0", chw=(last, 7, 7))  # after AdaptiveAvgPool2d((7, 7))
  m.linear(("fc2",), "classifier.3")
  m.linear(("head",), "classifier.6")


def _mobilenet_v2(m: _Mapper) -> None:
  m.conv_bn(("stem",), "features.0.0", "features.0.1")
  block = 0
  for expansion, _, repeats, _ in tv.MOBILENET_V2_SETTINGS:
    for _ in range(repeats):
      p, t = f"features.{block + 1}.conv", ("blocks", block)
      if expansion == 1:  # conv: [dw ConvBNReLU, pw Conv2d, BN]
        m.conv_bn((*t, "depthwise"), f"{p}.0.0", f"{p}.0.1")
        m.conv_bn((*t, "project"), f"{p}.1", f"{p}.2")
      else:  # conv: [pw ConvBNReLU, dw ConvBNReLU, pw Conv2d, BN]
        m.conv_bn((*t, "expand"), f"{p}.0.0", f"{p}.0.1")
        m.conv_bn((*t, "depthwise"), f"{p}.1.0", f"{p}.1.1")
        m.conv_bn((*t, "project"), f"{p}.2", f"{p}.3")
      block += 1
  m.conv_bn(("head_conv",), f"features.{block + 1}.0", f"features.{block + 1}.1")
  m.linear(("head",), "classifier.1")


def _twin_layers(state: dict[str, np.ndarray], arch: str) -> list[twins.Layer]:
  """The state_dict's modules in order, classified by their arrays (names are the user's)."""
  modules: dict[str, dict[str, np.ndarray]] = collections.OrderedDict()
  for key, value in state.items():
    module, _, name = key.rpartition(".")
    modules.setdefault(module, {})[name] = value
  layers = []
  for module, arrays in modules.items():
    weight = arrays.get("weight")
    if "running_mean" in arrays:
      layers.append(twins.Layer("norm", module, batch_norm(state, module)))
    elif weight is not None and weight.ndim == 4 and set(arrays) <= {"weight", "bias"}:
      bias = arrays.get("bias")
      layers.append(twins.Layer("conv", module, {
          "kernel": conv_kernel(state, f"{module}.weight"),
          "bias": None if bias is None else common.source(bias, f"{module}.bias")}))
    elif weight is not None and weight.ndim == 2 and set(arrays) <= {"weight", "bias"}:
      bias = arrays.get("bias")
      layers.append(twins.Layer(
          "dense", module, {"bias": None if bias is None else common.source(bias, f"{module}.bias")},
          kernel_for=lambda chw, key=f"{module}.weight": dense_kernel(state, key, chw)))
    else:
      raise errors.UserError(
          f"--checkpoint: unsupported layer {module!r} ({', '.join(sorted(arrays))}) for the "
          f"{arch} twin: only Conv2d, BatchNorm2d (running stats) and Linear layers are "
          "supported (GroupNorm/LayerNorm teachers are not)")
  return layers


def convert(path: str, arch: str, info: data.DatasetInfo, *, builder: str | None = None,
            builder_kwargs: dict[str, Any] | None = None) -> common.Converted:
  """Reads a PyTorch file (`torch_source`) and maps it onto the zoo model of `arch` for `info`.

  The result's `reference` runs the source model (a torch.export program, TorchScript, or a
  state_dict loaded into `builder(**builder_kwargs)`), None for a bare state_dict.

  Raises:
    errors.UserError: unreadable file, unknown arch, missing or unsupported layers, or shapes
      that do not fit (e.g. another number of classes than the dataset's).
  """
  arch = arch[len("tv_"):] if arch.startswith("tv_") and arch[3:] in TORCHVISION else arch
  if arch not in ARCHS:
    raise errors.UserError(f"--arch: unknown {arch!r} for --from=torch; choose one of "
                           f"{list(ARCHS)}, or --arch=graph for any classifier whose "
                           "operations are covered (docs/TEACHERS.md#graph-importer)")
  height, width, channels = info.image_shape
  state, reference = torch_source.load(path, twin=arch in twins.TWINS,
                                       chw=(channels, height, width), builder=builder,
                                       builder_kwargs=builder_kwargs)
  if arch in twins.TWINS:
    converted = twins.convert(arch, _twin_layers(state, arch), info)
  else:
    m = _Mapper(state, arch)
    if arch.startswith("resnet"):
      _resnet(m, (2, 2, 2, 2) if arch == "resnet18" else (3, 4, 6, 3))
    elif arch.startswith("vgg"):
      _vgg(m, "A" if arch == "vgg11_bn" else "D")
    else:
      _mobilenet_v2(m)
    converted = common.Converted(TORCHVISION[arch], "batch", m.done())
  return dataclasses.replace(converted, reference=reference)
