"""One SRR stage: the selective-RR release asks the teacher once and matches the formula; the
stage config refuses bad sizes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.methods.srr import stage

from teacher_fixtures import CountingTeacher


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_srr_output_frequencies_match_the_formula(epsilon):
  # Prior with candidate set {0, 1, 2, 3} at tau = 0.1 (k = 4); true label 2 (in the set) for
  # half the queries and 7 (outside) for the other half. 5-sigma binomial tolerance per cell.
  n = 20_000
  prior = jnp.tile(jnp.array([0.3, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.006, 0.004]), (2 * n, 1))
  labels = jnp.concatenate([jnp.full((n,), 2, jnp.int32), jnp.full((n,), 7, jnp.int32)])
  teacher = CountingTeacher(lambda queries: labels)
  release = stage.private_labels(teacher, jax.random.key(0), jnp.zeros((2 * n, 1, 1, 1)), prior,
                                 epsilon=epsilon, threshold=0.1)
  assert teacher.calls == 1 and teacher.rows == [2 * n]
  np.testing.assert_array_equal(release.set_sizes, 4)
  k, e = 4, math.exp(epsilon)
  expected_in = np.array([1, 1, e, 1] + [0] * 6) / (e + k - 1)
  expected_out = np.array([1, 1, 1, 1] + [0] * 6) / k
  for rows, expected in ((slice(0, n), expected_in), (slice(n, 2 * n), expected_out)):
    freq = np.bincount(np.asarray(release.noisy_labels[rows]), minlength=10) / n
    tolerance = 5 * np.sqrt(expected * (1 - expected) / n) + 1e-12
    assert np.all(np.abs(freq - expected) <= tolerance), (freq, expected)


_STAGE = dict(samples=32, batch_size=16, latent_dim=8, epsilon=1.0, threshold=0.1,
              student_epochs=1, generator_epochs=0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(samples=40), "multiple of batch_size"),
    (dict(student_epochs=0), "student_epochs"),
    (dict(generator_epochs=-1), "generator_epochs"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(threshold=1.5), "threshold"),
])
def test_bad_stage_config(kwargs, match):
  stage.StageConfig(**_STAGE)  # the base is valid
  with pytest.raises(ValueError, match=match):
    stage.StageConfig(**{**_STAGE, **kwargs})
