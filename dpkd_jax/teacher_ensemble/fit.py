"""Train a stacked ensemble from its config, with its meta; or train and save it, no student.

`fit(config, train, test, ...)` is the one training path (data-free PATE's `get_teachers`
calls it with its run's keys); `train_and_save(config, directory)` is the command
`python -m experiments.teacher_ensemble`: load the data, fit, save (`store`).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.privacy import seeds
from dpkd_jax.teacher_ensemble import config as config_lib
from dpkd_jax.teacher_ensemble import ensemble as ensemble_lib
from dpkd_jax.teacher_ensemble import store
from dpkd_jax.train import checkpoint
from dpkd_jax.train import memory

# fold_in tags of the ensemble's root key (`train_and_save`), one per use.
_INIT_FOLD, _TRAIN_FOLD = 0, 1


def fit(config: config_lib.TeacherEnsembleConfig, train: data.ArrayDataset,
        test: data.ArrayDataset, *, init_key: jax.Array, train_key: jax.Array
        ) -> tuple[ensemble_lib.Ensemble, dict[str, Any]]:
  """Trains `config`'s teachers on equal disjoint shards of `train`, tests them on `test`.

  Args:
    config: the ensemble (its `data_dir` and `seed` are not read here).
    train, test: the private training split (sharded) and the test split (the report).
    init_key, train_key: keys of `init_ensemble` and `train_ensemble`.

  Returns:
    (ensemble, meta): the meta as `store` describes it (identity, partition, report, ...).
  """
  info = train.info
  _check_size(config, train)
  ensemble = ensemble_lib.init_ensemble(config.teacher_model, config.num_teachers, info,
                                        init_key)
  images, labels = ensemble_lib.equal_shards(train, config.num_teachers, seed=config.shard_seed)
  start = time.perf_counter()
  ensemble, _ = ensemble_lib.train_ensemble(
      ensemble, images, labels, info, train_key, epochs=config.teacher_epochs,
      batch_size=min(config.teacher_batch_size, labels.shape[1]),
      learning_rate=config.teacher_learning_rate)
  seconds = time.perf_counter() - start
  meta = {"identity": config.identity(),
          "partition": store.partition_fields(train, config.dataset, config.num_teachers,
                                              shard_seed=config.shard_seed,
                                              shard_size=int(labels.shape[1])),
          "num_classes": info.num_classes, "image_shape": list(info.image_shape),
          "train_seconds": seconds,
          "report": ensemble_lib.ensemble_accuracy(ensemble, test)}
  return ensemble, meta


def _check_size(config: config_lib.TeacherEnsembleConfig, train: data.ArrayDataset) -> None:
  """Refuses (one line) an ensemble with an empty shard, or one whose parameters, gradients
  and Adam moments (4 float32 copies) and one batch per teacher cannot fit in memory, before
  anything is allocated."""
  if config.num_teachers > len(train):
    raise errors.UserError(f"--num_teachers={config.num_teachers} exceeds the {len(train)} "
                           "training records: some teacher would get none; give fewer teachers")
  one = jax.eval_shape(lambda: ensemble_lib.init_ensemble(
      config.teacher_model, 1, train.info, jax.random.key(0)).params)
  params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(one))
  batch = min(config.teacher_batch_size, len(train) // config.num_teachers)
  memory.check_fits("--num_teachers", config.num_teachers, config.num_teachers * (
      4 * 4 * params + batch * memory.per_example_bytes(train.info.image_shape)))


def train_and_save(config: config_lib.TeacherEnsembleConfig, directory: str, *,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains the ensemble and saves it in `directory`; returns its meta.

  A directory that already holds this ensemble (same identity, partition recorded) is kept
  as it is and its meta returned; one holding anything else is refused (nothing is written).

  Raises:
    UserError: `directory` holds another ensemble, or this one without its partition record.
  """
  if checkpoint.latest_step(directory) is not None:
    meta = store.read_meta(directory, flag="--workdir")
    if meta["identity"] != config.identity():
      raise errors.UserError(f"--workdir: {directory!r} holds an ensemble trained for "
                             f"{meta['identity']}, not {config.identity()}; give another "
                             "--workdir")
    if "partition" not in meta:
      raise errors.UserError(f"--workdir: {directory!r} holds this ensemble without the "
                             "record of its shards (saved by an older version), which DPDFD "
                             "needs to count one teacher per record; give another --workdir")
    log(f"{directory} already holds this ensemble: kept (remove it to retrain)")
    return meta
  train = data.load(config.dataset, "train", data_dir=config.data_dir)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  root = seeds.root_key(config.seed)  # all 64 bits of the seed
  ensemble, meta = fit(config, train, test, init_key=jax.random.fold_in(root, _INIT_FOLD),
                       train_key=jax.random.fold_in(root, _TRAIN_FOLD))
  store.save(directory, ensemble, {**meta, "seed": config.seed})
  return {**meta, "seed": config.seed}
