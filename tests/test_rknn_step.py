"""The reverse k-NN rooms of `rknn/step.py` and the student's training loop (`rknn/student.py`):
the labelling round (`build_train_step`: the queried samples relabelled, the noise from the
plan), the student's deterministic init, one compilation per setting, a student step that
learns from public images and released labels only."""

import dataclasses

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


def _round_labels(plan, queried):
  """One labelling round on 200 random private records and 40 public samples (4-d)."""
  rng = np.random.default_rng(0)
  public, private = (rng.normal(size=(n, 4)).astype(np.float32) for n in (40, 200))
  train_step = rknn.build_train_step(
      plan, CONFIG, public_embeddings=public, private_embeddings=private,
      private_labels=rng.integers(0, 10, 200).astype(np.int32), kmeans_key=jax.random.key(1),
      noise_key=jax.random.key(2))
  before = np.full(40, -1, np.int32)
  labels, assignments = train_step(before, queried, 0)
  assert before.tolist() == [-1] * 40 and assignments.shape == (len(queried),)
  return labels


def test_the_round_labels_the_queried_samples_with_the_plans_noise():
  plan = rknn.make_plan(CONFIG)
  queried = np.arange(0, 40, 2)
  labels = _round_labels(plan, queried)
  np.testing.assert_array_equal(labels, _round_labels(plan, queried))  # keys from the caller
  assert (labels[1::2] == -1).all() and ((0 <= labels[queried]) & (labels[queried] < 10)).all()
  # Only the plan changes: ε_r far below and far above the config's gives other labels.
  noisy, exact = (_round_labels(dataclasses.replace(plan, epsilon_per_round=e), queried)
                  for e in (1e-3, 1e3))
  assert not np.array_equal(noisy, exact)
