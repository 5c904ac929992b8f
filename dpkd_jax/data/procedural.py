"""Procedural query images made in code: strokes, arcs, blobs and textures (no data, no fonts).

Data-free PATE (`methods.dfpate`) needs inputs on which to ask the private teacher ensemble
for votes, without any public data set. This module draws them from a fixed, generic random
process that knows only the image shape (H, W, C):

* strokes: cubic Bézier curves or elliptic arcs, rendered as polylines of `POLYLINE_POINTS`
  points through a distance field (pixel intensity falls off past half the stroke width);
* blobs: filled ellipses, optionally modulated by a smooth random texture;
* per image: a random number of each, random intensities (random colours if C > 1), an
  optional 3×3 blur, additive pixel noise and an optional polarity inversion.

Nothing here looks at any data set: the same key gives the same images whatever the task, so
queries are public randomness and using them costs no privacy. Every function is pure, keyed
with a new-style `jax.random.key`, and jittable (shapes are static; optional components are
masked, not branched).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

# Points per polyline (a stroke is POLYLINE_POINTS - 1 straight segments).
POLYLINE_POINTS = 12
# Coarse grid of the smooth texture, upsampled to the image size.
_TEXTURE_GRID = 6


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProceduralConfig:
  """The random image process. Lengths are in pixels of a 28-pixel-high image, scaled by H/28.

  Attributes:
    image_shape: (H, W, C) of the images; the only thing known about the task.
    max_strokes: at most this many strokes per image (at least `min_strokes`).
    min_strokes: at least this many strokes.
    max_blobs: at most this many filled ellipses (0 disables them).
    stroke_width: (low, high) stroke width range.
    arc_probability: chance that a stroke is an elliptic arc instead of a Bézier curve.
    margin: fraction of the image kept free of control points on each side.
    texture_probability: chance that an image's blobs are modulated by a smooth texture.
    blur_probability: chance of a 3×3 binomial blur.
    pixel_noise: std of additive Gaussian pixel noise (intensities in [0, 1]).
    invert_probability: chance of inverting the polarity (dark strokes on a light ground).
  """

  image_shape: tuple[int, int, int]
  max_strokes: int = 4
  min_strokes: int = 1
  max_blobs: int = 2
  stroke_width: tuple[float, float] = (1.5, 4.0)
  arc_probability: float = 0.3
  margin: float = 0.15
  texture_probability: float = 0.5
  blur_probability: float = 0.5
  pixel_noise: float = 0.02
  invert_probability: float = 0.5

  def __post_init__(self):
    object.__setattr__(self, "image_shape", tuple(int(s) for s in self.image_shape))
    object.__setattr__(self, "stroke_width", tuple(float(w) for w in self.stroke_width))
    if len(self.image_shape) != 3 or min(self.image_shape) < 1:
      raise ValueError(f"image_shape must be (H, W, C) of positive ints, got {self.image_shape}")
    if min(self.image_shape[:2]) < 4:
      raise ValueError(f"images must be at least 4×4, got image_shape={self.image_shape}")
    if not 1 <= self.min_strokes <= self.max_strokes:
      raise ValueError(f"need 1 <= min_strokes <= max_strokes, got min_strokes="
                       f"{self.min_strokes}, max_strokes={self.max_strokes}")
    if self.max_blobs < 0:
      raise ValueError(f"max_blobs must be >= 0, got {self.max_blobs}")
    low, high = self.stroke_width
    if len(self.stroke_width) != 2 or not 0 < low <= high:
      raise ValueError(f"stroke_width must be (low, high) with 0 < low <= high, got "
                       f"{self.stroke_width}")
    if not 0 <= self.margin < 0.5:
      raise ValueError(f"margin must be in [0, 0.5), got {self.margin}")
    for name in ("arc_probability", "texture_probability", "blur_probability",
                 "invert_probability"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
    if not self.pixel_noise >= 0:
      raise ValueError(f"pixel_noise must be >= 0, got {self.pixel_noise}")


def _segment_distance(points: jax.Array, grid: jax.Array) -> jax.Array:
  """Distance of every pixel to a polyline.

  Args:
    points: (P, 2) polyline vertices (row, col) in pixels.
    grid: (H, W, 2) pixel centres.

  Returns:
    (H, W) distance to the nearest of the P - 1 segments.
  """
  start, end = points[:-1], points[1:]  # (S, 2) each
  direction = end - start  # (S, 2)
  rel = grid[None] - start[:, None, None, :]  # (S, H, W, 2)
  length2 = jnp.maximum(jnp.sum(direction ** 2, -1), 1e-6)[:, None, None]  # (S, 1, 1)
  t = jnp.clip(jnp.sum(rel * direction[:, None, None, :], -1) / length2, 0.0, 1.0)
  nearest = t[..., None] * direction[:, None, None, :]  # (S, H, W, 2)
  # Minimum of squared distances first: one square root per pixel instead of one per segment.
  return jnp.sqrt(jnp.min(jnp.sum((rel - nearest) ** 2, -1), axis=0) + 1e-12)


def _stroke_points(key: jax.Array, config: ProceduralConfig) -> jax.Array:
  """(POLYLINE_POINTS, 2) vertices of a Bézier curve or an elliptic arc, in pixels."""
  height, width, _ = config.image_shape
  size = jnp.array([height, width], jnp.float32)
  kind_key, ctrl_key, centre_key, radius_key, angle_key = jax.random.split(key, 5)
  t = jnp.linspace(0.0, 1.0, POLYLINE_POINTS)[:, None]  # (P, 1)
  # Cubic Bézier through 4 control points inside the margins.
  ctrl = jax.random.uniform(ctrl_key, (4, 2), minval=config.margin,
                            maxval=1.0 - config.margin) * size
  bezier = ((1 - t) ** 3 * ctrl[0] + 3 * (1 - t) ** 2 * t * ctrl[1]
            + 3 * (1 - t) * t ** 2 * ctrl[2] + t ** 3 * ctrl[3])  # (P, 2)
  # Elliptic arc: centre, radii, start angle and a sweep of a quarter to a full turn.
  centre = jax.random.uniform(centre_key, (2,), minval=0.3, maxval=0.7) * size
  radii = jax.random.uniform(radius_key, (2,), minval=0.1, maxval=0.3) * size
  start, sweep = jax.random.uniform(angle_key, (2,)) * jnp.array([2 * jnp.pi, 1.5 * jnp.pi])
  angle = start + (0.5 * jnp.pi + sweep) * t[:, 0]  # (P,)
  arc = centre + radii * jnp.stack([jnp.sin(angle), jnp.cos(angle)], -1)  # (P, 2)
  is_arc = jax.random.bernoulli(kind_key, config.arc_probability)
  return jnp.where(is_arc, arc, bezier)


def _smooth_texture(key: jax.Array, height: int, width: int) -> jax.Array:
  """(H, W) smooth random texture in [0, 1] (coarse Gaussian grid, bilinear upsampling)."""
  coarse = jax.random.normal(key, (_TEXTURE_GRID, _TEXTURE_GRID))
  fine = jax.image.resize(coarse, (height, width), "bilinear")
  return jax.nn.sigmoid(2.0 * fine)


def _blur(image: jax.Array) -> jax.Array:
  """3×3 binomial blur of an (H, W, C) image (edge padding)."""
  padded = jnp.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
  height, width = image.shape[:2]
  weights = jnp.array([0.25, 0.5, 0.25])
  rows = sum(w * padded[i:i + height] for i, w in enumerate(weights))  # (H, W + 2, C)
  return sum(w * rows[:, j:j + width] for j, w in enumerate(weights))


def render_image(key: jax.Array, config: ProceduralConfig) -> jax.Array:
  """One procedural image.

  Args:
    key: a `jax.random.key`; the image is a deterministic function of it.
    config: the random process.

  Returns:
    (H, W, C) float32 intensities in [0, 1].
  """
  height, width, channels = config.image_shape
  scale = height / 28.0
  keys = jax.random.split(key, 12)
  rows, cols = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32) + 0.5,
                            jnp.arange(width, dtype=jnp.float32) + 0.5, indexing="ij")
  grid = jnp.stack([rows, cols], -1)  # (H, W, 2)

  # Strokes: (S, H, W) coverage in [0, 1], masked beyond the drawn number of strokes.
  points = jax.vmap(lambda k: _stroke_points(k, config))(
      jax.random.split(keys[0], config.max_strokes))  # (S, P, 2)
  dist = jax.vmap(_segment_distance, in_axes=(0, None))(points, grid)  # (S, H, W)
  half_width = 0.5 * scale * jax.random.uniform(
      keys[1], (config.max_strokes, 1, 1), minval=config.stroke_width[0],
      maxval=config.stroke_width[1])
  coverage = jnp.clip(half_width - dist + 0.5, 0.0, 1.0)  # one-pixel anti-aliased edge
  num_strokes = jax.random.randint(keys[2], (), config.min_strokes, config.max_strokes + 1)
  stroke_on = (jnp.arange(config.max_strokes) < num_strokes)[:, None, None]
  stroke_ink = jax.random.uniform(keys[3], (config.max_strokes, channels), minval=0.6,
                                  maxval=1.0)  # (S, C) intensity / colour per stroke
  layers = [(coverage * stroke_on)[..., None] * stroke_ink[:, None, None, :]]  # (S, H, W, C)

  if config.max_blobs:
    size = jnp.array([height, width], jnp.float32)
    centre = jax.random.uniform(keys[4], (config.max_blobs, 2), minval=0.25,
                                maxval=0.75) * size
    radii = jax.random.uniform(keys[5], (config.max_blobs, 2), minval=0.08,
                               maxval=0.35) * size
    rel = (grid[None] - centre[:, None, None, :]) / radii[:, None, None, :]  # (Bl, H, W, 2)
    radius = jnp.sqrt(jnp.sum(rel ** 2, -1))  # (Bl, H, W); 1 on the ellipse
    fill = jnp.clip((1.0 - radius) * jnp.min(radii) + 0.5, 0.0, 1.0)
    num_blobs = jax.random.randint(keys[6], (), 0, config.max_blobs + 1)
    blob_on = (jnp.arange(config.max_blobs) < num_blobs)[:, None, None]
    texture = _smooth_texture(keys[7], height, width)  # (H, W)
    textured = jax.random.bernoulli(keys[8], config.texture_probability)
    modulation = jnp.where(textured, 0.4 + 0.6 * texture, 1.0)
    blob_ink = jax.random.uniform(keys[9], (config.max_blobs, channels), minval=0.3,
                                  maxval=1.0)
    layers.append((fill * blob_on * modulation)[..., None] * blob_ink[:, None, None, :])

  image = jnp.max(jnp.concatenate(layers, 0), axis=0)  # (H, W, C): brightest layer wins
  image = jnp.where(jax.random.bernoulli(keys[10], config.blur_probability), _blur(image), image)
  noise_key, invert_key = jax.random.split(keys[11])
  image = image + config.pixel_noise * jax.random.normal(noise_key, image.shape)
  image = jnp.clip(image, 0.0, 1.0)
  return jnp.where(jax.random.bernoulli(invert_key, config.invert_probability), 1.0 - image,
                   image)


@functools.partial(jax.jit, static_argnames=("num", "config"))
def generate(key: jax.Array, num: int, config: ProceduralConfig) -> jax.Array:
  """`num` independent procedural images as uint8, like a data set's images.

  Args:
    key: a `jax.random.key`; image i depends only on `fold_in(key, i)`, so a prefix of a
      larger batch equals a smaller batch from the same key.
    num: number of images.
    config: the random process.

  Returns:
    (num, H, W, C) uint8 pixels.
  """
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num))
  images = jax.vmap(lambda k: render_image(k, config))(keys)
  return jnp.round(images * 255.0).astype(jnp.uint8)


def generate_chunked(key: jax.Array, num: int, config: ProceduralConfig, *,
                     chunk: int = 4096) -> np.ndarray:
  """`generate` in fixed-size chunks (bounded memory), as a host NumPy array.

  Args:
    key: a `jax.random.key`; chunk c uses `fold_in(key, c)`.
    num: number of images.
    config: the random process.
    chunk: images per compiled call (at most `num`).

  Returns:
    (num, H, W, C) uint8 pixels.
  """
  if num < 0 or chunk < 1:
    raise ValueError(f"need num >= 0 and chunk >= 1, got num={num}, chunk={chunk}")
  chunk = max(min(chunk, num), 1)  # small requests compile a small batch, not a full chunk
  parts = [np.asarray(generate(jax.random.fold_in(key, c), chunk, config))
           for c in range(-(-num // chunk))]
  if not parts:
    return np.zeros((0, *config.image_shape), np.uint8)
  return np.concatenate(parts)[:num]
