"""Teacher architectures of stacked ensembles: models that vmap into batched matrix products.

`TEACHER_MODELS` is the registry an ensemble's `teacher_model` is validated against: an MLP and
a patch-matmul CNN written for `jax.vmap` over n teachers (on CPU a vmapped convolution becomes
a slow grouped convolution), plus every classifier of the zoo. Each takes the zoo's keyword
signature (num_classes, input_shape, norm, rngs) with norm "none".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpkd_jax import models
from dpkd_jax.models import core


class MLP(nnx.Module):
  """flatten → dense(hidden) → ReLU → dense(hidden) → ReLU → dense(classes).

  The default teacher: vmapped over n teachers its layers are batched matrix products, which
  XLA runs fast on CPU, whereas vmapped convolutions become grouped convolutions (slow there).
  Same keyword signature as every registry classifier; `norm` must be "none".
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "none",
               rngs: nnx.Rngs, hidden_width: int = 128):
    if norm != "none":
      raise ValueError(f"MLP has no normalisation layers; norm must be 'none', got {norm!r}")
    size = int(np.prod(input_shape))
    self.fc1 = nnx.Linear(size, hidden_width, rngs=rngs)
    self.fc2 = nnx.Linear(hidden_width, hidden_width, rngs=rngs)
    self.head = nnx.Linear(hidden_width, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    del train  # no dropout / normalisation
    hidden = jax.nn.relu(self.fc1(x.reshape(x.shape[0], -1)))  # (B, hidden)
    features = jax.nn.relu(self.fc2(hidden))  # (B, hidden)
    return core.ClassifierOutput(self.head(features), features, hidden)


class PatchCNN(nnx.Module):
  """Two 5×5 stride-2 convolutions (widths 8, 16) → ReLU → dense(classes), as patch matmuls.

  Each convolution extracts 5×5 patches (`conv_general_dilated_patches`, no parameters) and
  multiplies them by an (in·25, out) kernel, so n vmapped teachers run batched matrix
  products instead of CPU-slow grouped convolutions. Shapes at 28×28×C: (14, 14, 8) →
  (7, 7, 16) → 784 features. Same keyword signature as the registry; `norm` must be "none".
  """

  def __init__(self, *, num_classes: int, input_shape: Sequence[int], norm: str = "none",
               rngs: nnx.Rngs, widths: tuple[int, int] = (8, 16)):
    if norm != "none":
      raise ValueError(f"PatchCNN has no normalisation layers; norm must be 'none', got {norm!r}")
    height, width, channels = (int(s) for s in input_shape)
    self.conv1 = nnx.Linear(channels * 25, widths[0], rngs=rngs)
    self.conv2 = nnx.Linear(widths[0] * 25, widths[1], rngs=rngs)
    out_h, out_w = -(-(-(-height // 2)) // 2), -(-(-(-width // 2)) // 2)
    self.head = nnx.Linear(out_h * out_w * widths[1], num_classes, rngs=rngs)

  @staticmethod
  def _patches(x: jax.Array) -> jax.Array:
    """(B, H, W, C) → (B, ceil(H/2), ceil(W/2), 25·C) 5×5 patches at stride 2 ("SAME").

    Built from 25 strided slices of the padded input (memory moves only): XLA's CPU
    patch extraction is itself a grouped convolution, which is what we avoid.
    """
    height, width = x.shape[1:3]
    out_h, out_w = -(-height // 2), -(-width // 2)
    pad_h, pad_w = max((out_h - 1) * 2 + 5 - height, 0), max((out_w - 1) * 2 + 5 - width, 0)
    padded = jnp.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                         (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    slices = [padded[:, i:i + 2 * out_h:2, j:j + 2 * out_w:2, :]
              for i in range(5) for j in range(5)]  # 25 × (B, out_h, out_w, C)
    return jnp.concatenate(slices, axis=-1)

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    del train
    hint = jax.nn.relu(self.conv1(self._patches(x)))  # (B, H/2, W/2, 8)
    maps = jax.nn.relu(self.conv2(self._patches(hint)))  # (B, H/4, W/4, 16)
    features = maps.reshape(maps.shape[0], -1)
    return core.ClassifierOutput(self.head(features), features, hint)


# Teacher architectures: the zoo's classifiers plus the MLP above (explicit registry).
TEACHER_MODELS: dict[str, Callable[..., nnx.Module]] = {"mlp": MLP, "patch_cnn": PatchCNN,
                                                         **models.CLASSIFIERS}

