"""Deterministic partitions of a dataset into disjoint index sets.

Every method in this library needs some fixed split of its records: private vs public data
(SRR, reverse k-NN, RONA label a public set with a private teacher), disjoint private shards
(one teacher per shard), held-out evaluation data. These splits define *which* records are
private, so they must be reproducible from a seed alone and never overlap.

All functions take an integer `seed` and draw one permutation from
`np.random.default_rng(seed)` (a NumPy `Generator` on PCG64). This is data bookkeeping
done once on the host, not privacy noise, so a seeded NumPy generator is the right tool;
`tests/test_splits.py` pins the exact output for one seed so a change of NumPy's
permutation algorithm would be caught. Every returned index array is sorted ascending, so
subsets keep the original record order.
"""

from __future__ import annotations

from collections.abc import Mapping
import math
import numpy as np

from dpkd_jax.data.arrays import ArrayDataset

# Tolerance under which fractions that sum to 1 are treated as an exact cover.
_SUM_TOLERANCE = 1e-9


def _check_seed(seed: int) -> None:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def _check_count(value: int, what: str, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")


def _check_fractions(fractions: Mapping[str, float]) -> float:
  """Validates a name -> fraction mapping and returns the sum of the fractions."""
  if not fractions:
    raise ValueError("fractions must name at least one part, got an empty mapping")
  for name, fraction in fractions.items():
    if not isinstance(name, str) or not name:
      raise ValueError(f"part names must be non-empty strings, got {name!r}")
    if not isinstance(fraction, (int, float, np.floating, np.integer)) or isinstance(
        fraction, bool):
      raise ValueError(f"fraction of part {name!r} must be a number, got {fraction!r}")
    if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
      raise ValueError(f"fraction of part {name!r} must be in (0, 1], got {fraction!r}")
  total = float(sum(fractions.values()))
  if total > 1.0 + _SUM_TOLERANCE:
    raise ValueError(f"fractions must sum to at most 1, got {total!r} from {dict(fractions)}")
  return total


def _part_sizes(num_examples: int, fractions: Mapping[str, float], total: float) -> list[int]:
  """Sizes floor(fraction * N); if the fractions sum to 1 the leftover rows are handed out.

  The leftover (fewer rows than there are parts) goes to the parts with the largest
  fractional remainders, ties broken by mapping order, so a split such as
  {"a": 1/3, "b": 1/3, "c": 1/3} covers every record.
  """
  exact = [fraction * num_examples for fraction in fractions.values()]
  sizes = [math.floor(x) for x in exact]
  if abs(total - 1.0) <= _SUM_TOLERANCE:
    leftover = num_examples - sum(sizes)
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in by_remainder[:leftover]:
      sizes[i] += 1
  return sizes


def partition(
    num_examples: int, fractions: Mapping[str, float], *, seed: int
) -> dict[str, np.ndarray]:
  """Splits `range(num_examples)` into disjoint, randomly chosen index sets.

  Args:
    num_examples: N, the number of records to split.
    fractions: part name -> fraction of N, each in (0, 1], summing to at most 1. A part
      gets floor(fraction * N) records; if the fractions sum to 1 the rounding leftovers
      are distributed so that the parts cover all N records.
    seed: non-negative integer seed; the same seed gives the same partition.

  Returns:
    part name -> sorted int64 index array, in the order of `fractions`. Parts are
    pairwise disjoint.

  Raises:
    ValueError: on a bad `num_examples`, `seed` or fraction, or if a part would be empty.
  """
  _check_count(num_examples, "num_examples", 1)
  _check_seed(seed)
  total = _check_fractions(fractions)
  sizes = _part_sizes(num_examples, fractions, total)
  for name, size in zip(fractions, sizes):
    if size == 0:
      raise ValueError(
          f"part {name!r} with fraction {fractions[name]!r} of {num_examples} examples "
          "would be empty")
  permutation = np.random.default_rng(seed).permutation(num_examples)  # (N,)
  boundaries = np.cumsum([0] + sizes)
  return {
      name: np.sort(permutation[start:stop])
      for name, start, stop in zip(fractions, boundaries[:-1], boundaries[1:])
  }


def stratified_partition(
    labels: np.ndarray, fractions: Mapping[str, float], *, seed: int
) -> dict[str, np.ndarray]:
  """Like `partition`, but each part keeps the class proportions of `labels`.

  The fractions are applied per class (with the same rounding rule as `partition`), so
  part sizes may differ from fraction * N by up to the number of classes.

  Args:
    labels: (N,) integer class labels.
    fractions: part name -> fraction, as in `partition`.
    seed: non-negative integer seed.

  Returns:
    part name -> sorted int64 index array into `labels`; parts are pairwise disjoint.

  Raises:
    ValueError: on bad labels, seed or fractions, or if a part would be empty.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
        f"labels must be a non-empty 1-D integer array, got shape {labels.shape} "
        f"dtype {labels.dtype}")
  _check_seed(seed)
  total = _check_fractions(fractions)
  rng = np.random.default_rng(seed)
  parts: dict[str, list[np.ndarray]] = {name: [] for name in fractions}
  for label in np.unique(labels):  # Sorted order, so the draw sequence is fixed.
    members = rng.permutation(np.flatnonzero(labels == label))  # (N_c,)
    sizes = _part_sizes(len(members), fractions, total)
    boundaries = np.cumsum([0] + sizes)
    for name, start, stop in zip(fractions, boundaries[:-1], boundaries[1:]):
      parts[name].append(members[start:stop])
  result = {name: np.sort(np.concatenate(chunks)) for name, chunks in parts.items()}
  for name, indices in result.items():
    if indices.size == 0:
      raise ValueError(
          f"part {name!r} with fraction {fractions[name]!r} of {labels.size} examples "
          "would be empty")
  return result


def shard_indices(num_examples: int, num_shards: int, *, seed: int) -> list[np.ndarray]:
  """Splits all records into `num_shards` disjoint shards of near-equal size.

  Used to train an ensemble of teachers on disjoint private shards: shard sizes differ by
  at most one and their union is `range(num_examples)`.

  Args:
    num_examples: N, the number of records.
    num_shards: number of shards, 1 <= num_shards <= N.
    seed: non-negative integer seed.

  Returns:
    `num_shards` sorted int64 index arrays.

  Raises:
    ValueError: on a bad `num_examples`, `num_shards` or `seed`.
  """
  _check_count(num_examples, "num_examples", 1)
  _check_count(num_shards, "num_shards", 1)
  if num_shards > num_examples:
    raise ValueError(
        f"num_shards={num_shards} exceeds num_examples={num_examples}: some shard would be "
        "empty")
  _check_seed(seed)
  permutation = np.random.default_rng(seed).permutation(num_examples)  # (N,)
  return [np.sort(shard) for shard in np.array_split(permutation, num_shards)]


def split_dataset(
    dataset: ArrayDataset,
    fractions: Mapping[str, float],
    *,
    seed: int,
    stratify: bool = False,
) -> dict[str, ArrayDataset]:
  """Applies `partition` (or `stratified_partition`) to a dataset.

  Args:
    dataset: the `ArrayDataset` to split.
    fractions: part name -> fraction, as in `partition`.
    seed: non-negative integer seed.
    stratify: if True keep each part's class proportions equal to the dataset's.

  Returns:
    part name -> `ArrayDataset` holding that part's records.
  """
  if stratify:
    parts = stratified_partition(dataset.labels, fractions, seed=seed)
  else:
    parts = partition(len(dataset), fractions, seed=seed)
  return {name: dataset.subset(indices) for name, indices in parts.items()}


def private_public_split(
    dataset: ArrayDataset,
    public_fraction: float,
    *,
    seed: int,
    stratify: bool = False,
) -> tuple[ArrayDataset, ArrayDataset]:
  """Splits a dataset into a private part and a disjoint public part covering all of it.

  The public part is what a student may see (its labels are meant to come from the private
  teacher, not from `dataset.labels`); the private part trains the teacher.

  Args:
    dataset: the `ArrayDataset` to split.
    public_fraction: fraction of records that go to the public part, in (0, 1).
    seed: non-negative integer seed.
    stratify: if True both parts keep the dataset's class proportions.

  Returns:
    (private, public) `ArrayDataset`s; every record is in exactly one of them.

  Raises:
    ValueError: if `public_fraction` is not in (0, 1) or a part would be empty.
  """
  if not (isinstance(public_fraction, (int, float)) and 0.0 < public_fraction < 1.0):
    raise ValueError(f"public_fraction must be in (0, 1), got {public_fraction!r}")
  parts = split_dataset(
      dataset, {"private": 1.0 - public_fraction, "public": public_fraction},
      seed=seed, stratify=stratify)
  return parts["private"], parts["public"]


def shard_dataset(dataset: ArrayDataset, num_shards: int, *, seed: int) -> list[ArrayDataset]:
  """Splits a dataset into `num_shards` disjoint near-equal shards (see `shard_indices`)."""
  return [dataset.subset(indices) for indices in shard_indices(len(dataset), num_shards,
                                                               seed=seed)]


def hold_out_indices(num_examples: int, count: int, *, seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(kept indices, held-out indices), both sorted: `count` of `num_examples` records held out
  by `np.random.default_rng(seed).permutation(num_examples)[:count]` (the validation hold-out
  of every method and teacher: `dpkd_jax.train.selection`).

  Raises:
    ValueError: a bad count or seed, or a count that would leave no record.
  """
  _check_count(count, "validation_examples", 0)
  _check_seed(seed)
  if count >= num_examples:
    raise ValueError(f"validation_examples={count} leaves no training records out of "
                     f"{num_examples}")
  held = np.zeros(num_examples, bool)
  held[np.random.default_rng(seed).permutation(num_examples)[:count]] = True
  return np.flatnonzero(~held), np.flatnonzero(held)
