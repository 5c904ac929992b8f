"""Classifiers on ScatterNet features (`representations.scatternet`), after Tramèr & Boneh 2021.

Both take (h, w, F) feature maps (F = C K scattering coefficients) and start with a GroupNorm
without scale or bias over groups of three coefficient channels (the paper's 27 groups for
MNIST's 81): a per-example normalization, so it mixes no examples and costs no privacy.

* `ScatterLinear`: the normalized features → one dense layer (logistic regression).
* `ScatterCNN`: conv3×3(16, stride 2) → tanh → conv3×3(32) → tanh → dense(32) → tanh → dense,
  the paper's small CNN for 28×28 inputs (7×7 feature maps → 4×4). Tanh: bounded activations
  keep the per-example gradient norms steady under clipping (Papernot et al. 2021).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax import kernels
from dpkd_jax.models import core
from dpkd_jax.models.classifiers import validate_classifier_args

_NORMS = ("group", "none")
_CHANNELS_PER_GROUP = 3


def _input_norm(norm: str, channels: int, *, rngs: nnx.Rngs) -> nnx.GroupNorm | None:
  """The parameter-free input GroupNorm (groups of three channels when they divide), or None."""
  if norm not in _NORMS:
    raise ValueError(f"norm must be one of {_NORMS} for a ScatterNet head (BatchNorm statistics "
                     f"would mix the examples of a batch), got {norm!r}")
  if norm == "none":
    return None
  groups = channels // _CHANNELS_PER_GROUP if channels % _CHANNELS_PER_GROUP == 0 else channels
  return nnx.GroupNorm(channels, num_groups=groups, use_scale=False, use_bias=False, rngs=rngs)


def _normalize(layer: nnx.GroupNorm | None, x: jax.Array) -> jax.Array:
  return x if layer is None else layer(x)


class ScatterLinear(nnx.Module):
  """GroupNorm (no parameters) → dense: a linear classifier on ScatterNet features.

  Output features and hint: the normalized (B, h w F) features and (B, h, w, F) maps.
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "group",
               rngs: nnx.Rngs):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    self.norm = _input_norm(norm, channels, rngs=rngs)
    self.head = nnx.Linear(height * width * channels, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    del train  # no BatchNorm, no dropout
    hint = _normalize(self.norm, x)
    features = hint.reshape(hint.shape[0], -1)
    return core.ClassifierOutput(self.head(features), features, hint)


class ScatterCNN(nnx.Module):
  """GroupNorm (no parameters) → conv3×3(16, s2) → tanh → conv3×3(32) → tanh → dense(32) → tanh →
  dense. Hint: the (B, ⌈h/2⌉, ⌈w/2⌉, 32) second activation; features: the (B, 32) hidden layer."""

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "group",
               rngs: nnx.Rngs, widths: tuple[int, int, int] = (16, 32, 32)):
    height, width, channels = validate_classifier_args(num_classes, input_shape)
    self.norm = _input_norm(norm, channels, rngs=rngs)
    first, second, hidden = widths
    padding = ((1, 1), (1, 1))
    conv = kernels.conv_general_dilated  # lax's, or the opt-in CPU kernels'
    self.conv1 = nnx.Conv(channels, first, (3, 3), strides=2, padding=padding, rngs=rngs,
                          conv_general_dilated=conv)
    self.conv2 = nnx.Conv(first, second, (3, 3), padding=padding, rngs=rngs,
                          conv_general_dilated=conv)
    out_h, out_w = (height + 1) // 2, (width + 1) // 2
    self.fc = nnx.Linear(out_h * out_w * second, hidden, rngs=rngs)
    self.head = nnx.Linear(hidden, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    del train
    x = jnp.tanh(self.conv1(_normalize(self.norm, x)))
    hint = jnp.tanh(self.conv2(x))
    features = jnp.tanh(self.fc(hint.reshape(hint.shape[0], -1)))
    return core.ClassifierOutput(self.head(features), features, hint)
