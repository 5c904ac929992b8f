"""The reverse k-NN student's state and step (`rknn/step.py`) and its training loop
(`rknn/student.py`): deterministic init, one compilation per setting, a step that learns
from public images and released labels only."""

import jax
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.methods import rknn
from dpkd_jax.methods.rknn import student as student_lib

STUDENT = rknn.StudentConfig(model="lenet5_half", epochs=1, batch_size=8)
CONFIG = rknn.RKNNConfig(dataset="digits", num_queries=10, k=1, epsilon=2.0, student=STUDENT)
INFO = data.DATASETS["digits"]


def _leaves(state):
  return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_init_state_is_a_function_of_its_key():
  a = rknn.init_state(CONFIG, jax.random.key(0), total_steps=4)
  again = rknn.init_state(CONFIG, jax.random.key(0), total_steps=4)
  other = rknn.init_state(CONFIG, jax.random.key(1), total_steps=4)
  assert all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(again)))
  assert not all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(other)))
  assert int(a.step) == 0 and a.tx is again.tx  # one optimizer object per setting


def test_train_step_is_cached_and_updates_the_state():
  assert rknn.build_student_step(STUDENT, INFO) is rknn.build_student_step(STUDENT, INFO)
  state = rknn.init_state(CONFIG, jax.random.key(0), total_steps=4)
  before = _leaves(state)
  images = data.load("digits", "test").images[:8]
  labels = np.arange(8, dtype=np.int32) % INFO.num_classes
  state, metrics = rknn.build_student_step(STUDENT, INFO)(state, images, labels,
                                                          jax.random.key(2))
  assert int(state.step) == 1 and set(metrics) == {"loss", "accuracy"}
  assert np.isfinite(float(metrics["loss"])) and 0.0 <= float(metrics["accuracy"]) <= 1.0
  assert any(not np.array_equal(x, y) for x, y in zip(before, _leaves(state)))


def test_train_student_refuses_mismatched_labels():
  images = np.zeros((4, *INFO.image_shape), np.uint8)
  with pytest.raises(ValueError, match="4 images but 3 labels"):
    student_lib.train_student(CONFIG, jax.random.key(0), images, np.zeros(3, np.int32))
