"""Tests for dpkd_jax.privacy.counts: discrete Laplace counts, LDP flip rate, unbiased estimators."""

import fractions
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import counts
from dpkd_jax.privacy import discrete_laplace


@pytest.mark.parametrize("l1_sensitivity,epsilon", [(2.0, 1.0), (6, 0.4)])
def test_laplace_counts_add_exact_discrete_laplace_of_scale_delta_over_eps(l1_sensitivity,
                                                                          epsilon):
  scale = discrete_laplace.rational_scale(l1_sensitivity, epsilon)
  assert scale >= fractions.Fraction(l1_sensitivity) / fractions.Fraction(epsilon)
  true_counts = jnp.tile(jnp.arange(100, dtype=jnp.int32), (500, 1))  # (500, 100)
  noisy = jax.jit(functools.partial(counts.laplace_counts, l1_sensitivity=l1_sensitivity,
                                    epsilon=epsilon))(jax.random.key(0), true_counts)
  chex.assert_shape(noisy, true_counts.shape)
  chex.assert_type(noisy, jnp.int32)
  noise = np.asarray(noisy, np.float64) - np.asarray(true_counts)
  # DLap(t), q = e^(-1/t): Var = 2q / (1 - q)^2, E|X| = 2q / (1 - q^2); 5e4 draws: 4% is
  # more than 8 standard errors.
  q = math.exp(-1.0 / float(scale))
  np.testing.assert_allclose(np.var(noise), 2 * q / (1 - q) ** 2, rtol=0.04)
  np.testing.assert_allclose(np.mean(np.abs(noise)), 2 * q / (1 - q * q), rtol=0.04)
  assert abs(noise.mean()) < 5 * math.sqrt(2 * q / (1 - q) ** 2 / noise.size)


def test_laplace_and_flip_bits_under_jit_vmap_and_scan():
  laplace = functools.partial(counts.laplace_counts, l1_sensitivity=2.0, epsilon=1.0)
  flip = functools.partial(counts.ldp_flip_bits, epsilon=1.0, k=1, r=1)
  true_counts = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
  bits = true_counts > 5
  keys = jax.random.split(jax.random.key(1), 3)

  @jax.jit
  def transformed(keys, true_counts):
    batched = (jax.vmap(laplace, in_axes=(0, None))(keys, true_counts),
               jax.vmap(flip, in_axes=(0, None))(keys, bits))
    _, scanned = jax.lax.scan(
        lambda carry, k: (carry, (laplace(k, true_counts), flip(k, bits))), 0, keys)
    return batched, scanned

  batched, scanned = transformed(keys, true_counts)
  chex.assert_shape(batched, (3, 3, 4))
  chex.assert_type(batched[0], jnp.int32)
  np.testing.assert_array_equal(scanned[0], batched[0])
  np.testing.assert_array_equal(scanned[1], batched[1])
  np.testing.assert_array_equal(batched[0][2], laplace(keys[2], true_counts))  # eager
  assert not np.array_equal(batched[0][0], batched[0][1])


def test_laplace_counts_is_the_scale_form_at_the_rational_scale():
  true_counts = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
  key = jax.random.key(5)
  np.testing.assert_array_equal(
      counts.laplace_counts(key, true_counts, l1_sensitivity=4, epsilon=0.3),
      counts.discrete_laplace_counts(key, true_counts,
                                     scale=discrete_laplace.rational_scale(4, 0.3)))


@pytest.mark.parametrize("epsilon,k,r", [(2.0, 3, 1), (1.0, 1, 1), (8.0, 2, 2)])
def test_flip_rate_matches_formula(epsilon, k, r):
  expected = 1.0 / (math.exp(epsilon / (2 * k * r)) + 1.0)
  np.testing.assert_allclose(counts.ldp_flip_probability(epsilon, k, r), expected, rtol=1e-6)
  bits = (jnp.arange(100_000) % 3 == 0).reshape(1000, 100)  # bool, one third ones
  noisy = jax.jit(functools.partial(counts.ldp_flip_bits, epsilon=epsilon, k=k, r=r))(
      jax.random.key(2), bits)
  chex.assert_type(noisy, bool)
  chex.assert_shape(noisy, bits.shape)
  flipped = np.asarray(noisy) != np.asarray(bits)
  sd = math.sqrt(expected * (1 - expected) / flipped.size)  # sd of the overall flip rate
  assert abs(flipped.mean() - expected) <= 5 * sd
  # The rate does not depend on the bit value (ones flip to zero as often as zeros to one):
  # the two rates use n/3 and 2n/3 bits, so their difference has sd sqrt(3 + 1.5) * sd.
  ones = np.asarray(bits)
  assert abs(flipped[ones].mean() - flipped[~ones].mean()) <= 5 * math.sqrt(4.5) * sd


def test_flip_bits_keeps_integer_dtype_and_huge_epsilon_flips_nothing():
  bits = (jnp.arange(64) % 2).astype(jnp.int8)
  noisy = counts.ldp_flip_bits(jax.random.key(3), bits, epsilon=1e4, k=1, r=1)
  chex.assert_type(noisy, jnp.int8)
  np.testing.assert_array_equal(noisy, bits)


def test_ldp_estimator_is_unbiased():
  epsilon, k, r = 2.0, 2, 1
  num_records, num_trials = 100, 2000
  true_counts = np.array([0, 5, 10, 20, 40, 60, 80, 100])
  # Record j votes for cell c iff j < true_counts[c]: (num_records, 8) bits. (Unbiasedness
  # does not rely on the <= k r ones per record that privacy needs.)
  bits = jnp.asarray(np.arange(num_records)[:, None] < true_counts[None, :])

  @jax.jit
  def estimates(keys):
    noisy = jax.vmap(lambda key: counts.ldp_flip_bits(key, bits, epsilon=epsilon, k=k, r=r))(
        keys)  # (T, n, d)
    sums = jnp.sum(noisy, axis=1)  # (T, d)
    return counts.ldp_unbiased_counts(sums, num_records, epsilon=epsilon, k=k, r=r)

  est = np.asarray(estimates(jax.random.split(jax.random.key(4), num_trials)), np.float64)
  p = 1.0 / (math.exp(epsilon / (2 * k * r)) + 1.0)
  single_sd = math.sqrt(num_records * p * (1 - p)) / (1 - 2 * p)
  # Mean over T trials has sd single_sd / sqrt(T) (~0.47 here); allow 5 sd per cell.
  np.testing.assert_allclose(est.mean(0), true_counts, atol=5 * single_sd / math.sqrt(num_trials))
  np.testing.assert_allclose(est.std(0), single_sd, rtol=0.1)


COLLISION_EPSILON, COLLISION_SET_SIZE = 2.0, 2  # l = floor(3 + 2 e^2) = 17 buckets
# One compiled sampler for many (private key, public hash key, item set) triples.
_reports_for_hashes = jax.jit(jax.vmap(functools.partial(
    counts.collision_report_for_hash, epsilon=COLLISION_EPSILON,
    max_set_size=COLLISION_SET_SIZE)))


def test_collision_report_distribution_for_a_fixed_hash():
  epsilon, max_set_size = COLLISION_EPSILON, COLLISION_SET_SIZE
  num_buckets = counts.collision_num_buckets(epsilon, max_set_size)
  assert num_buckets == math.floor(2 * max_set_size - 1 + max_set_size * math.exp(epsilon))
  omega = max_set_size * math.exp(epsilon) + num_buckets - max_set_size
  hash_key = jax.random.key(6)
  bucket_of = np.asarray(counts.collision_hash(hash_key, jnp.arange(200), num_buckets))
  second = int(np.flatnonzero(bucket_of != bucket_of[0])[0])
  colliding = int(np.flatnonzero(bucket_of[1:] == bucket_of[0])[0] + 1)
  # Sets: two distinct buckets (c = 2), two items in one bucket (c = 1), one item + padding.
  item_sets = np.array([[0, second], [0, colliding], [second, -1]])
  samples_per_set = 100_000
  items = jnp.asarray(np.repeat(item_sets, samples_per_set, axis=0))  # (3N, D)
  keys = jax.random.split(jax.random.key(5), items.shape[0])
  hash_keys = jnp.broadcast_to(hash_key, keys.shape)  # the same public hash for every run
  samples = np.asarray(_reports_for_hashes(keys, hash_keys, items)).reshape(3, -1)
  distributions = []
  for set_items, set_samples in zip(item_sets, samples):
    collision_set = set(bucket_of[set_items[set_items >= 0]].tolist())
    c = len(collision_set)
    expected = np.array([math.exp(epsilon) / omega if b in collision_set
                         else (omega - c * math.exp(epsilon)) / ((num_buckets - c) * omega)
                         for b in range(num_buckets)])
    freqs = np.bincount(set_samples, minlength=num_buckets) / samples_per_set
    assert freqs.size == num_buckets
    tolerance = 5 * np.sqrt(expected * (1 - expected) / samples_per_set)
    assert np.all(np.abs(freqs - expected) <= tolerance), (set_items, freqs, expected)
    distributions.append(expected)
  # The eps-LDP property: every output probability ratio between two sets is <= e^eps.
  worst_ratio = max(np.max(a / b) for a in distributions for b in distributions)
  assert worst_ratio <= math.exp(epsilon) * (1 + 1e-9)


def test_collision_estimator_is_unbiased():
  epsilon, max_set_size = COLLISION_EPSILON, COLLISION_SET_SIZE
  num_items, num_records, num_runs = 6, 20_000, 5
  # Record j holds {j % 3, 3 + j % 2} (odd records with the second item as padding -1 when
  # j % 4 == 3): true counts of items 0..5.
  record = np.arange(num_records)
  second_item = np.where(record % 4 == 3, -1, 3 + record % 2)
  items = jnp.asarray(np.stack([record % 3, second_item], axis=1))
  true_counts = np.array([np.sum(np.asarray(items) == i) for i in range(num_items)])
  assert true_counts[5] == 0 and true_counts[4] == num_records // 4

  @jax.jit
  def estimate(key):
    keys = jax.random.split(key, num_records)
    hash_keys, reports = jax.vmap(functools.partial(
        counts.collision_report, epsilon=epsilon, max_set_size=max_set_size))(keys, items)
    support = counts.collision_support_counts(hash_keys, reports, num_items=num_items,
                                              epsilon=epsilon, max_set_size=max_set_size)
    return counts.collision_unbiased_counts(support, num_records, epsilon=epsilon,
                                            max_set_size=max_set_size)

  est = np.stack([np.asarray(estimate(key))
                  for key in jax.random.split(jax.random.key(7), num_runs)])
  num_buckets = counts.collision_num_buckets(epsilon, max_set_size)
  tpr = math.exp(epsilon) / (max_set_size * math.exp(epsilon) + num_buckets - max_set_size)
  fpr = 1 / num_buckets
  support_var = true_counts * tpr * (1 - tpr) + (num_records - true_counts) * fpr * (1 - fpr)
  sd_of_mean = np.sqrt(support_var) / (tpr - fpr) / math.sqrt(num_runs)
  np.testing.assert_array_less(np.abs(est.mean(0) - true_counts), 5 * sd_of_mean)


@pytest.mark.parametrize("call,param", [
    (lambda: counts.laplace_counts(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                   l1_sensitivity=0.0, epsilon=1.0), "l1_sensitivity"),
    (lambda: counts.laplace_counts(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                   l1_sensitivity=1.5, epsilon=1.0), "whole number"),
    (lambda: counts.laplace_counts(jax.random.key(0), jnp.zeros(3, jnp.int32),
                                   l1_sensitivity=1.0, epsilon=-1.0), "epsilon"),
    (lambda: counts.laplace_counts(jax.random.key(0), jnp.zeros(3), l1_sensitivity=1.0,
                                   epsilon=1.0), "integer dtype"),
    (lambda: counts.ldp_flip_bits(jax.random.key(0), jnp.zeros(3, bool), epsilon=0.0, k=1,
                                  r=1), "epsilon"),
    (lambda: counts.ldp_flip_bits(jax.random.key(0), jnp.zeros(3, bool), epsilon=1.0, k=0,
                                  r=1), "k"),
    (lambda: counts.ldp_unbiased_counts(jnp.zeros(3), 5, epsilon=1.0, k=1, r=0), "r"),
    (lambda: counts.collision_num_buckets(30.0, 4), "epsilon"),
    (lambda: counts.collision_num_buckets(1.0, 0), "max_set_size"),
])
def test_invalid_parameters_raise_value_error_naming_them(call, param):
  with pytest.raises(ValueError, match=param):
    call()
