"""A Keras 3 `.keras` model -> a `models.graph` program (`--from=keras --arch=graph`).

Keras is NHWC, so the program keeps that layout; arrays are turned into the program's PyTorch
conventions (convolution weights (O, I / groups, kh, kw), linear weights (out, in)). A Sequential
model is a chain; a functional model is walked through its layers' inbound nodes in Keras'
topological order. "same" padding is TensorFlow's (the extra pixel of an odd total goes last),
written out as explicit pads. A final softmax is dropped (its input is the logits), Dropout is
identity at inference. Layers outside `_LAYERS` are refused with one line naming them all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.importers import common
from dpkd_jax.importers import keras as keras_lib
from dpkd_jax.models import graph

_ACTIVATIONS = {"relu": "relu", "silu": "silu", "swish": "silu", "gelu": "gelu",
                "sigmoid": "sigmoid", "tanh": "tanh", "hard_swish": "hardswish",
                "hard_silu": "hardswish", "hard_sigmoid": "hardsigmoid", "relu6": "relu6",
                "softmax": "softmax"}
_LAYERS = ("Conv2D", "DepthwiseConv2D", "Dense", "BatchNormalization", "Activation", "ReLU",
           "MaxPooling2D", "AveragePooling2D", "GlobalAveragePooling2D", "Flatten", "Dropout",
           "SpatialDropout2D", "Add", "Multiply", "Subtract", "Concatenate", "Reshape",
           "ZeroPadding2D", "Rescaling", "InputLayer")


def _same(size: int, kernel: int, stride: int, dilation: int = 1) -> list[int]:
  """TensorFlow's "same" pads of one axis: [lo, hi], the extra pixel last."""
  span = (kernel - 1) * dilation + 1
  total = max((-(-size // stride) - 1) * stride + span - size, 0)
  return [total // 2, total - total // 2]


class _Builder:
  """Collects the program's nodes and arrays while the layers are walked."""

  def __init__(self):
    self.params, self.sources, self.norms, self.nodes = [], {}, [], []
    self.unsupported, self.last_dense_input, self.notes = [], None, []

  def param(self, value: Any, name: str) -> dict[str, int]:
    value = np.asarray(value, np.float32)
    index = len(self.params)
    self.params.append(list(value.shape))
    self.sources[("params", "arrays", index)] = common.source(value, name)
    return {"p": index}

  def node(self, op: str, args: list[Any], **kwargs: Any) -> dict[str, str]:
    name = f"n{len(self.nodes)}"
    self.nodes.append({"name": name, "op": op, "args": args, "kwargs": kwargs})
    return {"v": name}

  def activation(self, x: dict[str, str], name: str, layer: Any, last: bool) -> dict[str, str]:
    if name == "linear":
      return x
    if name == "softmax" and last:
      self.notes.append(f"final softmax of {layer.name!r} dropped: the logits are its input")
      return x
    op = _ACTIVATIONS.get(name)
    if op is None or op == "softmax":
      self.unsupported.append(f"{type(layer).__name__}({name})")
      return x
    if op == "relu6":
      return self.node("hardtanh", [x, 0.0, 6.0])
    return self.node(op, [x], **({"approximate": "tanh"} if name == "gelu" and
                                 layer.get_config().get("approximate") else {}))

  def batch_norm(self, x: dict[str, str], layer: Any) -> dict[str, str]:
    config, k = layer.get_config(), len(self.norms)
    axis = config["axis"][0] if isinstance(config["axis"], (list, tuple)) else config["axis"]
    name = layer.name
    self.norms.append({"channels": int(np.asarray(layer.moving_mean).shape[0]),
                       "eps": float(layer.epsilon), "affine": True, "axis": int(axis)})
    mean = np.asarray(layer.moving_mean, np.float32)
    for kind, field, value in (
        ("params", "scale", layer.gamma if layer.scale else np.ones_like(mean)),
        ("params", "bias", layer.beta if layer.center else np.zeros_like(mean)),
        ("batch_stats", "mean", mean), ("batch_stats", "var", layer.moving_variance)):
      self.sources[(kind, "norms", k, field)] = common.source(np.asarray(value), f"{name}/{field}")
    name = f"n{len(self.nodes)}"
    self.nodes.append({"name": name, "op": "batch_norm", "norm": k, "args": [x]})
    return {"v": name}


def _conv(b: _Builder, x: dict[str, str], layer: Any, shape: tuple[int, ...]) -> dict[str, str]:
  config = layer.get_config()
  depthwise = type(layer).__name__ == "DepthwiseConv2D"
  kernel = np.asarray(layer.kernel, np.float32)  # (kh, kw, in / groups, out) or (kh, kw, in, m)
  kh, kw = kernel.shape[:2]
  if depthwise:  # output channel c * m + j is input channel c's j-th filter
    groups = kernel.shape[2]
    kernel = kernel.reshape(kh, kw, 1, -1)
  else:
    groups = int(config.get("groups", 1))
  strides, dilation = list(config["strides"]), list(config["dilation_rate"])
  pads = ([_same(n, k, s, d) for n, k, s, d in zip(shape[1:3], (kh, kw), strides, dilation)]
          if config["padding"] == "same" else [[0, 0], [0, 0]])
  bias = b.param(layer.bias, f"{layer.name}/bias") if config["use_bias"] else None
  return b.node("conv2d", [x, b.param(kernel.transpose(3, 2, 0, 1), f"{layer.name}/kernel"),
                           bias, strides, pads, dilation, groups])


def _pool(b: _Builder, x: dict[str, str], layer: Any, shape: tuple[int, ...]) -> dict[str, str]:
  config = layer.get_config()
  size = list(config["pool_size"])
  strides = list(config["strides"] or size)
  pads = ([_same(n, k, s) for n, k, s in zip(shape[1:3], size, strides)]
          if config["padding"] == "same" else [[0, 0], [0, 0]])
  op = "max_pool2d" if type(layer).__name__ == "MaxPooling2D" else "avg_pool2d"
  return b.node(op, [x, size, strides, pads])


def _layer(b: _Builder, layer: Any, inputs: list[dict[str, str]], shapes: list[tuple],
           last: bool) -> dict[str, str]:
  """The program nodes of one layer; returns its output reference."""
  kind, config, x = type(layer).__name__, layer.get_config(), inputs[0]
  if config.get("data_format", "channels_last") != "channels_last":
    raise errors.UserError(f"--checkpoint: layer {layer.name!r} is channels_first; save the "
                           "model channels_last")
  if kind in ("Conv2D", "DepthwiseConv2D"):
    return b.activation(_conv(b, x, layer, shapes[0]), config["activation"], layer, last)
  if kind == "Dense":
    b.last_dense_input = x
    bias = b.param(layer.bias, f"{layer.name}/bias") if config["use_bias"] else None
    y = b.node("linear", [x, b.param(np.asarray(layer.kernel).T, f"{layer.name}/kernel"), bias])
    return b.activation(y, config["activation"], layer, last)
  if kind == "BatchNormalization":
    return b.batch_norm(x, layer)
  if kind == "Activation":
    return b.activation(x, config["activation"], layer, last)
  if kind == "ReLU":
    if config.get("negative_slope", 0.0) or config.get("threshold", 0.0):
      b.unsupported.append(f"ReLU({config})")
    high = config.get("max_value")
    return b.node("relu", [x]) if high is None else b.node("hardtanh", [x, 0.0, float(high)])
  if kind in ("MaxPooling2D", "AveragePooling2D"):
    return _pool(b, x, layer, shapes[0])
  if kind == "GlobalAveragePooling2D":
    return b.node("mean", [x, [1, 2], bool(config.get("keepdims", False))])
  if kind == "Flatten":
    return b.node("flatten", [x, 1])
  if kind in ("Dropout", "SpatialDropout2D"):
    return x
  if kind in ("Add", "Multiply", "Subtract"):
    op = {"Add": "add", "Multiply": "mul", "Subtract": "sub"}[kind]
    for other in inputs[1:]:
      x = b.node(op, [x, other])
    return x
  if kind == "Concatenate":
    return b.node("cat", [inputs, int(config["axis"])])
  if kind == "Reshape":
    return b.node("reshape", [x, [None, *config["target_shape"]]])
  if kind == "ZeroPadding2D":
    return b.node("pad2d", [x, [list(p) for p in config["padding"]]])
  if kind == "Rescaling":
    x = b.node("mul", [x, b.param(np.asarray(config["scale"]), f"{layer.name}/scale")])
    return b.node("add", [x, b.param(np.asarray(config["offset"]), f"{layer.name}/offset")])
  b.unsupported.append(kind)
  return x


def _walk(b: _Builder, model: Any) -> dict[str, str]:
  """Every layer once, in order; returns the model output's reference."""
  import keras  # pylint: disable=import-outside-toplevel
  if isinstance(model, keras.Sequential):
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    x, shape = {"v": "input"}, (None, *model.inputs[0].shape[1:])
    for index, layer in enumerate(layers):
      x = _layer(b, layer, [x], [shape], index == len(layers) - 1)
      shape = tuple(layer.compute_output_shape(shape))
    return x
  values = {id(t): {"v": "input"} for t in model.inputs}
  operations = [op for op in model.operations if not isinstance(op, keras.layers.InputLayer)]
  for index, layer in enumerate(operations):
    inbound = layer._inbound_nodes  # pylint: disable=protected-access
    nodes = [n for n in inbound if all(id(t) in values for t in n.input_tensors)]
    if len(nodes) != 1:
      b.unsupported.append(f"{type(layer).__name__} called {len(nodes)} times")
      continue
    tensors = nodes[0].input_tensors
    out = _layer(b, layer, [values[id(t)] for t in tensors], [tuple(t.shape) for t in tensors],
                 index == len(operations) - 1)
    for tensor in nodes[0].output_tensors:
      values[id(tensor)] = out
  return values[id(model.outputs[0])]


def convert(path: str, info: data.DatasetInfo) -> common.Converted:
  """A `.keras` file -> `common.Converted` carrying the graph program, checked against the
  Keras model itself.

  Raises:
    errors.UserError: unreadable file, another input shape than the dataset's, or layers
      outside the table (all named in one line).
  """
  model = keras_lib.load_model(path)
  inputs = getattr(model, "inputs", None)
  if not inputs or len(inputs) != 1 or tuple(inputs[0].shape[1:]) != info.image_shape:
    shape = [tuple(t.shape[1:]) for t in inputs or []]
    raise errors.UserError(f"--checkpoint: the model takes inputs {shape}, {info.name} has "
                           f"{info.image_shape}; import a one-input teacher of this dataset")
  b = _Builder()
  output = _walk(b, model)
  if b.unsupported:
    names = sorted(set(b.unsupported))
    raise errors.UserError(
        f"--checkpoint: the graph importer does not cover {len(names)} layer(s) of the model: "
        f"{', '.join(names)} (covered: docs/TEACHERS.md#graph-importer); nothing written")
  program = {"format": graph.FORMAT, "layout": "NHWC", "params": b.params, "norms": b.norms,
             "nodes": b.nodes, "output": output, "features": b.last_dense_input or output}
  return common.Converted(graph.MODEL, "batch" if b.norms else "none", b.sources,
                          notes=("imported through the graph importer from a Keras model",
                                 *b.notes),
                          reference=keras_lib.reference(model), program=program)
