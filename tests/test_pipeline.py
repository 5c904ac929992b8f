"""Tests for dpkd_jax.data.pipeline: normalization, batching, Poisson sampling, augment."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpkd_jax.data import pipeline
from dpkd_jax.data import sources

MNIST = sources.DATASETS["mnist"]
CIFAR10 = sources.DATASETS["cifar10"]


def _uint8_images(seed: int, shape) -> np.ndarray:
  # Test inputs only (not privacy randomness): NumPy avoids a compile per shape.
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _indexed_dataset(num: int) -> sources.ArrayDataset:
  """Record i has every pixel equal to i (num <= 256) and label i % 10."""
  images = np.broadcast_to(
      np.arange(num, dtype=np.uint8)[:, None, None, None], (num, 28, 28, 1)).copy()
  labels = (np.arange(num) % 10).astype(np.int32)
  return sources.ArrayDataset(images=images, labels=labels, info=MNIST)


# ------------------------------------------------------------------------ normalization


@pytest.mark.parametrize("info,shape", [(MNIST, (4, 28, 28, 1)), (CIFAR10, (4, 32, 32, 3))])
def test_normalize_values_and_round_trip(info, shape):
  images = _uint8_images(0, shape)
  normalized = pipeline.normalize(images, info)
  assert isinstance(normalized, np.ndarray) and normalized.dtype == np.float32
  expected = (images / 255.0 - np.array(info.mean)) / np.array(info.std)
  np.testing.assert_allclose(normalized, expected, rtol=1e-5, atol=1e-5)
  restored = pipeline.denormalize(normalized, info)
  np.testing.assert_allclose(restored, images / 255.0, atol=1e-6)


@pytest.mark.parametrize("info,shape", [(MNIST, (2, 28, 28, 1)), (CIFAR10, (2, 32, 32, 3))])
def test_normalize_jax_and_jit_agree_with_numpy(info, shape):
  images = _uint8_images(1, shape)
  jitted = jax.jit(pipeline.normalize, static_argnums=1)(jnp.asarray(images), info)
  assert isinstance(jitted, jax.Array) and jitted.dtype == jnp.float32
  np.testing.assert_allclose(jitted, pipeline.normalize(images, info), atol=1e-6)
  restored = jax.jit(pipeline.denormalize, static_argnums=1)(jitted, info)
  np.testing.assert_allclose(restored, images / 255.0, atol=1e-6)


def test_denormalize_clips_to_unit_range():
  x = np.array([[-100.0], [100.0]], np.float32)  # (2, 1) far outside the data range
  np.testing.assert_array_equal(pipeline.denormalize(x, MNIST), [[0.0], [1.0]])


def test_normalize_rejects_wrong_channel_count():
  with pytest.raises(ValueError, match="3 channels"):
    pipeline.normalize(np.zeros((1, 32, 32, 1), np.uint8), CIFAR10)


# ------------------------------------------------------------------------------ batching


def test_epoch_batches_every_index_once():
  batches = list(pipeline.epoch_batches(jax.random.key(0), 103, 10, drop_remainder=False))
  assert [len(b) for b in batches] == [10] * 10 + [3]
  np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.arange(103))
  assert batches[0].dtype == np.int32


def test_epoch_batches_drop_remainder():
  batches = list(pipeline.epoch_batches(jax.random.key(0), 103, 10))
  assert [len(b) for b in batches] == [10] * 10
  flat = np.concatenate(batches)
  assert len(np.unique(flat)) == 100 and flat.min() >= 0 and flat.max() < 103


def test_epoch_batches_deterministic_per_key():
  first = np.concatenate(list(pipeline.epoch_batches(jax.random.key(3), 50, 5)))
  second = np.concatenate(list(pipeline.epoch_batches(jax.random.key(3), 50, 5)))
  other = np.concatenate(list(pipeline.epoch_batches(jax.random.key(4), 50, 5)))
  np.testing.assert_array_equal(first, second)
  assert not np.array_equal(first, other)


@pytest.mark.parametrize("key,num,batch,match", [
    (jax.random.PRNGKey(0), 10, 2, "typed PRNG key"),  # legacy raw uint32 key
    (jax.random.split(jax.random.key(0), 2), 10, 2, "single PRNG key"),
    (jax.random.key(0), 10, 0, "batch_size"),
    (jax.random.key(0), 5, 8, "epoch would be empty"),
])
def test_epoch_batches_rejects_bad_input(key, num, batch, match):
  with pytest.raises(ValueError, match=match):
    next(pipeline.epoch_batches(key, num, batch))


def test_iterate_epochs_differ_and_labels_follow_images():
  dataset = _indexed_dataset(40)
  batches = list(pipeline.iterate(jax.random.key(0), dataset, 8, num_epochs=2))
  assert len(batches) == 10
  for images, labels in batches:
    chex.assert_shape(images, (8, 28, 28, 1))
    np.testing.assert_array_equal(labels, images[:, 0, 0, 0] % 10)
  epoch_orders = [np.concatenate([im[:, 0, 0, 0] for im, _ in batches[e * 5:(e + 1) * 5]])
                  for e in range(2)]
  for order in epoch_orders:
    np.testing.assert_array_equal(np.sort(order), np.arange(40))
  assert not np.array_equal(epoch_orders[0], epoch_orders[1])
  # Epoch e uses fold_in(key, e), so it can be reproduced on its own.
  epoch1 = np.concatenate(list(pipeline.epoch_batches(
      jax.random.fold_in(jax.random.key(0), 1), 40, 8)))
  np.testing.assert_array_equal(epoch1, epoch_orders[1])
  again = list(pipeline.iterate(jax.random.key(0), dataset, 8, num_epochs=2))
  for (a, _), (b, _) in zip(batches, again):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="num_epochs"):
    next(pipeline.iterate(jax.random.key(0), dataset, 8, num_epochs=0))


# ---------------------------------------------------------------------- Poisson sampling


def test_poisson_batch_mean_size_and_mask():
  num, rate, max_size, draws = 1000, 0.05, 100, 200
  root = jax.random.key(0)
  sizes = []
  for draw in range(draws):
    indices, mask = pipeline.poisson_batch(jax.random.fold_in(root, draw), num, rate,
                                           max_batch_size=max_size)
    chex.assert_shape([indices, mask], (max_size,))
    assert indices.dtype == np.int32 and mask.dtype == np.bool_
    size = int(mask.sum())
    np.testing.assert_array_equal(mask, np.arange(max_size) < size)  # real rows first
    real = indices[:size]
    assert np.all(np.diff(real) > 0) and real.min() >= 0 and real.max() < num
    assert not indices[size:].any()  # padding points at record 0
    sizes.append(size)
  # Mean of 200 Binomial(1000, 0.05) sizes: expectation 50, std 0.49; 5 sigma = 2.45.
  assert abs(np.mean(sizes) - num * rate) < 2.45
  assert np.std(sizes) > 0  # sizes really vary (Poisson, not fixed-size sampling)


def test_poisson_batch_deterministic_per_key():
  a = pipeline.poisson_batch(jax.random.key(5), 500, 0.1, max_batch_size=120)
  b = pipeline.poisson_batch(jax.random.key(5), 500, 0.1, max_batch_size=120)
  c = pipeline.poisson_batch(jax.random.key(6), 500, 0.1, max_batch_size=120)
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.array_equal(a[0], c[0])


def test_poisson_batch_overflow_raises():
  with pytest.raises(ValueError, match="overflows max_batch_size=5"):
    pipeline.poisson_batch(jax.random.key(0), 10, 1.0, max_batch_size=5)
  with pytest.raises(ValueError, match="sampling_rate"):
    pipeline.poisson_batch(jax.random.key(0), 10, 0.0, max_batch_size=5)


@pytest.mark.parametrize("num,rate", [(60000, 256 / 60000), (1000, 0.5)])
def test_suggested_max_batch_size(num, rate):
  size = pipeline.suggested_max_batch_size(num, rate, overflow_probability=1e-9)
  assert size > num * rate
  assert stats.binom.sf(size, num, rate) <= 1e-9
  assert stats.binom.sf(size - 1, num, rate) > 1e-9  # smallest such size


# ---------------------------------------------------------------------------- augment


def test_augment_shape_dtype_jit_and_determinism():
  images = jnp.asarray(_uint8_images(0, (6, 32, 32, 3)))
  key = jax.random.key(1)
  eager = pipeline.augment(key, images)
  chex.assert_shape(eager, images.shape)
  chex.assert_type(eager, jnp.uint8)
  # Inside a caller's jit (e.g. a train step) it gives the same result.
  chex.assert_trees_all_equal(eager, jax.jit(pipeline.augment)(key, images))
  chex.assert_trees_all_equal(eager, pipeline.augment(key, images))
  assert not np.array_equal(eager, pipeline.augment(jax.random.key(2), images))
  as_float = pipeline.augment(key, images.astype(jnp.float32))
  chex.assert_type(as_float, jnp.float32)
  # Same key, same crops and flips, whatever the dtype.
  np.testing.assert_array_equal(as_float, np.asarray(eager, np.float32))


def test_augment_flip_only_flips_some_images():
  images = jnp.asarray(_uint8_images(0, (16, 8, 8, 3)))
  out = np.asarray(pipeline.augment(jax.random.key(3), images, pad=0, flip=True))
  flipped = np.array([np.array_equal(o, np.asarray(i)[:, ::-1]) for o, i in zip(out, images)])
  unchanged = np.array([np.array_equal(o, np.asarray(i)) for o, i in zip(out, images)])
  assert np.all(flipped | unchanged)
  # With 16 independent fair flips, all-same has probability 2^-15 (and the key is fixed).
  assert flipped.any() and unchanged.any()


@pytest.mark.parametrize("pad_mode", ["constant", "reflect"])
def test_augment_crop_is_window_of_padded_image(pad_mode):
  pad = 4
  images = jnp.asarray(_uint8_images(0, (8, 12, 12, 3)))
  out = np.asarray(pipeline.augment(jax.random.key(4), images, pad=pad, flip=False,
                                    pad_mode=pad_mode))
  padded = np.pad(np.asarray(images), ((0, 0), (pad, pad), (pad, pad), (0, 0)),
                  mode=pad_mode)
  offsets = []
  for o, p in zip(out, padded):
    matches = [(dy, dx) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
               if np.array_equal(o, p[dy:dy + 12, dx:dx + 12])]
    assert matches, "augmented image is not a crop of the padded image"
    offsets.append(matches[0])
  assert len(set(offsets)) > 1  # crops really are random


def test_augment_rejects_bad_input():
  with pytest.raises(ValueError, match="B, H, W, C"):
    pipeline.augment(jax.random.key(0), jnp.zeros((32, 32, 3)))
  with pytest.raises(ValueError, match="pad_mode"):
    pipeline.augment(jax.random.key(0), jnp.zeros((1, 8, 8, 3)), pad_mode="wrap")


def test_random_translate_is_a_zero_filled_shift_per_image():
  images = jnp.arange(2 * 6 * 6, dtype=jnp.float32).reshape(2, 6, 6, 1) + 1.0  # no zeros
  np.testing.assert_array_equal(pipeline.random_translate(jax.random.key(0), images, 0), images)
  out = np.asarray(pipeline.random_translate(jax.random.key(1), images, 2))
  assert out.shape == images.shape
  for original, shifted in zip(np.asarray(images), out):
    matches = []
    for dy in range(-2, 3):
      for dx in range(-2, 3):
        padded = np.pad(original, ((2, 2), (2, 2), (0, 0)))
        candidate = padded[2 + dy:2 + dy + 6, 2 + dx:2 + dx + 6]
        matches.append(np.array_equal(candidate, shifted))
    assert sum(matches) == 1  # exactly one translation within ±2 explains each image
  with pytest.raises(ValueError, match="max_shift >= 0"):
    pipeline.random_translate(jax.random.key(0), images, -1)
  with pytest.raises(ValueError, match="B, H, W, C"):
    pipeline.random_translate(jax.random.key(0), images[0], 1)
