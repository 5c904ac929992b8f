"""Batches, normalization and augmentation.

Batch *selection* (`epoch_batches`, `iterate`, `poisson_batch`) runs on the host and returns
NumPy index arrays: datasets are small in-memory NumPy arrays and gathering on the host
avoids shipping the whole dataset to the device. The randomness still comes from explicit
`jax.random` keys so a run is reproducible from its root key. `normalize`, `denormalize`
and `augment` are pure and jittable.
"""

from __future__ import annotations

from collections.abc import Iterator
import functools
import types
from typing import Literal

import dm_pix as pix
import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax.data.arrays import ArrayDataset, DatasetInfo

ArrayLike = np.ndarray | jax.Array

# Jitted once per size: eager op-by-op dispatch of these samplers is slow on CPU.
_permutation = jax.jit(jax.random.permutation, static_argnums=1)
_bernoulli = jax.jit(jax.random.bernoulli, static_argnums=2)


def _check_key(key: jax.Array) -> None:
  """Requires a typed key from `jax.random.key` (house rule: no raw uint32 keys)."""
  if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
    raise ValueError(
        f"expected a typed PRNG key from jax.random.key, got "
        f"{getattr(key, 'dtype', type(key))}")
  if key.shape != ():
    raise ValueError(f"expected a single PRNG key (shape ()), got shape {key.shape}")


def _stats(x: ArrayLike, info: DatasetInfo,
           xp: types.ModuleType) -> tuple[ArrayLike, ArrayLike]:
  """Checks the channel count and returns (mean, std), each (C,) float32, as `xp` arrays."""
  if x.shape[-1] != len(info.mean):
    raise ValueError(
        f"{info.name}: last axis must hold {len(info.mean)} channels, got shape {x.shape}")
  return xp.asarray(info.mean, xp.float32), xp.asarray(info.std, xp.float32)  # (C,), (C,)


def normalize(images: ArrayLike, info: DatasetInfo) -> ArrayLike:
  """Maps uint8 pixels to float32 `(x / 255 - mean) / std`, per channel.

  NumPy in gives NumPy out (host-side pipelines stay off the device); a JAX array or tracer
  in gives a JAX array out, so this is jittable.

  Args:
    images: (..., C) uint8 (or float in [0, 255]) pixels.
    info: the dataset's `DatasetInfo` (supplies the per-channel mean and std).

  Returns:
    (..., C) float32 normalized images.
  """
  xp = np if isinstance(images, np.ndarray) else jnp
  mean, std = _stats(images, info, xp)
  return (xp.asarray(images, xp.float32) / 255.0 - mean) / std


def model_inputs(images: ArrayLike, info: DatasetInfo) -> ArrayLike:
  """What a model reads: uint8 pixels normalized (`normalize`), float32 features unchanged.

  Training steps and `train.evaluate` call this, so they take an `ArrayDataset` (pixels) or a
  `FeatureDataset` (precomputed features, e.g. ScatterNet's) alike; the dtype is static under
  jit, so each compiles one branch.
  """
  if images.dtype == np.uint8:
    return normalize(images, info)
  if images.dtype != np.float32:
    raise ValueError(f"model inputs must be uint8 pixels or float32 features, got {images.dtype}")
  return images


def denormalize(x: ArrayLike, info: DatasetInfo) -> ArrayLike:
  """Inverse of `normalize`, back to [0, 1] floats for image grids.

  Values are clipped to [0, 1]: generator outputs may leave the data range and image grids
  expect valid intensities. For images that came from `normalize` the clip is a no-op.

  Args:
    x: (..., C) normalized float images (NumPy or JAX).
    info: the dataset's `DatasetInfo`.

  Returns:
    (..., C) float32 images in [0, 1].
  """
  xp = np if isinstance(x, np.ndarray) else jnp
  mean, std = _stats(x, info, xp)
  return xp.clip(xp.asarray(x, xp.float32) * std + mean, 0.0, 1.0)


def epoch_batches(
    key: jax.Array,
    num_examples: int,
    batch_size: int,
    *,
    drop_remainder: bool = True,
) -> Iterator[np.ndarray]:
  """Yields the index batches of one epoch over a random permutation.

  Args:
    key: typed PRNG key; it fixes the permutation of this epoch.
    num_examples: N, the number of records.
    batch_size: B, indices per batch.
    drop_remainder: if True drop the last N % B indices so every batch has exactly B rows
      (fixed shapes, no recompilation); if False the last batch may be smaller.

  Yields:
    (B,) int32 NumPy index arrays; each index appears at most once per epoch (exactly once
    when `drop_remainder` is False or B divides N).

  Raises:
    ValueError: bad key or sizes, or an epoch that would have no batch at all.
  """
  _check_key(key)
  if num_examples < 1 or batch_size < 1:
    raise ValueError(f"num_examples and batch_size must be >= 1, got {num_examples} and "
                     f"{batch_size}")
  if drop_remainder and batch_size > num_examples:
    raise ValueError(f"batch_size={batch_size} exceeds num_examples={num_examples} with "
                     "drop_remainder=True: the epoch would be empty")
  permutation = np.asarray(_permutation(key, num_examples), np.int32)  # (N,)
  stop = num_examples - num_examples % batch_size if drop_remainder else num_examples
  for start in range(0, stop, batch_size):
    yield permutation[start:start + batch_size]


def iterate(
    key: jax.Array,
    dataset: ArrayDataset,
    batch_size: int,
    *,
    num_epochs: int,
    drop_remainder: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields shuffled `(images, labels)` batches for `num_epochs` epochs.

  Epoch e is shuffled with `jax.random.fold_in(key, e)`, so epochs differ and any epoch can
  be reproduced on its own.

  Args:
    key: typed PRNG key for the whole run.
    dataset: the `ArrayDataset` to iterate over.
    batch_size: B, rows per batch.
    num_epochs: number of passes over the data, >= 1.
    drop_remainder: see `epoch_batches`.

  Yields:
    images (B, H, W, C) uint8 and labels (B,) int32, as NumPy arrays.
  """
  _check_key(key)
  if num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
  for epoch in range(num_epochs):
    for indices in epoch_batches(jax.random.fold_in(key, epoch), len(dataset), batch_size,
                                 drop_remainder=drop_remainder):
      yield dataset.images[indices], dataset.labels[indices]


def poisson_batch(
    key: jax.Array,
    num_examples: int,
    sampling_rate: float,
    *,
    max_batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
  """Poisson subsampling for DP-SGD, padded to a fixed size so the train step compiles once.

  Every record is included independently with probability q = `sampling_rate`, the
  sampling scheme that DP-SGD privacy accounting (`dp_accounting` Poisson events) assumes.
  The batch size is Binomial(N, q); it is padded to `max_batch_size` rows, and `mask`
  marks the real ones (padded rows point at record 0 and must be zero-weighted).

  The sample is never truncated (that would break the accounting): a sample larger than
  `max_batch_size` raises instead. Choose `max_batch_size` so overflow is negligible, e.g.
  with `suggested_max_batch_size`.

  Args:
    key: typed PRNG key for this step's sample.
    num_examples: N, the number of records.
    sampling_rate: q in (0, 1].
    max_batch_size: padded batch size M >= 1.

  Returns:
    indices (M,) int32 and mask (M,) bool, NumPy arrays; real rows come first.

  Raises:
    ValueError: on bad arguments, or if the sample has more than M records.
  """
  _check_key(key)
  if num_examples < 1 or max_batch_size < 1:
    raise ValueError(f"num_examples and max_batch_size must be >= 1, got {num_examples} "
                     f"and {max_batch_size}")
  if not 0.0 < sampling_rate <= 1.0:
    raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
  included = np.asarray(_bernoulli(key, sampling_rate, (num_examples,)))  # (N,)
  sampled = np.flatnonzero(included).astype(np.int32)
  if sampled.size > max_batch_size:
    raise ValueError(
        f"Poisson sample of {sampled.size} records overflows max_batch_size="
        f"{max_batch_size} (N={num_examples}, q={sampling_rate}); raise max_batch_size so "
        "that overflow is negligible (see suggested_max_batch_size)")
  indices = np.zeros((max_batch_size,), np.int32)
  indices[:sampled.size] = sampled
  mask = np.arange(max_batch_size) < sampled.size
  return indices, mask


def suggested_max_batch_size(num_examples: int, sampling_rate: float, *,
                             overflow_probability: float = 1e-9) -> int:
  """Smallest M with P(Binomial(N, q) > M) <= `overflow_probability`."""
  if not 0.0 < overflow_probability < 1.0:
    raise ValueError(f"overflow_probability must be in (0, 1), got {overflow_probability!r}")
  from scipy import stats  # Deferred: scipy is only needed here.

  return max(1, int(stats.binom.isf(overflow_probability, num_examples, sampling_rate)))


@functools.partial(jax.jit, static_argnames=("pad", "flip", "pad_mode"))
def augment(
    key: jax.Array,
    images: jax.Array,
    *,
    pad: int = 4,
    flip: bool = True,
    pad_mode: Literal["reflect", "constant"] = "reflect",
) -> jax.Array:
  """Random crop after padding plus random horizontal flip (dm-pix), one key per image.

  The standard CIFAR/SVHN augmentation for 32x32 colour images. Leave it off for digits
  and MNIST-like sets (a flipped digit is a different or invalid digit). Already jitted
  (eager vmap of dm-pix's per-image ops is very slow); `pad`, `flip`, `pad_mode` are static.

  Args:
    key: typed PRNG key for this batch.
    images: (B, H, W, C) images of any dtype.
    pad: pixels of padding on each side of H and W before the H x W crop (0: no crop).
    flip: if True flip each image left-right with probability 1/2.
    pad_mode: "reflect" (mirror without repeating the edge) or "constant" (zeros).

  Returns:
    (B, H, W, C) augmented images, same dtype as `images`.
  """
  _check_key(key)
  if images.ndim != 4:
    raise ValueError(f"images must be (B, H, W, C), got shape {images.shape}")
  if pad < 0 or pad_mode not in ("reflect", "constant"):
    raise ValueError(f"need pad >= 0 and pad_mode in ('reflect', 'constant'), got pad={pad} "
                     f"pad_mode={pad_mode!r}")
  height, width, channels = images.shape[1:]
  padded = jnp.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode=pad_mode)

  def one_image(image_key: jax.Array, image: jax.Array) -> jax.Array:
    crop_key, flip_key = jax.random.split(image_key)
    image = pix.random_crop(crop_key, image, (height, width, channels))
    if flip:
      image = pix.random_flip_left_right(flip_key, image)
    return image

  image_keys = jax.random.split(key, images.shape[0])  # (B,) keys
  return jax.vmap(one_image)(image_keys, padded)


def random_translate(key: jax.Array, images: jax.Array, max_shift: int) -> jax.Array:
  """Random translation by up to `max_shift` pixels, one offset per image, zero fill.

  A cheap alternative to `augment` for digit-like data (no flip, no reflection padding):
  the (B, H, W, C) batch is zero-padded by `max_shift` and each image cropped back to H x W at
  an offset drawn from `key` (one (B, 2) draw; vmappable over an ensemble axis).

  Args:
    key: typed PRNG key for this batch.
    images: (B, H, W, C) images of any dtype.
    max_shift: largest translation in pixels along each axis (>= 0).

  Returns:
    (B, H, W, C) translated images, same dtype as `images`.
  """
  if images.ndim != 4 or max_shift < 0:
    raise ValueError(f"need (B, H, W, C) images and max_shift >= 0, got shape {images.shape} "
                     f"and max_shift={max_shift}")
  height, width = images.shape[1:3]
  padded = jnp.pad(images, ((0, 0), (max_shift, max_shift), (max_shift, max_shift), (0, 0)))
  offsets = jax.random.randint(key, (images.shape[0], 2), 0, 2 * max_shift + 1)
  return jax.vmap(lambda im, o: jax.lax.dynamic_slice(
      im, (o[0], o[1], 0), (height, width, im.shape[-1])))(padded, offsets)
