"""Tests for dpkd_jax.data.sources: embedded digits, local .npz files, tfds, errors."""

import hashlib
from pathlib import Path

import chex
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from dpkd_jax.data import sources

# Real MNIST / Fashion-MNIST live in ../shared/data beside the repository (also on CI).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


pytestmark = pytest.mark.usefixtures("isolated_data_sources")


def _write_npz(path: Path, num: int = 6, label_value: int | None = None, **overrides):
  """Writes a small valid MNIST-shaped .npz, with any array replaced by `overrides`."""
  arrays = {
      "x_train": np.full((num, 28, 28, 1), 7, np.uint8),
      "y_train": np.arange(num, dtype=np.uint8) % 10,
      "x_test": np.full((num // 2, 28, 28, 1), 9, np.uint8),
      "y_test": np.arange(num // 2, dtype=np.uint8) % 10,
  }
  if label_value is not None:
    arrays["y_train"] = np.full((num,), label_value, np.uint8)
  arrays.update(overrides)
  np.savez_compressed(path, **{k: v for k, v in arrays.items() if v is not None})
  return arrays


# ----------------------------------------------------------------------------- registry


def test_registry_covers_all_datasets():
  assert set(sources.DATASETS) == {
      "digits", "mnist", "fashion_mnist", "cifar10", "svhn_cropped", "cifar100"}
  for name, info in sources.DATASETS.items():
    assert info.name == name
    assert len(info.class_names) == info.num_classes
  assert sources.DATASETS["cifar100"].num_classes == 100
  assert len(set(sources.DATASETS["cifar100"].class_names)) == 100


def test_fashion_mnist_class_names_match_tfds():
  names = tfds.builder("fashion_mnist").info.features["label"].names
  assert tuple(names) == sources.DATASETS["fashion_mnist"].class_names


@pytest.mark.parametrize("bad", [
    dict(mean=(0.5, 0.5)),  # 2 channel values for a 1-channel image
    dict(std=(0.0,)),
    dict(class_names=("a", "b")),
    dict(image_shape=(28, 28)),
    dict(mean=[0.5]),  # a list would make DatasetInfo unhashable as a static jit argument
])
def test_dataset_info_validation(bad):
  kwargs = dict(name="x", image_shape=(28, 28, 1), num_classes=10, mean=(0.5,), std=(0.5,),
                class_names=tuple("abcdefghij"))
  kwargs.update(bad)
  with pytest.raises(ValueError, match="x:"):
    sources.DatasetInfo(**kwargs)


def test_array_dataset_validation_and_subset():
  info = sources.DATASETS["digits"]
  images = np.arange(5, dtype=np.uint8)[:, None, None, None] * np.ones((1, 28, 28, 1),
                                                                       np.uint8)
  labels = np.array([0, 1, 2, 3, 4], np.int32)
  dataset = sources.ArrayDataset(images=images, labels=labels, info=info)
  part = dataset.subset(np.array([4, 1]))
  assert len(part) == 2
  np.testing.assert_array_equal(part.labels, [4, 1])
  np.testing.assert_array_equal(part.images[:, 0, 0, 0], [4, 1])
  with pytest.raises(ValueError, match="int32"):
    sources.ArrayDataset(images=images, labels=labels.astype(np.int64), info=info)
  with pytest.raises(ValueError, match=r"labels must be in \[0, 10\)"):
    sources.ArrayDataset(images=images, labels=labels + 6, info=info)
  with pytest.raises(ValueError, match="integer"):
    dataset.subset(np.array([0.5]))


# ------------------------------------------------------------------------------ digits


@pytest.mark.parametrize("split,size,sha256", [
    ("train", 1442, "e812b846967273222cdfa34a8672eb9b66145eec874da7edd3fde53a4e2e0149"),
    ("test", 355, "9a3308ec1c75d047d095a01437315fe87a6ba5ffce323f3cebf2dc79d9dcb69d"),
])
def test_digits_embedded(split, size, sha256):
  dataset = sources.load("digits", split)
  chex.assert_shape(dataset.images, (size, 28, 28, 1))
  chex.assert_shape(dataset.labels, (size,))
  assert dataset.images.dtype == np.uint8 and dataset.labels.dtype == np.int32
  np.testing.assert_array_equal(np.unique(dataset.labels), np.arange(10))
  # The 2 px zero border of the 24x24 upsampled digit.
  assert not dataset.images[:, :2].any() and not dataset.images[:, -2:].any()
  assert not dataset.images[:, :, :2].any() and not dataset.images[:, :, -2:].any()
  assert dataset.images.max() == 255
  # Pinned content: catches any change of the embedded split or resampling.
  digest = hashlib.sha256(dataset.images.tobytes() + dataset.labels.tobytes()).hexdigest()
  assert digest == sha256


def test_digits_split_is_stratified_and_disjoint_cover():
  train, test = sources.load("digits", "train"), sources.load("digits", "test")
  class_counts = np.bincount(train.labels, minlength=10) + np.bincount(test.labels,
                                                                       minlength=10)
  np.testing.assert_array_equal(class_counts,
                                [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
  np.testing.assert_array_equal(np.bincount(test.labels), class_counts // 5)


def test_digits_cached_read_only_and_deterministic():
  first = sources.load("digits", "test")
  assert sources.load("digits", "test") is first  # Served from the cache.
  assert not first.images.flags.writeable and not first.labels.flags.writeable
  with pytest.raises(ValueError):
    first.images[0, 0, 0, 0] = 1
  sources.clear_cache()
  rebuilt = sources.load("digits", "test")
  assert rebuilt is not first
  np.testing.assert_array_equal(rebuilt.images, first.images)
  np.testing.assert_array_equal(rebuilt.labels, first.labels)


def test_digits_mean_std_match_info():
  pixels = sources.load("digits", "train").images / 255.0
  info = sources.DATASETS["digits"]
  # DatasetInfo stores 4 decimals, so rounding error is at most 5e-5.
  np.testing.assert_allclose(pixels.mean(), info.mean[0], atol=5e-5)
  np.testing.assert_allclose(pixels.std(), info.std[0], atol=5e-5)


def test_digits_upsampling_is_jax_bilinear():
  images = jax.random.uniform(jax.random.key(0), (3, 8, 8)) * 255.0
  interp = sources._bilinear_matrix(8, 3)  # (24, 8)
  ours = np.einsum("ph,nhw,qw->npq", interp, np.asarray(images, np.float64), interp)
  reference = jax.image.resize(images, (3, 24, 24), "linear")
  np.testing.assert_allclose(ours, reference, atol=1e-3)  # float32 reference


# ------------------------------------------------------------------ real MNIST-like data


@pytest.mark.parametrize("name,train_class_counts", [
    ("mnist", [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]),
    ("fashion_mnist", [6000] * 10),
])
def test_real_npz_from_shared_dir(name, train_class_counts):
  if not (SHARED_DATA / f"{name}.npz").is_file():
    pytest.skip(f"{SHARED_DATA / (name + '.npz')} not present")
  train = sources.load(name, "train", data_dir=SHARED_DATA)
  test = sources.load(name, "test", data_dir=SHARED_DATA)
  chex.assert_shape(train.images, (60000, 28, 28, 1))
  chex.assert_shape(test.images, (10000, 28, 28, 1))
  assert train.labels.dtype == np.int32 and not train.images.flags.writeable
  np.testing.assert_array_equal(np.bincount(train.labels), train_class_counts)
  info = sources.DATASETS[name]
  pixels = train.images[::7] / 255.0  # Every 7th image keeps the test fast.
  np.testing.assert_allclose(pixels.mean(), info.mean[0], atol=2e-3)
  np.testing.assert_allclose(pixels.std(), info.std[0], atol=2e-3)
  assert sources.load(name, "train", data_dir=SHARED_DATA) is train


# --------------------------------------------------------------------------- tfds (mock)


@pytest.mark.parametrize("name,num_classes", [
    ("cifar10", 10), ("svhn_cropped", 10), ("cifar100", 100)])
@pytest.mark.parametrize("split", ["train", "test"])
def test_tfds_mock_data_source_without_tensorflow(name, num_classes, split):
  with tfds.testing.mock_data(num_examples=12):
    dataset = sources.load(name, split)
  chex.assert_shape(dataset.images, (12, 32, 32, 3))
  assert dataset.images.dtype == np.uint8 and dataset.labels.dtype == np.int32
  assert 0 <= dataset.labels.min() and dataset.labels.max() < num_classes
  assert dataset.info.num_classes == num_classes
  assert not dataset.images.flags.writeable


def test_tfds_used_when_data_dir_lacks_file(tmp_path):
  with tfds.testing.mock_data(num_examples=5):
    dataset = sources.load("cifar10", "train", data_dir=tmp_path)
  chex.assert_shape(dataset.images, (5, 32, 32, 3))


# ---------------------------------------------------------------------- errors / lookup


def _failing_tfds(monkeypatch):
  def data_source(*args, **kwargs):
    raise RuntimeError("simulated tfds failure 1234")
  monkeypatch.setattr(tfds, "data_source", data_source)


def test_not_found_without_data_dir(monkeypatch):
  _failing_tfds(monkeypatch)
  with pytest.raises(sources.DataNotFoundError) as excinfo:
    sources.load("cifar10", "test")
  message = str(excinfo.value)
  assert isinstance(excinfo.value, FileNotFoundError)
  for fragment in ("'cifar10'", "no --data_dir given", "DPKD_DATA_DIR",
                   "simulated tfds failure 1234"):
    assert fragment in message


def test_not_found_names_directory(monkeypatch, tmp_path):
  _failing_tfds(monkeypatch)
  with pytest.raises(sources.DataNotFoundError) as excinfo:
    sources.load("svhn_cropped", data_dir=tmp_path)
  message = str(excinfo.value)
  for fragment in ("svhn_cropped.npz", str(tmp_path), "DPKD_DATA_DIR",
                   "simulated tfds failure 1234"):
    assert fragment in message


@pytest.mark.parametrize("via_env", [False, True])
def test_missing_directory(monkeypatch, tmp_path, via_env):
  missing = tmp_path / "does_not_exist"
  if via_env:
    monkeypatch.setenv(sources.DATA_DIR_ENV_VAR, str(missing))
  with pytest.raises(sources.DataNotFoundError, match="does_not_exist"):
    sources.load("mnist", data_dir=None if via_env else missing)


def test_unknown_name_and_split():
  with pytest.raises(ValueError, match="known datasets.*cifar10.*mnist"):
    sources.load("imagenet")
  with pytest.raises(ValueError, match="unknown split 'validation'"):
    sources.load("digits", "validation")


def test_env_var_and_argument_precedence(monkeypatch, tmp_path):
  env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
  env_dir.mkdir()
  arg_dir.mkdir()
  _write_npz(env_dir / "mnist.npz", num=4)
  _write_npz(arg_dir / "mnist.npz", num=8)
  monkeypatch.setenv(sources.DATA_DIR_ENV_VAR, str(env_dir))
  assert len(sources.load("mnist")) == 4  # env var used when no argument
  assert len(sources.load("mnist", data_dir=arg_dir)) == 8  # argument wins over env var
  assert len(sources.load("mnist", "test", data_dir=arg_dir)) == 4


def test_rewritten_file_is_reloaded(tmp_path):
  _write_npz(tmp_path / "mnist.npz", num=4)
  assert len(sources.load("mnist", data_dir=tmp_path)) == 4
  _write_npz(tmp_path / "mnist.npz", num=10)
  assert len(sources.load("mnist", data_dir=tmp_path)) == 10


def test_corrupt_and_truncated_files(tmp_path):
  path = tmp_path / "mnist.npz"
  path.write_bytes(b"this is not a zip archive" * 10)
  with pytest.raises(ValueError, match=r"mnist\.npz.*cannot read"):
    sources.load("mnist", data_dir=tmp_path)
  _write_npz(path, num=50)
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(ValueError, match=r"mnist\.npz.*cannot read"):
    sources.load("mnist", data_dir=tmp_path)


@pytest.mark.parametrize("overrides,match", [
    (dict(y_train=None), r"missing key\(s\) \['y_train'\]"),
    (dict(x_train=np.zeros((6, 28, 28, 1), np.float32)), "must be a uint8 array"),
    (dict(x_train=np.zeros((6, 28, 28), np.uint8)), r"shape \(N, 28, 28, 1\)"),
    (dict(x_train=np.zeros((6, 32, 32, 3), np.uint8)), r"got \(6, 32, 32, 3\)"),
    (dict(y_train=np.zeros((5,), np.uint8)), "6 images but 5 labels"),
    (dict(y_train=np.zeros((6,), np.float32)), "integer"),
    (dict(label_value=10), r"labels must be in \[0, 10\)"),
])
def test_bad_npz_contents(tmp_path, overrides, match):
  kwargs = dict(overrides)
  label_value = kwargs.pop("label_value", None)
  _write_npz(tmp_path / "mnist.npz", label_value=label_value, **kwargs)
  with pytest.raises(ValueError, match=match) as excinfo:
    sources.load("mnist", data_dir=tmp_path)
  assert str(tmp_path / "mnist.npz") in str(excinfo.value)

