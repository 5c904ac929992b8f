"""Tests of the procedural query images (data/procedural.py)."""

import chex
import jax
import numpy as np
import pytest

from dpkd_jax.data import procedural

_MNIST = procedural.ProceduralConfig(image_shape=(28, 28, 1))


# Every distinct (num, config) compiles `generate` once: the tests share a few of them.


def test_shape_dtype_and_range():
  images = np.asarray(procedural.generate(jax.random.key(0), 8, _MNIST))
  chex.assert_shape(images, (8, 28, 28, 1))
  assert images.dtype == np.uint8
  # Something is drawn on every image: not constant.
  assert (images.reshape(8, -1).std(-1) > 5).all()


def test_deterministic_in_key_and_prefix_stable():
  a = np.asarray(procedural.generate(jax.random.key(3), 8, _MNIST))
  b = np.asarray(procedural.generate(jax.random.key(3), 4, _MNIST))
  c = np.asarray(procedural.generate(jax.random.key(4), 4, _MNIST))
  np.testing.assert_array_equal(a[:4], b)  # image i depends only on fold_in(key, i)
  assert np.abs(b.astype(int) - c.astype(int)).mean() > 5  # another key, other images
  assert np.abs(a[0].astype(int) - a[1].astype(int)).mean() > 5  # images differ


def test_polarity():
  dark = procedural.ProceduralConfig(image_shape=(28, 28, 1), invert_probability=0.0)
  light = procedural.ProceduralConfig(image_shape=(28, 28, 1), invert_probability=1.0)
  a = np.asarray(procedural.generate(jax.random.key(1), 8, dark)).astype(int)
  b = np.asarray(procedural.generate(jax.random.key(1), 8, light)).astype(int)
  # Same key, same drawing: the inverted image is 255 minus the other (up to rounding).
  np.testing.assert_allclose(a + b, 255, atol=1)
  corners = a[:, [0, 0, -1, -1], [0, -1, 0, -1], 0]  # margins keep strokes off the corners
  assert np.median(corners) < 64


def test_colour_and_other_sizes():
  config = procedural.ProceduralConfig(image_shape=(32, 24, 3))
  images = np.asarray(procedural.generate(jax.random.key(2), 4, config))
  chex.assert_shape(images, (4, 32, 24, 3))


def test_chunked_matches_shape_and_is_deterministic():
  a = procedural.generate_chunked(jax.random.key(5), 10, _MNIST, chunk=4)
  b = procedural.generate_chunked(jax.random.key(5), 10, _MNIST, chunk=4)
  chex.assert_shape(a, (10, 28, 28, 1))
  np.testing.assert_array_equal(a, b)
  assert procedural.generate_chunked(jax.random.key(5), 0, _MNIST).shape == (0, 28, 28, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"image_shape": (28, 28)}, "image_shape"),
    ({"image_shape": (2, 2, 1)}, "at least 4"),
    ({"min_strokes": 3, "max_strokes": 2}, "min_strokes"),
    ({"max_blobs": -1}, "max_blobs"),
    ({"stroke_width": (3.0, 1.0)}, "stroke_width"),
    ({"margin": 0.5}, "margin"),
    ({"invert_probability": 1.5}, "invert_probability"),
    ({"pixel_noise": -0.1}, "pixel_noise"),
])
def test_config_errors(kwargs, match):
  kwargs = {"image_shape": (28, 28, 1), **kwargs}
  with pytest.raises(ValueError, match=match):
    procedural.ProceduralConfig(**kwargs)
