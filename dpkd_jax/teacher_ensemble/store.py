"""A teachers directory: the stacked parameters of an ensemble and the meta that describes it.

Layout: an Orbax checkpoint (`train.checkpoint`) at the directory itself, whose arrays are the
params stacked on a leading teacher axis (n, ...) and whose meta holds

  identity      dataset, num_teachers, teacher_model, teacher_epochs, teacher_batch_size,
                teacher_learning_rate, shard_seed (`TeacherEnsembleConfig.identity()`, equal to
                a data-free PATE run's `teacher_identity()`; the architecture is rebuilt from
                it). Stores saved before the rename hold `teacher_lr`: `read_meta` and `load`
                return their identity renamed (`config.migrate_identity`), the files unchanged.
  partition     what proves the teachers' shards disjoint (`partition_fields`): dataset, the
                sharded split's name, size and SHA-256, num_shards, shard_seed, shard_size,
                scheme "equal_shards" (`teacher_partition.ensemble_teachers_per_record`)
  num_classes, image_shape, seed, train_seconds
  report        test accuracy of the teachers (`ensemble_accuracy`; a PRIVATE diagnostic)

Directories saved by data-free PATE before `partition` existed hold only identity,
train_seconds and report: they still load, and count as m = n teachers per record.
The directory is as secret as the data it was trained on.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher_partition
from dpkd_jax.teacher_ensemble import architectures
from dpkd_jax.teacher_ensemble import config as config_lib
from dpkd_jax.teacher_ensemble import ensemble as ensemble_lib
from dpkd_jax.train import checkpoint

_HINT = ("train one with `python -m experiments.teacher_ensemble --dataset=... "
         "--num_teachers=... --workdir=DIR`")


def partition_fields(train: data.ArrayDataset, dataset: str, num_teachers: int, *,
                     shard_seed: int, shard_size: int) -> dict[str, Any]:
  """The meta's `partition` record of `equal_shards(train, num_teachers, seed=shard_seed)`."""
  return {"dataset": dataset, **teacher_partition.source_fields(train, "train"),
          "num_shards": num_teachers, "shard_seed": shard_seed, "shard_size": shard_size,
          "scheme": teacher_partition.EQUAL_SHARDS}


def save(directory: str, ensemble: ensemble_lib.Ensemble, meta: dict[str, Any]) -> None:
  """Saves the stacked params and `meta` as the directory's next checkpoint step."""
  latest = checkpoint.latest_step(directory)
  step = 0 if latest is None else latest + 1
  checkpoint.save(directory, step, jax.device_get(ensemble.params), meta)


def read_meta(directory: str, *, flag: str, dataset: str | None = None) -> dict[str, Any]:
  """The meta of the ensemble saved in `directory`, checked cheaply (no array read).

  Args:
    directory: a teachers directory.
    flag: the flag that named it, for the messages.
    dataset: if given, the dataset the ensemble must have been trained on.

  Raises:
    UserError: no such directory, no saved ensemble, a meta that names no architecture, or
      another dataset (one line naming `flag`).
  """
  where = f"{flag}: {directory!r}"
  if not os.path.isdir(directory):
    raise errors.UserError(f"{where} does not exist or is not a directory; {_HINT}")
  if checkpoint.latest_step(directory) is None:
    teacher = (" (it is one teacher's workdir: those go in --teacher_dirs)"
               if os.path.isfile(os.path.join(directory, "card.json")) else "")
    raise errors.UserError(f"{where} holds no saved teacher ensemble{teacher}; {_HINT}")
  meta = _migrated(checkpoint.restore_metadata(directory))
  identity = meta.get("identity")
  if (not isinstance(identity, dict) or identity.get("dataset") not in data.DATASETS
      or identity.get("teacher_model") not in architectures.TEACHER_MODELS
      or not isinstance(identity.get("num_teachers"), int)):
    raise errors.UserError(f"{where} holds a checkpoint that is not a teacher ensemble (no "
                           f"dataset, teacher_model and num_teachers in its meta); {_HINT}")
  if dataset is not None and identity["dataset"] != dataset:
    raise errors.UserError(f"{where} holds teachers of {identity['dataset']}, not {dataset}; "
                           f"give an ensemble trained on {dataset} (or --dataset="
                           f"{identity['dataset']})")
  return meta


def load(directory: str, *, flag: str, dataset: str | None = None,
         info: data.DatasetInfo | None = None) -> tuple[ensemble_lib.Ensemble, dict[str, Any]]:
  """(ensemble, meta) saved in `directory`, its architecture rebuilt from the meta.

  Args:
    directory, flag, dataset: as in `read_meta`.
    info: if given, the classes and image shape the teachers must have.

  Raises:
    UserError: as `read_meta`, or classes / image shape other than `info`'s.
    CheckpointMismatchError: arrays that do not fit the architecture the meta names.
  """
  meta = read_meta(directory, flag=flag, dataset=dataset)
  identity = meta["identity"]
  saved_info = data.DATASETS[identity["dataset"]]
  if info is not None:
    saved = (meta.get("num_classes", saved_info.num_classes),
             tuple(meta.get("image_shape", saved_info.image_shape)))
    if saved != (info.num_classes, tuple(info.image_shape)):
      raise errors.UserError(f"{flag}: {directory!r} holds teachers of {saved[0]} classes on "
                             f"{saved[1]} images, this run needs {info.num_classes} on "
                             f"{tuple(info.image_shape)}")
  template = ensemble_lib.init_ensemble(identity["teacher_model"], identity["num_teachers"],
                                        saved_info, jax.random.key(0))
  params, meta = checkpoint.restore(directory, template.params)
  return ensemble_lib.Ensemble(template.graphdef, params), _migrated(meta)


def _migrated(meta: dict[str, Any]) -> dict[str, Any]:
  """A saved meta with its identity under today's names (`config.migrate_identity`)."""
  if "identity" not in meta:
    return meta
  return {**meta, "identity": config_lib.migrate_identity(meta["identity"])}


def overlap(meta: dict[str, Any], num_teachers: int) -> teacher_partition.Overlap:
  """m (teachers one record reaches) of a loaded ensemble of `num_teachers`, from its meta."""
  return teacher_partition.ensemble_teachers_per_record(
      meta.get("partition"), num_teachers, dataset=meta["identity"]["dataset"])
