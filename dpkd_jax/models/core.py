"""Functional core shared by every model: nnx at the edges, pure functions inside.

A model is built once as an `nnx.Module`, split once into a static `graphdef` and two pure
pytrees of arrays (`params`, trained by optax; `batch_stats`, BatchNorm running statistics),
and from then on only `apply` is used inside jitted losses. Keeping params as plain nested
dicts makes them trivially checkpointable (Orbax), vmappable (per-example gradients) and
keeps the teacher a read-only argument of a train step rather than hidden module state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from flax import nnx

PyTree = Any


class ClassifierOutput(NamedTuple):
  """What every classifier returns.

  Attributes:
    logits: (B, num_classes) unnormalised class scores.
    features: (B, F) penultimate features (input of the last dense layer); DPDFD's
      generator loss uses their L2 norm (DAFL-style activation reward, see losses.feature_norm).
    hint: (B, ...) an intermediate "hint" activation (RONA's guided layer); its shape is
      model specific and documented on each model.
  """

  logits: jax.Array
  features: jax.Array
  hint: jax.Array


class ModelParts(NamedTuple):
  """A model split into its static definition and its pure array pytrees."""

  graphdef: nnx.GraphDef
  params: PyTree  # nested dict of arrays, trained
  batch_stats: PyTree  # nested dict of arrays (empty dict for models without BatchNorm)


def split(model: nnx.Module) -> ModelParts:
  """Splits an nnx model once into (graphdef, params, batch_stats) pure pytrees."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return ModelParts(graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rest))


def merge(parts: ModelParts) -> nnx.Module:
  """Rebuilds a stateful nnx module (for notebooks / inspection, not for jitted code)."""
  return nnx.merge(parts.graphdef, parts.params, parts.batch_stats)


def apply(
    graphdef: nnx.GraphDef,
    params: PyTree,
    batch_stats: PyTree,
    x: jax.Array,
    *,
    train: bool,
) -> tuple[Any, PyTree]:
  """Pure forward pass.

  Args:
    graphdef: static model definition from `split`.
    params: trainable parameters (nested dict of arrays).
    batch_stats: BatchNorm running statistics (nested dict; may be empty).
    x: (B, H, W, C) float32 inputs for classifiers, (B, latent) for generators.
    train: if True BatchNorm normalises with batch statistics and the returned
      `batch_stats` carry the updated running averages; if False running averages
      are used and `batch_stats` is returned unchanged.

  Returns:
    (output, new_batch_stats): the model's output (a `ClassifierOutput` for
    classifiers, an image batch for generators) and the batch statistics.
  """
  module = nnx.merge(graphdef, params, batch_stats)
  out = module(x, train=train)
  if not train:
    return out, batch_stats
  _, _, new_stats = nnx.split(module, nnx.Param, ...)
  return out, nnx.to_pure_dict(new_stats)
