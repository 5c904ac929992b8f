"""In-memory datasets: `DatasetInfo` (static facts) and `ArrayDataset` (images + labels).

Kept apart from `sources` (where arrays come from) and `splits` (how they are partitioned),
which both use these types, so neither needs to import the other's module for them.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetInfo:
  """Static facts about a dataset.

  Attributes:
    name: registry name (also the `.npz` stem and the tfds name).
    image_shape: (H, W, C) of one image.
    num_classes: number of classes; labels are in [0, num_classes).
    mean: (C,) per-channel mean of pixels / 255 over the train split.
    std: (C,) per-channel standard deviation of pixels / 255 over the train split.
    class_names: `num_classes` human-readable class names, index = label.
    flip_invariant: a left-right mirrored image keeps its label (clothes, objects), so random
      horizontal flips are a valid augmentation; False for digits and house numbers.
  """

  name: str
  image_shape: tuple[int, int, int]
  num_classes: int
  mean: tuple[float, ...]
  std: tuple[float, ...]
  class_names: tuple[str, ...]
  flip_invariant: bool = False

  def __post_init__(self):
    for field in ("image_shape", "mean", "std", "class_names"):
      if not isinstance(getattr(self, field), tuple):
        # Tuples keep DatasetInfo hashable, so it can be a static argument of jax.jit.
        raise ValueError(f"{self.name}: {field} must be a tuple, got {getattr(self, field)!r}")
    if len(self.image_shape) != 3 or min(self.image_shape) < 1:
      raise ValueError(f"{self.name}: image_shape must be (H, W, C) > 0, got {self.image_shape}")
    channels = self.image_shape[2]
    if len(self.mean) != channels or len(self.std) != channels:
      raise ValueError(
          f"{self.name}: mean {self.mean} and std {self.std} need {channels} channel values")
    if min(self.std) <= 0:
      raise ValueError(f"{self.name}: std must be positive, got {self.std}")
    if self.num_classes < 2 or len(self.class_names) != self.num_classes:
      raise ValueError(
          f"{self.name}: need num_classes >= 2 names, got num_classes={self.num_classes} "
          f"and {len(self.class_names)} class_names")


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ArrayDataset:
  """An in-memory labelled image dataset.

  Attributes:
    images: (N, H, W, C) uint8 pixels, (H, W, C) == info.image_shape.
    labels: (N,) int32 labels in [0, info.num_classes).
    info: the dataset's `DatasetInfo`.
  """

  images: np.ndarray
  labels: np.ndarray
  info: DatasetInfo

  def __post_init__(self):
    check_arrays(self.images, self.labels, self.info, where=f"ArrayDataset({self.info.name})")
    if self.labels.dtype != np.int32:
      raise ValueError(
          f"ArrayDataset({self.info.name}): labels must be int32, got {self.labels.dtype}")

  def __len__(self) -> int:
    return int(self.labels.shape[0])

  def subset(self, indices: np.ndarray) -> ArrayDataset:
    """Returns the records at `indices` ((M,) integer array), in that order."""
    indices = np.asarray(indices)
    if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
      raise ValueError(
          f"subset indices must be a 1-D integer array, got shape {indices.shape} "
          f"dtype {indices.dtype}")
    return ArrayDataset(images=self.images[indices], labels=self.labels[indices],
                        info=self.info)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class FeatureDataset:
  """A labelled dataset whose inputs are precomputed float32 features, not pixels.

  The same interface as `ArrayDataset` (`images`, `labels`, `info`, `len`, `subset`), so
  training loops and `train.evaluate` take either: `pipeline.model_inputs` normalizes uint8
  pixels and passes float32 features through unchanged.

  Attributes:
    images: (N, *feature_shape) float32 model inputs (e.g. ScatterNet features).
    labels: (N,) int32 labels in [0, info.num_classes).
    info: the dataset the features were computed from.
  """

  images: np.ndarray
  labels: np.ndarray
  info: DatasetInfo

  def __post_init__(self):
    where = f"FeatureDataset({self.info.name})"
    if not isinstance(self.images, np.ndarray) or self.images.dtype != np.float32:
      raise ValueError(f"{where}: features must be a float32 array, got "
                       f"{getattr(self.images, 'dtype', type(self.images))}")
    if self.labels.dtype != np.int32 or self.labels.shape != self.images.shape[:1]:
      raise ValueError(f"{where}: labels must be int32 of shape ({len(self.images)},), got "
                       f"{self.labels.dtype} {self.labels.shape}")

  def __len__(self) -> int:
    return int(self.labels.shape[0])

  def subset(self, indices: np.ndarray) -> FeatureDataset:
    """Returns the records at `indices` ((M,) integer array), in that order."""
    return FeatureDataset(images=self.images[indices], labels=self.labels[indices],
                          info=self.info)


def check_arrays(images: np.ndarray, labels: np.ndarray, info: DatasetInfo, *,
                 where: str) -> None:
  """Raises ValueError (prefixed by `where`) unless images/labels fit `info`."""
  if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
    raise ValueError(f"{where}: images must be a uint8 array, got "
                     f"{getattr(images, 'dtype', type(images))}")
  if images.ndim != 4 or images.shape[1:] != info.image_shape:
    raise ValueError(f"{where}: images must have shape (N, {', '.join(map(str, info.image_shape))})"
                     f", got {images.shape}")
  if (not isinstance(labels, np.ndarray) or labels.ndim != 1
      or not np.issubdtype(labels.dtype, np.integer)):
    raise ValueError(f"{where}: labels must be a 1-D integer array, got "
                     f"{getattr(labels, 'shape', type(labels))} "
                     f"{getattr(labels, 'dtype', '')}")
  if labels.shape[0] != images.shape[0]:
    raise ValueError(f"{where}: {images.shape[0]} images but {labels.shape[0]} labels")
  if labels.size and (labels.min() < 0 or labels.max() >= info.num_classes):
    raise ValueError(f"{where}: labels must be in [0, {info.num_classes}), found range "
                     f"[{labels.min()}, {labels.max()}]")
