"""Batched, jitted evaluation of a classifier on an `ArrayDataset`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dpkd_jax import data
from dpkd_jax.models import core
from dpkd_jax.train import distributed

# results.json key of `accuracy_per_class` (the released student's, at the end of a run).
PER_CLASS_KEY = "test_accuracy_per_class"


@functools.partial(jax.jit, static_argnames=("graphdef", "info"))
def _batch_stats(graphdef: nnx.GraphDef, params, batch_stats, inputs, labels, mask, info):
  """(correct, loss_sum) over the real (mask=1) rows of one padded batch."""
  x = data.model_inputs(inputs, info)  # pixels normalized; features as they are
  out, _ = core.apply(graphdef, params, batch_stats, x, train=False)
  correct = jnp.sum((jnp.argmax(out.logits, -1) == labels) * mask)
  loss = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(out.logits, labels) * mask)
  return correct, loss


@functools.partial(jax.jit, static_argnames=("graphdef", "info"))
def _class_counts(graphdef: nnx.GraphDef, params, batch_stats, inputs, labels, mask, info):
  """(K,) correct predictions and (K,) real rows per true class of one padded batch."""
  x = data.model_inputs(inputs, info)
  out, _ = core.apply(graphdef, params, batch_stats, x, train=False)
  hits = (jnp.argmax(out.logits, -1) == labels) * mask
  zeros = jnp.zeros((out.logits.shape[-1],), jnp.float32)
  return zeros.at[labels].add(hits), zeros.at[labels].add(mask)


def fitted_chunk(chunk: int, n: int) -> int:
  """`chunk`, or the power of two at or above `n` when that is smaller.

  Fewer than `chunk` inputs are not padded up to it (64 mock test images padded to 1,000 rows
  ran 15x the forward passes for nothing); rounding up to a power of two keeps the compiled
  shapes few (at most log2(chunk) + 1 of them) whatever sizes the callers pass.
  """
  return min(chunk, 1 << max(n - 1, 0).bit_length())


def map_padded(fn, images: np.ndarray, chunk: int, *, axis: int = 0) -> np.ndarray:
  """`fn` over fixed-size chunks of `images` (the last one zero-padded), concatenated.

  Padding keeps the input shapes few (`fitted_chunk`), so a jitted `fn` compiles once for
  every len(images) >= chunk, and once per power of two below it.

  Args:
    fn: maps (chunk, ...) images to an array whose `axis` indexes those images.
    images: (N, ...) inputs.
    chunk: images per call.
    axis: the image axis of `fn`'s output (e.g. 1 for (teachers, images, K)).

  Returns:
    `fn`'s outputs for the N real images, concatenated along `axis`.
  """
  chunk = fitted_chunk(chunk, len(images))
  outs = []
  for start in range(0, len(images), chunk):
    part = images[start:start + chunk]
    pad = chunk - len(part)
    if pad:
      part = np.concatenate([part, np.zeros((pad,) + part.shape[1:], part.dtype)])
    outs.append(np.take(np.asarray(fn(part)), np.arange(chunk - pad), axis=axis))
  return np.concatenate(outs, axis=axis)


def predict_logits(parts: core.ModelParts, images_uint8: np.ndarray, info: data.DatasetInfo,
                   *, batch_size: int = 1000) -> np.ndarray:
  """Logits (N, K) of a model on uint8 images, in eval mode, in fixed-size padded batches."""
  fn = jax.jit(lambda p, s, x: core.apply(parts.graphdef, p, s, data.normalize(x, info), train=False)[0].logits)
  return map_padded(lambda x: fn(parts.params, parts.batch_stats, x), images_uint8, batch_size)


def _padded_batches(dataset: data.ArrayDataset | data.FeatureDataset, batch_size: int):
  """Yields (inputs, labels, mask) of `fitted_chunk(batch_size, N)` rows each: the dataset in
  order, the last batch zero-padded with mask 0 on its padding (one compiled shape).

  Host copies: every process evaluates the whole test set locally (multi-host: the trained
  params are global arrays; a test set fits in host memory).
  """
  n = len(dataset)
  if n == 0:
    raise ValueError("cannot evaluate on an empty dataset")
  batch_size = fitted_chunk(batch_size, n)
  for start in range(0, n, batch_size):
    images = np.asarray(dataset.images[start:start + batch_size])
    labels = np.asarray(dataset.labels[start:start + batch_size])
    mask = np.zeros(batch_size, np.float32)
    mask[:len(images)] = 1.0
    pad = batch_size - len(images)
    if pad:
      images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
      labels = np.concatenate([labels, np.zeros(pad, labels.dtype)])
    yield images, labels, mask


def evaluate(parts: core.ModelParts, dataset: data.ArrayDataset | data.FeatureDataset, *,
             batch_size: int = 1000) -> dict[str, float]:
  """Accuracy and mean cross-entropy of `parts` on `dataset` (eval-mode BatchNorm).

  Args:
    parts: the model (graphdef, params, batch_stats).
    dataset: uint8 images (normalized with `dataset.info`) or float32 features, and int labels.
    batch_size: evaluation batch (`fitted_chunk`: no larger than the dataset needs); the
      last batch is padded and masked so one shape compiles.

  Returns:
    {'accuracy': float in [0, 1], 'loss': float}.
  """
  n = len(dataset)
  params, batch_stats = distributed.to_host((parts.params, parts.batch_stats))
  correct = loss = 0.0
  for images, labels, mask in _padded_batches(dataset, batch_size):
    c, l = _batch_stats(parts.graphdef, params, batch_stats, images, labels, mask, dataset.info)
    correct += float(c)
    loss += float(l)
  return {"accuracy": correct / n, "loss": loss / n}


def accuracy_per_class(parts: core.ModelParts,
                       dataset: data.ArrayDataset | data.FeatureDataset, *,
                       batch_size: int = 1000) -> list[float | None]:
  """Test accuracy on each true class k = 0 .. K − 1 (None for a class with no example).

  Which classes a data-free student misses is the question its overall accuracy hides (a
  generator that rarely produces one class leaves the student weak on it); it is a function
  of the released student and public test labels only.
  """
  params, batch_stats = distributed.to_host((parts.params, parts.batch_stats))
  correct = total = 0.0
  for images, labels, mask in _padded_batches(dataset, batch_size):
    hits, rows = _class_counts(parts.graphdef, params, batch_stats, images, labels, mask,
                               dataset.info)
    correct = correct + np.asarray(hits, np.float64)  # counts: exact in float32 up to 2^24
    total = total + np.asarray(rows, np.float64)
  return [float(c / t) if t else None for c, t in zip(correct, total)]
