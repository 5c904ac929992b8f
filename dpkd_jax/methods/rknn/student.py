"""The reverse k-NN student: a classifier trained on the privately labelled public set.

Training it costs no privacy: it sees public images and released labels only (`step`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from dpkd_jax import data
from dpkd_jax.methods.rknn import config as config_lib
from dpkd_jax.methods.rknn import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import sharding
from dpkd_jax.train.progress import StepBar

_LOG_EVERY_STEPS = 50


def steps(config: config_lib.RKNNConfig, num_images: int) -> int:
  """Optimizer steps of `train_student` on `num_images` images (full batches, all epochs)."""
  return num_images // min(config.student.batch_size, num_images) * config.student.epochs


def train_student(config: config_lib.RKNNConfig, key: jax.Array, images: np.ndarray,
                  labels: np.ndarray, *, progress: bool = False,
                  writer: metrics_lib.MetricsWriter | None = None, step_offset: int = 0,
                  desc: str = "student", mesh: Mesh | None = None) -> core.ModelParts:
  """Trains a fresh student (`config.student`, on `config.info`) on (public images, DP labels).

  Args:
    config: the run.
    key: a `jax.random.key`; split into initialisation, batch-order and augmentation streams.
    images: (n, H, W, C) uint8 public images.
    labels: (n,) int labels (released DP labels, never the true public labels).
    progress: show a tqdm bar.
    writer: optional metrics writer (train loss every 50 steps, at `step_offset + step`).
    step_offset: added to the logged steps (rounds share one metrics file).
    desc: progress bar label.
    mesh: a mesh with a 'data' axis: each batch split over it, the state replicated (the
      batch size must divide by its size); None: one device.

  Returns:
    The trained model's `ModelParts`.
  """
  if len(images) != len(labels):
    raise ValueError(f"{len(images)} images but {len(labels)} labels")
  student = config.student
  batch_size = min(student.batch_size, len(images))
  init_key, order_key, augment_key = jax.random.split(key, 3)
  total_steps = steps(config, len(images))
  state = step_lib.init_state(config, init_key, total_steps=total_steps)
  train_step = step_lib.build_student_step(student, config.info, mesh)
  if mesh is not None:
    state = sharding.replicate(state, mesh)
  labels = np.asarray(labels, np.int32)
  bar = StepBar(total=total_steps, disable=not progress, desc=desc)
  step = 0  # Host-side counter: reading state.step would block on every dispatch.
  for epoch in range(student.epochs):
    for indices in data.epoch_batches(jax.random.fold_in(order_key, epoch), len(images),
                                      batch_size):
      batch = (images[indices], labels[indices])
      if mesh is not None:
        batch = sharding.shard_batch(batch, mesh)
      state, step_metrics = train_step(state, *batch, jax.random.fold_in(augment_key, step))
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
