"""The reference ops: plain `jax.lax` and Flax, what the model zoo computes by default.

Every backend (CPU, GPU, TPU) and every JAX transformation (grad, jvp, vmap, export with
symbolic shapes) takes them as they are. The opt-in CPU kernels (`kernels.xla_cpu`) are tested
against these for equal values and gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax


def upsample_nearest_2x(x: jax.Array) -> jax.Array:
  """(B, H, W, C) → (B, 2H, 2W, C), each pixel repeated 2×2."""
  return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def max_pool_2x2(x: jax.Array) -> jax.Array:
  """2×2 max-pool, stride 2, VALID (odd sides are floored): `nnx.max_pool`."""
  return nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))


def group_norm(layer: nnx.GroupNorm, x: jax.Array) -> jax.Array:
  """`layer(x)`."""
  return layer(x)


def norm_relu_max_pool(norm: object, y: jax.Array, *, train: bool) -> None:
  """No fused norm → ReLU → pool: the caller applies the three layers in turn."""
  del norm, y, train
  return None


def upsample_conv(conv: nnx.Conv, x: jax.Array) -> jax.Array:
  """`conv(upsample_nearest_2x(x))`: (B, H, W, C) → (B, 2H, 2W, O)."""
  return conv(upsample_nearest_2x(x))


def normalised_group_norm(layer: nnx.GroupNorm, x: jax.Array) -> None:
  """No closed form: ghost clipping computes x̂ through the layer with scale 1, bias 0."""
  del layer, x
  return None


def tapped_group_norm_relu_max_pool(layer: nnx.GroupNorm, x: jax.Array, tap) -> None:
  """No fused tapped op: ghost clipping taps the GroupNorm, ReLU and pool in turn."""
  del layer, x, tap
  return None


conv_general_dilated = lax.conv_general_dilated
