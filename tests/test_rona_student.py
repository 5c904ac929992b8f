"""RONA's student: the hint adapter maps to the teacher's hint shape; the deployed student
has no adapter."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.methods.rona import student
from dpkd_jax.models import core

INFO = data.DATASETS["digits"]


@pytest.mark.parametrize("student_hint,teacher_hint,is_conv", [
    ((7, 7, 16), (7, 7, 64), True),
    ((7, 7, 16), (5, 5, 8), False),
    ((32,), (7, 7, 64), False),
])
def test_adapter_maps_to_the_teacher_hint_shape(student_hint, teacher_hint, is_conv):
  adapter = student.HintAdapter(student_hint, teacher_hint, rngs=nnx.Rngs(0))
  assert adapter.is_conv == is_conv
  out = jax.eval_shape(adapter, jax.ShapeDtypeStruct((3, *student_hint), jnp.float32))
  assert out.shape == (3, *teacher_hint)


def test_deployed_student_excludes_the_adapter():
  state, graphdef = student.create_state("compact_5k", info=INFO, norm="batch",
                                         learning_rate=1e-3, teacher_hint_shape=(7, 7, 64),
                                         key=jax.random.key(3))
  assert set(state.params) == {"student", "adapter"}
  parts = student.student_parts(state, graphdef)
  assert models.count_params(parts.params) == 5026
  out, _ = core.apply(parts.graphdef, parts.params, parts.batch_stats,
                      jnp.zeros((2, 28, 28, 1)), train=False)
  assert out.hint.shape == (2, 7, 7, 16)


def test_optimizer_cosine_decays_to_zero_over_its_steps_and_is_cached():
  assert student.optimizer(1e-2) is student.optimizer(1e-2)  # jit compares tx by identity
  tx = student.optimizer(1e-2, "cosine", 4)
  params = {"w": jnp.zeros(())}
  state, sizes = tx.init(params), []
  for _ in range(5):
    updates, state = tx.update({"w": jnp.ones(())}, state, params)
    sizes.append(float(-updates["w"]))
  # Adam's first steps move by ~lr * schedule(t): cosine 1, 0.85, 0.5, 0.15, then 0.
  assert sizes[0] == pytest.approx(1e-2, rel=1e-3)
  assert sizes[2] == pytest.approx(0.5e-2, rel=1e-3) and sizes[4] == 0.0
  with pytest.raises(ValueError, match="schedule"):
    student.optimizer(1e-2, "linear", 4)
