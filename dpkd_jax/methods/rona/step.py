"""RONA's jitted student steps: hint learning and distillation (private), self learning and
the BatchNorm re-estimation (public).

Each private step queries the teacher on one public batch of S rows and lets the student learn
only from the *sanitized* teacher knowledge (`sanitize.release_knowledge`):

    knowledge  k = teacher(x)          hint (S, h, w, c) or softened probs softmax(t/τ) (S, K),
                                        padding rows zeroed
    release    k~ = clip_F(k, B) + N(0, σ²B²)        σ and B from the plan
    student    <- grad of hint_l2(adapter(student_hint(x)), k~)      (hint step)
               or   τ² · CE(k~, softmax(student_logits(x)/τ))        (distillation step)

The sanitize acts on the teacher's knowledge *before* the loss: noise added to a loss value is
a constant shift that changes no gradient. The distillation loss is the soft cross-entropy to
the noisy target; it differs from Hinton's KL only by the target's entropy, a constant, so with
σ = 0 and an inactive bound the gradient equals `losses.kd_kl`'s. It is linear in the target,
so the student's expected gradient is the one of the bounded clean target. Teachers run in
eval mode with `stop_gradient`; metrics report only the loss, B and the noise std
(post-mechanism values). `build_train_step(plan, kind, ...)` takes σ and the bound from the
plan (`RONAPlan.sanitize_config`), the only source of both.

The self-learning step is plain cross-entropy on public labels (`train.supervised`, the
teacher's step), optionally on randomly shifted public images, and never touches a teacher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from dpkd_jax import data
from dpkd_jax import kernels
from dpkd_jax import losses
from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona import student as student_lib
from dpkd_jax.methods.rona.config import RONAConfig
from dpkd_jax.methods.rona.privacy import RONAPlan
from dpkd_jax.models import core
from dpkd_jax import config_checks
from dpkd_jax.train import sharding
from dpkd_jax.train import supervised
from dpkd_jax.train.state import TrainState

PyTree = Any
KINDS = ("hint", "distill")


class FrozenModel(NamedTuple):
  """A read-only model's arrays (teacher or auxiliary teacher); its graphdef is static."""

  params: PyTree
  batch_stats: PyTree


def _frozen_outputs(graphdef: nnx.GraphDef, model: FrozenModel,
                    x: jax.Array) -> core.ClassifierOutput:
  out, _ = core.apply(graphdef, model.params, model.batch_stats, x, train=False)
  return jax.tree.map(jax.lax.stop_gradient, out)


def _masked_mean(per_example: jax.Array, mask: jax.Array) -> jax.Array:
  weight = mask.astype(per_example.dtype)  # (S,)
  return jnp.sum(per_example * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def _zero_padding(x: jax.Array, mask: jax.Array) -> jax.Array:
  return x * mask.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)


def init_state(config: RONAConfig, key: jax.Array, *, teacher_hint_shape: Sequence[int]
               ) -> tuple[TrainState, nnx.GraphDef]:
  """The student of `config` with its hint adapter, initialised from `key`, and Adam at
  `config.learning_rate` (`student.create_state`); and the bare student's graphdef.

  `teacher_hint_shape` is one example's teacher hint shape (the adapter's output).
  """
  return student_lib.create_state(config.student_model, info=config.info,
                                  norm=config.student_norm, learning_rate=config.learning_rate,
                                  teacher_hint_shape=teacher_hint_shape, key=key)


def build_train_step(plan: RONAPlan, kind: str, *, temperature: float,
                     info: data.DatasetInfo, teacher_graphdef: nnx.GraphDef,
                     aux_graphdef: nnx.GraphDef | None) -> Callable:
  """The pure private `step(state, teacher, aux_teacher, bound, images_uint8, mask, key)`.

  Args:
    plan: the run's plan: σ and the bound of the release (`plan.sanitize_config(kind)`).
    kind: "hint" (adapted student hint regresses the sanitized teacher hint) or "distill"
      (student softened by τ fits the sanitized softened teacher probabilities).
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
  if kind not in KINDS:
    raise ValueError(f"kind must be 'hint' or 'distill', got {kind!r}")
  return _private_step(kind, plan.sanitize_config(kind), temperature=temperature, info=info,
                       teacher_graphdef=teacher_graphdef, aux_graphdef=aux_graphdef)


def _private_step(kind: str, config: sanitize.SanitizeConfig, *, temperature: float,
                  info: data.DatasetInfo, teacher_graphdef: nnx.GraphDef,
                  aux_graphdef: nnx.GraphDef | None) -> Callable:
  """`build_train_step` with its release config resolved (see there)."""
  config_checks.number("temperature", temperature, positive=True)

  def knowledge_of(out: core.ClassifierOutput) -> jax.Array:
    if kind == "hint":
      return out.hint  # (S, h, w, c)
    return jax.nn.softmax(out.logits / temperature, axis=-1)  # (S, K)

  if config.bound_mode == "adaptive" and aux_graphdef is None:
    raise ValueError("the adaptive bound needs the auxiliary teacher's graphdef")

  def step(state: TrainState, teacher: FrozenModel, aux_teacher: FrozenModel | None,
           bound: sanitize.BoundState, images_uint8: jax.Array, mask: jax.Array,
           key: jax.Array):
    x = data.normalize(images_uint8, info)  # (S, H, W, C)
    knowledge = _zero_padding(knowledge_of(_frozen_outputs(teacher_graphdef, teacher, x)), mask)
    aux = None
    if config.bound_mode == "adaptive":
      aux = _zero_padding(knowledge_of(_frozen_outputs(aux_graphdef, aux_teacher, x)), mask)
    noisy, bound, l2_bound, noise_stddev = sanitize.release_knowledge(config, key, knowledge,
                                                                      aux, bound)
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


def build_self_learning_step(info: data.DatasetInfo, augment: bool = False) -> Callable:
  """The pure `step(state, images_uint8, labels, key=None) -> (state, metrics)`: CE on public
  labels; with `augment`, of the images shifted at random (pad 2 black pixels, crop back:
  `data.augment` on uint8 pixels, one draw per image from `key`, which it then needs).

  No teacher is involved, so it has no privacy cost. Metrics: loss, accuracy.
  """

  def step(state: TrainState, images_uint8: jax.Array, labels: jax.Array,
           key: jax.Array | None = None):
    if augment:
      images_uint8 = data.augment(key, images_uint8, pad=2, flip=info.flip_invariant,
                                  pad_mode="constant")
    return supervised.cross_entropy_step(state, data.normalize(images_uint8, info), labels)

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


@kernels.cache_per_ops
def make_batch_stats_step(info: data.DatasetInfo, mesh: Mesh) -> Callable:
  """`build_batch_stats_step` jitted, state donated, output replicated on `mesh`."""
  return jax.jit(build_batch_stats_step(info), donate_argnums=0,
                 out_shardings=sharding.replicated(mesh))


def make_train_step(plan: RONAPlan, kind: str, *, temperature: float,
                    info: data.DatasetInfo, teacher_graphdef: nnx.GraphDef,
                    aux_graphdef: nnx.GraphDef | None, mesh: Mesh) -> Callable:
  """`build_train_step` jitted, state donated, outputs replicated on `mesh`. Cached on the
  release config (σ, bound), so resumed runs, sweeps and tests in one process reuse the
  compiled step."""
  if kind not in KINDS:
    raise ValueError(f"kind must be 'hint' or 'distill', got {kind!r}")
  return _jitted_private_step(kind, plan.sanitize_config(kind), temperature=temperature,
                              info=info, teacher_graphdef=teacher_graphdef,
                              aux_graphdef=aux_graphdef, mesh=mesh)


@kernels.cache_per_ops
def _jitted_private_step(kind: str, config: sanitize.SanitizeConfig, *, temperature: float,
                         info: data.DatasetInfo, teacher_graphdef: nnx.GraphDef,
                         aux_graphdef: nnx.GraphDef | None, mesh: Mesh) -> Callable:
  replicated = sharding.replicated(mesh)
  return jax.jit(_private_step(kind, config, temperature=temperature, info=info,
                               teacher_graphdef=teacher_graphdef, aux_graphdef=aux_graphdef),
                 donate_argnums=0, out_shardings=(replicated, replicated, replicated))


@kernels.cache_per_ops
def make_self_learning_step(info: data.DatasetInfo, mesh: Mesh, augment: bool = False
                            ) -> Callable:
  """`build_self_learning_step` jitted, state donated, outputs replicated on `mesh`."""
  replicated = sharding.replicated(mesh)
  return jax.jit(build_self_learning_step(info, augment), donate_argnums=0,
                 out_shardings=(replicated, replicated))
