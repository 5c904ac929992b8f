"""Models of the graph importer's tests and benchmark (benchmarks/graph_import.py): a custom
PyTorch classifier and a functional Keras model, each using many operations of the table.
torch and keras are imported lazily."""

import importlib
import importlib.util
import os
import sys
import types

import numpy as np

import torch_fixtures


def graph_custom(channels=1, num_classes=10):
  """A custom classifier for the graph importer: convolutions with dilation, stride and groups,
  group / batch / layer norm, SiLU, GELU, Hardswish, max-pool (ceil mode), average pool (pads
  not counted), squeeze-excitation, concatenation, adaptive average pooling, dropout."""
  import torch  # pylint: disable=g-import-not-at-top
  nn = torch.nn

  class Custom(nn.Module):
    """Every operation family of the graph importer's table, at digits' or CIFAR's size."""

    def __init__(self):
      super().__init__()
      self.c1 = nn.Conv2d(channels, 16, 3, padding=2, dilation=2)
      self.gn = nn.GroupNorm(4, 16)
      self.c2 = nn.Conv2d(16, 16, 3, stride=2, groups=4, padding=1)
      self.bn = nn.BatchNorm2d(16)
      self.ln = nn.LayerNorm([16])
      self.mp = nn.MaxPool2d(3, 2, 1, ceil_mode=True)
      self.ap = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
      self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(),
                              nn.Conv2d(4, 16, 1), nn.Hardsigmoid())
      self.pool = nn.AdaptiveAvgPool2d(3)
      self.drop = nn.Dropout(0.3)
      self.fc = nn.Linear(32 * 9, num_classes)

    def forward(self, x):
      x = nn.functional.silu(self.gn(self.c1(x)))
      y = nn.functional.gelu(self.bn(self.c2(x)))
      y = self.ln(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
      y = nn.functional.hardswish(self.ap(self.mp(y)))
      y = torch.cat([y, y * self.se(y)], 1)
      return self.fc(self.drop(torch.flatten(self.pool(y), 1)))

  return torch_fixtures.randomise_batch_norms(Custom())


def keras_model():
  """A functional Keras model: strided "same" convolutions, depthwise convolution, batch norms
  (Keras' eps), swish, ReLU6, squeeze-excitation (Multiply), Add, max / average pooling with
  "same" pads, Dropout and a final softmax."""
  os.environ.setdefault("KERAS_BACKEND", "jax")
  import keras  # pylint: disable=g-import-not-at-top
  layers = keras.layers
  keras.utils.set_random_seed(0)
  x = inputs = keras.Input((28, 28, 1))
  x = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(x)
  x = layers.Activation("swish")(layers.BatchNormalization()(x))
  y = layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(x)
  y = layers.ReLU(max_value=6.0)(layers.BatchNormalization()(y))
  se = layers.GlobalAveragePooling2D(keepdims=True)(y)
  se = layers.Dense(32, activation="hard_sigmoid")(layers.Dense(8, activation="relu")(se))
  y = layers.Conv2D(16, 1, activation="gelu")(layers.Multiply()([y, se]))
  x = layers.MaxPooling2D(3, strides=2, padding="same")(layers.Add()([x, y]))
  x = layers.Dropout(0.5)(layers.Flatten()(layers.AveragePooling2D(2, padding="same")(x)))
  model = keras.Model(inputs, layers.Dense(10, activation="softmax")(x))
  rng = np.random.default_rng(0)
  for layer in model.layers:  # non-trivial batch norms
    if isinstance(layer, layers.BatchNormalization):
      n = layer.moving_mean.shape[0]
      for variable, low, high in ((layer.moving_mean, -0.5, 0.5), (layer.moving_variance, 0.5, 2),
                                  (layer.gamma, 0.5, 1.5), (layer.beta, -0.3, 0.3)):
        variable.assign(rng.uniform(low, high, n).astype(np.float32))
  return model


def torchvision_gray(name):
  """torchvision's `name` (resnet50, efficientnet_b0, mobilenet_v3_small) for 10 classes with a
  1-channel first convolution (digits, MNIST) and non-trivial batch-norm statistics."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = getattr(torchvision_models(), name)(num_classes=10)
  first = model.conv1 if name == "resnet50" else model.features[0][0]
  gray = torch.nn.Conv2d(1, first.out_channels, first.kernel_size, first.stride, first.padding,
                         bias=False)
  if name == "resnet50":
    model.conv1 = gray
  else:
    model.features[0][0] = gray
  return torch_fixtures.randomise_batch_norms(model)


def torchvision_models():
  """torchvision.models, or its pure-Python model definitions where torchvision's compiled ops
  do not load (as `torch_fixtures.tv_models`, without restoring sys.modules: for scripts)."""
  try:
    return importlib.import_module("torchvision").models
  except (ImportError, RuntimeError):
    for name in [k for k in sys.modules if k.split(".")[0] == "torchvision"]:
      del sys.modules[name]
  package = types.ModuleType("torchvision")
  package.__path__ = list(importlib.util.find_spec("torchvision").submodule_search_locations)
  sys.modules["torchvision"] = package
  return importlib.import_module("torchvision.models")
