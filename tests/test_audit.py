"""Tests for dpkd_jax.privacy.audit: the shipped mechanisms pass, broken ones are caught.

Each audit uses N = 20000 runs per input (10000 select + 10000 evaluate) at confidence 0.95.
Claimed epsilons are computed independently of the library: dp_accounting's PLD accountant
for the Gaussian mechanisms (noise multiplier sigma / (2 sqrt(B)) or sigma / 2) and the
closed forms eps for RR, SRR, Laplace(Delta_1 / eps) and the local-DP reports.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import GaussianDpEvent
from dp_accounting.pld import PLDAccountant

from dpkd_jax.privacy import audit
from dpkd_jax.privacy import counts
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import randomized_response as rr

NUM_SAMPLES = 20_000
DELTA = 1e-5
BATCH, DIM = 4, 3  # (B, K) rows for the output-gradient mechanisms
# sigma chosen so that every Gaussian mechanism's accounting multiplier is 2.0.
SIGMA_ROWS = 2.0 * 2 * math.sqrt(BATCH)  # sigma / (2 sqrt(B)) = 2
SIGMA_SANITIZE = 2.0 * 2  # sigma / 2 = 2
NUM_TEACHERS = 10


@functools.lru_cache(maxsize=None)
def _gaussian_epsilon(accounting_noise_multiplier: float) -> float:
  accountant = PLDAccountant()
  accountant.compose(GaussianDpEvent(accounting_noise_multiplier))
  return accountant.get_epsilon(DELTA)


def _rows(sign):
  return sign * 10.0 * jnp.ones((BATCH, DIM))  # far outside C = 1: bounded to norm ~1


def _output_gradient(method, sigma):
  def mechanism(key, grads):
    return mechanisms.output_gradient_mechanism(
        key, grads, l2_clip_norm=1.0, noise_multiplier=sigma, method=method).noisy
  return mechanism


def _multi_teacher(sigma):
  def mechanism(key, grads):
    return mechanisms.multi_teacher_output_gradients(
        key, grads, l2_clip_norm=1.0, noise_multiplier=sigma).noisy
  return mechanism


def _sanitize(sigma):
  def mechanism(key, knowledge):
    return mechanisms.sanitize(key, knowledge, l2_clip_norm=1.0, noise_multiplier=sigma).noisy
  return mechanism


def _rr(epsilon):
  return lambda key, labels: rr.randomized_response(key, labels, num_classes=4, epsilon=epsilon)


def _srr(epsilon):
  prior = jnp.array([[0.4, 0.3, 0.2, 0.1]])  # tau = 0.15 -> S = {0, 1, 2}
  return lambda key, labels: rr.selective_randomized_response(
      key, labels, prior, epsilon=epsilon, threshold=0.15).noisy_labels


def _laplace(claimed_l1_sensitivity, epsilon):
  return lambda key, cells: counts.laplace_counts(
      key, cells, l1_sensitivity=claimed_l1_sensitivity, epsilon=epsilon)


def _flip_bits(epsilon):
  return lambda key, bits: counts.ldp_flip_bits(key, bits, epsilon=epsilon, k=1, r=1)


def _collision(epsilon):
  return lambda key, items: counts.collision_report(key, items, epsilon=epsilon, max_set_size=2)


def _supports_item_one_not_zero(report):
  """Collision statistic: does z match h(1) rather than h(0)? (h is the report's hash)."""
  hash_key, z = report
  buckets = counts.collision_hash(hash_key, jnp.array([0, 1]),
                                  counts.collision_num_buckets(2.0, 2))
  return (buckets[1] == z).astype(jnp.float32) - (buckets[0] == z).astype(jnp.float32)


def _picks_label_one(labels):
  return (labels[0] == 1).astype(jnp.float32)


def _teachers(first_sign, other_sign):
  """(n, B, K): teacher 0's rows with `first_sign`, all others with `other_sign`."""
  grads = jnp.broadcast_to(_rows(other_sign), (NUM_TEACHERS, BATCH, DIM))
  return grads.at[0].set(_rows(first_sign))


# name -> (mechanism, x, x', statistic, delta, claimed eps). Neighbouring pairs are worst
# cases: every bounded row flips sign (the teacher is not private), one teacher flips (one
# record is in one shard), one label changes, one count moves by Delta_1.
SOUND_CASES = {
    "output_grad_normalize": (_output_gradient("normalize", SIGMA_ROWS), _rows(1), _rows(-1),
                              None, DELTA, lambda: _gaussian_epsilon(2.0)),
    "output_grad_clip": (_output_gradient("clip", SIGMA_ROWS), _rows(1), _rows(-1),
                         None, DELTA, lambda: _gaussian_epsilon(2.0)),
    "multi_teacher": (_multi_teacher(SIGMA_ROWS), _teachers(1, 1), _teachers(-1, 1),
                      None, DELTA, lambda: _gaussian_epsilon(2.0)),
    "sanitize": (_sanitize(SIGMA_SANITIZE), _rows(1), _rows(-1), None, DELTA,
                 lambda: _gaussian_epsilon(2.0)),
    "randomized_response": (_rr(1.0), jnp.array([0]), jnp.array([1]), _picks_label_one, 0.0,
                            lambda: 1.0),
    "selective_rr": (_srr(1.0), jnp.array([0]), jnp.array([1]), _picks_label_one, 0.0,
                     lambda: 1.0),
    "laplace_counts": (_laplace(2.0, 1.0), jnp.zeros(4, jnp.int32),
                       jnp.zeros(4, jnp.int32).at[1].set(2), None, 0.0, lambda: 1.0),
    # Local DP: a one-hot vote vector (k r = 1) moved to the other cell (2 bits differ).
    "ldp_flip_bits": (_flip_bits(2.0), jnp.array([1, 0]), jnp.array([0, 1]), None, 0.0,
                      lambda: 2.0),
    "collision": (_collision(2.0), jnp.array([0, -1]), jnp.array([1, -1]),
                  _supports_item_one_not_zero, 0.0, lambda: 2.0),
}

# Deliberately broken: noise 10x too small, wrong epsilon, misstated sensitivity (teachers
# that share the record although the analysis assumes disjoint shards; counts that move by
# 10 Delta_1). Claimed eps as in the sound cases.
BROKEN_CASES = {
    "output_grad_noise_10x_too_small": (
        _output_gradient("normalize", SIGMA_ROWS / 10), _rows(1), _rows(-1), None, DELTA,
        lambda: _gaussian_epsilon(2.0)),
    "multi_teacher_overlapping_shards": (
        _multi_teacher(SIGMA_ROWS), _teachers(1, 1), _teachers(-1, -1), None, DELTA,
        lambda: _gaussian_epsilon(2.0)),
    "sanitize_noise_10x_too_small": (
        _sanitize(SIGMA_SANITIZE / 10), _rows(1), _rows(-1), None, DELTA,
        lambda: _gaussian_epsilon(2.0)),
    "randomized_response_eps_10x": (
        _rr(10.0), jnp.array([0]), jnp.array([1]), _picks_label_one, 0.0, lambda: 1.0),
    "laplace_sensitivity_misstated": (
        _laplace(2.0, 1.0), jnp.zeros(4, jnp.int32), jnp.zeros(4, jnp.int32).at[1].set(20),
        None, 0.0, lambda: 1.0),
}


def _run(case, seed):
  mechanism, x, x_prime, statistic, delta, claimed = case
  result = audit.audit_mechanism(jax.random.key(seed), mechanism, x, x_prime,
                                 num_samples=NUM_SAMPLES, delta=delta, statistic=statistic)
  return result, claimed()


@pytest.mark.parametrize("name", sorted(SOUND_CASES))
def test_sound_mechanism_lower_bound_does_not_exceed_claimed_epsilon(name):
  result, claimed = _run(SOUND_CASES[name], seed=11)
  assert result.num_samples == NUM_SAMPLES and result.confidence == 0.95
  assert 0.0 <= result.epsilon_lower_bound <= claimed, (result, claimed)
  # The audit is not vacuous on these pairs: it finds a real fraction of the guarantee.
  assert result.epsilon_lower_bound >= 0.2 * claimed, (result, claimed)


@pytest.mark.parametrize("name", sorted(BROKEN_CASES))
def test_broken_mechanism_is_caught(name):
  result, claimed = _run(BROKEN_CASES[name], seed=12)
  assert result.epsilon_lower_bound > claimed, (result, claimed)


def test_identical_inputs_give_no_evidence():
  mechanism = _output_gradient("normalize", SIGMA_ROWS)
  result = audit.audit_mechanism(jax.random.key(13), mechanism, _rows(1), _rows(1),
                                 num_samples=NUM_SAMPLES, delta=DELTA)
  # With no signal the CP bounds make eps_lb ~0 (log of a ratio <= 1 + 2 sampling errors).
  assert result.epsilon_lower_bound < 0.1, result


def test_batched_sampling_matches_full_vmap():
  mechanism, x, x_prime, statistic, delta, _ = SOUND_CASES["laplace_counts"]
  kwargs = dict(num_samples=2_000, delta=delta, statistic=statistic)
  full = audit.audit_mechanism(jax.random.key(14), mechanism, x, x_prime, **kwargs)
  batched = audit.audit_mechanism(jax.random.key(14), mechanism, x, x_prime, batch_size=300,
                                  **kwargs)
  np.testing.assert_allclose(batched.epsilon_lower_bound, full.epsilon_lower_bound, rtol=1e-6)


def test_clopper_pearson_upper_matches_closed_forms():
  alpha = 0.025
  # k = 0: 1 - alpha^(1/n); k = n: 1.
  np.testing.assert_allclose(audit.clopper_pearson_upper(np.array([0]), 100, alpha),
                             [1 - alpha ** (1 / 100)], rtol=1e-10)
  np.testing.assert_allclose(audit.clopper_pearson_upper(np.array([100]), 100, alpha), [1.0])
  bounds = audit.clopper_pearson_upper(np.arange(0, 101, 10), 100, alpha)
  assert np.all(np.diff(bounds) > 0) and np.all(bounds >= np.arange(0, 101, 10) / 100)


def test_epsilon_from_error_rates():
  np.testing.assert_allclose(audit.epsilon_from_error_rates(0.1, 0.2, 0.0),
                             max(math.log(0.8 / 0.1), math.log(0.9 / 0.2)))
  np.testing.assert_allclose(audit.epsilon_from_error_rates(0.2, 0.1, 0.05),
                             max(math.log(0.85 / 0.2), math.log(0.75 / 0.1)))
  assert audit.epsilon_from_error_rates(1.0, 1.0, 0.0) == -np.inf


@pytest.mark.parametrize("kwargs,param", [
    (dict(num_samples=50), "num_samples"),
    (dict(num_samples=1001), "num_samples"),
    (dict(num_samples=1000, delta=1.0), "delta"),
    (dict(num_samples=1000, confidence=1.0), "confidence"),
    (dict(num_samples=1000, max_thresholds=1), "max_thresholds"),
])
def test_invalid_parameters_raise_value_error_naming_them(kwargs, param):
  mechanism = SOUND_CASES["laplace_counts"][0]
  with pytest.raises(ValueError, match=param):
    audit.audit_mechanism(jax.random.key(0), mechanism, jnp.zeros(4, jnp.int32),
                          jnp.zeros(4, jnp.int32), **kwargs)
