"""Where images come from: embedded digits, local `.npz` files, or tensorflow-datasets.

`load(name, split)` tries, in order:

1. `digits` only: built in from scikit-learn's `load_digits` (1,797 8x8 images, works
   offline anywhere). Values 0..16 are scaled to 0..255, upsampled 3x **bilinearly**
   (half-pixel centres, edges clamped; equal to `jax.image.resize(..., "linear")`) to
   24x24, rounded to uint8 and zero-padded by 2 px to 28x28x1, so MNIST-sized models run
   unchanged. Split: stratified, 20% of each class to test, seed 0 ->
   1,442 train / 355 test images (per class: floor(0.2 * class size) to test).
2. `<dir>/<name>.npz` with keys `x_train, y_train, x_test, y_test` (uint8, NHWC images,
   integer labels), where `<dir>` is the `data_dir` argument or else the `DPKD_DATA_DIR`
   environment variable. A named directory that does not exist is an error.
3. `tfds.data_source(name, split=...)` (random access to ArrayRecord files, no TensorFlow
   needed), reading every record into NumPy arrays. tfds looks in its own data dir
   (`TFDS_DATA_DIR` or `~/tensorflow_datasets`) first without touching the network. Only with
   `download=True`, and only after a TCP connection to the tfds download host opened within
   `NETWORK_TIMEOUT_S` seconds, does it download: an offline machine fails in seconds instead
   of hanging in download retries.

Every "not found" is a `DataNotFoundError` (a `UserError`): one line naming each place looked
in and how to provide the file. A corrupt or malformed `.npz` is a `UserError` naming the file.

Loaded arrays are cached per (name, split, source) for the life of the process and are
read-only, so repeated calls are cheap and callers cannot corrupt the cache.
"""

from __future__ import annotations

import os
from pathlib import Path
import zipfile
import zlib

import numpy as np

from dpkd_jax import errors
from dpkd_jax.data import splits
# Re-exported: `sources.ArrayDataset` / `sources.DatasetInfo` are public names.
from dpkd_jax.data.arrays import ArrayDataset
from dpkd_jax.data.arrays import check_arrays
from dpkd_jax.data.arrays import DatasetInfo
from dpkd_jax.data import tfds_source

DATA_DIR_ENV_VAR = "DPKD_DATA_DIR"
SPLITS = ("train", "test")
# Embedded digits split: fraction of each class held out for test, and its seed.
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


class DataNotFoundError(errors.UserError, FileNotFoundError):
  """No source could provide the requested dataset (a user error: one line, exit 2)."""


_DIGIT_NAMES = tuple(str(d) for d in range(10))
_CIFAR100_NAMES = tuple("""
    apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house
    kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle
    mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree
    plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew
    skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank
    telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree
    wolf woman worm""".split())

# mean/std: digits measured on the embedded train split (tests recompute them); MNIST and
# Fashion-MNIST measured on ../shared/data (equal to the published values); CIFAR-10,
# CIFAR-100 and SVHN are the commonly published train-split values (not re-measured here).
DATASETS: dict[str, DatasetInfo] = {
    info.name: info for info in (
        DatasetInfo(name="digits", image_shape=(28, 28, 1), num_classes=10,
                    mean=(0.2244,), std=(0.3139,), class_names=_DIGIT_NAMES),
        DatasetInfo(name="mnist", image_shape=(28, 28, 1), num_classes=10,
                    mean=(0.1307,), std=(0.3081,), class_names=_DIGIT_NAMES),
        DatasetInfo(name="fashion_mnist", image_shape=(28, 28, 1), num_classes=10,
                    mean=(0.2860,), std=(0.3530,),
                    class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                 "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
                    flip_invariant=True),
        DatasetInfo(name="cifar10", image_shape=(32, 32, 3), num_classes=10,
                    mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                    class_names=("airplane", "automobile", "bird", "cat", "deer", "dog",
                                 "frog", "horse", "ship", "truck"),
                    flip_invariant=True),
        DatasetInfo(name="svhn_cropped", image_shape=(32, 32, 3), num_classes=10,
                    mean=(0.4377, 0.4438, 0.4728), std=(0.1980, 0.2010, 0.1970),
                    class_names=_DIGIT_NAMES),
        DatasetInfo(name="cifar100", image_shape=(32, 32, 3), num_classes=100,
                    mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
                    class_names=_CIFAR100_NAMES, flip_invariant=True),
    )
}

# How each dataset's images were made before they reach a model, in words (the model card's).
PREPROCESSING = {
    "digits": "scikit-learn's 8x8 handwritten digits (values 0..16) scaled to 0..255, "
              "upsampled 3x bilinearly to 24x24, rounded to uint8 and zero-padded by 2 pixels "
              "on each side to 28x28x1",
    "mnist": "MNIST's 28x28 grayscale images as stored (uint8), unchanged",
    "fashion_mnist": "Fashion-MNIST's 28x28 grayscale images as stored (uint8), unchanged",
    "cifar10": "CIFAR-10's 32x32 RGB images as stored (uint8), unchanged",
    "svhn_cropped": "SVHN's cropped 32x32 RGB digits as stored (uint8), unchanged",
    "cifar100": "CIFAR-100's 32x32 RGB images as stored (uint8), unchanged",
}


def _read_only(images: np.ndarray, labels: np.ndarray,
               info: DatasetInfo) -> ArrayDataset:
  images.setflags(write=False)
  labels.setflags(write=False)
  return ArrayDataset(images=images, labels=labels, info=info)


def _bilinear_matrix(in_size: int, scale: int) -> np.ndarray:
  """(in_size*scale, in_size) 1-D linear interpolation weights, half-pixel centres."""
  out_coords = (np.arange(in_size * scale) + 0.5) / scale - 0.5
  out_coords = np.clip(out_coords, 0.0, in_size - 1)  # Clamp: edge pixels are repeated.
  lower = np.floor(out_coords).astype(int)
  upper = np.minimum(lower + 1, in_size - 1)
  frac = out_coords - lower
  weights = np.zeros((in_size * scale, in_size))
  rows = np.arange(in_size * scale)
  np.add.at(weights, (rows, lower), 1.0 - frac)
  np.add.at(weights, (rows, upper), frac)
  return weights


def _embedded_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
  """Builds the 28x28x1 uint8 digits split from scikit-learn's bundled 8x8 digits."""
  from sklearn import datasets as sk_datasets  # Deferred: only digits needs scikit-learn.

  bunch = sk_datasets.load_digits()
  pixels = bunch.images * (255.0 / 16.0)  # (1797, 8, 8) float64 in [0, 255]
  interp = _bilinear_matrix(8, 3)  # (24, 8)
  upsampled = np.einsum("ph,nhw,qw->npq", interp, pixels, interp)  # (1797, 24, 24)
  images = np.rint(np.clip(upsampled, 0, 255)).astype(np.uint8)
  images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None]  # (1797, 28, 28, 1)
  labels = bunch.target.astype(np.int32)
  test = splits.stratified_partition(
      labels, {"test": DIGITS_TEST_FRACTION}, seed=DIGITS_SPLIT_SEED)["test"]
  is_test = np.zeros(labels.shape, bool)
  is_test[test] = True
  keep = is_test if split == "test" else ~is_test
  return images[keep], labels[keep]


def _read_npz(path: Path, split: str, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
  """Reads and validates one split from a `.npz` file; the UserError names file and problem."""
  image_key, label_key = f"x_{split}", f"y_{split}"
  try:
    with np.load(path, allow_pickle=False) as archive:
      missing = [key for key in (image_key, label_key) if key not in archive.files]
      if missing:
        raise errors.UserError(f"{path}: missing key(s) {missing}; found "
                               f"{sorted(archive.files)}; expected x_train, y_train, x_test, "
                               "y_test")
      images, labels = archive[image_key], archive[label_key]
  except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:
    raise errors.UserError(
        f"{path}: cannot read as .npz (corrupt or truncated?): {type(error).__name__}: {error}"
    ) from error
  except errors.UserError:
    raise
  except ValueError as error:  # e.g. not an archive at all (np.load then suspects a pickle)
    raise errors.UserError(f"{path}: cannot read as .npz (not a NumPy .npz archive?): "
                           f"{error}") from error
  try:
    check_arrays(images, labels, info, where=f"{path} [{image_key}, {label_key}]")
  except ValueError as error:
    raise errors.UserError(str(error)) from error
  _check_not_empty(len(labels), where=f"{path} [{image_key}, {label_key}]")
  return images, labels.astype(np.int32)


def _check_not_empty(count: int, *, where: str) -> None:
  """An empty split cannot be trained on or evaluated: refused when loaded, before any run
  charges its ledger (every CLI loads its splits first)."""
  if count == 0:
    raise errors.UserError(f"{where}: the split holds no examples; give a dataset with at "
                           "least one training and one test example")


_CACHE: dict[tuple, ArrayDataset] = {}


def clear_cache() -> None:
  """Forgets every cached dataset (e.g. after using `tfds.testing.mock_data`)."""
  _CACHE.clear()


def _resolve_data_dir(data_dir: str | os.PathLike | None) -> tuple[Path | None, str]:
  """Returns (directory or None, the flag or variable it came from)."""
  if data_dir is not None:
    return Path(data_dir), "--data_dir"
  from_env = os.environ.get(DATA_DIR_ENV_VAR)
  if from_env:
    return Path(from_env), f"${DATA_DIR_ENV_VAR}"
  return None, ""


def _no_directory(name: str, directory: Path, origin: str) -> DataNotFoundError:
  return DataNotFoundError(
      f"{origin} {str(directory)!r} does not exist or is not a directory (looking for "
      f"{name}.npz there); give a directory holding {name}.npz")


def _not_found(name: str, what: str, looked: str, why: str) -> DataNotFoundError:
  """The one line of a dataset no source has: where it was looked for, and how to provide it."""
  return DataNotFoundError(
      f"dataset {name!r} ({what}) not found: {looked}; {why}; give --data_dir=DIR "
      f"(or set ${DATA_DIR_ENV_VAR}=DIR) with DIR/{name}.npz holding arrays x_train, "
      "y_train, x_test, y_test (uint8 NHWC images, integer labels), or let "
      "tensorflow-datasets fetch it on a machine with internet (--download of "
      "experiments.teacher/dpsgd/rknn/rona)")


def check_available(name: str, *, data_dir: str | os.PathLike | None = None,
                    download: bool = False) -> None:
  """Raises the error `load` would for data no source has, without reading any: cheap, for a
  command to say first that its data is missing.

  Found: `digits`; `<data_dir>/<name>.npz` (a file, not yet validated); with `download`,
  anything (`load` tries); tensorflow-datasets' folder of `name` (`tfds_source.data_dir()`),
  taken as prepared: `load` reads it or says why not.

  Raises:
    UserError: an unknown name.
    DataNotFoundError: as `load`'s, for a named directory that does not exist or no source.
  """
  if name not in DATASETS:
    raise errors.UserError(f"unknown dataset {name!r}; known datasets: {sorted(DATASETS)}")
  if name == "digits" or download:
    return
  directory, origin = _resolve_data_dir(data_dir)
  if directory is not None:
    if not directory.is_dir():
      raise _no_directory(name, directory, origin)
    if (directory / f"{name}.npz").is_file():
      return
    looked = f"no {name}.npz in {str(directory)!r} ({origin})"
  else:
    looked = f"no --data_dir given and ${DATA_DIR_ENV_VAR} unset"
  if os.path.isdir(os.path.join(tfds_source.data_dir(), name)):
    return
  raise _not_found(name, "train and test splits", looked,
                   f"tensorflow-datasets has not prepared it in {tfds_source.data_dir()!r}")


def load(
    name: str,
    split: str = "train",
    *,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> ArrayDataset:
  """Loads one split of a dataset as read-only NumPy arrays.

  Args:
    name: one of `DATASETS` (digits, mnist, fashion_mnist, cifar10, svhn_cropped, cifar100).
    split: "train" or "test".
    data_dir: directory holding `<name>.npz`; defaults to `$DPKD_DATA_DIR`. Ignored for
      the embedded `digits`.
    download: if no local file or prepared tfds data is found, let tfds download and
      prepare the dataset, after a network check of at most
      `tfds_source.NETWORK_TIMEOUT_S` seconds. False (default) never touches the network.

  Returns:
    An `ArrayDataset` with read-only `images` (N, H, W, C) uint8 and `labels` (N,) int32.

  Raises:
    UserError: unknown name, or a local file that is corrupt, lacks keys or holds arrays of
      the wrong dtype/shape/label range (the message names the file).
    DataNotFoundError: a UserError: the named directory does not exist, or no source has
      the data (the message names every place looked in and how to provide the file).
    ValueError: unknown split (a caller's bug).
  """
  if name not in DATASETS:
    raise errors.UserError(f"unknown dataset {name!r}; known datasets: {sorted(DATASETS)}")
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r} for {name!r}; expected one of {SPLITS}")
  info = DATASETS[name]

  if name == "digits":
    key = (name, split, "embedded")
    if key not in _CACHE:
      _CACHE[key] = _read_only(*_embedded_digits(split), info)
    return _CACHE[key]

  directory, origin = _resolve_data_dir(data_dir)
  if directory is not None:
    if not directory.is_dir():
      raise _no_directory(name, directory, origin)
    path = (directory / f"{name}.npz").resolve()
    if path.is_file():
      stat = path.stat()
      # mtime and size in the key: a rewritten file is reloaded, not served stale.
      key = (name, split, str(path), stat.st_mtime_ns, stat.st_size)
      if key not in _CACHE:
        _CACHE[key] = _read_only(*_read_npz(path, split, info), info)
      return _CACHE[key]
    looked = f"no {name}.npz in {str(directory)!r} ({origin})"
  else:
    looked = f"no --data_dir given and ${DATA_DIR_ENV_VAR} unset"

  key = (name, split, "tensorflow_datasets")
  if key not in _CACHE:
    try:
      images, labels = tfds_source.read(name, split, download=download)
    except tfds_source.TfdsUnavailable as error:
      raise _not_found(name, f"{split} split", looked, str(error)) from error
    # Validated outside the try: a malformed tfds record is a ValueError, not "not found".
    check_arrays(images, labels, info, where=f"tensorflow-datasets {name}[{split}]")
    _check_not_empty(len(labels), where=f"tensorflow-datasets {name}[{split}]")
    _CACHE[key] = _read_only(images, labels.astype(np.int32), info)
  return _CACHE[key]
