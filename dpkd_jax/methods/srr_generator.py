"""The generator of DP-DFD with selective randomized response: data-free pretraining against a
frozen teacher, and fine-tuning on noisy labels through the student.

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

This generator is a deterministic function of the teacher, with no noise: see `srr` for what
that means for the record-level guarantee (`generator_prior="teacher"`: none).

Fine-tuning (both priors): CE(student(G(z)), noisy label) on the stage's latents and released
labels. It touches neither the teacher nor the true labels: post-processing of the release.

Reading the BatchNorm inputs. The model zoo does not expose the features entering each
BatchNorm layer. Rather than editing the models, `teacher_forward_with_bn_statistics` wraps the
`promote_dtype` hook that every `nnx.BatchNorm` applies to `(x, running_mean, running_var,
scale, bias)` before normalising (a constructor argument of `nnx.BatchNorm`), on a freshly
merged copy of the teacher inside the traced function, and records x's per-channel statistics.
The stored teacher is never modified.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
import tqdm
from flax import nnx

from dpkd_jax import losses
from dpkd_jax.models import core
from dpkd_jax.train import checkpoint
from dpkd_jax.train import outputs
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

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
    for name in ("entropy_weight", "bn_weight"):
      if not getattr(self, name) >= 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    for name in ("steps", "batch_size", "latent_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")


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


def build_pretrain_step(config: PretrainConfig, teacher_graphdef: nnx.GraphDef):
  """Pure `step(generator, teacher_params, teacher_batch_stats, key) -> (generator, metrics)`."""

  def step(generator: TrainState, teacher_params: PyTree, teacher_batch_stats: PyTree,
           key: jax.Array):
    z = jax.random.normal(key, (config.batch_size, config.latent_dim))  # (B, latent)

    def loss_fn(params):
      x, new_stats = core.apply(generator.graphdef, params, generator.batch_stats, z, train=True)
      out, bn_stats = teacher_forward_with_bn_statistics(
          teacher_graphdef, teacher_params, teacher_batch_stats, x)
      terms = generator_loss_terms(config, out.logits, bn_stats)
      return sum(terms.values()), (terms, new_stats)

    (loss, (terms, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(generator.params)
    generator = generator.apply_gradients(grads, new_stats)
    return generator, {"loss": loss, **{f"l_{k}": v for k, v in terms.items()}}

  return step


@functools.cache
def make_pretrain_step(config: PretrainConfig, teacher_graphdef: nnx.GraphDef):
  """`build_pretrain_step` jitted with the generator state donated (one per setting, so
  repeated runs in one process reuse the compiled step)."""
  return jax.jit(build_pretrain_step(config, teacher_graphdef), donate_argnums=0)


def build_finetune_step(student_graphdef: nnx.GraphDef):
  """Pure `step(generator, student_params, student_batch_stats, z, labels) -> (generator,
  metrics)`: one update of CE(student(G(z)), labels), the student frozen in eval mode.

  `labels` are released (noisy) labels: no teacher quantity enters this step.
  """

  def step(generator: TrainState, student_params: PyTree, student_batch_stats: PyTree,
           z: jax.Array, labels: jax.Array):
    student_params, student_batch_stats = jax.lax.stop_gradient(
        (student_params, student_batch_stats))

    def loss_fn(params):
      x, new_stats = core.apply(generator.graphdef, params, generator.batch_stats, z, train=True)
      out, _ = core.apply(student_graphdef, student_params, student_batch_stats, x, train=False)
      ce = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels)  # (B,)
      return jnp.mean(ce), new_stats

    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(generator.params)
    return generator.apply_gradients(grads, new_stats), {"generator_loss": loss}

  return step


@functools.cache
def make_finetune_step(student_graphdef: nnx.GraphDef):
  """`build_finetune_step` jitted with the generator state donated (one per architecture)."""
  return jax.jit(build_finetune_step(student_graphdef), donate_argnums=0)


def pretrain_generator(config: PretrainConfig, generator: core.ModelParts,
                       teacher: core.ModelParts, workdir: str, key: jax.Array, *,
                       identity: dict[str, Any], checkpoint_every: int = 250,
                       progress: bool = True, mesh: jax.sharding.Mesh | None = None,
                       ) -> core.ModelParts:
  """Pretrains `generator` against the frozen `teacher`, resumable from `workdir`.

  `workdir/checkpoints/<step>` holds the generator state and, in its metadata, the config,
  `identity` (what the generator is for: dataset, teacher, architecture; compared on resume
  and by `load_pretrained`) and the key data of `key`, so a resumed run continues the same
  stream. `key` must be derived from the caller's root key (never the root key itself).

  Args:
    config: the pretraining hyper-parameters.
    generator: the initial generator.
    teacher: the frozen teacher.
    workdir: output directory.
    key: this phase's key (a restored run uses its saved key instead).
    identity: JSON-able description of the generator's purpose.
    checkpoint_every: steps between checkpoints.
    progress: show a tqdm bar.
    mesh: devices (default: all, replicated state).

  Returns:
    The pretrained generator (params and BatchNorm running statistics).
  """
  mesh = sharding.data_mesh() if mesh is None else mesh
  state = TrainState.create(generator, _optimizer(config))
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = {"config": _config_json(config), "identity": identity, "step": 0,
          "key_data": jax.random.key_data(key).tolist()}
  start = 0
  if checkpoint.latest_step(ckpt_dir) is not None:
    saved = checkpoint.restore_metadata(ckpt_dir)
    if saved.get("config") != meta["config"] or saved.get("identity") != identity:
      raise ValueError(f"{workdir!r} holds a generator pretrained for another run; use a fresh"
                       " directory")
    arrays, meta = checkpoint.restore(ckpt_dir, state.arrays())
    state, start = state.with_arrays(arrays), int(meta["step"])
    key = jax.random.wrap_key_data(jnp.asarray(meta["key_data"], jnp.uint32))
  state = sharding.replicate(state, mesh)
  teacher = sharding.replicate(teacher, mesh)
  step_fn = make_pretrain_step(config, teacher.graphdef)
  # Losses of teacher(G(z)): noiseless functions of the teacher, so private diagnostics.
  writer = outputs.PrivateDiagnosticsWriter(workdir)
  bar = tqdm.tqdm(total=config.steps, initial=start, disable=not progress, desc="generator")
  step = start
  while step < config.steps:
    for _ in range(min(checkpoint_every, config.steps - step)):
      state, step_metrics = step_fn(state, teacher.params, teacher.batch_stats,
                                    jax.random.fold_in(key, step))
      step += 1
      bar.update(1)
    step_metrics = jax.device_get(step_metrics)
    writer.write(step, step_metrics, prefix="pretrain/")
    bar.set_postfix(loss=f"{step_metrics['loss']:.3f}")
    checkpoint.save(ckpt_dir, step, jax.device_get(state.arrays()), {**meta, "step": step})
  bar.close()
  writer.close()
  return jax.device_get(state.parts)


def load_pretrained(workdir: str, template: core.ModelParts, *, config: PretrainConfig,
                    identity: dict[str, Any]) -> core.ModelParts:
  """The finished generator of `pretrain_generator(config, ..., workdir, identity=identity)`.

  Both must match, so that a run reusing the generator reports its true pretraining.

  Raises:
    FileNotFoundError: no checkpoint in `workdir`.
    ValueError: it was pretrained for another dataset/teacher/architecture or with another
      config, or is unfinished.
  """
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = checkpoint.restore_metadata(ckpt_dir)
  if meta.get("identity") != identity:
    raise ValueError(f"the generator in {workdir!r} was pretrained for {meta.get('identity')},"
                     f" not for {identity}")
  if meta.get("config") != _config_json(config):
    raise ValueError(f"the generator in {workdir!r} was pretrained with {meta.get('config')},"
                     f" this run asks for {_config_json(config)}")
  if meta["step"] < config.steps:
    raise ValueError(f"the generator in {workdir!r} is unfinished ({meta['step']} of"
                     f" {config.steps} steps)")
  arrays, _ = checkpoint.restore(ckpt_dir, TrainState.create(template, _optimizer(config)).arrays())
  return core.ModelParts(template.graphdef, arrays["params"], arrays["batch_stats"])


def _optimizer(config: PretrainConfig) -> optax.GradientTransformation:
  return adam(config.learning_rate, config.steps)


@functools.cache
def adam(learning_rate: float, decay_steps: int | None = None) -> optax.GradientTransformation:
  """Adam, cosine-decayed over `decay_steps` if given. One object per setting: TrainState's
  static `tx` is compared by identity under jit, so repeated runs reuse compiled steps."""
  if decay_steps is None:
    return optax.adam(learning_rate)
  return optax.adam(optax.cosine_decay_schedule(learning_rate, decay_steps))


def _config_json(config: PretrainConfig) -> dict[str, Any]:
  out = dataclasses.asdict(config)
  out["terms"] = list(config.terms)
  return out
