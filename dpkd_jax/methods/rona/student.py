"""RONA's student: any classifier of `STUDENTS` with an adaptation layer on its hint.

The adaptation layer (`HintAdapter`) maps the student's hint to the teacher's hint shape: a
1×1 convolution when both are (B, h, w, c) maps of equal spatial size, else a dense layer on
the flattened hint. It is trained with the student (`HintedStudent`, whose params split as
{"student": ..., "adapter": ...}) but is not part of the deployed model (`student_parts`).
`init_state` builds the train state (Adam; `run.py` gives each stage its own `optimizer` and
moments per stage).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.models import compact
from dpkd_jax.models import core
from dpkd_jax.train.state import TrainState

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


SCHEDULES = ("constant", "cosine")  # the learning-rate schedules of `optimizer`


@functools.cache
def optimizer(learning_rate: float, schedule: str = "constant",
              total_steps: int = 0) -> optax.GradientTransformation:
  """Adam at a constant rate, or decayed to 0 by a cosine over `total_steps` of its updates.

  One object per arguments: TrainState's static `tx` is compared by identity under jit, so runs
  in one process (resume, sweeps, tests) reuse the compiled steps instead of recompiling.
  """
  if schedule == "constant":
    return optax.adam(learning_rate)
  if schedule == "cosine":
    return optax.adam(optax.cosine_decay_schedule(learning_rate, max(total_steps, 1)))
  raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def phase_optimizers(learning_rate: float, schedule: str,
                     steps: dict[str, int]) -> dict[str, optax.GradientTransformation]:
  """Each training stage's Adam: `optimizer` at `learning_rate`, a cosine over that stage's
  `steps[stage]` updates when `schedule` is "cosine"."""
  return {stage: optimizer(learning_rate, schedule, n) for stage, n in steps.items()}


def create_state(name: str, *, info: data.DatasetInfo, norm: str, learning_rate: float,
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
  return TrainState.create(core.split(hinted), optimizer(learning_rate)), student_graphdef


def student_parts(state: TrainState, student_graphdef: nnx.GraphDef) -> core.ModelParts:
  """The deployed student (no adapter) from a `HintedStudent` train state."""
  return core.ModelParts(student_graphdef, state.params["student"],
                         state.batch_stats.get("student", {}))
