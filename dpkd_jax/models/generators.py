"""Image generators for data-free distillation (DAFL, DPDFD).

A generator maps latent vectors z (B, latent_dim) to normalised images (B, H, W, C) that a
teacher classifies; it follows the model conventions of `core`: `model(z, train=...)`, BatchNorm
reading `use_running_average=not train` at call time.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpkd_jax import kernels
from dpkd_jax.models.classifiers import validate_image_shape

# PyTorch's default BatchNorm momentum 0.1, as in DAFL's reference code.
_MOMENTUM = 0.9
# DAFL writes `nn.BatchNorm2d(128, 0.8)`: the positional 0.8 is PyTorch's `eps`, not momentum.
# Kept as is, since it changes how strongly those layers normalise small activations.
_DAFL_CONV_EPSILON = 0.8


def _validate_image_shape(image_shape: Sequence[int]) -> tuple[int, int, int]:
  height, width, channels = validate_image_shape(image_shape, arg_name="image_shape")
  if height % 4 or width % 4:
    raise ValueError(
        f"image height and width must be divisible by 4, got image_shape={image_shape!r}")
  return height, width, channels


class DAFLGenerator(nnx.Module):
  """The generator of DAFL (Chen et al., ICCV 2019), reused by DPDFD.

  dense(latent → H/4·W/4·c) → reshape (B, H/4, W/4, c) → BatchNorm → upsample ×2 → conv3×3(c)
  → BatchNorm(ε=0.8) → LeakyReLU(0.2) → upsample ×2 → conv3×3(c/2) → BatchNorm(ε=0.8)
  → LeakyReLU(0.2) → conv3×3(C) → tanh → BatchNorm without scale or bias, with c = base_channels
  (128 in DAFL). The final affine-free BatchNorm standardises every channel of a training batch,
  so samples match the teacher's normalised inputs rather than tanh's [-1, 1] range.
  """

  def __init__(self, *, latent_dim: int = 100, image_shape: Sequence[int], rngs: nnx.Rngs,
               base_channels: int = 128):
    """Builds the generator.

    Args:
      latent_dim: size of the latent vector z.
      image_shape: (H, W, C) of the images to produce; H and W divisible by 4.
      rngs: random streams for parameter initialisation.
      base_channels: width c of the first two stages (the last conv has c / 2 channels).
    """
    height, width, channels = _validate_image_shape(image_shape)
    if (not isinstance(latent_dim, (int, np.integer)) or isinstance(latent_dim, bool)
        or latent_dim < 1):
      raise ValueError(f"latent_dim must be a positive integer, got {latent_dim!r}")
    if base_channels < 2 or base_channels % 2:
      raise ValueError(f"base_channels must be an even integer >= 2, got {base_channels!r}")
    self.latent_dim = int(latent_dim)
    self.init_shape = (height // 4, width // 4, base_channels)
    self.project = nnx.Linear(latent_dim, int(np.prod(self.init_shape)), rngs=rngs)
    self.project_norm = nnx.BatchNorm(base_channels, momentum=_MOMENTUM, rngs=rngs)
    conv = kernels.conv_general_dilated  # lax's, or the opt-in CPU kernels' (same parameters)
    self.conv1 = nnx.Conv(base_channels, base_channels, (3, 3), rngs=rngs,
                          conv_general_dilated=conv)
    self.norm1 = nnx.BatchNorm(base_channels, momentum=_MOMENTUM, epsilon=_DAFL_CONV_EPSILON,
                               rngs=rngs)
    self.conv2 = nnx.Conv(base_channels, base_channels // 2, (3, 3), rngs=rngs,
                          conv_general_dilated=conv)
    self.norm2 = nnx.BatchNorm(base_channels // 2, momentum=_MOMENTUM,
                               epsilon=_DAFL_CONV_EPSILON, rngs=rngs)
    self.conv_out = nnx.Conv(base_channels // 2, channels, (3, 3), rngs=rngs,
                             conv_general_dilated=conv)
    self.output_norm = nnx.BatchNorm(channels, momentum=_MOMENTUM, use_scale=False,
                                     use_bias=False, rngs=rngs)

  def __call__(self, z: jax.Array, *, train: bool = False) -> jax.Array:
    """Generates images.

    Args:
      z: (B, latent_dim) latent vectors.
      train: normalise with batch statistics and update the running averages.

    Returns:
      (B, H, W, C) float32 images.
    """
    if z.ndim != 2 or z.shape[-1] != self.latent_dim:
      raise ValueError(f"z must have shape (batch, {self.latent_dim}), got {z.shape}")
    running = not train
    x = self.project(z).reshape(z.shape[0], *self.init_shape)  # (B, H/4, W/4, c)
    x = self.project_norm(x, use_running_average=running)
    # Upsample ×2 then conv (the CPU kernels compute it as sub-pixel convolutions on the small
    # map: same function and parameters).
    x = kernels.upsample_conv(self.conv1, x)  # (B, H/2, W/2, c)
    x = nnx.leaky_relu(self.norm1(x, use_running_average=running), 0.2)
    x = kernels.upsample_conv(self.conv2, x)  # (B, H, W, c / 2)
    x = nnx.leaky_relu(self.norm2(x, use_running_average=running), 0.2)
    x = jnp.tanh(self.conv_out(x))  # (B, H, W, C)
    return self.output_norm(x, use_running_average=running)


def class_coded_latents(z: jax.Array, classes: jax.Array, num_classes: int) -> jax.Array:
  """z (B, latent_dim) with its first `num_classes` coordinates replaced by the one-hot code of
  `classes` (B,) int, scaled by sqrt(num_classes) so that the code's mean square per coordinate
  is z's (1): a class-conditional generator with the same architecture and parameters."""
  if z.shape[-1] <= num_classes:
    raise ValueError(f"latent_dim {z.shape[-1]} must exceed num_classes {num_classes} to hold "
                     "a class code beside the noise")
  code = jax.nn.one_hot(classes, num_classes, dtype=z.dtype) * jnp.sqrt(float(num_classes))
  return z.at[:, :num_classes].set(code)

