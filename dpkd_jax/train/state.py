"""Train state: a pure pytree of (step, params, batch_stats, opt_state).

The static parts (model graphdef, optax transformation) live in pytree-static fields so the
whole state can be donated to a jitted step (`jax.jit(step, donate_argnums=0)`) and saved by
Orbax without pickling. Teacher parameters never live here: a teacher is a read-only argument
of a student's train step.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpkd_jax.models import core

PyTree = Any


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training of one model.

  Attributes:
    step: scalar int32 number of updates applied so far.
    params: trainable parameters (nested dict of arrays).
    batch_stats: BatchNorm running statistics (nested dict, possibly empty).
    opt_state: optax state of `tx` for `params`.
    graphdef: static model definition (not a pytree leaf).
    tx: static optax transformation (not a pytree leaf).
  """

  step: jax.Array
  params: PyTree
  batch_stats: PyTree
  opt_state: optax.OptState
  graphdef: nnx.GraphDef = flax.struct.field(pytree_node=False)
  tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)

  @classmethod
  def create(cls, parts: core.ModelParts, tx: optax.GradientTransformation) -> "TrainState":
    """Builds the initial state from a split model and an optimizer."""
    return cls(
        step=jnp.zeros((), jnp.int32),
        params=parts.params,
        batch_stats=parts.batch_stats,
        opt_state=tx.init(parts.params),
        graphdef=parts.graphdef,
        tx=tx,
    )

  def apply_gradients(self, grads: PyTree, batch_stats: PyTree | None = None) -> "TrainState":
    """One optimizer update; optionally replaces the BatchNorm statistics."""
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    return self.replace(
        step=self.step + 1,
        params=optax.apply_updates(self.params, updates),
        batch_stats=self.batch_stats if batch_stats is None else batch_stats,
        opt_state=opt_state,
    )

  @property
  def parts(self) -> core.ModelParts:
    """The model as `ModelParts` (for `core.apply` and evaluation)."""
    return core.ModelParts(self.graphdef, self.params, self.batch_stats)

  def arrays(self) -> dict[str, PyTree]:
    """The array leaves to checkpoint (no static fields)."""
    return {
        "step": self.step,
        "params": self.params,
        "batch_stats": self.batch_stats,
        "opt_state": self.opt_state,
    }

  def with_arrays(self, arrays: dict[str, PyTree]) -> "TrainState":
    """Inverse of `arrays`: the same static fields with restored leaves."""
    return self.replace(**arrays)


@flax.struct.dataclass
class StudentGeneratorState:
  """A student and the generator of its synthetic queries (data-free methods); the teacher
  is never part of it."""

  student: TrainState
  generator: TrainState

  def arrays(self) -> dict[str, PyTree]:
    """The array leaves to checkpoint, per network."""
    return {"student": self.student.arrays(), "generator": self.generator.arrays()}

  def with_arrays(self, arrays: dict[str, PyTree]) -> "StudentGeneratorState":
    """Inverse of `arrays` (keeps the subclass)."""
    return self.replace(student=self.student.with_arrays(arrays["student"]),
                        generator=self.generator.with_arrays(arrays["generator"]))
