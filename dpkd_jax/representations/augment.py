"""Random affine and photometric augmentations (dm-pix), one key per image, jitted.

Used by the SimCLR encoder (two random views per public image) and by the reverse k-NN
student (rotation + translation, as the reference code's `RandomRotation(20)` and
`RandomAffine(translate=0.2)` for MNIST). Digits must not be mirrored, so flips are opt-in.
"""

from __future__ import annotations

import functools
import math

import dm_pix as pix
import jax
import jax.numpy as jnp


def _affine_one(key: jax.Array, image: jax.Array, rotation_degrees: float,
                translate_fraction: float, scale_range: tuple[float, float]) -> jax.Array:
  """One (H, W, C) float image rotated, scaled and shifted about its centre (zero fill)."""
  angle_key, scale_key, shift_key = jax.random.split(key, 3)
  height, width = image.shape[0], image.shape[1]
  angle = jax.random.uniform(angle_key, (), minval=-1.0, maxval=1.0) * math.radians(
      rotation_degrees)
  scale = jax.random.uniform(scale_key, (), minval=scale_range[0], maxval=scale_range[1])
  shift = jax.random.uniform(shift_key, (2,), minval=-1.0, maxval=1.0) * translate_fraction * (
      jnp.array([height, width], jnp.float32))
  # affine_transform maps *output* coordinates o to input ones: i = A (o - c) + c - shift,
  # with A the inverse rotation/scale; the channel axis is left alone.
  cos, sin = jnp.cos(angle) / scale, jnp.sin(angle) / scale
  inverse = jnp.array([[cos, sin], [-sin, cos]])  # (2, 2)
  centre = jnp.array([(height - 1) / 2.0, (width - 1) / 2.0])
  matrix = jnp.eye(3).at[:2, :2].set(inverse)  # (3, 3) over (row, col, channel)
  offset = jnp.concatenate([centre - inverse @ centre - shift, jnp.zeros(1)])
  return pix.affine_transform(image, matrix, offset=offset, order=1, mode="constant", cval=0.0)


@functools.partial(jax.jit, static_argnames=("rotation_degrees", "translate_fraction",
                                             "scale_range", "flip"))
def random_affine(key: jax.Array, images: jax.Array, *, rotation_degrees: float = 20.0,
                  translate_fraction: float = 0.1,
                  scale_range: tuple[float, float] = (1.0, 1.0),
                  flip: bool = False) -> jax.Array:
  """Random rotation, scale, translation (and optional left-right flip) of every image.

  Args:
    key: a `jax.random.key`, split into one key per image.
    images: (B, H, W, C) images (any dtype; computed and returned as float32, same range).
    rotation_degrees: angle uniform in [-r, r] degrees.
    translate_fraction: shift uniform in [-t, t] times H (rows) and W (columns).
    scale_range: zoom factor uniform in [lo, hi] (> 1 enlarges).
    flip: also flip left-right with probability 1/2 (only for flip-invariant classes).

  Returns:
    (B, H, W, C) float32 augmented images; uncovered pixels are 0.
  """
  if images.ndim != 4:
    raise ValueError(f"images must be (B, H, W, C), got shape {images.shape}")

  def one_image(image_key: jax.Array, image: jax.Array) -> jax.Array:
    affine_key, flip_key = jax.random.split(image_key)
    image = _affine_one(affine_key, image.astype(jnp.float32), rotation_degrees,
                        translate_fraction, scale_range)
    return pix.random_flip_left_right(flip_key, image) if flip else image

  return jax.vmap(one_image)(jax.random.split(key, images.shape[0]), images)


@functools.partial(jax.jit, static_argnames=("max_brightness", "contrast_range",
                                             "noise_std"))
def random_photometric(key: jax.Array, images: jax.Array, *, max_brightness: float = 0.2,
                       contrast_range: tuple[float, float] = (0.6, 1.4),
                       noise_std: float = 0.05) -> jax.Array:
  """Random brightness, contrast and additive Gaussian noise on [0, 1] images, clipped.

  Args:
    key: a `jax.random.key`, split per image and per transformation.
    images: (B, H, W, C) float images in [0, 1].
    max_brightness: brightness delta uniform in [-m, m].
    contrast_range: contrast factor uniform in [lo, hi].
    noise_std: standard deviation of the pixel noise.

  Returns:
    (B, H, W, C) float32 images in [0, 1].
  """

  def one_image(image_key: jax.Array, image: jax.Array) -> jax.Array:
    brightness_key, contrast_key, noise_key = jax.random.split(image_key, 3)
    image = pix.random_brightness(brightness_key, image, max_brightness)
    image = pix.random_contrast(contrast_key, image, *contrast_range)
    image = image + noise_std * jax.random.normal(noise_key, image.shape)
    return jnp.clip(image, 0.0, 1.0)

  return jax.vmap(one_image)(jax.random.split(key, images.shape[0]),
                             images.astype(jnp.float32))
