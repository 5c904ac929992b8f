"""Tests of the data-free PATE student (`dfpate.student`): targets, selection, pseudo-labels."""

import chex
import jax
import numpy as np

from dpkd_jax.methods.dfpate import student as student_lib


def test_targets_from_votes_and_margin_filter():
  hist = np.array([[8.0, 1.0, 1.0], [4.0, 5.0, 1.0]])
  targets, weights = student_lib.targets_from_votes(hist, 10, target="hard",
                                                    margin_threshold=0.3)
  np.testing.assert_array_equal(targets.argmax(-1), [0, 1])
  np.testing.assert_array_equal(weights, [1.0, 0.0])
  soft, soft_weights = student_lib.targets_from_votes(hist, 10, target="soft",
                                                      margin_threshold=0.3)
  np.testing.assert_allclose(soft, hist / 10)
  np.testing.assert_array_equal(soft_weights, [1.0, 1.0])


def test_select_queries_is_class_balanced_and_distinct():
  probs = np.asarray(jax.nn.softmax(3 * jax.random.normal(jax.random.key(0), (500, 5))))
  chosen = student_lib.select_queries(probs, 50)
  chex.assert_shape(chosen, (50,))
  assert len(np.unique(chosen)) == 50
  np.testing.assert_array_equal(np.bincount(probs[chosen].argmax(-1), minlength=5), [10] * 5)
