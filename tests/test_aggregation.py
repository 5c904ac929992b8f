"""Tests of the PATE aggregation mechanisms and their accounting (privacy/aggregation.py)."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import aggregation

DELTA = 1e-5


def _logits(key, n=7, q=50, k=10):
  return jax.random.normal(key, (n, q, k))


def test_hard_histogram_counts_votes():
  logits = jnp.array([[[2.0, 0.0, 0.0]], [[0.0, 3.0, 0.0]], [[5.0, 0.0, 1.0]]])  # (3, 1, 3)
  hist = aggregation.vote_histogram(logits, votes="hard")
  np.testing.assert_array_equal(hist, [[2.0, 1.0, 0.0]])


@pytest.mark.parametrize("votes", ["hard", "soft"])
def test_rows_sum_to_num_teachers(votes):
  hist = aggregation.vote_histogram(_logits(jax.random.key(0)), votes=votes)
  chex.assert_shape(hist, (50, 10))
  np.testing.assert_allclose(hist.sum(-1), 7.0, rtol=1e-5)


@pytest.mark.parametrize("votes", ["hard", "soft"])
def test_zero_noise_releases_exact_votes(votes):
  logits = _logits(jax.random.key(1))
  hist = aggregation.vote_histogram(logits, votes=votes)
  out = aggregation.gnmax(jax.random.key(2), logits, 0.0, votes=votes)
  np.testing.assert_array_equal(out.histogram, hist)
  np.testing.assert_array_equal(out.labels, jnp.argmax(hist, -1))
  top2 = np.sort(np.asarray(hist), -1)[:, -2:]
  np.testing.assert_allclose(out.margin, top2[:, 1] - top2[:, 0], atol=1e-6)


@pytest.mark.parametrize("noise_std", [1.0, 25.0])
def test_measured_noise_std_matches(noise_std):
  hist = jnp.zeros((20000, 10)).at[:, 3].set(100.0)
  out = jax.jit(aggregation.noisy_histogram)(jax.random.key(3), hist, noise_std)
  noise = np.asarray(out.histogram - hist)
  # 2e5 draws: the sample std is within 1% of σ with overwhelming probability (se ≈ 0.16%).
  assert abs(noise.std() / noise_std - 1) < 0.01
  assert abs(noise.mean()) < 0.01 * noise_std


@pytest.mark.parametrize("votes", ["hard", "soft"])
def test_one_changed_teacher_moves_histogram_by_at_most_sqrt2(votes):
  """Disjoint shards: one record changes one teacher, the histogram moves <= √2 in L2."""
  for trial in range(20):
    key_a, key_b = jax.random.split(jax.random.key(100 + trial))
    logits = _logits(key_a) * 5
    changed = logits.at[trial % 7].set(jax.random.normal(key_b, (50, 10)) * 5)
    diff = (aggregation.vote_histogram(logits, votes=votes)
            - aggregation.vote_histogram(changed, votes=votes))
    assert float(jnp.max(jnp.linalg.norm(diff, axis=-1))) <= math.sqrt(2) + 1e-5


@pytest.mark.parametrize("num_queries", [1, 10, 1000])
def test_event_matches_direct_dp_accounting(num_queries):
  sigma = 40.0
  ours = accounting.epsilon(accounting.pate_event(noise_std=sigma, num_queries=num_queries),
                            delta=DELTA)
  acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
  acc.compose(dp_event.GaussianDpEvent(sigma / math.sqrt(2)), num_queries)
  assert ours == pytest.approx(acc.get_epsilon(DELTA), rel=1e-3)
  # Same thing from first principles: std σ, L2 sensitivity √2, Q-fold composition.
  pld = privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=sigma, sensitivity=math.sqrt(2),
      value_discretization_interval=1e-3).self_compose(num_queries)
  assert ours == pytest.approx(pld.get_epsilon_for_delta(DELTA), rel=2e-2)


def test_epsilon_grows_with_queries_and_is_inf_without_noise():
  eps = [accounting.epsilon(accounting.pate_event(noise_std=50.0, num_queries=q), delta=DELTA)
         for q in (1, 10, 100, 1000)]
  assert all(a < b for a, b in zip(eps, eps[1:]))
  assert accounting.epsilon(accounting.pate_event(noise_std=0.0, num_queries=5),
                            delta=DELTA) == math.inf
  assert accounting.epsilon(accounting.pate_event(noise_std=1.0, num_queries=0),
                            delta=DELTA) == 0.0


def test_calibration_meets_target_tightly():
  sigma = aggregation.calibrate_noise_std(target_epsilon=2.0, delta=DELTA, num_queries=500)
  eps = lambda s: accounting.epsilon(accounting.pate_event(noise_std=s, num_queries=500),
                                     delta=DELTA)
  assert eps(sigma) <= 2.0
  assert eps(0.98 * sigma) > 2.0
  queries = aggregation.max_queries(target_epsilon=2.0, delta=DELTA, noise_std=sigma,
                                    limit=10_000)
  assert 500 <= queries < 520


@pytest.mark.parametrize("call, match", [
    (lambda: aggregation.vote_histogram(jnp.zeros((2, 3, 4)), votes="mean"), "votes"),
    (lambda: aggregation.vote_histogram(jnp.zeros((3, 4))), r"\(n, Q, K\)"),
    (lambda: aggregation.noisy_histogram(jax.random.key(0), jnp.zeros((3, 4)), -1.0),
     "noise_std"),
    (lambda: aggregation.noisy_histogram(jax.random.PRNGKey(0), jnp.zeros((3, 4)), 1.0), "key"),
    (lambda: aggregation.noisy_histogram(jax.random.key(0), jnp.zeros((4,)), 1.0), "histogram"),
    (lambda: accounting.pate_event(noise_std=1.0, num_queries=-1), "num_queries"),
    (lambda: aggregation.calibrate_noise_std(target_epsilon=0.0, delta=DELTA, num_queries=5),
     "target_epsilon"),
])
def test_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()
