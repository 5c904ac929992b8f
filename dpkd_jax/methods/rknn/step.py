"""The reverse k-NN student's state and training step (no noise: post-processing).

The student sees only public images and their DP labels (post-processing of the noisy vote
counts), so its step carries no privacy parameter and may use BatchNorm. Cross-entropy with
label smoothing (cluster labels are noisy as a block; the reference code smooths with 0.45)
and random rotation + translation (+ flips for flip-invariant classes), as the reference
code's MNIST student. AdamW with a cosine-decayed learning rate.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpkd_jax import data
from dpkd_jax import kernels
from dpkd_jax import models
from dpkd_jax.methods.rknn import config as config_lib
from dpkd_jax.models import core
from dpkd_jax.representations import augment
from dpkd_jax.train.state import TrainState


@functools.cache
def _optimizer(learning_rate: float, weight_decay: float,
               total_steps: int) -> optax.GradientTransformation:
  # One object per setting: TrainState's static `tx` is compared by identity under jit, so
  # later rounds and repeated runs in one process reuse the compiled step.
  return optax.adamw(optax.cosine_decay_schedule(learning_rate, total_steps),
                     weight_decay=weight_decay)


def init_state(key: jax.Array, config: config_lib.StudentConfig, info: data.DatasetInfo, *,
               total_steps: int) -> TrainState:
  """A fresh student (initialised from `key`) and its AdamW state for `total_steps` steps."""
  parts = core.split(models.create_classifier(
      config.model, num_classes=info.num_classes, input_shape=info.image_shape,
      norm=config.norm, rngs=nnx.Rngs(key)))
  return TrainState.create(parts, _optimizer(config.learning_rate, config.weight_decay,
                                             total_steps))


@kernels.cache_per_ops
def build_train_step(config: config_lib.StudentConfig, info: data.DatasetInfo):
  """Jitted `(state, images_uint8, labels, key) -> (state, metrics)`, state donated; cached
  per (config, dataset) so that every round of a run shares one compilation."""

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

  return jax.jit(train_step, donate_argnums=0)
