"""The steps of DP-DFD with selective randomized response, and the stage step bound to a plan.

    student step     KL(one_hot(y~) || softmax(student(x))) on released labels y~ (paper), or
                     -log P(y~ | student) through the known SRR channel (`rr_likelihood_loss`)
    pretrain step    the generator against the frozen teacher (`generator` losses; "teacher"
                     prior only: a noiseless function of the teacher)
    finetune step    CE(student(G(z)), y~): the generator through the frozen student
    stage step       `build_train_step(plan, ...)`: one stage (`stage.run_stage`) with the ε
                     per query OF THE PLAN, the one its ledger events are built from

The per-batch steps are pure and jitted with their train state donated; the stage step is a
Python loop over them (its one release, the SRR labels, is made once per stage).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpkd_jax import data
from dpkd_jax import kernels
from dpkd_jax import models
from dpkd_jax.methods.srr import config as config_lib
from dpkd_jax.methods.srr import generator as generator_lib
from dpkd_jax.methods.srr import privacy
from dpkd_jax.methods.srr import stage as stage_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import randomized_response
from dpkd_jax.train.state import TrainState

PyTree = Any
# (state, key, stage index) -> the stage's state, release and metrics.
StageStep = Callable[[stage_lib.SRRState, jax.Array, int], stage_lib.StageResult]


@functools.cache
def adam(learning_rate: float, decay_steps: int | None = None) -> optax.GradientTransformation:
  """Adam, cosine-decayed over `decay_steps` if given. One object per setting: TrainState's
  static `tx` is compared by identity under jit, so repeated runs reuse compiled steps."""
  if decay_steps is None:
    return optax.adam(learning_rate)
  return optax.adam(optax.cosine_decay_schedule(learning_rate, decay_steps))


def init_models(config: config_lib.SRRConfig,
                key: jax.Array) -> tuple[core.ModelParts, core.ModelParts]:
  """(student, generator) initialised from `key` (split into one key per network)."""
  return models.create_student_and_generator(config, key)


def init_state(config: config_lib.SRRConfig, key: jax.Array, *,
               stages: int) -> stage_lib.SRRState:
  """Fresh student and generator (`init_models(config, key)`) and their train states; the
  student's cosine schedule spans all `stages` (`config.engine.student_schedule`; "constant":
  none). With `engine.student_replay`, room for every stage's release (`stage.Released`,
  zeros until written)."""
  student, generator = init_models(config, key)
  student_steps = stages * config.student_epochs * (config.samples_per_stage // config.batch_size)
  released = None
  if config.engine.student_replay:
    released = stage_lib.Released.empty(stages * config.samples_per_stage,
                                        config.info.image_shape, config.info.num_classes)
  return stage_lib.SRRState(
      TrainState.create(student, adam(config.student_learning_rate, max(student_steps, 1)
                                      if config.engine.student_schedule == "cosine" else None)),
      TrainState.create(generator, adam(config.generator_learning_rate)), released)


def with_generator(config: config_lib.SRRConfig, state: stage_lib.SRRState,
                   generator: core.ModelParts) -> stage_lib.SRRState:
  """`state` with `generator` (the prior the stages start from) and a fresh Adam state for it,
  as `init_state` builds it."""
  return state.replace(generator=TrainState.create(generator, adam(config.generator_learning_rate)))


def student_kl_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean over the batch of KL(one_hot(labels) || softmax(logits)).

  Args:
    logits: (B, K) student logits.
    labels: (B,) released labels.

  Returns:
    Scalar loss (equal to the cross-entropy, as a one-hot target has zero entropy).
  """
  target = jax.nn.one_hot(labels, logits.shape[-1])  # (B, K)
  return jnp.mean(optax.losses.kl_divergence(jax.nn.log_softmax(logits), target))


def rr_likelihood_loss(logits: jax.Array, labels: jax.Array, candidate_mask: jax.Array,
                       epsilon: float) -> jax.Array:
  """Mean over the batch of -log P(released label | student), through the known SRR channel.

  The student's softmax p is its belief about the teacher's label y; selective RR with the
  query's public candidate set then releases y~ with probability T(y, y~), the mechanism's own
  channel (`randomized_response.selective_rr_log_likelihood`). The loss is
  -log sum_y p_y T(y, y~) (forward loss correction with the exact channel): a function of
  released labels and public sets only, so post-processing.

  Args:
    logits: (B, K) student logits.
    labels: (B,) released labels (members of their candidate sets).
    candidate_mask: (B, K) bool, the public candidate sets of the release.
    epsilon: ε per query of the release (inf: members pass unchanged).

  Returns:
    Scalar loss.
  """
  log_channel = randomized_response.selective_rr_log_likelihood(labels, candidate_mask,
                                                                epsilon)  # (B, K)
  log_released = jax.nn.logsumexp(jax.nn.log_softmax(logits) + log_channel, axis=-1)  # (B,)
  return -jnp.mean(log_released)


def build_student_step(loss: str, epsilon: float, shift: int):
  """Pure `step(student, x, labels, candidate_mask, key) -> (student, metrics)`.

  Args:
    loss: "kl" (the paper: KL to the one-hot released label; mask unused) or "rr_likelihood"
      (`rr_likelihood_loss` with the release's ε and candidate sets).
    epsilon: ε per query of the release.
    shift: random translation of the queries by up to `shift` pixels (0: none; `key` unused).
  """
  if loss not in config_lib.STUDENT_LOSSES:
    raise ValueError(f"student_loss must be one of {config_lib.STUDENT_LOSSES}, got {loss!r}")

  def step(student: TrainState, x: jax.Array, labels: jax.Array, candidate_mask, key):
    if shift:  # (B, H, W, C) queries moved by a public random offset: post-processing
      x = data.random_translate(key, x, shift)

    def loss_fn(params):
      out, new_stats = core.apply(student.graphdef, params, student.batch_stats, x, train=True)
      if loss == "kl":
        return student_kl_loss(out.logits, labels), new_stats
      return rr_likelihood_loss(out.logits, labels, candidate_mask, epsilon), new_stats

    (value, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(student.params)
    return student.apply_gradients(grads, new_stats), {"student_loss": value}

  return step


@kernels.cache_per_ops
def make_student_step(loss: str, epsilon: float, shift: int):
  """`build_student_step` jitted with the student state donated (one per setting; the static
  graphdef/tx of the state key the compilation cache across runs)."""
  return jax.jit(build_student_step(loss, epsilon, shift), donate_argnums=0)


def build_pretrain_step(config: generator_lib.PretrainConfig, teacher_graphdef: nnx.GraphDef):
  """Pure `step(generator, teacher_params, teacher_batch_stats, key) -> (generator, metrics)`."""

  def step(generator: TrainState, teacher_params: PyTree, teacher_batch_stats: PyTree,
           key: jax.Array):
    z = jax.random.normal(key, (config.batch_size, config.latent_dim))  # (B, latent)

    def loss_fn(params):
      x, new_stats = core.apply(generator.graphdef, params, generator.batch_stats, z, train=True)
      out, bn_stats = generator_lib.teacher_forward_with_bn_statistics(
          teacher_graphdef, teacher_params, teacher_batch_stats, x)
      terms = generator_lib.generator_loss_terms(config, out.logits, bn_stats)
      return sum(terms.values()), (terms, new_stats)

    (loss, (terms, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(generator.params)
    generator = generator.apply_gradients(grads, new_stats)
    return generator, {"loss": loss, **{f"l_{k}": v for k, v in terms.items()}}

  return step


@kernels.cache_per_ops
def make_pretrain_step(config: generator_lib.PretrainConfig, teacher_graphdef: nnx.GraphDef):
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


@kernels.cache_per_ops
def make_finetune_step(student_graphdef: nnx.GraphDef):
  """`build_finetune_step` jitted with the generator state donated (one per architecture)."""
  return jax.jit(build_finetune_step(student_graphdef), donate_argnums=0)


def stage_config(plan: privacy.SRRPlan, config: config_lib.SRRConfig, *,
                 first: bool) -> stage_lib.StageConfig:
  """What a stage does: ε per query from `plan`; sizes, tau and epochs from `config`."""
  return stage_lib.StageConfig(
      samples=config.samples_per_stage, batch_size=config.batch_size,
      latent_dim=config.latent_dim, epsilon=plan.epsilon_per_query, threshold=config.tau,
      student_epochs=config.student_epochs, generator_epochs=config.generator_epochs,
      uniform_prior=first and config.first_prior == "uniform",
      query_pool=config.engine.query_pool)


def build_train_step(plan: privacy.SRRPlan, config: config_lib.SRRConfig,
                     teacher_label_fn: stage_lib.TeacherLabelFn, *,
                     mesh: jax.sharding.Mesh) -> StageStep:
  """`train_step(state, key, stage) -> StageResult`: one stage, the ε per query of `plan`.

  Not jitted: a stage is a loop of jitted steps around one release (`stage.run_stage`). The
  stage index picks the first stage's prior (`config.first_prior`).

  Args:
    plan: the executed plan: its `epsilon_per_query` is the one the RR draws use.
    config: the run (sizes, tau, epochs, first prior).
    teacher_label_fn: the only path to the teacher (`stage.make_teacher_label_fn`).
    mesh: devices; batches are split over its 'data' axis.
  """
  configs = {first: stage_config(plan, config, first=first) for first in (True, False)}
  student_step = make_student_step(config.engine.student_loss, plan.epsilon_per_query,
                                   config.engine.student_shift)

  def train_step(state: stage_lib.SRRState, key: jax.Array,
                 stage: int) -> stage_lib.StageResult:
    return stage_lib.run_stage(
        state, key, configs[stage == 0], teacher_label_fn, student_step=student_step,
        generator_step=make_finetune_step(state.student.graphdef), mesh=mesh, stage=stage)

  return train_step


def make_train_step(plan: privacy.SRRPlan, config: config_lib.SRRConfig,
                    teacher_label_fn: stage_lib.TeacherLabelFn, *,
                    mesh: jax.sharding.Mesh) -> StageStep:
  """The stage as the run calls it: `build_train_step`'s, as built (host code: its student,
  generator and release steps are jitted and cached inside)."""
  return build_train_step(plan, config, teacher_label_fn, mesh=mesh)
