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
from dpkd_jax.errors import UserError

# Card fields that differ between two identical trainings (wall and CPU time).
_VOLATILE = ("train_seconds_this_run", "train_cpu_seconds_this_run")
# The card's `split` fields that fix the partition (besides the dataset).
_PARTITION_FIELDS = ("source_split", "num_source_examples", "source_sha256", "num_shards",
                     "shard_seed")


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
  n, shards = split["num_source_examples"], split["num_shards"]
  if not (isinstance(shards, int) and 1 <= shards <= n and 0 <= split["shard"] < shards):
    return None
  # data.shard_indices: np.array_split of a permutation of range(N), so shard i holds
  # N // n + (i < N % n) records; a card claiming another size used another partition.
  if split.get("num_train_examples") != n // shards + (split["shard"] < n % shards):
    return None
  return (card.get("dataset"), *(split[name] for name in _PARTITION_FIELDS))


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
