"""Keras 3 `.keras` file -> zoo model: the Keras twins of `lenet5` and `small_cnn`.

Keras is NHWC like Flax: Conv2D kernels are already (kh, kw, in, out), Dense kernels (in, out),
and Flatten keeps H, W, C order, so arrays keep their layout. BatchNormalization (eps 1e-3 by
default) matches the zoo's eps 1e-5 exactly by storing var + eps - 1e-5; a Conv2D bias before it
is folded into the moving mean. Unlike a PyTorch state_dict, a `.keras` file records the whole
network, so every layer is checked against the twin: padding, strides, pooling, activations and
the place of each BatchNormalization (after its convolution, before the ReLU). A leading
`Rescaling` layer becomes part of the input adapter; Dropout is identity at inference; a final
softmax is dropped (its input is the logits). The model itself is the `verify.Reference` the
import is checked against. Keras is imported only when a file is read (with
the JAX backend unless KERAS_BACKEND says otherwise: no TensorFlow needed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.importers import common
from dpkd_jax.importers import twins
from dpkd_jax.importers import verify

ARCHS = tuple(twins.TWINS)
# Each twin's network with the norms left out: what the layers must spell, in order.
_SKELETONS = {
    "lenet5": ("conv", "relu", "pool", "conv", "relu", "pool", "flatten", "dense", "relu",
               "dense", "relu", "dense"),
    "small_cnn": ("conv", "relu", "pool", "conv", "relu", "pool", "flatten", "dense", "relu",
                  "dense"),
}


def framework_version() -> str:
  import keras  # pylint: disable=import-outside-toplevel
  return keras.__version__


def _array(variable: Any, name: str) -> common.SourceArray | None:
  if variable is None:
    return None
  return common.source(np.asarray(variable), name)


def _conv_pads(arch: str, info: data.DatasetInfo) -> tuple[str, str]:
  """The Keras padding of the twin's two convolutions that equals the zoo model's."""
  if arch == "small_cnn":
    return ("same", "same")
  height, width, _ = info.image_shape
  pads = {max(0, (32 - height) // 2), max(0, (32 - width) // 2)}  # classifiers.LeNet5
  first = {frozenset({2}): "same", frozenset({0}): "valid"}.get(frozenset(pads))
  if first is None:
    raise errors.UserError(f"--arch=lenet5: the zoo's LeNet-5 pads {info.name}'s "
                           f"{height}x{width} inputs by {sorted(pads)}, which no Keras padding "
                           "gives; use --from=torch")
  return (first, "valid")


def _activation(name: str, layer_name: str, last: bool) -> list[str]:
  if name == "linear":
    return []
  if name == "relu":
    return ["relu"]
  if name == "softmax" and last:
    return ["softmax"]
  raise errors.UserError(f"--checkpoint: layer {layer_name!r} has activation {name!r}; the "
                         "twins use ReLU (and a final linear or softmax output)")


def _tokens(model: Any) -> tuple[list[tuple[str, Any]], tuple[np.ndarray, np.ndarray] | None]:
  """The model's layers as (token, layer) in order, and a leading Rescaling's (a, b)."""
  import keras  # pylint: disable=import-outside-toplevel
  layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
  tokens, rescale = [], None
  for index, layer in enumerate(layers):
    last = index == len(layers) - 1
    config = layer.get_config()
    if config.get("data_format", "channels_last") != "channels_last":
      raise errors.UserError(f"--checkpoint: layer {layer.name!r} is channels_first; save the "
                             "model channels_last")
    if isinstance(layer, keras.layers.Rescaling) and not tokens and rescale is None:
      rescale = (np.asarray(config["scale"], np.float32), np.asarray(config["offset"], np.float32))
    elif isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
      kind = "conv" if isinstance(layer, keras.layers.Conv2D) else "dense"
      tokens.append((kind, layer))
      tokens += [(t, layer) for t in _activation(config["activation"], layer.name, last)]
    elif isinstance(layer, keras.layers.BatchNormalization):
      tokens.append(("norm", layer))
    elif isinstance(layer, keras.layers.Activation):
      tokens += [(t, layer) for t in _activation(config["activation"], layer.name, last)]
    elif isinstance(layer, keras.layers.ReLU):
      if config.get("max_value") is not None or config.get("negative_slope", 0.0) != 0.0 or \
          config.get("threshold", 0.0) != 0.0:
        raise errors.UserError(f"--checkpoint: layer {layer.name!r} is not a plain ReLU")
      tokens.append(("relu", layer))
    elif isinstance(layer, keras.layers.MaxPooling2D):
      tokens.append(("pool", layer))
    elif isinstance(layer, keras.layers.Flatten):
      tokens.append(("flatten", layer))
    elif not isinstance(layer, keras.layers.Dropout):  # Dropout: identity at inference
      raise errors.UserError(f"--checkpoint: unsupported layer {layer.name!r} "
                             f"({type(layer).__name__}) for a Keras twin; supported: Conv2D, "
                             "BatchNormalization, ReLU, MaxPooling2D, Flatten, Dense, Dropout, "
                             "a leading Rescaling")
  return tokens, rescale


def _check_layer(token: str, layer: Any, pad: str | None) -> None:
  config = layer.get_config()
  where = f"--checkpoint: layer {layer.name!r}"
  if token == "conv":
    if (tuple(config["strides"]) != (1, 1) or tuple(config["dilation_rate"]) != (1, 1)
        or config.get("groups", 1) != 1 or config["padding"] != pad):
      raise errors.UserError(f"{where} needs strides 1, no dilation or groups and padding "
                             f"{pad!r} to be the twin's convolution, got {config['strides']}, "
                             f"{config['dilation_rate']}, {config['padding']!r}")
  elif token == "pool":
    strides = config["strides"] or config["pool_size"]
    if (tuple(config["pool_size"]) != (2, 2) or tuple(strides) != (2, 2)
        or config["padding"] != "valid"):
      raise errors.UserError(f"{where} must be a 2x2 max-pool, stride 2, padding 'valid'")
  elif token == "norm" and config["axis"] not in (-1, 3, [-1], [3]):
    raise errors.UserError(f"{where} normalises axis {config['axis']}, not the channels")


def _layers(tokens: list[tuple[str, Any]], arch: str, info: data.DatasetInfo) -> list[twins.Layer]:
  """Checks the tokens against the twin and returns its parameter layers in order."""
  skeleton = tuple(t for t, _ in tokens if t not in ("norm", "softmax"))
  if skeleton != _SKELETONS[arch]:
    raise errors.UserError(f"--checkpoint: the layers spell {' '.join(skeleton)}, not the "
                           f"{arch} twin ({' '.join(_SKELETONS[arch])}, a BatchNormalization "
                           "allowed after each convolution); check --arch")
  pads = iter(_conv_pads(arch, info))
  layers = []
  for index, (token, layer) in enumerate(tokens):
    _check_layer(token, layer, next(pads) if token == "conv" else None)
    name = layer.name
    if token == "norm":
      if index == 0 or tokens[index - 1][0] != "conv":
        raise errors.UserError(f"--checkpoint: BatchNormalization {name!r} must come right "
                               "after a convolution (before its ReLU), as in the zoo model")
      layers.append(twins.Layer("norm", name, {
          "scale": _array(layer.gamma, f"{name}/gamma"), "bias": _array(layer.beta, f"{name}/beta"),
          "mean": _array(layer.moving_mean, f"{name}/moving_mean"),
          "var": _array(layer.moving_variance, f"{name}/moving_variance"),
          "eps": float(layer.epsilon)}))
    elif token == "conv":
      layers.append(twins.Layer("conv", name, {"kernel": _array(layer.kernel, f"{name}/kernel"),
                                               "bias": _array(layer.bias, f"{name}/bias")}))
    elif token == "dense":
      kernel = _array(layer.kernel, f"{name}/kernel")  # Flatten of NHWC: already H, W, C
      layers.append(twins.Layer("dense", name, {"bias": _array(layer.bias, f"{name}/bias")},
                                kernel_for=lambda chw, kernel=kernel: kernel))
  return layers


def load_model(path: str) -> Any:
  os.environ.setdefault("KERAS_BACKEND", "jax")
  import keras  # pylint: disable=import-outside-toplevel
  try:
    return keras.saving.load_model(path, compile=False, safe_mode=True)
  except Exception as error:  # pylint: disable=broad-except
    first = (str(error).strip().splitlines() or [""])[0][:200]
    raise errors.UserError(f"--checkpoint: {path!r} is not a Keras 3 model file readable "
                           f"with safe_mode=True ({type(error).__name__}: {first}); save it "
                           "with model.save('teacher.keras')") from error


def reference(model: Any) -> verify.Reference:
  """The Keras model's logits: a final softmax is switched off while it runs."""
  import keras  # pylint: disable=import-outside-toplevel
  last = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)][-1]
  softmax = last.get_config().get("activation") == "softmax"

  def logits(x: np.ndarray) -> np.ndarray:
    if not softmax:
      return np.asarray(model(x, training=False), np.float32)
    saved, last.activation = last.activation, keras.activations.linear
    try:
      return np.asarray(model(x, training=False), np.float32)
    finally:
      last.activation = saved
  return verify.Reference(logits, "Keras model")


def convert(path: str, arch: str, info: data.DatasetInfo) -> common.Converted:
  """Reads a `.keras` file and maps it onto the zoo twin `arch` for dataset `info`.

  Raises:
    errors.UserError: unreadable file, unknown arch, a layer that is not the twin's, or shapes
      that do not fit the dataset.
  """
  if arch not in ARCHS:
    raise errors.UserError(f"--arch: unknown {arch!r} for --from=keras; choose one of "
                           f"{list(ARCHS)}, or --arch=graph for any classifier whose "
                           "operations are covered (docs/TEACHERS.md#graph-importer)")
  model = load_model(path)
  input_shape = tuple(model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else None
  if input_shape is not None and None not in input_shape and input_shape != info.image_shape:
    raise errors.UserError(f"--checkpoint: the model takes inputs of shape {input_shape}, "
                           f"{info.name} has {info.image_shape}; import a teacher of this dataset")
  tokens, rescale = _tokens(model)
  converted = twins.convert(arch, _layers(tokens, arch, info), info)
  notes = (["final softmax dropped: the logits are its input"]
           if tokens and tokens[-1][0] == "softmax" else [])
  if rescale is not None:
    notes.append(f"leading Rescaling(scale={rescale[0].tolist()}, offset={rescale[1].tolist()}) "
                 "applied by the input adapter")
  return common.Converted(converted.model, converted.norm, converted.sources, rescale=rescale,
                          notes=tuple(notes), reference=reference(model))
