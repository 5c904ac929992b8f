"""n teachers of one architecture trained at once, vmapped over disjoint equal shards.

The n teachers' parameters are stacked along a leading axis (n, ...) and one jitted step,
`jax.vmap`ped over (params, optimizer state, shard batch), trains all of them together (one
compilation, not n runs). Shards come from `data.shard_indices` and are cut to equal size (at
most n − 1 records dropped) so that they stack (`equal_shards`); shard i trains teacher i only,
which is what makes one private record change at most one teacher. Teachers are not private:
whatever leaves them towards a student must go through a mechanism of `dpkd_jax.privacy`.
"""

from __future__ import annotations

import functools
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
from dpkd_jax.models import core
from dpkd_jax.teacher_ensemble import architectures
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
    model: a key of `architectures.TEACHER_MODELS`.
    num_teachers: n >= 1.
    info: the private dataset's info (classes, image shape).
    key: a `jax.random.key`; teacher i initialises from `fold_in(key, i)`.

  Returns:
    The `Ensemble` (params stacked to (n, ...)).
  """
  config_checks.integer("num_teachers", num_teachers, minimum=1)
  config_checks.one_of("teacher model", model, architectures.TEACHER_MODELS)

  def build(init_key: jax.Array) -> core.ModelParts:
    return models.split(architectures.TEACHER_MODELS[model](
        num_classes=info.num_classes, input_shape=info.image_shape, norm="none",
        rngs=nnx.Rngs(init_key)))

  parts = build(jax.random.key(0))  # shapes only; weights come from `key` below
  if jax.tree.leaves(parts.batch_stats):  # every forward here passes no statistics
    raise ValueError(f"teacher model {model!r} keeps BatchNorm statistics with norm 'none'; "
                     "use one without (mlp, patch_cnn)")
  graphdef = parts.graphdef
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

  images: (n, b, H, W, C) uint8; labels: (n, b), -1 = unlabelled (no loss: e.g. a public
  image its teacher did not label confidently); key: split into one key per teacher.
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
