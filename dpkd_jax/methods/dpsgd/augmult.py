"""Augmentation multiplicity (De et al. 2022) for DP-SGD on ScatterNet features (`--augmult`).

Each training record is seen as V views: view 0 is the image itself, views 1 .. V − 1 are
copies of it translated by (dy, dx) in [−s, s]² pixels (s = `augmult_max_shift`), zero-filled
(the uint8 background), each put through the ScatterNet transform. The record's gradient is the
mean of its loss gradients over its V views, taken BEFORE the per-example clipping
(`step.per_example_gradients`): one record still contributes one vector of norm <= C to the
noisy sum, so the sensitivity, σ, the events and ε are those of the same run without views.

The shifts are drawn once per (record, view) from numpy's `default_rng` seeded with (the run's
root seed, `SHIFT_TAG`): they read no data, so they cost no privacy (they are as public, or as
secret, as the seed), and a resumed run redraws the same ones. The features of all views are
computed once before training, as those of the images are (`run.featurized`): (N, V, h, w, F)
float32, V times the memory of the unaugmented features. Validation and test read the
unshifted images only.
"""

from __future__ import annotations

import numpy as np

from dpkd_jax import data
from dpkd_jax.representations import scatternet

# Mixed into the seed of the shift generator, so that its stream is not that of another
# numpy generator seeded with the root seed alone ("aug").
SHIFT_TAG = 0x617567


def view_shifts(num_examples: int, views: int, max_shift: int, seed: int) -> np.ndarray:
  """The (dy, dx) pixel translation of each view of each record, data-independent.

  Args:
    num_examples: N, the records (in the order of the training split).
    views: V >= 1.
    max_shift: s >= 0; each coordinate uniform in [−s, s].
    seed: the run's root seed (an integer in [0, 2**64)).

  Returns:
    (N, V, 2) int32 shifts; view 0's are (0, 0) (the record itself).
  """
  rng = np.random.default_rng([seed, SHIFT_TAG])
  shifts = rng.integers(-max_shift, max_shift + 1, size=(num_examples, views, 2))
  shifts[:, 0] = 0
  return shifts.astype(np.int32)


def shift_images(images: np.ndarray, shifts: np.ndarray) -> np.ndarray:
  """Each image translated by its shift, zero-filled: out[i, y, x] = images[i, y − dy, x − dx].

  Args:
    images: (N, H, W, C) uint8 images.
    shifts: (N, 2) integer (dy, dx), |dy| < H, |dx| < W.

  Returns:
    (N, H, W, C) uint8 shifted images.
  """
  height, width = images.shape[1:3]
  pad = int(np.abs(shifts).max(initial=0))
  padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  out = np.empty_like(images)
  # One slice per distinct shift ((2 s + 1)² at most), not one per image.
  for dy, dx in np.unique(shifts, axis=0):
    rows = np.flatnonzero((shifts == (dy, dx)).all(axis=1))
    out[rows] = padded[rows, pad - dy:pad - dy + height, pad - dx:pad - dx + width]
  return out


def augmented_features(dataset: data.ArrayDataset, *, views: int, max_shift: int,
                       seed: int) -> data.FeatureDataset:
  """The ScatterNet features of the V views of every record (`view_shifts`).

  Computed one view at a time into one preallocated array, so the peak memory is that array
  plus one view's features, not two copies of all of them.

  Args:
    dataset: (N, H, W, C) uint8 training images and their labels.
    views, max_shift, seed: as for `view_shifts`.

  Returns:
    A `FeatureDataset` of (N, V, h, w, F) float32 features (view 0: the unshifted images'),
    with the dataset's labels.
  """
  config = scatternet.ScatterNetConfig()
  shape = config.output_shape(tuple(dataset.images.shape[1:]))
  shifts = view_shifts(len(dataset), views, max_shift, seed)
  out = np.empty((len(dataset), views, *shape), np.float32)
  for view in range(views):
    images = dataset.images if view == 0 else shift_images(dataset.images, shifts[:, view])
    out[:, view] = scatternet.features(images, dataset.info, config)
  return data.FeatureDataset(images=out, labels=dataset.labels, info=dataset.info)
