"""How many teachers of an ensemble one private record can reach, from the teachers' cards.

A teacher is not private: one record may change every teacher trained on it arbitrarily. When
n teachers' bounded rows (norm <= C) are summed and noised once (multi-teacher DPDFD), one
record that reaches m teachers moves each summed row by <= 2Cm, so the release's L2
sensitivity is 2Cm·sqrt(B) and the accounting must divide the noise multiplier by m
(`accounting.dpdfd_event(teachers_per_record=m)`). The rule, from the cards alone:

* the same workdir twice, or two cards of the same training (equal but for timings): a
  `UserError`, since nothing would be gained and the accounting would be wrong;
* cards that prove one partition (same dataset, same source split with the same size and
  content digest, same `num_shards`, same `shard_seed`, shard sizes as `data.shard_indices`
  makes them): m = the largest number of teachers on one shard (1 for distinct shard ids);
* anything else (other partitions, cards written before they recorded their source): m = n,
  the worst case, with a line saying so.

`source_fields(train)` is what `teacher.train_teacher` adds to a card's `split` to make that
proof possible: `data.shard_indices` permutes range(N) of the full training split, so the
partition is fixed by (that split's content, N, num_shards, shard_seed).

A stacked ensemble (`teacher_ensemble`: n teachers in one directory, trained at once) proves its
partition with one `partition` record instead of n cards (`ensemble_teachers_per_record`):
teacher i of the stack is trained on row i of `equal_shards`, the first floor(N/n) records of
shard i of `data.shard_indices(N, n, shard_seed)`, and on nothing else of the private data, so
m = 1 when the record says so; a missing or inconsistent record gives m = n.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dpkd_jax import data
from dpkd_jax.data import splits
from dpkd_jax.errors import UserError

# Card fields that differ between two identical trainings (wall and CPU time).
_VOLATILE = ("train_seconds_this_run", "train_cpu_seconds_this_run")
# The card's `split` fields that fix the partition (besides the dataset).
_PARTITION_FIELDS = ("source_split", "num_source_examples", "source_sha256", "num_shards",
                     "shard_seed")
# How a stacked ensemble cut its shards (`teacher_ensemble.equal_shards`).
EQUAL_SHARDS = "equal_shards"


class Overlap(NamedTuple):
  """teachers_per_record: m, the most teachers one record can reach; reason: one line."""

  teachers_per_record: int
  reason: str


def source_fields(train: data.ArrayDataset, split: str = "train") -> dict[str, Any]:
  """The card fields naming the split that was sharded: its name, size and content digest."""
  digest = hashlib.sha256()
  for array in (train.images, train.labels):
    digest.update(np.ascontiguousarray(array).tobytes())
  return {"source_split": split, "num_source_examples": len(train),
          "source_sha256": digest.hexdigest()}


def training_split(config: Any) -> tuple[data.ArrayDataset, dict[str, Any]]:
  """(a teacher config's shard of the train split, the card fields naming that split).

  `config`: a `teacher.TeacherConfig` (its dataset, data_dir, download, num_shards, shard,
  shard_seed).
  """
  train = data.load(config.dataset, "train", data_dir=config.data_dir, download=config.download)
  source = source_fields(train)  # lets ensembles prove disjoint shards
  held = getattr(config, "validation_examples", 0)
  if held:  # the methods' validation hold-out never trains the teacher (`train.selection`)
    train = train.subset(splits.hold_out_indices(len(train), held)[0])
  if config.num_shards == 1:
    return train, source
  shards = data.shard_indices(len(train), config.num_shards, seed=config.shard_seed)
  return train.subset(shards[config.shard]), source


def split_fields(config: Any, num_train: int, source: dict[str, Any]) -> dict[str, Any]:
  """The card's `split`: which shard of the training split the teacher saw, and its source
  (and the validation hold-out left out before the shards, when there is one)."""
  held = getattr(config, "validation_examples", 0)
  return {"num_shards": config.num_shards, "shard": config.shard,
          "shard_seed": config.shard_seed, "num_train_examples": num_train, **source,
          **({"validation_examples": held} if held else {})}


def check_distinct(teacher_dirs: Sequence[str], cards: Sequence[dict[str, Any]]) -> None:
  """Raises UserError if a workdir or a training appears twice among the teachers."""
  seen: dict[str, str] = {}
  for workdir, card in zip(teacher_dirs, cards):
    real = os.path.realpath(workdir)
    if real in seen:
      raise UserError(f"--teacher_dirs names {workdir!r} twice (as {seen[real]!r} too): one "
                      "teacher counted twice would under-count epsilon; list each teacher once")
    seen[real] = workdir
  trainings: dict[str, str] = {}
  for workdir, card in zip(teacher_dirs, cards):
    stable = json.dumps({k: v for k, v in card.items() if k not in _VOLATILE}, sort_keys=True)
    if stable in trainings:
      raise UserError(f"--teacher_dirs: {workdir!r} and {trainings[stable]!r} hold the same "
                      "teacher (equal card.json): list each teacher once")
    trainings[stable] = workdir


def _partition(card: dict[str, Any]) -> tuple[Any, ...] | None:
  """The card's partition key, or None if the card cannot prove which partition it used."""
  split = card.get("split") or {}
  if any(split.get(name) is None for name in _PARTITION_FIELDS) or "shard" not in split:
    return None
  held = split.get("validation_examples", 0)
  if not (isinstance(held, int) and not isinstance(held, bool) and held >= 0):
    return None
  # The shards cut the source split less its hold-out (`training_split`).
  n, shards = split["num_source_examples"] - held, split["num_shards"]
  if not (isinstance(shards, int) and 1 <= shards <= n and 0 <= split["shard"] < shards):
    return None
  # data.shard_indices: np.array_split of a permutation of range(N), so shard i holds
  # N // n + (i < N % n) records; a card claiming another size used another partition.
  if split.get("num_train_examples") != n // shards + (split["shard"] < n % shards):
    return None
  # Teachers that left out different hold-outs cut different sets: never one partition.
  return (card.get("dataset"), *(split[name] for name in _PARTITION_FIELDS),
          split.get("validation_examples", 0))


def teachers_per_record(cards: Sequence[dict[str, Any]]) -> Overlap:
  """m for `cards` (one per teacher) under the module's rule; never below the truth."""
  n = len(cards)
  if n == 1:
    return Overlap(1, "one teacher")
  keys = [_partition(card) for card in cards]
  if any(key is None for key in keys):
    old = sum(key is None for key in keys)
    return Overlap(n, f"{old} of the {n} teacher cards do not record their shard's source "
                   f"(retrain them with this version of experiments.teacher): assuming one "
                   f"record may reach all {n} teachers (epsilon as for sensitivity {n}x)")
  if len(set(keys)) > 1:
    return Overlap(n, f"the {n} teachers come from different partitions (dataset, source, "
                   f"num_shards or shard_seed differ): assuming one record may reach all "
                   f"{n} (epsilon as for sensitivity {n}x)")
  per_shard = collections.Counter(card["split"]["shard"] for card in cards)
  m = max(per_shard.values())
  if m == 1:
    return Overlap(1, f"{n} teachers on distinct shards of one partition")
  return Overlap(m, f"up to {m} of the {n} teachers share a shard of one partition: one "
                 f"record may reach {m} teachers (epsilon as for sensitivity {m}x)")


def _ensemble_proves_partition(partition: Any, num_teachers: int) -> bool:
  """True iff `partition` records one `equal_shards` partition into `num_teachers` shards."""
  if not isinstance(partition, dict) or partition.get("scheme") != EQUAL_SHARDS:
    return False
  if any(partition.get(name) is None for name in (*_PARTITION_FIELDS, "dataset", "shard_size")):
    return False
  n, shards, size = (partition[k] for k in ("num_source_examples", "num_shards", "shard_size"))
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, shards, size)):
    return False
  # One shard per teacher, and every teacher's rows cut to the smallest shard (N // n).
  return shards == num_teachers and 1 <= shards <= n and size == n // shards


def ensemble_teachers_per_record(partition: Any, num_teachers: int, *,
                                 dataset: str | None = None) -> Overlap:
  """m of a stacked ensemble of `num_teachers` from its saved `partition` record.

  Args:
    partition: the ensemble's `meta["partition"]` (None when the meta has none): dataset,
      source_split, num_source_examples, source_sha256, num_shards, shard_seed, shard_size
      and scheme "equal_shards".
    num_teachers: n, the size of the stack as loaded (not as the record claims).
    dataset: if given, the dataset the record must name (the one the teachers were built
      for).

  Returns:
    m = 1 if the record proves n disjoint equal shards of one split, else m = n (never below
    the truth).
  """
  n = num_teachers
  if n == 1:
    return Overlap(1, "one teacher")
  if (_ensemble_proves_partition(partition, n)
      and (dataset is None or partition["dataset"] == dataset)):
    return Overlap(1, f"{n} stacked teachers on disjoint equal shards of one partition "
                   f"({partition['dataset']} {partition['source_split']}, "
                   f"{partition['num_source_examples']} records, shard_seed "
                   f"{partition['shard_seed']}, {partition['shard_size']} records per teacher)")
  return Overlap(n, f"the stacked ensemble's meta does not prove a partition into {n} disjoint "
                 f"shards (saved without one, e.g. by an older data-free PATE run; retrain it "
                 f"with experiments.teacher_ensemble): assuming one record may reach all {n} "
                 f"teachers (epsilon as for sensitivity {n}x)")
