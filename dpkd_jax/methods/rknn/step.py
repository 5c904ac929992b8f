"""The reverse k-NN rooms: one labelling round (`build_train_step`) and the student's state and
step.

`build_train_step(plan, config, ...)` is one round's release: k-means++ queries from the public
embeddings, the private records' votes released with the plan's noise
(`votes.release_counts`: the only release, `plan.event(1)`, charged by the caller BEFORE the
step) and the noisy labels propagated to the queried public samples. The round is host code
around jitted parts (k-means, the counts).

The student sees only public images and their DP labels (post-processing of the noisy vote
counts), so its step carries no privacy parameter and may use BatchNorm. Cross-entropy with
label smoothing (cluster labels are noisy as a block; the reference code smooths with 0.45)
and random rotation + translation (+ flips for flip-invariant classes), as the reference
code's MNIST student. AdamW with a cosine-decayed learning rate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from dpkd_jax import data
from dpkd_jax import kernels
from dpkd_jax import models
from dpkd_jax.methods.rknn import config as config_lib
from dpkd_jax.methods.rknn import privacy
from dpkd_jax.methods.rknn import votes
from dpkd_jax.models import core
from dpkd_jax.representations import augment
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState


@functools.cache
def _optimizer(learning_rate: float, weight_decay: float,
               total_steps: int) -> optax.GradientTransformation:
  # One object per setting: TrainState's static `tx` is compared by identity under jit, so
  # later rounds and repeated runs in one process reuse the compiled step.
  return optax.adamw(optax.cosine_decay_schedule(learning_rate, total_steps),
                     weight_decay=weight_decay)


def init_state(config: config_lib.RKNNConfig, key: jax.Array, *, total_steps: int
               ) -> TrainState:
  """A fresh student of `config.student` (initialised from `key`) and its AdamW state for
  `total_steps` steps."""
  student, info = config.student, config.info
  parts = core.split(models.create_classifier(
      student.model, num_classes=info.num_classes, input_shape=info.image_shape,
      norm=student.norm, rngs=nnx.Rngs(key)))
  return TrainState.create(parts, _optimizer(student.learning_rate, student.weight_decay,
                                             total_steps))


# A round: (public labels (n_public,) int32, queried public indices, round index) -> (the
# labels with the queried ones replaced, (n_queried,) int cluster of every queried sample).
RoundStep = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def build_train_step(plan: privacy.RKNNPlan, config: config_lib.RKNNConfig, *,
                     public_embeddings: np.ndarray, private_embeddings: np.ndarray,
                     private_labels: np.ndarray, kmeans_key: jax.Array,
                     noise_key: jax.Array) -> RoundStep:
  """The labelling round of a run: the noise (mode, k, ε_r) from `plan`, the rest from `config`.

  Args:
    plan: the run's plan (`votes.release_counts` reads its mode, k and ε_r).
    config: the run (queries, k-means, chunk size, classes).
    public_embeddings: (n_public, d) the public images' embeddings.
    private_embeddings, private_labels: (N, d) and (N,) the private records.
    kmeans_key, noise_key: the run's streams; round r uses fold_in(stream, r).

  Returns:
    `train_step(public_labels, queried, round_index) -> (public_labels, assignments)`.
  """
  def train_step(public_labels: np.ndarray, queried: np.ndarray,
                 round_index: int) -> tuple[np.ndarray, np.ndarray]:
    clusters = votes.kmeans(jax.random.fold_in(kmeans_key, round_index),
                            public_embeddings[queried], config.num_queries,
                            num_iterations=config.kmeans_iterations,
                            num_restarts=config.kmeans_restarts)
    noisy_counts = votes.release_counts(
        plan, jax.random.fold_in(noise_key, round_index), private_embeddings, private_labels,
        clusters.centres, num_classes=config.info.num_classes, chunk_size=config.chunk_size)
    assignments = np.asarray(clusters.assignments)
    labels = np.array(public_labels, copy=True)
    labels[queried] = np.asarray(votes.propagate_labels(noisy_counts, assignments))
    return labels, assignments

  return train_step


def make_train_step(plan: privacy.RKNNPlan, config: config_lib.RKNNConfig, *,
                    public_embeddings: np.ndarray, private_embeddings: np.ndarray,
                    private_labels: np.ndarray, kmeans_key: jax.Array,
                    noise_key: jax.Array) -> RoundStep:
  """The round as the run calls it: `build_train_step`'s, as built (host code: its k-means and
  counts are compiled and cached inside `votes`)."""
  return build_train_step(plan, config, public_embeddings=public_embeddings,
                          private_embeddings=private_embeddings, private_labels=private_labels,
                          kmeans_key=kmeans_key, noise_key=noise_key)


@kernels.cache_per_ops
def build_student_step(config: config_lib.StudentConfig, info: data.DatasetInfo,
                       mesh: Mesh | None = None):
  """Jitted `(state, images_uint8, labels, key) -> (state, metrics)`, state donated; cached
  per (config, dataset, mesh) so that every round of a run shares one compilation. With a
  `mesh`, the batch comes split over its 'data' axis and state and metrics stay replicated."""

  def train_step(state: TrainState, images_uint8: jax.Array, labels: jax.Array,
                 key: jax.Array):
    images = images_uint8.astype(jnp.float32)  # (B, H, W, C) in [0, 255]
    if config.augment:
      images = augment.random_affine(key, images, rotation_degrees=config.rotation_degrees,
                                     translate_fraction=config.translate_fraction,
                                     flip=info.flip_invariant)
    x = data.normalize(images, info)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, info.num_classes),
                                  config.label_smoothing)  # (B, C)

    def loss_fn(params):
      out, new_stats = core.apply(state.graphdef, params, state.batch_stats, x, train=True)
      return optax.softmax_cross_entropy(out.logits, targets).mean(), (out.logits, new_stats)

    (loss, (logits, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params)
    state = state.apply_gradients(grads, new_stats)
    return state, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

  if mesh is None:
    return jax.jit(train_step, donate_argnums=0)
  replicated = sharding.replicated(mesh)
  return jax.jit(train_step, donate_argnums=0, out_shardings=(replicated, replicated))
