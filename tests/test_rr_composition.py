"""Exact RR composition on the loss lattice vs closed forms, brute force and PLD."""

import itertools
import math

from dp_accounting.pld import privacy_loss_distribution
import numpy as np
import pytest
from scipy import stats

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import rr_composition

DELTA = 1e-5


def _p(eps0: float, k: int) -> float:
  return k / (math.exp(eps0) + k - 1)


def _brute_force_delta(eps: float, eps0: float, k: int, n: int) -> float:
  """δ(ε) by enumerating every output sequence of n k-ary RR queries (labels a vs b)."""
  p = _p(eps0, k)
  probs_a = np.full(k, p / k)
  probs_a[0] += 1 - p  # true label a = 0
  probs_b = np.full(k, p / k)
  probs_b[1] += 1 - p  # true label b = 1
  delta = 0.0
  for outputs in itertools.product(range(k), repeat=n):
    pa, pb = np.prod(probs_a[list(outputs)]), np.prod(probs_b[list(outputs)])
    delta += max(pa - math.exp(eps) * pb, 0.0)
  return delta


@pytest.mark.parametrize("k,n", [(2, 6), (3, 5), (4, 4)])
@pytest.mark.parametrize("eps", [0.0, 0.5, 2.0])
def test_delta_equals_brute_force_enumeration(k, n, eps):
  eps0 = 0.7
  ours = rr_composition.composed_delta(eps, [(_p(eps0, k), k, n)])
  assert ours == pytest.approx(_brute_force_delta(eps, eps0, k, n), rel=1e-9, abs=1e-14)


def test_binary_matches_the_binomial_closed_form_at_many_queries():
  eps0, n = 0.05, 5000
  plus = math.exp(eps0) / (1 + math.exp(eps0))
  j = np.arange(n + 1)
  loss = eps0 * (2 * j - n)
  for eps in (1.0, 3.0):
    exact = float(np.sum(stats.binom.pmf(j, n, plus) * np.clip(1 - np.exp(eps - loss), 0, None)))
    assert rr_composition.composed_delta(eps, [(_p(eps0, 2), 2, n)]) == pytest.approx(
        exact, rel=1e-9)


def test_epsilon_inverts_delta_and_errs_on_the_safe_side():
  leaves = [(_p(0.01, 10), 10, 20_000)]
  eps = rr_composition.composed_epsilon(DELTA, leaves)
  assert rr_composition.composed_delta(eps, leaves) <= DELTA
  assert rr_composition.composed_delta(eps * 0.999, leaves) > DELTA


def test_small_per_query_epsilon_has_no_discretisation_floor():
  # PLD at the library's grid step charges each query up to one step: ε ≈ 13 here.
  eps0, n = 1e-3, 25_600
  p = _p(eps0, 2)
  pld = privacy_loss_distribution.from_randomized_response(
      noise_parameter=p, num_buckets=2,
      value_discretization_interval=accounting.DEFAULT_VALUE_DISCRETIZATION_INTERVAL)
  pessimistic = pld.self_compose(n).get_epsilon_for_delta(DELTA)
  exact = accounting.epsilon(accounting.srr_event(epsilon_per_query=eps0, num_queries=n),
                             delta=DELTA)
  assert pessimistic > 10
  # Gaussian approximation of n ε0-RR: ε ≈ ε0·sqrt(n)·Φ⁻¹(1 − δ)-ish, well below 1.
  assert 0.3 < exact < 1.0
  assert exact <= pessimistic


@pytest.mark.parametrize("k", [2, 10])
def test_exact_never_exceeds_the_fine_grid_pld_and_is_close(k):
  eps0, n = 0.5, 300
  pld = privacy_loss_distribution.from_randomized_response(
      noise_parameter=_p(eps0, k), num_buckets=k, value_discretization_interval=1e-4)
  pessimistic = pld.self_compose(n).get_epsilon_for_delta(DELTA)
  exact = accounting.epsilon(
      accounting.srr_event(epsilon_per_query=eps0, num_queries=n, num_classes=k), delta=DELTA)
  assert exact <= pessimistic <= exact * 1.02


def test_epsilon_grows_with_the_number_of_queries():
  eps = [accounting.epsilon(accounting.srr_event(epsilon_per_query=0.1, num_queries=n),
                            delta=DELTA) for n in (1, 10, 100, 1000)]
  # One query: δ > 0 buys a little below ε0.
  assert eps == sorted(eps) and 0.0999 < eps[0] <= 0.1 and eps[-1] > 5


def test_leaves_with_different_epsilon0_fall_back_to_pld():
  mixed = accounting.dp_event.ComposedDpEvent([
      accounting.srr_event(epsilon_per_query=0.5, num_queries=10),
      accounting.srr_event(epsilon_per_query=1.0, num_queries=10)])
  assert rr_composition.common_epsilon0(
      [(_p(0.5, 2), 2, 10), (_p(1.0, 2), 2, 10)]) is None
  one = accounting.epsilon(accounting.srr_event(epsilon_per_query=1.0, num_queries=10),
                           delta=DELTA)
  both = accounting.epsilon(mixed, delta=DELTA)
  assert one < both < 15.0


def test_noiseless_rr_is_infinite_and_trivial_rr_is_free():
  assert rr_composition.rr_epsilon0(0.5, 2) == pytest.approx(math.log(3))
  noiseless = accounting.dp_event.RandomizedResponseDpEvent(noise_parameter=0.0, num_buckets=2)
  assert accounting.epsilon(noiseless, delta=DELTA) == math.inf
  free = accounting.dp_event.RandomizedResponseDpEvent(noise_parameter=1.0, num_buckets=2)
  assert accounting.epsilon(free, delta=DELTA) == 0.0
