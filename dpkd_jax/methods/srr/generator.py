"""The generator's losses in DP-DFD with selective randomized response: data-free pretraining
against a frozen teacher (the steps are in `step`, the resumable phase in `pretrain`).

Pretraining (Liu et al., arXiv:2409.12384, after DAFL and DeepInversion), teacher frozen:

    z ~ N(0, I)                                   (B, latent)
    x = G(z)                                      (B, H, W, C), generator in train mode
    t, {mu_l, var_l} = teacher(x)                 (B, K) eval-mode logits and, per teacher
                                                  BatchNorm layer l, the batch mean / biased
                                                  variance (C_l,) of the features entering it
    L = CE(t, argmax t) + alpha * IE(t) + beta * sum_l ||mu_l - mu_run_l|| + ||var_l - var_run_l||

with alpha = 5, beta = 10 by default; each term can be left out (`terms`, the paper's Table III
ablation). The teacher is a read-only argument: its parameters and running statistics are
`stop_gradient`ed, so the gradient reaches only the generator (through the teacher's input).

This generator is a deterministic function of the teacher, with no noise: see `privacy` for
what that means for the record-level guarantee (`generator_prior="teacher"`: none).

Fine-tuning (both priors, `step.build_finetune_step`): CE(student(G(z)), noisy label) on the
stage's latents and released labels. It touches neither the teacher nor the true labels:
post-processing of the release.

Reading the BatchNorm inputs. The model zoo does not expose the features entering each
BatchNorm layer. Rather than editing the models, `teacher_forward_with_bn_statistics` wraps the
`promote_dtype` hook that every `nnx.BatchNorm` applies to `(x, running_mean, running_var,
scale, bias)` before normalising (a constructor argument of `nnx.BatchNorm`), on a freshly
merged copy of the teacher inside the traced function, and records x's per-channel statistics.
The stored teacher is never modified.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax import config_checks
from dpkd_jax import losses
from dpkd_jax.models import core

PyTree = Any
# CE: teacher confidence (DAFL's one-hot loss); IE: class balance (information entropy);
# BN: DeepInversion's BatchNorm-statistics matching ("Norm" in the paper's ablation).
GENERATOR_TERMS = ("ce", "ie", "bn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainConfig:
  """Data-free generator pretraining (static under jit).

  Attributes:
    terms: which loss terms are on, a non-empty subset of `GENERATOR_TERMS`.
    entropy_weight: alpha, weight of the information-entropy term.
    bn_weight: beta, weight of the BatchNorm-statistics term.
    steps: generator updates.
    batch_size: B, latents per step.
    latent_dim: generator input size.
    learning_rate: Adam learning rate (cosine-decayed over `steps`).
  """

  terms: tuple[str, ...] = GENERATOR_TERMS
  entropy_weight: float = 5.0
  bn_weight: float = 10.0
  steps: int = 1000
  batch_size: int = 128
  latent_dim: int = 100
  learning_rate: float = 1e-3

  def __post_init__(self):
    object.__setattr__(self, "terms", tuple(self.terms))
    unknown = [t for t in self.terms if t not in GENERATOR_TERMS]
    if not self.terms or unknown or len(set(self.terms)) != len(self.terms):
      raise ValueError(f"generator terms must be distinct members of {GENERATOR_TERMS},"
                       f" at least one, got {self.terms!r}")
    config_checks.non_negative(self, "entropy_weight", "bn_weight")
    config_checks.integers(self, "steps", "batch_size", "latent_dim")
    config_checks.positive(self, "learning_rate")


class BatchNormInputStats(NamedTuple):
  """Per teacher BatchNorm layer, in call order: statistics of the features entering it.

  Attributes:
    batch_means: (C_l,) per-channel means of the layer's input over (B, H, W).
    batch_vars: (C_l,) biased variances of the same (as BatchNorm normalises with).
    running_means: (C_l,) the layer's stored running means.
    running_vars: (C_l,) the layer's stored running variances.
  """

  batch_means: tuple[jax.Array, ...]
  batch_vars: tuple[jax.Array, ...]
  running_means: tuple[jax.Array, ...]
  running_vars: tuple[jax.Array, ...]


def _recording_hook(layer: nnx.BatchNorm, records: list):
  """A `promote_dtype` for `layer` that appends its input's statistics to `records`.

  Args:
    layer: a BatchNorm of a freshly merged teacher.
    records: receives (batch mean, biased batch var, running mean, running var), each (C,),
      once per call of the layer, in call order.

  Returns:
    The hook: `nnx.BatchNorm.__call__` passes it `(x, running_mean, running_var, scale, bias)`
    before normalising; it records and then defers to the layer's own `promote_dtype`.
  """
  original = layer.promote_dtype
  if not isinstance(layer.axis, int):
    raise ValueError(f"BatchNorm with feature axes {layer.axis!r} is not supported")

  def hook(args, dtype=None):
    x, running_mean, running_var = args[0], args[1], args[2]
    feature_axis = layer.axis % x.ndim
    reduce_axes = tuple(i for i in range(x.ndim) if i != feature_axis)
    records.append((jnp.mean(x, reduce_axes), jnp.var(x, reduce_axes),
                    running_mean, running_var))
    return original(args, dtype=dtype)

  return hook


def teacher_forward_with_bn_statistics(
    graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
    x: jax.Array) -> tuple[core.ClassifierOutput, BatchNormInputStats]:
  """Eval-mode teacher forward pass that also returns the statistics entering each BN layer.

  The teacher's parameters and running statistics are `stop_gradient`ed: differentiating the
  result w.r.t. `x` works, w.r.t. the teacher gives zeros.

  Args:
    graphdef, params, batch_stats: the teacher (`core.ModelParts`).
    x: (B, H, W, C) inputs.

  Returns:
    (ClassifierOutput with (B, K) logits, BatchNormInputStats; empty tuples without BN).
  """
  params, batch_stats = jax.lax.stop_gradient((params, batch_stats))
  module = nnx.merge(graphdef, params, batch_stats)  # a fresh copy: the hooks die with it
  records: list = []
  for _, layer in nnx.iter_modules(module):
    if isinstance(layer, nnx.BatchNorm):
      layer.promote_dtype = _recording_hook(layer, records)
  out = module(x, train=False)
  return out, BatchNormInputStats(*(tuple(r[i] for r in records) for i in range(4)))


def generator_loss_terms(config: PretrainConfig, logits: jax.Array,
                         bn_stats: BatchNormInputStats) -> dict[str, jax.Array]:
  """The active pretraining terms, weighted: {"ce", "ie", "bn"} subset, scalars.

  Args:
    config: which terms and their weights.
    logits: (B, K) teacher logits on the generated batch.
    bn_stats: the teacher's BatchNorm input statistics on that batch.

  Returns:
    {term: weighted scalar}; the loss is their sum.
  """
  terms = {}
  if "ce" in config.terms:
    terms["ce"] = losses.argmax_cross_entropy(logits)
  if "ie" in config.terms:
    terms["ie"] = config.entropy_weight * losses.information_entropy(logits)
  if "bn" in config.terms:
    if not bn_stats.batch_means:
      raise ValueError("the BN-statistics term needs a teacher with BatchNorm layers")
    terms["bn"] = config.bn_weight * losses.bn_statistics_loss(*bn_stats)
  return terms
