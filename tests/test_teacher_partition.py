"""Which teachers one record can reach, from the cards (dpkd_jax/teacher_partition.py)."""

import copy
import os

import pytest

from dpkd_jax import data
from dpkd_jax import teacher
from dpkd_jax import teacher_partition
from dpkd_jax.errors import UserError

_N = 1442  # digits' train split


def _card(shard=0, *, num_shards=3, shard_seed=0, digest="d" * 64, seed=0, n=_N):
  return {"dataset": "digits", "model": "lenet5", "seed": seed, "test_accuracy": 0.5,
          "train_seconds_this_run": 1.0,
          "split": {"num_shards": num_shards, "shard": shard, "shard_seed": shard_seed,
                    "num_train_examples": n // num_shards + (shard < n % num_shards),
                    "source_split": "train", "num_source_examples": n,
                    "source_sha256": digest}}


def test_one_teacher_reaches_each_record_once():
  assert teacher_partition.teachers_per_record([_card()]).teachers_per_record == 1


def test_distinct_shards_of_one_partition_give_one():
  overlap = teacher_partition.teachers_per_record([_card(0), _card(1), _card(2)])
  assert overlap == (1, "3 teachers on distinct shards of one partition")


def test_shared_shards_count_their_teachers():
  cards = [_card(0), _card(0, seed=1), _card(0, seed=2), _card(1)]
  assert teacher_partition.teachers_per_record(cards).teachers_per_record == 3
  # Whole-data teachers (num_shards = 1) all share shard 0.
  whole = [_card(0, num_shards=1), _card(0, num_shards=1, seed=1)]
  assert teacher_partition.teachers_per_record(whole).teachers_per_record == 2


@pytest.mark.parametrize("change", [
    dict(shard_seed=1), dict(num_shards=4), dict(digest="e" * 64), dict(n=_N - 1),
], ids=["shard_seed", "num_shards", "other data", "other size"])
def test_other_partitions_assume_the_worst(change):
  cards = [_card(0), _card(1), _card(2, **change)]
  overlap = teacher_partition.teachers_per_record(cards)
  assert overlap.teachers_per_record == 3 and "different partitions" in overlap.reason


def test_cards_without_their_source_assume_the_worst():
  old = _card(1)
  for name in ("source_split", "num_source_examples", "source_sha256"):
    del old["split"][name]
  overlap = teacher_partition.teachers_per_record([_card(0), old])
  assert overlap.teachers_per_record == 2 and "do not record" in overlap.reason
  wrong_size = _card(1)
  wrong_size["split"]["num_train_examples"] += 1  # not a shard of data.shard_indices
  assert teacher_partition.teachers_per_record([_card(0), wrong_size]).teachers_per_record == 2


def test_the_same_teacher_twice_is_a_user_error(tmp_path):
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  os.makedirs(a)
  os.symlink(a, b)
  for dirs in ((a, a), (a, a + os.sep), (a, b)):
    with pytest.raises(UserError, match="twice"):
      teacher_partition.check_distinct(dirs, [_card(0), _card(1)])
  rerun = copy.deepcopy(_card(0))
  rerun["train_seconds_this_run"] = 2.0  # the same training again: only timings differ
  with pytest.raises(UserError, match="same teacher"):
    teacher_partition.check_distinct((a, str(tmp_path / "c")), [_card(0), rerun])
  teacher_partition.check_distinct((a, str(tmp_path / "c")), [_card(0), _card(0, seed=1)])


def test_cards_of_one_all_shards_run_prove_disjoint_shards(tmp_path):
  # What `experiments.teacher --num_shards=2 --all_shards` writes.
  cards = [teacher.train_teacher(teacher.TeacherConfig(
      dataset="digits", model="lenet5_half", epochs=1, batch_size=64, num_shards=2, shard=i),
      str(tmp_path / f"shard_{i}"), progress=False) for i in range(2)]
  source = teacher_partition.source_fields(data.load("digits", "train"))
  assert all(card["split"].items() >= source.items() for card in cards)
  assert source["num_source_examples"] == _N and len(source["source_sha256"]) == 64
  assert teacher_partition.teachers_per_record(cards).teachers_per_record == 1


def _held_card(shard, held, num_shards=3):
  # A teacher of `experiments.teacher --validation_examples=held`: its shards cut N - held.
  card = _card(shard, num_shards=num_shards)
  cut = _N - held
  card["split"].update(num_train_examples=cut // num_shards + (shard < cut % num_shards),
                       validation_examples=held)
  return card


def test_teachers_that_left_out_one_hold_out_share_a_partition_and_others_do_not():
  assert teacher_partition.teachers_per_record(
      [_held_card(i, 100) for i in range(3)]).teachers_per_record == 1
  # Another hold-out, or none, permutes another set: the shards may overlap.
  for other in (_held_card(2, 101), _card(2)):
    mixed = teacher_partition.teachers_per_record([_held_card(0, 100), _held_card(1, 100), other])
    assert mixed.teachers_per_record == 3 and "different partitions" in mixed.reason
  # Shard sizes that match the full split's prove nothing about a card naming a hold-out.
  wrong = [_card(i) for i in range(3)]
  for card in wrong:
    card["split"]["validation_examples"] = 7
  assert teacher_partition.teachers_per_record(wrong).teachers_per_record == 3


def test_a_teachers_hold_out_is_left_out_of_its_training_split():
  config = teacher.TeacherConfig(dataset="digits", model="lenet5_half", num_shards=2, shard=1,
                                 validation_examples=100)
  train, source = teacher_partition.training_split(config)
  full = data.load("digits", "train")
  assert source["num_source_examples"] == _N and len(train) == (_N - 100) // 2
  fields = teacher_partition.split_fields(config, len(train), source)
  assert fields["validation_examples"] == 100
  partition = teacher_partition._partition  # pylint: disable=protected-access
  assert partition({"dataset": "digits", "split": fields}) is not None
  _, held = data.splits.hold_out_indices(len(full), 100)
  held_images = {full.images[i].tobytes() for i in held}
  assert not any(image.tobytes() in held_images for image in train.images)
  assert "validation_examples" not in teacher_partition.split_fields(
      teacher.TeacherConfig(dataset="digits", model="lenet5_half"), _N, source)


# --------------------------------------------------------------- stacked ensembles (one record)


def _partition(n=3, **change):
  record = {"dataset": "digits", "source_split": "train", "num_source_examples": _N,
            "source_sha256": "d" * 64, "num_shards": n, "shard_seed": 0,
            "shard_size": _N // n, "scheme": teacher_partition.EQUAL_SHARDS}
  return {**record, **change}


def test_a_stacked_ensemble_on_equal_shards_reaches_one_teacher_per_record():
  overlap = teacher_partition.ensemble_teachers_per_record(_partition(), 3)
  assert overlap.teachers_per_record == 1 and "disjoint equal shards" in overlap.reason
  assert teacher_partition.ensemble_teachers_per_record(None, 1).teachers_per_record == 1


@pytest.mark.parametrize("partition", [
    None, {}, _partition(num_shards=4), _partition(shard_size=_N // 3 + 1),
    _partition(scheme="other"), _partition(source_sha256=None), _partition(num_shards="3"),
    _partition(shard_seed=None), _partition(num_source_examples=2, shard_size=0),
], ids=["none", "empty", "other_n", "other_size", "other_scheme", "no_digest", "str_n",
        "no_seed", "more_shards_than_records"])
def test_a_stacked_ensemble_that_proves_nothing_counts_every_teacher(partition):
  overlap = teacher_partition.ensemble_teachers_per_record(partition, 3)
  assert overlap.teachers_per_record == 3 and "does not prove a partition" in overlap.reason


def test_a_stacked_ensemble_record_of_another_dataset_counts_every_teacher():
  assert teacher_partition.ensemble_teachers_per_record(
      _partition(), 3, dataset="digits").teachers_per_record == 1
  assert teacher_partition.ensemble_teachers_per_record(
      _partition(), 3, dataset="mnist").teachers_per_record == 3
