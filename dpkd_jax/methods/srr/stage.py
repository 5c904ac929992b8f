"""One stage of DP-DFD with selective randomized response (the steps it runs are in `step`).

    z ~ N(0, I)                        (N, latent)     public randomness
    D_t = G(z)                         (N, H, W, C)    synthetic queries (eval-mode generator)
    p_s = softmax(student(D_t))        (N, K)          public prior (a function of past releases)
      (with `query_pool` P > 1: P N latents, of which the N that `selection` keeps, balanced
       over the student's classes: public quantities only)
    y = argmax teacher(D_t)            (N,)            PRIVATE: asked once per query
    y~ = SRR(y; p_s, tau, eps)         (N,)            the only release
    student   <- E epochs of KL(one_hot(y~) || softmax(student(D_t)))   reuses y~
                 (or of -log P(y~ | student) through the SRR channel; `step`); with replay,
                 each epoch is N rows drawn from the releases of stages 0..t   reuses them
    generator <- E_g epochs of CE(student(G(z)), y~)                      reuses y~

The teacher is reached only through `teacher_label_fn`, called exactly once per stage on all N
queries, and its labels only feed `selective_randomized_response`: everything after the release
is post-processing of y~ and public quantities. Metrics are released quantities only (losses on
y~, candidate-set sizes), never teacher agreement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax.methods.srr import selection
from dpkd_jax.models import core
from dpkd_jax.privacy import randomized_response
from dpkd_jax.train import sharding
from dpkd_jax.train import state as state_lib

PyTree = Any
# (N, H, W, C) synthetic queries -> (N,) int32 teacher labels.
TeacherLabelFn = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageConfig:
  """What one stage does.

  Attributes:
    samples: N, synthetic queries per stage (a multiple of `batch_size`).
    batch_size: B, for generation, labelling, student and generator updates.
    latent_dim: generator input size.
    epsilon: ε per query (inf: teacher labels in the candidate set pass unchanged).
    threshold: tau of the candidate set.
    uniform_prior: use the uniform prior 1/K instead of the student's (for the first stage,
      whose student has seen no label: its prior would be an arbitrary function of its
      random weights; with tau <= 1/K every class is then a candidate, plain K-ary RR).
    student_epochs: E, passes of the student over (D_t, y~).
    generator_epochs: E_g, passes of the generator fine-tuning over (z, y~); 0 disables it.
    query_pool: draw this many times N latents and ask the N that `selection.balanced_subset`
      keeps (balanced over the student's classes; post-processing); 1: the N drawn. A stage
      with the uniform prior (an untrained student) draws N.
  """

  samples: int
  batch_size: int
  latent_dim: int
  epsilon: float
  threshold: float
  student_epochs: int
  generator_epochs: int
  uniform_prior: bool = False
  query_pool: int = 1

  def __post_init__(self):
    config_checks.integers(self, "samples", "batch_size", "latent_dim", "student_epochs",
                           "query_pool")
    config_checks.integers(self, "generator_epochs", minimum=0)
    if self.samples % self.batch_size:
      raise ValueError(f"samples_per_stage={self.samples} must be a multiple of"
                       f" batch_size={self.batch_size}")
    if not self.epsilon > 0:
      raise ValueError(f"epsilon must be > 0, got {self.epsilon}")
    config_checks.fraction("threshold", self.threshold, open_low=False, open_high=False)


# Tag of the student's shift stream under the stage's student key (its epochs use 0..E-1).
_SHIFT_TAG = 2**31 - 1
# Tag of the query choice under the stage key (whose split(key, 4) gives the other streams).
_SELECTION_TAG = 2**31 - 2


@flax.struct.dataclass
class Released:
  """Every release of the run so far, kept for the student to train on again (`replay`):
  room for all S stages of N rows; stage t writes rows [t N, (t + 1) N). Released labels,
  their public candidate sets and the queries they answer: reusing them is post-processing."""

  queries: jax.Array  # (S N, H, W, C) float32
  labels: jax.Array  # (S N,) int32
  candidate_mask: jax.Array  # (S N, K) bool

  @classmethod
  def empty(cls, rows: int, image_shape: tuple[int, ...], num_classes: int) -> "Released":
    return cls(jnp.zeros((rows, *image_shape), jnp.float32), jnp.zeros((rows,), jnp.int32),
               jnp.zeros((rows, num_classes), bool))

  def write(self, start: int, queries: jax.Array, labels: jax.Array,
            candidate_mask: jax.Array) -> "Released":
    """The buffer with rows [start, start + N) replaced by one stage's release."""
    stop = start + queries.shape[0]
    return Released(self.queries.at[start:stop].set(queries),
                    self.labels.at[start:stop].set(labels),
                    self.candidate_mask.at[start:stop].set(candidate_mask))


@flax.struct.dataclass
class SRRState(state_lib.StudentGeneratorState):
  """Student and generator train states (the teacher is never part of the state), and with
  replay every release so far."""

  released: Released | None = None

  def arrays(self) -> dict[str, PyTree]:
    out = super().arrays()
    if self.released is not None:  # runs without replay keep the checkpoint layout they had
      out["released"] = {"queries": self.released.queries, "labels": self.released.labels,
                         "candidate_mask": self.released.candidate_mask}
    return out

  def with_arrays(self, arrays: dict[str, PyTree]) -> "SRRState":
    state = super().with_arrays(arrays)
    if self.released is None:
      return state
    return state.replace(released=Released(**arrays["released"]))


class StageResult(NamedTuple):
  """A finished stage: the new state, the release and teacher-free metrics."""

  state: SRRState
  noisy_labels: np.ndarray  # (N,) int32, the released labels
  set_sizes: np.ndarray  # (N,) int32, public candidate-set sizes
  metrics: dict[str, float]


def _eval_fn(output: Callable[[Any], jax.Array]):
  """Jitted `(graphdef static, params, batch_stats, x) -> output(model(x))`, eval mode."""
  def fn(graphdef, params, batch_stats, x):
    return output(core.apply(graphdef, params, batch_stats, x, train=False)[0])
  return jax.jit(fn, static_argnums=0)


_generate = _eval_fn(lambda images: images)  # (B, latent) -> (B, H, W, C)
_probabilities = _eval_fn(lambda out: jax.nn.softmax(out.logits))  # (B, H, W, C) -> (B, K)
_argmax_labels = _eval_fn(lambda out: jnp.argmax(out.logits, -1).astype(jnp.int32))
_balanced_subset = jax.jit(selection.balanced_subset, static_argnames="n")
_selective_rr = jax.jit(randomized_response.selective_randomized_response,
                        static_argnames=("epsilon", "threshold"))


def _batched(fn: Callable[..., jax.Array], parts: core.ModelParts, inputs: jax.Array,
             batch_size: int, mesh: jax.sharding.Mesh) -> jax.Array:
  """fn(parts, batch) over `inputs` in batches of `batch_size` (N divisible by it)."""
  outs = [fn(parts.graphdef, parts.params, parts.batch_stats,
             sharding.shard_batch(inputs[i:i + batch_size], mesh))
          for i in range(0, inputs.shape[0], batch_size)]
  return jnp.concatenate(outs)


def generate_images(generator: core.ModelParts, z: jax.Array, batch_size: int,
                    mesh: jax.sharding.Mesh) -> jax.Array:
  """(N, latent) -> (N, H, W, C) eval-mode generator outputs, in batches (N divisible)."""
  return _batched(_generate, generator, z, batch_size, mesh)


def make_teacher_label_fn(teacher: core.ModelParts, batch_size: int,
                          mesh: jax.sharding.Mesh) -> TeacherLabelFn:
  """The teacher's eval-mode argmax labels on all queries, in batches: (N, ...) -> (N,)."""
  return lambda x: _batched(_argmax_labels, teacher, x, batch_size, mesh)


def private_labels(teacher_label_fn: TeacherLabelFn, key: jax.Array, queries: jax.Array,
                   prior: jax.Array, *, epsilon: float,
                   threshold: float) -> randomized_response.SelectiveRRResult:
  """Asks the teacher once per query and releases only the selective-RR labels.

  Args:
    teacher_label_fn: the teacher's argmax on (N, H, W, C) queries.
    key: the RR key (used once).
    queries: (N, H, W, C) synthetic queries.
    prior: (N, K) public prior (student probabilities).
    epsilon, threshold: ε per query and tau.

  Returns:
    The SRR release (noisy labels, candidate masks, set sizes); the true labels stay here.
  """
  true_labels = teacher_label_fn(queries)  # (N,) private
  return _selective_rr(key, true_labels, prior, epsilon=epsilon, threshold=threshold)


def _student_pool(state: SRRState, stage: int, queries: jax.Array,
                  release: randomized_response.SelectiveRRResult):
  """(queries, labels, masks, state.released) the student draws its batches from: this
  stage's N rows, or with replay the (t + 1) N rows of stages 0..t (this one written in)."""
  if state.released is None:
    return queries, release.noisy_labels, release.candidate_mask, None
  n = queries.shape[0]
  released = state.released.write(stage * n, queries, release.noisy_labels,
                                  release.candidate_mask)
  rows = (stage + 1) * n
  return (released.queries[:rows], released.labels[:rows], released.candidate_mask[:rows],
          released)


def run_stage(state: SRRState, key: jax.Array, config: StageConfig,
              teacher_label_fn: TeacherLabelFn, *, student_step, generator_step,
              mesh: jax.sharding.Mesh, stage: int) -> StageResult:
  """Runs one stage (module docstring); `step.build_train_step` binds its steps and ε.

  Args:
    state: student and generator.
    key: this stage's key (split into latents, RR, student order, generator order).
    config: the stage's sizes, privacy and epochs.
    teacher_label_fn: the only path to the teacher; called once.
    student_step: the jitted `(student, x, labels, candidate_mask, key) -> (student, metrics)`
      (`step.make_student_step`).
    generator_step: the jitted generator fine-tuning step (`step.make_finetune_step`).
    mesh: devices; batches are split over its 'data' axis.
    stage: t, this stage's index: with replay (`state.released`), where its release is kept.

  Returns:
    StageResult(state, released labels, set sizes, metrics).
  """
  z_key, rr_key, student_key, generator_key = jax.random.split(key, 4)
  n, b = config.samples, config.batch_size
  pool = 1 if config.uniform_prior else config.query_pool
  z = jax.random.normal(z_key, (pool * n, config.latent_dim))  # (P N, latent)
  queries = generate_images(state.generator.parts, z, b, mesh)  # (P N, H, W, C)
  prior = _batched(_probabilities, state.student.parts, queries, b, mesh)  # (P N, K)
  if pool > 1:  # keep N of the P N, balanced over the student's classes (public quantities)
    keep = _balanced_subset(jax.random.fold_in(key, _SELECTION_TAG), prior, n)  # (N,)
    z, queries, prior = z[keep], queries[keep], prior[keep]
  if config.uniform_prior:
    prior = jnp.full_like(prior, 1.0 / prior.shape[-1])
  release = private_labels(teacher_label_fn, rr_key, queries, prior, epsilon=config.epsilon,
                           threshold=config.threshold)
  noisy = release.noisy_labels  # (N,), reused by every epoch below
  # (M, ...) rows the student reads, M = N, or (t + 1) N with replay.
  pool_x, pool_y, pool_mask, released = _student_pool(state, stage, queries, release)

  student = state.student
  student_losses = []
  shift_key = jax.random.fold_in(student_key, _SHIFT_TAG)  # epochs use tags 0..E-1
  for epoch in range(config.student_epochs):
    # N / B batches per epoch whatever M: the first N of a permutation of the M rows.
    batches = data.epoch_batches(jax.random.fold_in(student_key, epoch), pool_y.shape[0], b)
    for i, idx in zip(range(n // b), batches):
      batch = sharding.shard_batch((pool_x[idx], pool_y[idx], pool_mask[idx]), mesh)
      student, step_metrics = student_step(
          student, *batch, jax.random.fold_in(jax.random.fold_in(shift_key, epoch), i))
      student_losses.append(step_metrics["student_loss"])
  generator = state.generator
  generator_losses = []
  for epoch in range(config.generator_epochs):
    for idx in data.epoch_batches(jax.random.fold_in(generator_key, epoch), n, b):
      batch = sharding.shard_batch((z[idx], noisy[idx]), mesh)
      generator, step_metrics = generator_step(generator, student.params, student.batch_stats,
                                               *batch)
      generator_losses.append(step_metrics["generator_loss"])

  metrics = {
      "student_loss": float(np.mean(jax.device_get(student_losses[-(n // b):]))),
      "mean_candidate_set_size": float(jnp.mean(release.set_sizes)),
  }
  if generator_losses:
    metrics["generator_loss"] = float(np.mean(jax.device_get(generator_losses[-(n // b):])))
  return StageResult(SRRState(student, generator, released), np.asarray(noisy),
                     np.asarray(release.set_sizes), metrics)

