"""Tests for dpkd_jax.data.splits: disjointness, coverage, determinism, validation."""

import numpy as np
import pytest

from dpkd_jax.data import sources
from dpkd_jax.data import splits


def _indexed_dataset(num: int) -> sources.ArrayDataset:
  """A dataset whose record i has every pixel equal to i (num <= 256) and label i % 10."""
  images = np.broadcast_to(
      np.arange(num, dtype=np.uint8)[:, None, None, None], (num, 28, 28, 1)).copy()
  labels = (np.arange(num) % 10).astype(np.int32)
  return sources.ArrayDataset(images=images, labels=labels, info=sources.DATASETS["digits"])


def _record_ids(dataset: sources.ArrayDataset) -> np.ndarray:
  return dataset.images[:, 0, 0, 0].astype(int)


def _assert_disjoint(parts) -> np.ndarray:
  """Asserts pairwise disjointness, sortedness; returns the union."""
  union = np.concatenate(list(parts))
  assert len(np.unique(union)) == len(union), "parts overlap or repeat an index"
  for part in parts:
    assert np.all(np.diff(part) > 0), "indices must be sorted and unique"
  return union


@pytest.mark.parametrize("num,fractions,sizes", [
    (100, {"a": 0.5, "b": 0.25}, [50, 25]),
    (10, {"a": 0.5, "b": 0.5}, [5, 5]),
    (100, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, [34, 33, 33]),  # leftover handed out
    (7, {"x": 0.3}, [2]),
    (1000, {"train": 0.8, "val": 0.1, "test": 0.1}, [800, 100, 100]),
])
def test_partition_sizes_disjoint_and_cover(num, fractions, sizes):
  parts = splits.partition(num, fractions, seed=3)
  assert list(parts) == list(fractions)
  assert [len(p) for p in parts.values()] == sizes
  union = _assert_disjoint(parts.values())
  assert union.min() >= 0 and union.max() < num
  if abs(sum(fractions.values()) - 1.0) < 1e-9:
    np.testing.assert_array_equal(np.sort(union), np.arange(num))


def test_partition_deterministic_and_pinned():
  fractions = {"a": 0.5, "b": 0.5}
  first = splits.partition(10, fractions, seed=0)
  second = splits.partition(10, fractions, seed=0)
  for name in fractions:
    np.testing.assert_array_equal(first[name], second[name])
  # Pinned: a change of NumPy's permutation stream would silently move records between
  # private and public sets, so it must fail here.
  np.testing.assert_array_equal(first["a"], [2, 3, 4, 6, 7])
  np.testing.assert_array_equal(first["b"], [0, 1, 5, 8, 9])


def test_partition_seeds_differ():
  first = splits.partition(1000, {"a": 0.5}, seed=0)["a"]
  second = splits.partition(1000, {"a": 0.5}, seed=1)["a"]
  assert not np.array_equal(first, second)


@pytest.mark.parametrize("num,fractions,seed,match", [
    (10, {}, 0, "at least one part"),
    (10, {"a": 0.0}, 0, r"must be in \(0, 1\]"),
    (10, {"a": -0.1}, 0, r"must be in \(0, 1\]"),
    (10, {"a": 1.5}, 0, r"must be in \(0, 1\]"),
    (10, {"a": float("nan")}, 0, r"must be in \(0, 1\]"),
    (10, {"a": "half"}, 0, "must be a number"),
    (10, {"a": 0.6, "b": 0.5}, 0, "sum to at most 1"),
    (10, {"": 0.5}, 0, "non-empty strings"),
    (10, {"a": 0.05}, 0, "would be empty"),
    (0, {"a": 0.5}, 0, "num_examples"),
    (10.0, {"a": 0.5}, 0, "num_examples"),
    (10, {"a": 0.5}, -1, "seed"),
    (10, {"a": 0.5}, 1.5, "seed"),
    (10, {"a": 0.5}, True, "seed"),
])
def test_partition_rejects_bad_input(num, fractions, seed, match):
  with pytest.raises(ValueError, match=match):
    splits.partition(num, fractions, seed=seed)


def test_stratified_partition_keeps_class_proportions():
  labels = np.repeat(np.arange(4), [40, 20, 30, 10])  # (100,)
  parts = splits.stratified_partition(labels, {"a": 0.5, "b": 0.3}, seed=0)
  _assert_disjoint(parts.values())
  np.testing.assert_array_equal(np.bincount(labels[parts["a"]]), [20, 10, 15, 5])
  np.testing.assert_array_equal(np.bincount(labels[parts["b"]]), [12, 6, 9, 3])
  again = splits.stratified_partition(labels, {"a": 0.5, "b": 0.3}, seed=0)
  np.testing.assert_array_equal(parts["a"], again["a"])
  other = splits.stratified_partition(labels, {"a": 0.5, "b": 0.3}, seed=1)
  assert not np.array_equal(parts["a"], other["a"])


@pytest.mark.parametrize("labels", [np.zeros((0,), int), np.zeros((3, 2), int),
                                    np.array([0.0, 1.0])])
def test_stratified_partition_rejects_bad_labels(labels):
  with pytest.raises(ValueError, match="labels"):
    splits.stratified_partition(labels, {"a": 0.5}, seed=0)


@pytest.mark.parametrize("num,num_shards", [(10, 1), (10, 3), (101, 10), (5, 5)])
def test_shard_indices(num, num_shards):
  shards = splits.shard_indices(num, num_shards, seed=7)
  assert len(shards) == num_shards
  union = _assert_disjoint(shards)
  np.testing.assert_array_equal(np.sort(union), np.arange(num))
  sizes = [len(s) for s in shards]
  assert max(sizes) - min(sizes) <= 1
  for a, b in zip(shards, splits.shard_indices(num, num_shards, seed=7)):
    np.testing.assert_array_equal(a, b)


def test_shard_indices_seeds_differ_and_pinned():
  assert [s.tolist() for s in splits.shard_indices(7, 3, seed=1)] == [[0, 1, 5], [2, 4],
                                                                       [3, 6]]
  first = splits.shard_indices(100, 4, seed=0)
  second = splits.shard_indices(100, 4, seed=1)
  assert not all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("num,num_shards,seed,match", [
    (10, 0, 0, "num_shards"), (3, 4, 0, "exceeds num_examples"), (0, 1, 0, "num_examples"),
    (10, 2, -3, "seed"),
])
def test_shard_indices_rejects_bad_input(num, num_shards, seed, match):
  with pytest.raises(ValueError, match=match):
    splits.shard_indices(num, num_shards, seed=seed)


@pytest.mark.parametrize("stratify", [False, True])
def test_private_public_split(stratify):
  dataset = _indexed_dataset(200)
  private, public = splits.private_public_split(dataset, 0.25, seed=5, stratify=stratify)
  assert (len(private), len(public)) == (150, 50)
  ids = _assert_disjoint([_record_ids(private), _record_ids(public)])
  np.testing.assert_array_equal(np.sort(ids), np.arange(200))
  # Labels travel with their images.
  np.testing.assert_array_equal(public.labels, _record_ids(public) % 10)
  if stratify:
    np.testing.assert_array_equal(np.bincount(public.labels), [5] * 10)
  again_private, _ = splits.private_public_split(dataset, 0.25, seed=5, stratify=stratify)
  np.testing.assert_array_equal(_record_ids(private), _record_ids(again_private))


@pytest.mark.parametrize("public_fraction", [0.0, 1.0, -0.5, 2.0])
def test_private_public_split_rejects_bad_fraction(public_fraction):
  with pytest.raises(ValueError, match="public_fraction"):
    splits.private_public_split(_indexed_dataset(20), public_fraction, seed=0)


def test_split_and_shard_dataset():
  dataset = _indexed_dataset(60)
  parts = splits.split_dataset(dataset, {"train": 0.5, "val": 0.5}, seed=2)
  assert [len(p) for p in parts.values()] == [30, 30]
  _assert_disjoint([_record_ids(p) for p in parts.values()])
  shards = splits.shard_dataset(dataset, 4, seed=2)
  assert [len(s) for s in shards] == [15] * 4
  ids = _assert_disjoint([_record_ids(s) for s in shards])
  np.testing.assert_array_equal(np.sort(ids), np.arange(60))
