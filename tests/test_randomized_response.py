"""Tests for dpkd_jax.privacy.randomized_response: output frequencies, sets, transforms."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import randomized_response as rr

NUM_SAMPLES = 100_000
PRIOR = jnp.array([0.40, 0.30, 0.15, 0.10, 0.05])  # K = 5


def _assert_frequencies(samples, expected_probs):
  """Per-cell binomial check: |freq - p| <= 5 sd + 1e-9 for every class (fixed keys)."""
  samples = np.asarray(samples)
  expected_probs = np.asarray(expected_probs, np.float64)
  counts = np.bincount(samples, minlength=expected_probs.size)
  assert counts.size == expected_probs.size, "sample outside the label range"
  freqs = counts / samples.size
  tolerance = 5 * np.sqrt(expected_probs * (1 - expected_probs) / samples.size) + 1e-9
  assert np.all(np.abs(freqs - expected_probs) <= tolerance), (freqs, expected_probs)


def _rr_probs(true_label, set_mask, epsilon):
  """Closed-form RR distribution over a candidate set (all classes for plain RR)."""
  set_mask = np.asarray(set_mask, bool)
  k = set_mask.sum()
  probs = np.where(set_mask, 1.0 / (math.exp(epsilon) + k - 1), 0.0)
  if set_mask[true_label]:
    probs[true_label] = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
  else:
    probs = set_mask / k
  return probs


_rr_jit = jax.jit(rr.randomized_response, static_argnames=("num_classes", "epsilon"))
_srr_jit = jax.jit(rr.selective_randomized_response, static_argnames=("epsilon", "threshold"))
# epsilon and threshold traced: Python-side validation is skipped, one compile for all values.
_srr_traced_params = jax.jit(rr.selective_randomized_response)


def _dirichlet_priors(seed, num_rows, num_classes):
  """Test priors (plain NumPy data, not privacy code)."""
  return jnp.asarray(np.random.default_rng(seed).dirichlet(np.ones(num_classes), num_rows),
                     jnp.float32)


@pytest.mark.parametrize("num_classes,epsilon", [(2, 0.5), (5, 1.0), (10, 3.0)])
def test_randomized_response_frequencies_match_formula(num_classes, epsilon):
  # Labels cycle through all classes; check the conditional distribution for two of them.
  labels = jnp.arange(NUM_SAMPLES, dtype=jnp.int32) % num_classes
  noisy = np.asarray(_rr_jit(jax.random.key(0), labels, num_classes=num_classes,
                             epsilon=epsilon))
  for true_label in (0, num_classes - 1):
    _assert_frequencies(noisy[np.asarray(labels) == true_label],
                        _rr_probs(true_label, np.ones(num_classes), epsilon))


def test_keep_probability_is_stable_for_large_epsilon():
  np.testing.assert_allclose(rr.keep_probability(1.0, 4), math.e / (math.e + 3), rtol=1e-6)
  np.testing.assert_allclose(rr.keep_probability(jnp.array([200.0, jnp.inf]), 4), [1.0, 1.0])


@pytest.mark.parametrize("epsilon", [200.0, math.inf])
def test_large_epsilon_keeps_labels(epsilon):
  labels = jnp.arange(1000, dtype=jnp.int32) % 7
  np.testing.assert_array_equal(
      _rr_jit(jax.random.key(2), labels, num_classes=7, epsilon=epsilon), labels)
  result = _srr_traced_params(
      jax.random.key(3), labels % 5, jnp.tile(PRIOR, (1000, 1)), epsilon=epsilon, threshold=0.0)
  np.testing.assert_array_equal(result.noisy_labels, labels % 5)


def test_out_of_range_label_gets_a_uniform_answer():
  labels = jnp.full((NUM_SAMPLES,), 9, jnp.int32)
  noisy = _rr_jit(jax.random.key(4), labels, num_classes=4, epsilon=2.0)
  _assert_frequencies(noisy, np.full(4, 0.25))


def test_selective_rr_in_set_and_out_of_set_frequencies():
  epsilon = 1.0
  # tau = 0.1 -> S = {0, 1, 2, 3} (k = 4); class 4 (prior 0.05) is outside the set.
  # Rows alternate between an in-set true label (2) and an out-of-set one (4); a second
  # prior (reversed) on every other pair checks the per-row vectorisation.
  prior = jnp.stack([PRIOR, PRIOR[::-1]])[jnp.arange(NUM_SAMPLES) // 2 % 2]  # (N, 5)
  labels = jnp.where(jnp.arange(NUM_SAMPLES) % 2 == 0, 2, 4).astype(jnp.int32)
  result = _srr_jit(jax.random.key(5), labels, prior, epsilon=epsilon, threshold=0.1)
  noisy = np.asarray(result.noisy_labels)
  mask = np.asarray(result.candidate_mask)
  first_prior = (np.arange(NUM_SAMPLES) // 2 % 2) == 0
  in_set = np.array([True, True, True, True, False])
  np.testing.assert_array_equal(mask[first_prior], np.tile(in_set, (first_prior.sum(), 1)))
  np.testing.assert_array_equal(mask[~first_prior],
                                np.tile(in_set[::-1], ((~first_prior).sum(), 1)))
  np.testing.assert_array_equal(result.set_sizes, np.full(NUM_SAMPLES, 4))
  even = np.arange(NUM_SAMPLES) % 2 == 0
  # First prior: label 2 in the set (kept w.p. e^eps/(e^eps+3)); label 4 outside (uniform).
  _assert_frequencies(noisy[first_prior & even], _rr_probs(2, in_set, epsilon))
  _assert_frequencies(noisy[first_prior & ~even], _rr_probs(4, in_set, epsilon))
  # Reversed prior: S = {1, 2, 3, 4}; label 2 and label 4 are both members.
  _assert_frequencies(noisy[~first_prior & even], _rr_probs(2, in_set[::-1], epsilon))
  _assert_frequencies(noisy[~first_prior & ~even], _rr_probs(4, in_set[::-1], epsilon))


def _channel_matrix(mask_row, epsilon):
  """(K, K) T[y, o] = P(release o | true y) read off `selective_rr_log_likelihood`, one
  released member o at a time (columns of non-members stay 0: never released)."""
  num_classes = mask_row.size
  members = np.flatnonzero(mask_row)
  log_t = rr.selective_rr_log_likelihood(jnp.asarray(members, jnp.int32),
                                         jnp.tile(jnp.asarray(mask_row), (members.size, 1)),
                                         epsilon)  # (|S|, K): row j is o = members[j]
  matrix = np.zeros((num_classes, num_classes))
  matrix[:, members] = np.exp(np.asarray(log_t, np.float64)).T
  return matrix


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_the_likelihood_is_the_mechanisms_channel(epsilon):
  # S = {0, 1, 3} of K = 5: true labels in S and outside it (2, 4).
  in_set = np.array([True, True, False, True, False])
  matrix = _channel_matrix(in_set, epsilon)
  np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=1e-6)  # a distribution per y
  keep = float(rr.keep_probability(epsilon, 3))
  np.testing.assert_allclose(np.diag(matrix)[in_set], keep, rtol=1e-6)
  prior = jnp.asarray(np.where(in_set, 0.3, 0.05), jnp.float32)  # tau 0.2 -> S
  for true_label in range(5):
    labels = jnp.full((NUM_SAMPLES,), true_label, jnp.int32)
    result = _srr_jit(jax.random.key(10 + true_label), labels, jnp.tile(prior, (NUM_SAMPLES, 1)),
                      epsilon=epsilon, threshold=0.2)
    np.testing.assert_array_equal(result.candidate_mask[0], in_set)
    _assert_frequencies(result.noisy_labels, matrix[true_label])


def test_the_likelihood_without_noise_keeps_members():
  matrix = _channel_matrix(np.array([True, False, True, True]), math.inf)
  np.testing.assert_array_equal(matrix[[0, 2, 3]][:, [0, 2, 3]], np.eye(3))
  np.testing.assert_allclose(matrix[1], [1 / 3, 0, 1 / 3, 1 / 3], rtol=1e-6)  # y outside S


def test_top_two_are_always_candidates():
  prior = _dirichlet_priors(6, 500, 8)
  mask = rr.candidate_set_mask(prior, threshold=1.0)  # nothing passes tau = 1
  top2 = np.argsort(-np.asarray(prior), axis=1)[:, :2]
  expected = np.zeros((500, 8), bool)
  np.put_along_axis(expected, top2, True, axis=1)
  np.testing.assert_array_equal(mask, expected)
  # Ties: a uniform prior keeps the two lowest class indices.
  tied = rr.candidate_set_mask(jnp.full((1, 4), 0.25), threshold=0.9)
  np.testing.assert_array_equal(tied, [[True, True, False, False]])


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.2, 0.5])
def test_threshold_selects_classes_at_or_above_tau(threshold):
  prior = _dirichlet_priors(7, 300, 6)
  result = _srr_traced_params(
      jax.random.key(8), jnp.zeros(300, jnp.int32), prior, epsilon=1.0, threshold=threshold)
  top2 = np.zeros((300, 6), bool)
  np.put_along_axis(top2, np.argsort(-np.asarray(prior), axis=1)[:, :2], True, axis=1)
  expected = (np.asarray(prior) >= threshold) | top2
  np.testing.assert_array_equal(result.candidate_mask, expected)
  np.testing.assert_array_equal(result.set_sizes, expected.sum(1))
  assert np.all(np.asarray(result.set_sizes) >= 2)
  # Released labels are always members of their row's set.
  assert np.all(np.take_along_axis(expected, np.asarray(result.noisy_labels)[:, None], 1))
  if threshold == 0.0:
    assert np.all(expected)


def test_jit_vmap_and_scan():
  labels = jnp.arange(64, dtype=jnp.int32) % 5
  prior = jnp.tile(PRIOR, (64, 1))
  keys = jax.random.split(jax.random.key(9), 4)
  rr_fn = functools.partial(rr.randomized_response, num_classes=5, epsilon=0.5)
  srr_fn = functools.partial(rr.selective_randomized_response, epsilon=0.5, threshold=0.1)

  @jax.jit
  def transformed(keys):
    single = (rr_fn(keys[1], labels), srr_fn(keys[1], labels, prior).noisy_labels)
    batched = (jax.vmap(rr_fn, in_axes=(0, None))(keys, labels),
               jax.vmap(srr_fn, in_axes=(0, None, None))(keys, labels, prior).noisy_labels)

    def step(carry, step_key):
      out = (rr_fn(step_key, labels), srr_fn(step_key, labels, prior).noisy_labels)
      return carry, out

    _, scanned = jax.lax.scan(step, 0, keys)
    return single, batched, scanned

  single, batched, scanned = transformed(keys)
  chex.assert_shape(batched, (4, 64))
  for index in range(2):
    np.testing.assert_array_equal(batched[index][1], single[index])
    np.testing.assert_array_equal(scanned[index], batched[index])
  # Eager and jit agree for the same key; another key changes the answer somewhere.
  np.testing.assert_array_equal(rr_fn(keys[1], labels), single[0])
  assert not np.array_equal(batched[0][0], batched[0][1])
  assert not np.array_equal(batched[1][0], batched[1][1])


@pytest.mark.parametrize("call,param", [
    (lambda: rr.randomized_response(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                    num_classes=1, epsilon=1.0), "num_classes"),
    (lambda: rr.randomized_response(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                    num_classes=3, epsilon=0.0), "epsilon"),
    (lambda: rr.randomized_response(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                    num_classes=3, epsilon=-1.0), "epsilon"),
    (lambda: rr.selective_randomized_response(
        jax.random.key(0), jnp.zeros(3, jnp.int32), jnp.ones((3, 4)) / 4, epsilon=0.0,
        threshold=0.1), "epsilon"),
    (lambda: rr.selective_randomized_response(
        jax.random.key(0), jnp.zeros(3, jnp.int32), jnp.ones((3, 4)) / 4, epsilon=1.0,
        threshold=1.5), "threshold"),
    (lambda: rr.selective_randomized_response(
        jax.random.key(0), jnp.zeros(3, jnp.int32), jnp.ones((3, 1)), epsilon=1.0,
        threshold=0.1), "classes"),
])
def test_invalid_parameters_raise_value_error_naming_them(call, param):
  with pytest.raises(ValueError, match=param):
    call()


def test_shape_mismatch_is_caught_by_chex():
  with pytest.raises(AssertionError):
    rr.selective_randomized_response(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                     jnp.ones((4, 5)) / 5, epsilon=1.0, threshold=0.1)
