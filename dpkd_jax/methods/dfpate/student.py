"""Data-free PATE student: training on noisy ensemble answers, and query selection.

Everything here is post-processing of released quantities (`aggregation.NoisyVotes`) and of
public randomness (procedural images): no function in this module sees a teacher.

Targets from one noisy histogram h̃ (Q, K) of n teachers:
  * "hard": cross-entropy to argmax h̃ (GNMax label), weight 1 where the noisy top-2 margin is
    at least `margin_threshold · n` and 0 elsewhere (unanswered queries keep weight 0);
  * "soft": squared error between the student's softmax and h̃ / n. E[h̃ / n] = h / n, so the
    loss is an unbiased estimate of the loss to the ensemble's mean vote, up to a constant.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpkd_jax import data
from dpkd_jax.models import core
from dpkd_jax.train import evaluate
from dpkd_jax.train.state import TrainState

TargetKind = Literal["hard", "soft"]
TARGET_KINDS = ("hard", "soft")
# Random translation of student inputs by up to this many pixels (free augmentation).
_SHIFT = 2


def targets_from_votes(noisy_histogram: np.ndarray, num_teachers: int, *, target: TargetKind,
                       margin_threshold: float) -> tuple[np.ndarray, np.ndarray]:
  """Training targets and weights from released noisy histograms (post-processing).

  Args:
    noisy_histogram: (Q, K) released noisy vote histograms.
    num_teachers: n (a public parameter of the run).
    target: "hard" or "soft" (module docstring).
    margin_threshold: hard targets only: keep queries whose noisy top-2 margin is at least
      this fraction of n (0 keeps all).

  Returns:
    (targets (Q, K) float32, weights (Q,) float32).
  """
  if target not in TARGET_KINDS:
    raise ValueError(f"target must be one of {TARGET_KINDS}, got {target!r}")
  hist = np.asarray(noisy_histogram, np.float32)
  if target == "soft":
    return hist / num_teachers, np.ones(len(hist), np.float32)
  top2 = np.sort(hist, -1)[:, -2:]  # (Q, 2): second largest, largest
  keep = (top2[:, 1] - top2[:, 0]) >= margin_threshold * num_teachers
  onehot = np.eye(hist.shape[-1], dtype=np.float32)[hist.argmax(-1)]
  return onehot, keep.astype(np.float32)


@functools.partial(jax.jit, static_argnames=("info", "target"))
def train_step(state: TrainState, images: jax.Array, targets: jax.Array, weights: jax.Array,
               key: jax.Array, *, info: data.DatasetInfo, target: TargetKind
               ) -> tuple[TrainState, jax.Array]:
  """One student update on a batch of answered queries.

  Args:
    state: student train state.
    images: (B, H, W, C) uint8 queries.
    targets: (B, K) targets from `targets_from_votes`.
    weights: (B,) per-query weights (0 = unanswered / filtered out).
    key: a `jax.random.key` for the augmentation.
    info: dataset info (normalisation).
    target: "hard" (weighted cross-entropy) or "soft" (squared error of probabilities).

  Returns:
    (new state, weighted mean loss).
  """
  x = data.normalize(data.random_translate(key, images, _SHIFT), info)
  denominator = jnp.maximum(jnp.sum(weights), 1.0)

  def loss_fn(params):
    out, new_stats = core.apply(state.graphdef, params, state.batch_stats, x, train=True)
    if target == "hard":
      per_query = optax.softmax_cross_entropy(out.logits, targets)  # (B,)
    else:
      per_query = jnp.sum((jax.nn.softmax(out.logits) - targets) ** 2, -1)  # (B,)
    return jnp.sum(per_query * weights) / denominator, new_stats

  (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  return state.apply_gradients(grads, new_stats), loss


def train_student(state: TrainState, images: np.ndarray, targets: np.ndarray,
                  weights: np.ndarray, key: jax.Array, *, info: data.DatasetInfo,
                  target: TargetKind, epochs: int, batch_size: int) -> tuple[TrainState, float]:
  """Epochs of `train_step` over the answered queries with positive weight.

  Args:
    state: student train state.
    images: (Q, H, W, C) uint8 queries; targets (Q, K); weights (Q,).
    key: a `jax.random.key`; epoch e shuffles with `fold_in(key, 2e)` and augments with
      `fold_in(fold_in(key, 2e + 1), step)`.
    info, target: as in `train_step`.
    epochs: passes over the kept queries.
    batch_size: B (the last partial batch of an epoch is dropped; one batch minimum).

  Returns:
    (new state, mean loss of the last epoch).
  """
  kept = np.flatnonzero(weights > 0)
  if kept.size == 0:
    return state, float("nan")
  batch_size = min(batch_size, kept.size)
  losses = []
  for epoch in range(epochs):
    order = kept[np.asarray(jax.random.permutation(jax.random.fold_in(key, 2 * epoch),
                                                   kept.size))]
    losses = []
    for step, start in enumerate(range(0, kept.size - batch_size + 1, batch_size)):
      rows = order[start:start + batch_size]
      state, loss = train_step(state, images[rows], targets[rows], weights[rows],
                               jax.random.fold_in(jax.random.fold_in(key, 2 * epoch + 1), step),
                               info=info, target=target)
      losses.append(loss)
  return state, float(jnp.mean(jnp.stack(losses)))


@functools.partial(jax.jit, static_argnames=("info",))
def _probs(state: TrainState, images: jax.Array, *, info: data.DatasetInfo) -> jax.Array:
  out, _ = core.apply(state.graphdef, state.params, state.batch_stats,
                      data.normalize(images, info), train=False)
  return jax.nn.softmax(out.logits)


def predict_probs(state: TrainState, images: np.ndarray, info: data.DatasetInfo, *,
                  chunk: int = 2000) -> np.ndarray:
  """(N, K) student probabilities on uint8 images (padded fixed-size chunks)."""
  return evaluate.map_padded(lambda x: _probs(state, x, info=info), images, chunk)


def pseudo_label_targets(student_probs: np.ndarray, *, threshold: float
                         ) -> tuple[np.ndarray, np.ndarray]:
  """Self-training targets: the student's own argmax where it is confident (post-processing).

  Args:
    student_probs: (P, K) student probabilities on unanswered pool images.
    threshold: minimum confidence; less confident images get weight 0.

  Returns:
    (one-hot targets (P, K) float32, weights (P,) float32 in {0, 1}).
  """
  if not 0 <= threshold <= 1:
    raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
  probs = np.asarray(student_probs, np.float32)
  onehot = np.eye(probs.shape[-1], dtype=np.float32)[probs.argmax(-1)]
  return onehot, (probs.max(-1) >= threshold).astype(np.float32)


def select_queries(student_probs: np.ndarray, num: int) -> np.ndarray:
  """Class-balanced, most-confident pool images according to the DP student.

  Post-processing: uses only the (DP) student and a public pool. For each class k the pool
  images the student assigns to k are ranked by confidence and the top ceil(num / K) kept;
  shortfalls are filled with the most confident remaining images.

  Args:
    student_probs: (P, K) student probabilities on the pool.
    num: number of queries to pick (<= P).

  Returns:
    (num,) distinct pool indices.
  """
  pool, num_classes = student_probs.shape
  if not 0 <= num <= pool:
    raise ValueError(f"num must be in [0, pool size {pool}], got {num}")
  predicted = student_probs.argmax(-1)
  confidence = student_probs.max(-1)
  per_class = -(-num // num_classes)
  chosen = []
  for k in range(num_classes):
    members = np.flatnonzero(predicted == k)
    chosen.append(members[np.argsort(-confidence[members], kind="stable")[:per_class]])
  chosen = np.concatenate(chosen)
  if chosen.size > num:  # drop the least confident picks across classes
    chosen = chosen[np.argsort(-confidence[chosen], kind="stable")[:num]]
  if chosen.size < num:
    rest = np.setdiff1d(np.arange(pool), chosen)
    fill = rest[np.argsort(-confidence[rest], kind="stable")[:num - chosen.size]]
    chosen = np.concatenate([chosen, fill])
  return np.sort(chosen)
