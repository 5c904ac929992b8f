"""A PATE teacher ensemble trained all at once: n models vmapped over disjoint shards.

The n teachers share one architecture; their parameters are stacked along a leading axis
(n, ...) and one jitted step, `jax.vmap`ped over (params, optimizer state, shard batch),
trains all of them together (one compilation, not n runs). Shards come from
`data.shard_indices` and are cut to equal size (at most n − 1 records dropped) so that they
stack; shard i trains teacher i only, which is what makes one private record change at most
one teacher (`privacy.aggregation`). Teachers are not private; everything that leaves this
module towards a student must go through `aggregation.noisy_histogram`.

`get_teachers` (trained or reused from `teachers_dir`) and `self_train_teachers` build the
ensemble of a run from its config.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.methods.dfpate import config as config_lib
from dpkd_jax.methods.dfpate import query_model as query_model_lib
from dpkd_jax.methods.dfpate import teacher_models
from dpkd_jax.models import core
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate

PyTree = Any
# Random translation of teacher training images by up to this many pixels (cheap augmentation
# that makes small-shard teachers less brittle off the training distribution).
_SHIFT = 2
# Teacher-image pairs per `ensemble_logits` call (bounds its memory to ~1 GB for PatchCNN).
_TEACHER_IMAGES_PER_CALL = 25_000


class Ensemble(NamedTuple):
  """n teachers of one architecture.

  Attributes:
    graphdef: static model definition (shared).
    params: parameters stacked along a leading axis of size n.
  """

  graphdef: nnx.GraphDef
  params: PyTree

  @property
  def size(self) -> int:
    return int(jax.tree.leaves(self.params)[0].shape[0])


def init_ensemble(model: str, num_teachers: int, info: data.DatasetInfo,
                  key: jax.Array) -> Ensemble:
  """`num_teachers` independently initialised copies of a teacher architecture (norm "none").

  Args:
    model: a key of `teacher_models.TEACHER_MODELS`.
    num_teachers: n >= 1.
    info: the private dataset's info (classes, image shape).
    key: a `jax.random.key`; teacher i initialises from `fold_in(key, i)`.

  Returns:
    The `Ensemble` (params stacked to (n, ...)).
  """
  config_checks.integer("num_teachers", num_teachers, minimum=1)
  config_checks.one_of("teacher model", model, teacher_models.TEACHER_MODELS)

  def build(init_key: jax.Array) -> core.ModelParts:
    return models.split(teacher_models.TEACHER_MODELS[model](
        num_classes=info.num_classes, input_shape=info.image_shape, norm="none",
        rngs=nnx.Rngs(init_key)))

  graphdef = build(jax.random.key(0)).graphdef  # shapes only; weights come from `key` below
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_teachers))
  params = jax.vmap(lambda k: build(k).params)(keys)
  return Ensemble(graphdef, params)


def equal_shards(dataset: data.ArrayDataset, num_teachers: int, *,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Disjoint shards cut to equal size.

  Args:
    dataset: the private training set.
    num_teachers: n, number of shards.
    seed: the (public) shard assignment seed.

  Returns:
    (images (n, m, H, W, C) uint8, labels (n, m) int32), m = floor(N / n).
  """
  shards = data.shard_indices(len(dataset), num_teachers, seed=seed)
  size = min(len(s) for s in shards)
  index = np.stack([s[:size] for s in shards])  # (n, m); rows disjoint
  return dataset.images[index], dataset.labels[index]


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "info", "augment"))
def _ensemble_step(graphdef, tx, info, augment, params, opt_state, images, labels, key):
  """One Adam step of every teacher on its own shard batch.

  images: (n, b, H, W, C) uint8; labels: (n, b), -1 = unlabelled (no loss; see
  `self_train`); key: split into one key per teacher.
  """
  def one_teacher(teacher_params, teacher_opt, x, y, teacher_key):
    if augment:
      x = data.random_translate(teacher_key, x, _SHIFT)
    x = data.normalize(x, info)

    def loss_fn(p):
      out, _ = core.apply(graphdef, p, {}, x, train=True)
      labelled = (y >= 0).astype(jnp.float32)  # (b,)
      per_image = optax.softmax_cross_entropy_with_integer_labels(out.logits, jnp.maximum(y, 0))
      return jnp.sum(per_image * labelled) / jnp.maximum(jnp.sum(labelled), 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(teacher_params)
    updates, teacher_opt = tx.update(grads, teacher_opt, teacher_params)
    return optax.apply_updates(teacher_params, updates), teacher_opt, loss

  keys = jax.random.split(key, images.shape[0])
  return jax.vmap(one_teacher)(params, opt_state, images, labels, keys)


def train_ensemble(ensemble: Ensemble, images: np.ndarray, labels: np.ndarray,
                   info: data.DatasetInfo, key: jax.Array, *, epochs: int, batch_size: int,
                   learning_rate: float, augment: bool = True) -> tuple[Ensemble, float]:
  """Trains every teacher on its own shard, all in one vmapped jitted step.

  Args:
    ensemble: initial ensemble (n teachers).
    images: (n, m, H, W, C) uint8 shards; labels: (n, m) int32 (-1: no loss on that image).
    info: dataset info (normalisation).
    key: a `jax.random.key`; step t uses `fold_in(key, t)` (shuffling and augmentation).
    epochs: passes over each shard.
    batch_size: per-teacher batch (<= m; the last partial batch of an epoch is dropped).
    learning_rate: Adam learning rate (cosine decay over all steps).
    augment: random ±2-pixel translations.

  Returns:
    (trained ensemble, mean training loss of the last step).
  """
  num_teachers, shard_size = labels.shape
  if not 1 <= batch_size <= shard_size:
    raise errors.UserError(f"teacher batch_size must be in [1, shard size {shard_size}], got "
                           f"{batch_size} (--teacher_batch_size)")
  steps_per_epoch = shard_size // batch_size
  tx = optax.adam(optax.cosine_decay_schedule(learning_rate, max(epochs * steps_per_epoch, 1)))
  params = ensemble.params
  opt_state = jax.vmap(tx.init)(params)
  loss = jnp.nan
  step = 0
  for epoch in range(epochs):
    order_key = jax.random.fold_in(key, 2 * epoch)
    # Independent permutation per teacher: (n, m) row indices into its own shard.
    order = np.asarray(jax.vmap(lambda k: jax.random.permutation(k, shard_size))(
        jax.random.split(order_key, num_teachers)))
    for start in range(0, steps_per_epoch * batch_size, batch_size):
      rows = order[:, start:start + batch_size]  # (n, b)
      batch_x = np.take_along_axis(images, rows[:, :, None, None, None], axis=1)
      batch_y = np.take_along_axis(labels, rows, axis=1)
      params, opt_state, losses = _ensemble_step(
          ensemble.graphdef, tx, info, augment, params, opt_state, batch_x, batch_y,
          jax.random.fold_in(jax.random.fold_in(key, 2 * epoch + 1), step))
      loss = losses
      step += 1
  return Ensemble(ensemble.graphdef, params), float(jnp.mean(loss))


def own_pseudo_labels(ensemble: Ensemble, pool: np.ndarray, info: data.DatasetInfo, *,
                      threshold: float) -> np.ndarray:
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
  logits = ensemble_logits(ensemble, pool, info)  # (n, P, K)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  labels = probs.argmax(-1).astype(np.int32)
  return np.where(probs.max(-1) >= threshold, labels, -1).astype(np.int32)


def self_train(ensemble: Ensemble, shard_images: np.ndarray, shard_labels: np.ndarray,
               pool: np.ndarray, info: data.DatasetInfo, key: jax.Array, *, epochs: int,
               batch_size: int, learning_rate: float, threshold: float
               ) -> tuple[Ensemble, float]:
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
  return train_ensemble(ensemble, images, labels, info, key, epochs=epochs,
                        batch_size=batch_size, learning_rate=learning_rate)


@functools.partial(jax.jit, static_argnames=("graphdef", "info"))
def _ensemble_logits(graphdef, info, params, images):
  x = data.normalize(images, info)  # (Q, H, W, C)
  return jax.vmap(lambda p: core.apply(graphdef, p, {}, x, train=False)[0].logits)(params)


def ensemble_logits(ensemble: Ensemble, images: np.ndarray, info: data.DatasetInfo, *,
                    chunk: int | None = None) -> np.ndarray:
  """Logits of every teacher on every image (NOT private: aggregate through a mechanism).

  Args:
    ensemble: the n teachers.
    images: (Q, H, W, C) uint8 queries.
    info: dataset info (normalisation).
    chunk: images per compiled call (the last chunk is padded); default: n · chunk ≈
      `_TEACHER_IMAGES_PER_CALL`, since the activations of every teacher on every image of
      the chunk are live at once (PatchCNN: ~40 KB per teacher-image).

  Returns:
    (n, Q, K) float32 logits.
  """
  if chunk is None:
    chunk = max(1, min(1000, _TEACHER_IMAGES_PER_CALL // ensemble.size))
  return evaluate.map_padded(
      lambda x: _ensemble_logits(ensemble.graphdef, info, ensemble.params, x), images, chunk,
      axis=1)


def ensemble_accuracy(ensemble: Ensemble, dataset: data.ArrayDataset) -> dict[str, float]:
  """Test accuracy of the teachers (a non-private diagnostic of the private models).

  Args:
    ensemble: the n teachers.
    dataset: a labelled (test) set.

  Returns:
    {"teacher_mean": mean single-teacher accuracy, "plurality": accuracy of the exact
     plurality vote, "agreement": mean fraction of teachers voting for the plurality class}.
  """
  logits = ensemble_logits(ensemble, dataset.images, dataset.info)  # (n, N, K)
  votes = logits.argmax(-1)  # (n, N)
  counts = np.stack([(votes == k).sum(0) for k in range(logits.shape[-1])], -1)  # (N, K)
  return {"teacher_mean": float((votes == dataset.labels[None]).mean()),
          "plurality": float((counts.argmax(-1) == dataset.labels).mean()),
          "agreement": float(counts.max(-1).mean() / ensemble.size)}


def get_teachers(config: config_lib.DFPATEConfig, train: data.ArrayDataset,
                 test: data.ArrayDataset, *, init_key: jax.Array, train_key: jax.Array
                 ) -> tuple[Ensemble, float, dict[str, float]]:
  """(ensemble, training seconds, test report): restored from `teachers_dir` if it matches,
  else trained (and saved there). The test report (`ensemble_accuracy`, n forward passes per
  test image: minutes on CPU) is computed once and stored beside the ensemble.

  Args:
    config: the run (teacher fields, `teachers_dir`).
    train, test: the private training set and the test set.
    init_key, train_key: keys of `init_ensemble` and `train_ensemble`.
  """
  info = config.info
  ensemble = init_ensemble(config.teacher_model, config.num_teachers, info, init_key)
  saved_dir = config.teachers_dir
  if saved_dir and checkpoint.latest_step(saved_dir) is not None:
    meta = checkpoint.restore_metadata(saved_dir)
    if meta.get("identity") != config.teacher_identity():
      raise ValueError(f"{saved_dir!r} holds an ensemble trained for {meta.get('identity')},"
                       f" not {config.teacher_identity()}; use another teachers_dir")
    params, meta = checkpoint.restore(saved_dir, ensemble.params)
    ensemble = Ensemble(ensemble.graphdef, params)
    if "report" not in meta:  # an ensemble saved without its report: add it once
      meta["report"] = ensemble_accuracy(ensemble, test)
      checkpoint.save(saved_dir, checkpoint.latest_step(saved_dir) + 1,
                      jax.device_get(ensemble.params), meta)
    return ensemble, float(meta["train_seconds"]), meta["report"]
  images, labels = equal_shards(train, config.num_teachers, seed=config.shard_seed)
  start = time.perf_counter()
  ensemble, _ = train_ensemble(
      ensemble, images, labels, info, train_key, epochs=config.teacher_epochs,
      batch_size=min(config.teacher_batch_size, labels.shape[1]),
      learning_rate=config.teacher_lr)
  seconds = time.perf_counter() - start
  report = ensemble_accuracy(ensemble, test)
  if saved_dir:
    checkpoint.save(saved_dir, 0, jax.device_get(ensemble.params),
                    {"identity": config.teacher_identity(), "train_seconds": seconds,
                     "report": report})
  return ensemble, seconds, report


def self_train_teachers(config: config_lib.DFPATEConfig, ensemble: Ensemble,
                        train: data.ArrayDataset, query_model: query_model_lib.QueryModel, *,
                        pool_key: jax.Array, train_key: jax.Array) -> tuple[Ensemble, float]:
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
  images, labels = equal_shards(train, config.num_teachers, seed=config.shard_seed)
  ensemble, _ = self_train(
      ensemble, images, labels, pool, config.info, train_key,
      epochs=config.teacher_self_training_epochs,
      batch_size=min(config.teacher_batch_size, labels.shape[1]),
      learning_rate=config.teacher_lr, threshold=config.teacher_pseudo_threshold)
  return ensemble, time.perf_counter() - start
