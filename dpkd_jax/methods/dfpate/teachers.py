"""Data-free PATE's teacher ensemble: trained or reused (`get_teachers`), then self-trained.

The ensemble itself (n teachers vmapped over disjoint equal shards, its logits, its saved
form) lives in `dpkd_jax.teacher_ensemble`, shared with multi-teacher DPDFD. This module adds
what only data-free PATE does with it: reuse from `teachers_dir` under the run's identity, and
self-training on samples of the released DP query model (`own_pseudo_labels`, `self_train`),
which keeps the one-record-one-teacher property since teacher i labels the public pool
itself. Teachers are not private; everything that leaves them towards a student goes through
`aggregation.noisy_histogram`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import data
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods.dfpate import config as config_lib
from dpkd_jax.methods.dfpate import query_model as query_model_lib
from dpkd_jax.teacher_ensemble import store
from dpkd_jax.train import checkpoint
from dpkd_jax.train import selection

def own_pseudo_labels(ensemble: teacher_ensemble.Ensemble, pool: np.ndarray,
                      info: data.DatasetInfo, *, threshold: float) -> np.ndarray:
  """Each teacher's OWN labels for a public pool: argmax where its confidence >= threshold.

  Teacher i's labels depend only on teacher i (never on the ensemble), so training teacher i
  on them keeps the one-record-one-teacher property.

  Args:
    ensemble: the n teachers.
    pool: (P, H, W, C) uint8 public images (e.g. samples of a released DP query model).
    info: dataset info (normalisation).
    threshold: minimum softmax confidence; below it the label is -1 (unlabelled).

  Returns:
    (n, P) int32 labels, -1 where the teacher is not confident.
  """
  logits = teacher_ensemble.ensemble_logits(ensemble, pool, info)  # (n, P, K)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  labels = probs.argmax(-1).astype(np.int32)
  return np.where(probs.max(-1) >= threshold, labels, -1).astype(np.int32)


def self_train(ensemble: teacher_ensemble.Ensemble, shard_images: np.ndarray,
               shard_labels: np.ndarray, pool: np.ndarray, info: data.DatasetInfo,
               key: jax.Array, *, epochs: int, batch_size: int, learning_rate: float,
               threshold: float) -> tuple[teacher_ensemble.Ensemble, float]:
  """One round of per-teacher self-training on a public pool (pseudo-labelling).

  Teacher i continues training on its shard plus the pool images it labels confidently
  itself (`own_pseudo_labels`): a function of shard i and public data only.

  Args:
    ensemble: trained teachers.
    shard_images: (n, m, H, W, C) uint8 shards; shard_labels: (n, m) int32.
    pool: (P, H, W, C) uint8 public images.
    info: dataset info.
    key: a `jax.random.key` (as in `train_ensemble`).
    epochs, batch_size, learning_rate: of the continued training.
    threshold: confidence threshold of the pseudo-labels.

  Returns:
    (self-trained ensemble, mean loss of the last step).
  """
  pseudo = own_pseudo_labels(ensemble, pool, info, threshold=threshold)  # (n, P)
  n = shard_labels.shape[0]
  images = np.concatenate([shard_images, np.broadcast_to(pool, (n, *pool.shape))], axis=1)
  labels = np.concatenate([shard_labels, pseudo], axis=1)
  return teacher_ensemble.train_ensemble(ensemble, images, labels, info, key, epochs=epochs,
                                         batch_size=batch_size, learning_rate=learning_rate)


def get_teachers(config: config_lib.DFPATEConfig, train: data.ArrayDataset,
                 test: data.ArrayDataset, *, init_key: jax.Array, train_key: jax.Array
                 ) -> tuple[teacher_ensemble.Ensemble, float, dict[str, float]]:
  """(ensemble, training seconds, test report): restored from `teachers_dir` if it matches,
  else trained (`teacher_ensemble.fit`) and saved there. The test report (`ensemble_accuracy`,
  n forward passes per test image: minutes on CPU) is computed once and stored beside the
  ensemble, with the record of its shards (so DPDFD can reuse it at one teacher per record).

  Args:
    config: the run (teacher fields, `teachers_dir`).
    train, test: the private training set and the test set.
    init_key, train_key: keys of `init_ensemble` and `train_ensemble`.
  """
  saved_dir = config.teachers_dir
  if saved_dir and checkpoint.latest_step(saved_dir) is not None:
    meta = store.read_meta(saved_dir, flag="--teachers_dir")  # identity in today's names
    if meta.get("identity") != config.teacher_identity():
      raise ValueError(f"{saved_dir!r} holds an ensemble trained for {meta.get('identity')},"
                       f" not {config.teacher_identity()}; use another teachers_dir")
    ensemble, meta = store.load(saved_dir, flag="--teachers_dir")
    if "report" not in meta:  # an ensemble saved without its report: add it once
      meta["report"] = teacher_ensemble.ensemble_accuracy(ensemble, test)
      store.save(saved_dir, ensemble, meta)
    return ensemble, float(meta["train_seconds"]), meta["report"]
  ensemble, meta = teacher_ensemble.fit(config.ensemble_config(), train, test,
                                        init_key=init_key, train_key=train_key)
  meta["identity"] = config.teacher_identity()  # + the hold-out its shards left out
  if saved_dir:
    store.save(saved_dir, ensemble, meta)
  return ensemble, meta["train_seconds"], meta["report"]


def private_rows(config: config_lib.DFPATEConfig, num_train: int) -> np.ndarray:
  """(R,) rows of the N = `num_train` training records the teachers' shards partition (all
  but the validation hold-out, `run._prepare`): where a one-run audit's canaries go, each in
  exactly one shard (`dpkd_jax.audit`)."""
  return selection.hold_out_indices(num_train, config.validation_examples)[0]


def self_train_teachers(config: config_lib.DFPATEConfig, ensemble: teacher_ensemble.Ensemble,
                        train: data.ArrayDataset, query_model: query_model_lib.QueryModel, *,
                        pool_key: jax.Array, train_key: jax.Array
                        ) -> tuple[teacher_ensemble.Ensemble, float]:
  """`self_train` on samples of the released query model (not cached: the pool depends on
  the run's secret seed). Returns (ensemble, seconds).

  Args:
    config: the run (`teacher_self_training_*` fields).
    ensemble: the trained teachers.
    train: the private training set (re-cut into the same shards).
    query_model: the released DP query model (its samples are public).
    pool_key, train_key: keys of the pool's samples and of the continued training.
  """
  start = time.perf_counter()
  pool = query_model_lib.sample_queries(
      pool_key, query_model, config.teacher_self_training_pool, config.info.image_shape,
      temperature=config.query_temperature)
  images, labels = teacher_ensemble.equal_shards(train, config.num_teachers,
                                                 seed=config.shard_seed)
  ensemble, _ = self_train(
      ensemble, images, labels, pool, config.info, train_key,
      epochs=config.teacher_self_training_epochs,
      batch_size=min(config.teacher_batch_size, labels.shape[1]),
      learning_rate=config.teacher_learning_rate, threshold=config.teacher_pseudo_threshold)
  return ensemble, time.perf_counter() - start
