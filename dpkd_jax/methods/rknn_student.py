"""The reverse k-NN student: a classifier trained on the privately labelled public set.

The student sees only public images and their DP labels (post-processing of the noisy vote
counts), so training it costs no privacy and may use BatchNorm. Cross-entropy with label
smoothing (cluster labels are noisy as a block; the reference code smooths with 0.45) and
random rotation + translation (+ flips for flip-invariant classes), as the reference code's
MNIST student. AdamW with a cosine-decayed learning rate.
"""

from __future__ import annotations

import dataclasses
import functools
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.models import classifiers
from dpkd_jax.models import core
from dpkd_jax.privacy import validation
from dpkd_jax.representations import augment
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train.state import TrainState

_LOG_EVERY_STEPS = 50


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentConfig:
  """How the student is trained on the labelled public set.

  Attributes:
    model: a name in `models.CLASSIFIERS`; norm: "batch", "group" or "none".
    epochs: passes over the public set; batch_size: images per step.
    learning_rate: peak AdamW rate (cosine decay to 0); weight_decay: decoupled decay.
    label_smoothing: in [0, 1), mass spread uniformly over the classes.
    augment: random rotation in [-rotation_degrees, rotation_degrees] and shifts up to
      `translate_fraction` of the image size (flips too for flip-invariant datasets).
  """

  model: str = "lenet5"
  norm: str = "batch"
  epochs: int = 20
  batch_size: int = 100
  learning_rate: float = 2e-3
  weight_decay: float = 1e-4
  label_smoothing: float = 0.1
  augment: bool = True
  rotation_degrees: float = 15.0
  translate_fraction: float = 0.1

  def __post_init__(self):
    if self.model not in models.CLASSIFIERS:
      raise ValueError(f"unknown student model {self.model!r}; known: "
                       f"{sorted(models.CLASSIFIERS)}")
    classifiers.validate_norm(self.norm)
    validation.check_int("epochs", self.epochs, minimum=1)
    validation.check_int("batch_size", self.batch_size, minimum=1)
    validation.check_float("learning_rate", self.learning_rate, positive=True)
    validation.check_float("weight_decay", self.weight_decay, positive=False)
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
    validation.check_float("rotation_degrees", self.rotation_degrees, positive=False)
    validation.check_float("translate_fraction", self.translate_fraction, positive=False)


@functools.cache
def _optimizer(learning_rate: float, weight_decay: float,
               total_steps: int) -> optax.GradientTransformation:
  # One object per setting: TrainState's static `tx` is compared by identity under jit, so
  # later rounds and repeated runs in one process reuse the compiled step.
  return optax.adamw(optax.cosine_decay_schedule(learning_rate, total_steps),
                     weight_decay=weight_decay)


@functools.cache
def _make_train_step(config: StudentConfig, info: data.DatasetInfo):
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


def train_student(key: jax.Array, images: np.ndarray, labels: np.ndarray, *,
                  info: data.DatasetInfo, config: StudentConfig, progress: bool = False,
                  writer: metrics_lib.MetricsWriter | None = None, step_offset: int = 0,
                  desc: str = "student") -> core.ModelParts:
  """Trains a fresh student on (public images, DP labels).

  Args:
    key: a `jax.random.key`; split into initialisation, batch-order and augmentation streams.
    images: (n, H, W, C) uint8 public images.
    labels: (n,) int labels (released DP labels, never the true public labels).
    info: the dataset's `DatasetInfo` (normalisation, classes, flip invariance).
    config: the `StudentConfig`.
    progress: show a tqdm bar.
    writer: optional metrics writer (train loss every 50 steps, at `step_offset + step`).
    step_offset: added to the logged steps (rounds share one metrics file).
    desc: progress bar label.

  Returns:
    The trained model's `ModelParts`.
  """
  if len(images) != len(labels):
    raise ValueError(f"{len(images)} images but {len(labels)} labels")
  batch_size = min(config.batch_size, len(images))
  init_key, order_key, augment_key = jax.random.split(key, 3)
  parts = core.split(models.create_classifier(
      config.model, num_classes=info.num_classes, input_shape=info.image_shape,
      norm=config.norm, rngs=nnx.Rngs(init_key)))
  steps_per_epoch = len(images) // batch_size
  total_steps = steps_per_epoch * config.epochs
  state = TrainState.create(parts, _optimizer(config.learning_rate, config.weight_decay,
                                             total_steps))
  train_step = _make_train_step(config, info)
  labels = np.asarray(labels, np.int32)
  bar = tqdm.tqdm(total=total_steps, disable=not progress, desc=desc)
  step = 0  # Host-side counter: reading state.step would block on every dispatch.
  for epoch in range(config.epochs):
    for indices in data.epoch_batches(jax.random.fold_in(order_key, epoch), len(images),
                                      batch_size):
      state, step_metrics = train_step(state, images[indices], labels[indices],
                                       jax.random.fold_in(augment_key, step))
      step += 1
      bar.update(1)
      if step % _LOG_EVERY_STEPS == 0 or step == total_steps:
        step_metrics = jax.device_get(step_metrics)
        if writer is not None:
          writer.write(step_offset + step, step_metrics, prefix="student/")
        bar.set_postfix(loss=f"{step_metrics['loss']:.3f}")
  bar.close()
  return state.parts


def confidence(parts: core.ModelParts, images: np.ndarray, info: data.DatasetInfo) -> np.ndarray:
  """(n,) max softmax probability of the student on each image (eval mode)."""
  logits = evaluate_lib.predict_logits(parts, images, info)  # (n, C)
  return np.asarray(jnp.max(jax.nn.softmax(jnp.asarray(logits), axis=-1), axis=-1))
