"""RONA's jitted student steps (hint learning, distillation, self learning) and the student
they train: any classifier of `STUDENTS` wrapped with an adaptation layer (`init_student`).

Each private step queries the teacher on one public batch of S rows and lets the student learn
only from the *sanitized* teacher knowledge (`privacy.mechanisms.sanitize`):

    knowledge  k = teacher(x)          hint (S, h, w, c) or softened probs softmax(t/τ) (S, K),
                                        padding rows zeroed
    bound      B = running mean of ||aux_teacher(x)||_F (adaptive) or a fixed B
    release    k~ = clip_F(k, B) + N(0, σ²B²)        the only teacher-dependent value
    student    <- grad of hint_l2(adapter(student_hint(x)), k~)      (hint step)
               or   τ² · CE(k~, softmax(student_logits(x)/τ))        (distillation step)

The sanitize acts on the teacher's knowledge *before* the loss: noise added to a loss value is
a constant shift that changes no gradient. The distillation loss is the soft cross-entropy to
the noisy target; it differs from Hinton's KL only by the target's entropy, a constant, so with
σ = 0 and an inactive bound the gradient equals `losses.kd_kl`'s. It is linear in the target,
so the student's expected gradient is the one of the bounded clean target. The self-learning
step is plain cross-entropy on public labels and never touches a teacher.

Privacy of one query (replace-one sensitive record; `accounting.rona_event`): the teacher may
change arbitrarily, so every row of k may change; after the Frobenius clip both versions lie
in the ball of radius B, so the release moves by <= 2B, and noise std σB makes it a Gaussian
mechanism with noise multiplier σ/2. The bound B must not depend on sensitive data: it comes
from the auxiliary teacher (trained on the public split only) on the same public batch and from
earlier public batches, never from the teacher. Teachers run in eval mode with
`stop_gradient`; metrics report only the loss, B and the noise std (post-mechanism values).

The adaptation layer (`HintAdapter`) maps the student's hint to the teacher's hint shape: a
1×1 convolution when both are (B, h, w, c) maps of equal spatial size, else a dense layer on
the flattened hint. It is trained with the student but is not part of the deployed model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from dpkd_jax import data
from dpkd_jax import losses
from dpkd_jax import models
from dpkd_jax.models import compact
from dpkd_jax.models import core
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import validation
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

PyTree = Any
BOUND_MODES = ("adaptive", "fixed", "none")
# Students: the zoo plus the compact RONA students (until they are in the model registry).
STUDENTS = {**models.CLASSIFIERS, **compact.COMPACT_CLASSIFIERS}


class HintAdapter(nnx.Module):
  """Maps a student hint (B, ...) to the teacher hint shape (B, *teacher_hint_shape).

  Args:
    student_hint_shape: one example's student hint shape, e.g. (7, 7, 16).
    teacher_hint_shape: one example's teacher hint shape, e.g. (7, 7, 64).
    rngs: initialisation streams.
  """

  def __init__(self, student_hint_shape: Sequence[int], teacher_hint_shape: Sequence[int], *,
               rngs: nnx.Rngs):
    self.teacher_hint_shape = tuple(int(d) for d in teacher_hint_shape)
    student_hint_shape = tuple(int(d) for d in student_hint_shape)
    self.is_conv = (len(student_hint_shape) == 3 and len(self.teacher_hint_shape) == 3
                    and student_hint_shape[:2] == self.teacher_hint_shape[:2])
    if self.is_conv:
      self.layer = nnx.Conv(student_hint_shape[-1], self.teacher_hint_shape[-1], (1, 1), rngs=rngs)
    else:
      self.layer = nnx.Linear(math.prod(student_hint_shape), math.prod(self.teacher_hint_shape),
                              rngs=rngs)

  def __call__(self, hint: jax.Array) -> jax.Array:
    if self.is_conv:
      return self.layer(hint)  # (B, h, w, c_teacher)
    flat = self.layer(hint.reshape(hint.shape[0], -1))  # (B, prod(teacher hint))
    return flat.reshape((hint.shape[0],) + self.teacher_hint_shape)


class HintedStudent(nnx.Module):
  """The student with its adaptation layer: `hint` of the output is the *adapted* hint.

  Its params split as {"student": ..., "adapter": ...}; `params["student"]` with the bare
  student's graphdef is the deployed model (see `student_parts`).
  """

  def __init__(self, student: nnx.Module, adapter: HintAdapter):
    self.student = student
    self.adapter = adapter

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    out = self.student(x, train=train)
    return core.ClassifierOutput(out.logits, out.features, self.adapter(out.hint))


def create_hinted_student(student: nnx.Module, *, input_shape: Sequence[int],
                          teacher_hint_shape: Sequence[int], rngs: nnx.Rngs) -> HintedStudent:
  """Wraps `student` with an adapter from its hint shape (probed at `input_shape`) to the
  teacher's `teacher_hint_shape` (one example, no batch axis)."""
  probe = jax.eval_shape(lambda: student(jnp.zeros((1, *input_shape)), train=False))
  return HintedStudent(student, HintAdapter(probe.hint.shape[1:], teacher_hint_shape, rngs=rngs))


@functools.cache
def _adam(learning_rate: float) -> optax.GradientTransformation:
  # One object per rate: TrainState's static `tx` is compared by identity under jit, so runs
  # in one process (resume, sweeps, tests) reuse the compiled steps instead of recompiling.
  return optax.adam(learning_rate)


def init_student(name: str, *, info: data.DatasetInfo, norm: str, learning_rate: float,
                 teacher_hint_shape: Sequence[int], key: jax.Array
                 ) -> tuple[TrainState, nnx.GraphDef]:
  """A `HintedStudent` train state (Adam) and the bare student's graphdef.

  Args:
    name: a key of `STUDENTS`.
    info: the dataset (classes, image shape).
    norm: the student's norm layers.
    learning_rate: Adam's learning rate.
    teacher_hint_shape: one example's teacher hint shape (the adapter's output).
    key: initialisation key (split for the student and the adapter).

  Returns:
    (state, student_graphdef): the train state of student + adapter, and the graphdef that
    turns `state.params["student"]` into the deployed student (`student_parts`).
  """
  student_key, adapter_key = jax.random.split(key)
  student = STUDENTS[name](num_classes=info.num_classes, input_shape=info.image_shape,
                           norm=norm, rngs=nnx.Rngs(student_key))
  student_graphdef = core.split(student).graphdef
  hinted = create_hinted_student(student, input_shape=info.image_shape,
                                 teacher_hint_shape=teacher_hint_shape,
                                 rngs=nnx.Rngs(adapter_key))
  return TrainState.create(core.split(hinted), _adam(learning_rate)), student_graphdef


def student_parts(state: TrainState, student_graphdef: nnx.GraphDef) -> core.ModelParts:
  """The deployed student (no adapter) from a `HintedStudent` train state."""
  return core.ModelParts(student_graphdef, state.params["student"],
                         state.batch_stats.get("student", {}))


class FrozenModel(NamedTuple):
  """A read-only model's arrays (teacher or auxiliary teacher); its graphdef is static."""

  params: PyTree
  batch_stats: PyTree


class BoundState(NamedTuple):
  """Running mean of the auxiliary teacher's knowledge norms: B = norm_sum / count."""

  norm_sum: jax.Array  # () float32
  count: jax.Array  # () float32

  @classmethod
  def zeros(cls) -> "BoundState":
    return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SanitizeConfig:
  """How one kind of teacher knowledge (hint or soft labels) is released.

  Attributes:
    noise_multiplier: σ >= 0: noise std σB on every coordinate.
    bound_mode: "adaptive" (B = running mean of the auxiliary teacher's norms, no privacy
      cost), "fixed" (B = `l2_bound`) or "none" (raw knowledge; only with σ = 0, non-private).
    l2_bound: B for "fixed"; must be None otherwise.
  """

  noise_multiplier: float
  bound_mode: str = "adaptive"
  l2_bound: float | None = None

  def __post_init__(self):
    validation.check_float("noise_multiplier", self.noise_multiplier, positive=False)
    if self.bound_mode not in BOUND_MODES:
      raise ValueError(f"bound_mode must be one of {BOUND_MODES}, got {self.bound_mode!r}")
    if (self.bound_mode == "fixed") != (self.l2_bound is not None):
      raise ValueError(f"give l2_bound exactly with bound_mode='fixed', got bound_mode="
                       f"{self.bound_mode!r}, l2_bound={self.l2_bound!r}")
    if self.l2_bound is not None:
      validation.check_float("l2_bound", self.l2_bound, positive=True)
    if self.bound_mode == "none" and self.noise_multiplier != 0:
      raise ValueError(f"bound_mode='none' releases raw teacher knowledge: it needs "
                       f"noise_multiplier=0 (non-private), got {self.noise_multiplier!r}")


def release_knowledge(config: SanitizeConfig, key: jax.Array, knowledge: jax.Array,
                      aux_knowledge: jax.Array | None, bound: BoundState
                      ) -> tuple[jax.Array, BoundState, jax.Array, jax.Array]:
  """The RONA sanitize of one query batch, with the bound chosen by `config.bound_mode`.

  Args:
    config: σ and the bound mode.
    key: used once, for the noise.
    knowledge: (S, ...) teacher knowledge, padding rows already zeroed.
    aux_knowledge: (S, ...) the auxiliary teacher's knowledge on the same rows (only its
      Frobenius norm is used, and only in adaptive mode; None in the other modes).
    bound: running-mean state before this batch.

  Returns:
    (noisy (S, ...) what the student may learn from, the updated bound state, B used, noise
    std σB).
  """
  if config.bound_mode == "none":
    return knowledge, bound, jnp.asarray(jnp.inf), jnp.zeros(())
  if config.bound_mode == "fixed":
    l2_bound = jnp.asarray(config.l2_bound, jnp.float32)
  else:
    aux_norm = jnp.sqrt(jnp.sum(jnp.square(aux_knowledge)))  # () Frobenius, public data only
    bound = BoundState(bound.norm_sum + aux_norm, bound.count + 1.0)
    l2_bound = bound.norm_sum / bound.count
  release = mechanisms.sanitize(key, knowledge, l2_bound=l2_bound,
                                noise_multiplier=config.noise_multiplier)
  return release.noisy, bound, l2_bound, release.noise_stddev


def _frozen_outputs(graphdef: nnx.GraphDef, model: FrozenModel,
                    x: jax.Array) -> core.ClassifierOutput:
  out, _ = core.apply(graphdef, model.params, model.batch_stats, x, train=False)
  return jax.tree.map(jax.lax.stop_gradient, out)


def _masked_mean(per_example: jax.Array, mask: jax.Array) -> jax.Array:
  weight = mask.astype(per_example.dtype)  # (S,)
  return jnp.sum(per_example * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def _zero_padding(x: jax.Array, mask: jax.Array) -> jax.Array:
  return x * mask.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)


def build_private_step(kind: str, config: SanitizeConfig, *, temperature: float,
                       info: data.DatasetInfo, teacher_graphdef: nnx.GraphDef,
                       aux_graphdef: nnx.GraphDef | None) -> Callable:
  """The pure `step(state, teacher, aux_teacher, bound, images_uint8, mask, key)`.

  Args:
    kind: "hint" (adapted student hint regresses the sanitized teacher hint) or "distill"
      (student softened by τ fits the sanitized softened teacher probabilities).
    config: the sanitize of this kind of knowledge.
    temperature: τ > 0 of distillation (unused by "hint").
    info: dataset normalisation.
    teacher_graphdef, aux_graphdef: static definitions of the two frozen models; the
      auxiliary teacher is only run (and needed) in adaptive bound mode.

  Returns:
    step -> (state, bound, metrics): `state` a `HintedStudent` TrainState, `teacher` and
    `aux_teacher` `FrozenModel`s (aux None unless adaptive), `bound` a `BoundState`, images
    (S, H, W, C) uint8, mask (S,) bool (False: padding), key this query's key. Metrics:
    loss, l2_bound, noise_stddev (post-mechanism values only).
  """
  if kind not in ("hint", "distill"):
    raise ValueError(f"kind must be 'hint' or 'distill', got {kind!r}")
  validation.check_float("temperature", temperature, positive=True)

  def knowledge_of(out: core.ClassifierOutput) -> jax.Array:
    if kind == "hint":
      return out.hint  # (S, h, w, c)
    return jax.nn.softmax(out.logits / temperature, axis=-1)  # (S, K)

  if config.bound_mode == "adaptive" and aux_graphdef is None:
    raise ValueError("the adaptive bound needs the auxiliary teacher's graphdef")

  def step(state: TrainState, teacher: FrozenModel, aux_teacher: FrozenModel | None,
           bound: BoundState, images_uint8: jax.Array, mask: jax.Array, key: jax.Array):
    x = data.normalize(images_uint8, info)  # (S, H, W, C)
    knowledge = _zero_padding(knowledge_of(_frozen_outputs(teacher_graphdef, teacher, x)), mask)
    aux = None
    if config.bound_mode == "adaptive":
      aux = _zero_padding(knowledge_of(_frozen_outputs(aux_graphdef, aux_teacher, x)), mask)
    noisy, bound, l2_bound, noise_stddev = release_knowledge(config, key, knowledge, aux, bound)
    target = jax.lax.stop_gradient(noisy)  # the only teacher-dependent value from here on

    def loss_fn(params):
      out, new_stats = core.apply(state.graphdef, params, state.batch_stats, x, train=True)
      if kind == "hint":
        per_example = losses.hint_l2(out.hint, target)  # (S,)
      else:
        per_example = losses.soft_cross_entropy(out.logits / temperature,
                                                target) * temperature**2  # (S,)
      return _masked_mean(per_example, mask), new_stats

    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads, new_stats)
    return state, bound, {"loss": loss, "l2_bound": l2_bound, "noise_stddev": noise_stddev}

  return step


def build_self_learning_step(info: data.DatasetInfo) -> Callable:
  """The pure `step(state, images_uint8, labels) -> (state, metrics)`: CE on public labels.

  No teacher is involved, so it has no privacy cost. Metrics: loss, accuracy.
  """

  def step(state: TrainState, images_uint8: jax.Array, labels: jax.Array):
    x = data.normalize(images_uint8, info)

    def loss_fn(params):
      out, new_stats = core.apply(state.graphdef, params, state.batch_stats, x, train=True)
      loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()
      return loss, (out.logits, new_stats)

    (loss, (logits, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads, new_stats)
    return state, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

  return step


def build_batch_stats_step(info: data.DatasetInfo) -> Callable:
  """The pure `step(state, images_uint8) -> state`: one train-mode forward pass that moves the
  student's BatchNorm running statistics towards this batch; parameters and optimizer state
  are unchanged.

  Selected queries (k-center, margin) are atypical by design, and running statistics taken
  from them broke evaluation: MNIST, 40% public, σ = 0, one distillation epoch took the test
  accuracy from 0.983 to 0.833, and 0.979 once the statistics were re-estimated on random
  public batches. `train_rona` therefore re-estimates them with this step after every private
  epoch (public data, no privacy cost).
  """

  def step(state: TrainState, images_uint8: jax.Array) -> TrainState:
    x = data.normalize(images_uint8, info)
    _, new_stats = core.apply(state.graphdef, state.params, state.batch_stats, x, train=True)
    return state.replace(batch_stats=new_stats)

  return step


@functools.cache
def make_batch_stats_step(info: data.DatasetInfo, mesh: Mesh) -> Callable:
  """`build_batch_stats_step` jitted, state donated, output replicated on `mesh`."""
  return jax.jit(build_batch_stats_step(info), donate_argnums=0,
                 out_shardings=sharding.replicated(mesh))


@functools.cache
def make_private_step(kind: str, config: SanitizeConfig, *, temperature: float,
                      info: data.DatasetInfo, teacher_graphdef: nnx.GraphDef,
                      aux_graphdef: nnx.GraphDef | None, mesh: Mesh) -> Callable:
  """`build_private_step` jitted, state donated, outputs replicated on `mesh`. Cached, so
  resumed runs, sweeps and tests in one process reuse the compiled step."""
  replicated = sharding.replicated(mesh)
  return jax.jit(build_private_step(kind, config, temperature=temperature, info=info,
                                    teacher_graphdef=teacher_graphdef, aux_graphdef=aux_graphdef),
                 donate_argnums=0, out_shardings=(replicated, replicated, replicated))


@functools.cache
def make_self_learning_step(info: data.DatasetInfo, mesh: Mesh) -> Callable:
  """`build_self_learning_step` jitted, state donated, outputs replicated on `mesh`."""
  replicated = sharding.replicated(mesh)
  return jax.jit(build_self_learning_step(info), donate_argnums=0,
                 out_shardings=(replicated, replicated))
