"""Tests for dpkd_jax.privacy.accounting: closed forms, the RR trap, validation."""

import math

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest
from scipy import optimize
from scipy import stats

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import discrete_laplace
from dpkd_jax.privacy import evaluation

DELTA = 1e-5


def analytic_gaussian_delta(eps: float, z: float) -> float:
  """δ(ε) of one Gaussian with sensitivity 1 and std z (Balle & Wang 2018)."""
  return float(stats.norm.cdf(0.5 / z - eps * z)
               - math.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z))


def analytic_gaussian_epsilon(delta: float, z: float) -> float:
  return optimize.brentq(lambda e: analytic_gaussian_delta(e, z) - delta,
                         0.0, 500.0, xtol=1e-12)


def binary_rr_composition_delta(eps: float, eps0: float, n: int) -> float:
  """Exact δ(ε) of n composed binary RR with ε0 each (Kairouz et al. 2015)."""
  j = np.arange(n + 1)
  pmf = stats.binom.pmf(j, n, math.exp(eps0) / (1 + math.exp(eps0)))
  loss = eps0 * (2 * j - n)
  return float(np.sum(pmf * np.clip(1 - np.exp(eps - loss), 0, None)))


def test_dpdfd_rdp_curve_is_the_gaussian_closed_form():
  # RDP(α) of T Gaussians with sensitivity 2C√B and std σC is
  # T·α·(2C√B)²/(2σ²C²) = 2·α·T·B/σ².
  sigma, batch, steps = 100.0, 256, 7
  acc = rdp_privacy_accountant.RdpAccountant().compose(accounting.dpdfd_event(
      noise_multiplier=sigma, batch_size=batch, steps=steps))
  np.testing.assert_allclose(acc.rdp, 2 * acc.orders * steps * batch / sigma**2,
                             rtol=1e-10)


@pytest.mark.parametrize("z,steps", [(3.125, 1), (0.8, 1), (3.125, 16)])
def test_gaussian_pld_matches_analytic_gaussian_mechanism(z, steps):
  batch = 256
  event = accounting.dpdfd_event(noise_multiplier=2 * math.sqrt(batch) * z,
                                 batch_size=batch, steps=steps)
  eps = accounting.epsilon(event, delta=DELTA)
  # T Gaussians with std z each == one Gaussian with std z/sqrt(T).
  z_total = z / math.sqrt(steps)
  # PLD is pessimistic: the exact δ at its ε is below the target δ...
  assert analytic_gaussian_delta(eps, z_total) <= DELTA * (1 + 1e-6)
  # ...and its ε is within the 1e-3 grid (plus slack) of the exact ε.
  assert eps == pytest.approx(analytic_gaussian_epsilon(DELTA, z_total),
                              abs=5e-3)


@pytest.mark.parametrize("eps_round,rounds", [(0.7, 1), (0.3, 5)])
def test_laplace_is_pure_epsilon(eps_round, rounds):
  event = accounting.laplace_counts_event(epsilon_per_round=eps_round,
                                          rounds=rounds)
  pure = eps_round * rounds  # Δ/b per round, composed.
  assert accounting.delta_for_epsilon(event, epsilon=pure + 2e-3) < 1e-12
  assert accounting.delta_for_epsilon(event, epsilon=0.9 * pure) > 1e-4
  if rounds == 1:
    assert accounting.epsilon(event, delta=1e-10) == pytest.approx(pure,
                                                                   abs=2e-3)


@pytest.mark.parametrize("eps_round,rounds", [(0.1, 1), (0.7, 1), (0.3, 5)])
def test_pure_laplace_tree_costs_exactly_its_pure_epsilon(eps_round, rounds):
  # The PLD grid alone charged a pure release up to one grid step more (0.1 → 0.1002). The
  # closed-form cap is the pure ε; at δ > 0 the grid may find slightly less, never more.
  event = accounting.laplace_counts_event(epsilon_per_round=eps_round, rounds=rounds)
  pure = eps_round * rounds
  for delta in (1e-5, 1e-10):
    eps = accounting.epsilon(event, delta=delta)
    assert eps <= pure
    assert eps == pytest.approx(pure, abs=1e-3)
  assert accounting.delta_for_epsilon(event, epsilon=pure) == 0.0
  if (eps_round, rounds) == (0.1, 1):  # the rknn release: the grid said 0.1002 here
    assert accounting.epsilon(event, delta=1e-5) == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize("l1_sensitivity,eps_round,rounds", [(2, 1.0, 1), (6, 0.25, 4),
                                                             (20, 0.01, 10), (2, 0.5, 30)])
def test_discrete_laplace_counts_cost_their_executed_pure_epsilon(l1_sensitivity, eps_round,
                                                                  rounds):
  # Pure ε of DLap(t) on integer sensitivity Δ is a·Δ, a = 1/t; the PLD ε at δ may be less,
  # never more; RDP (binary RR of a·Δ, which dominates it) is sound too.
  scale = discrete_laplace.rational_scale(l1_sensitivity, eps_round)
  event = accounting.discrete_laplace_counts_event(scale=scale, l1_sensitivity=l1_sensitivity,
                                                   rounds=rounds)
  leaf = event.event
  assert isinstance(leaf, dp_event.DiscreteLaplaceDpEvent) and leaf.sensitivity == l1_sensitivity
  assert event.relation == accounting.REPLACE_ONE and event.count == rounds
  pure = rounds * leaf.noise_parameter * l1_sensitivity
  assert pure <= rounds * eps_round * (1 + 1e-12)  # the scale is rounded up
  assert pure >= rounds * float(l1_sensitivity / scale)  # the charge is rounded up
  for delta in (1e-5, 1e-10):
    eps = accounting.epsilon(event, delta=delta)
    assert 0.5 * pure < eps <= pure
  assert accounting.delta_for_epsilon(event, epsilon=pure) == 0.0
  assert pure * 0.9 < accounting.epsilon(event, delta=1e-5, accountant="rdp")
  if rounds == 1:  # one pure release: exactly its pure ε
    assert accounting.epsilon(event, delta=1e-10) == pytest.approx(pure, abs=1e-3)
  assert isinstance(accounting.discrete_laplace_counts_event(
      scale=scale, l1_sensitivity=l1_sensitivity, rounds=0), dp_event.NoOpDpEvent)


def test_discrete_laplace_pld_matches_dp_accountings_own_accountant():
  # Under a unit-shift relation dp_accounting's PLDAccountant prices the same event directly.
  scale = discrete_laplace.rational_scale(2, 0.5)
  leaf = accounting.discrete_laplace_counts_event(scale=scale, l1_sensitivity=2,
                                                  rounds=1).event
  reference = pld_privacy_accountant.PLDAccountant(
      accounting.NeighborRel.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
  reference.compose(dp_event.SelfComposedDpEvent(leaf, 8))
  ours = accounting.epsilon(accounting.discrete_laplace_counts_event(
      scale=scale, l1_sensitivity=2, rounds=8), delta=1e-5)
  assert ours == pytest.approx(reference.get_epsilon(1e-5), abs=5e-3)


def test_closed_form_cap_is_never_above_the_grid():
  # A mixed tree (Laplace beside Gaussians): the cap only ever lowers ε, and composing more
  # Laplace releases still costs more.
  def event(laplace_rounds):
    return dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(10.0), laplace_rounds),
        dp_event.GaussianDpEvent(5.0)])
  grid = evaluation.pld_grid.evaluate(
      evaluation._parts(event(1)), lambda pld: float(pld.get_epsilon_for_delta(1e-5)), None,
      epsilon_scale=1.0)
  eps = [accounting.epsilon(event(n), delta=1e-5) for n in (1, 2, 4)]
  assert eps[0] <= grid
  assert eps[0] < eps[1] < eps[2]


@pytest.mark.parametrize("num_classes", [None, 5, 10])
@pytest.mark.parametrize("eps0", [0.5, 2.0])
def test_rr_epsilon_closed_form(num_classes, eps0):
  event = accounting.srr_event(epsilon_per_query=eps0, num_queries=1,
                               num_classes=num_classes)
  rr = event.event
  k = 2 if num_classes is None else num_classes
  p = rr.noise_parameter
  assert rr.num_buckets == k
  assert math.log(1 + k * (1 - p) / p) == pytest.approx(eps0, rel=1e-12)
  assert accounting.epsilon(event, delta=1e-10) == pytest.approx(eps0,
                                                                 abs=2e-3)


def test_rr_composition_matches_exact_binomial_composition():
  eps0, n = 0.5, 40
  event = accounting.srr_event(epsilon_per_query=eps0, num_queries=n)
  for eps in (2.0, 5.0, 8.0):
    exact = binary_rr_composition_delta(eps, eps0, n)
    ours = accounting.delta_for_epsilon(event, epsilon=eps)
    # An RR-only tree of one ε0 is evaluated exactly (rr_composition).
    assert ours == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("num_classes", [2, 10])
def test_rdp_of_rr_is_the_renyi_divergence(num_classes):
  # The "rdp" accountant uses dp_accounting's RR RDP under REPLACE_ONE: check
  # it is D_α(P || Q) for P, Q the output laws of RR on two different labels.
  n, k = 7, num_classes
  event = accounting.srr_event(epsilon_per_query=1.3, num_queries=n,
                               num_classes=k)
  p = event.event.noise_parameter
  acc = rdp_privacy_accountant.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
  ).compose(event)
  law_p = np.full(k, p / k)
  law_p[0] += 1 - p
  law_q = np.roll(law_p, 1)
  orders = acc.orders[acc.orders < 64]
  renyi = [np.log(np.sum(law_p**a * law_q**(1 - a))) / (a - 1)
           for a in orders]
  np.testing.assert_allclose(acc.rdp[acc.orders < 64], n * np.array(renyi),
                             rtol=1e-9)
  assert accounting.epsilon(event, delta=DELTA, accountant="rdp") == (
      pytest.approx(acc.get_epsilon(DELTA)))


def test_pld_accountant_rr_count_trap_exists_in_this_dp_accounting():
  """dp-accounting 0.6.0 composes an RR event once whatever the count.

  If this fails, the bug is fixed upstream: the hand-built RR PLD in
  accounting.py can then be replaced by PLDAccountant.
  """
  rr = dp_event.RandomizedResponseDpEvent(noise_parameter=0.5, num_buckets=2)
  relation = dp_accounting.NeighboringRelation.REPLACE_ONE

  def pld_epsilon(event):
    return pld_privacy_accountant.PLDAccountant(relation).compose(
        event).get_epsilon(DELTA)

  assert pld_epsilon(dp_event.SelfComposedDpEvent(rr, 10)) == pld_epsilon(rr)
  assert pld_epsilon(rr) == pld_privacy_accountant.PLDAccountant(
      relation).compose(rr, 10).get_epsilon(DELTA)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_our_rr_epsilon_grows_with_number_of_queries(accountant):
  eps = [accounting.epsilon(accounting.srr_event(
      epsilon_per_query=1.0, num_queries=n), delta=DELTA, accountant=accountant)
         for n in (1, 10, 100)]
  assert eps[0] < eps[1] < eps[2]
  assert eps[1] > 5 * eps[0]  # The trap would give eps[1] == eps[0].


@pytest.mark.parametrize("make_event", [
    lambda t: accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                     steps=t),
    lambda t: accounting.laplace_counts_event(epsilon_per_round=0.2, rounds=t),
    lambda t: accounting.rona_event(noise_multiplier=20.0, num_queries=t),
    lambda t: accounting.dpsgd_event(noise_multiplier=1.1, sampling_rate=0.01,
                                     steps=t, relation="add-remove"),
])
def test_composition_grows_with_steps(make_event):
  eps = [accounting.epsilon(make_event(t), delta=DELTA) for t in (10, 20)]
  assert 0 < eps[0] < eps[1]
  assert accounting.epsilon(make_event(0), delta=DELTA) == 0.0


def test_multi_teacher_has_the_same_event():
  kwargs = dict(noise_multiplier=50.0, batch_size=64, steps=3)
  assert (accounting.dpdfd_event(**kwargs, num_teachers=5)
          == accounting.dpdfd_event(**kwargs))


def test_a_record_reaching_m_teachers_divides_the_multiplier_by_m():
  # Each summed row moves by 2Cm: the event of sigma / m.
  kwargs = dict(batch_size=64, steps=3, num_teachers=5)
  assert (accounting.dpdfd_event(noise_multiplier=50.0, teachers_per_record=5, **kwargs)
          == accounting.dpdfd_event(noise_multiplier=10.0, **kwargs))
  for bad, match in ((0, "teachers_per_record"), (6, "exceeds num_teachers")):
    with pytest.raises(ValueError, match=match):
      accounting.dpdfd_event(noise_multiplier=1.0, teachers_per_record=bad, **kwargs)


def test_rona_event_and_query_count():
  assert accounting.rona_event(noise_multiplier=4.0, num_queries=3) == (
      accounting.TaggedDpEvent(dp_event.GaussianDpEvent(2.0), 3, accounting.REPLACE_ONE))
  # (Th + R·Td)·ceil(|x_q|/S) = (2 + 3·4)·ceil(100/32) = 14·4.
  assert accounting.rona_num_queries(
      hint_epochs=2, distillation_epochs=4, rounds=3, num_query_samples=100,
      batch_size=32) == 56


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("event", [
    accounting.dpdfd_event(noise_multiplier=0.0, batch_size=8, steps=3),
    accounting.rona_event(noise_multiplier=0.0, num_queries=1),
    accounting.dpsgd_event(noise_multiplier=0.0, sampling_rate=0.1, steps=2, relation="add-remove"),
    dp_event.ComposedDpEvent([
        dp_event.NonPrivateDpEvent(),
        accounting.srr_event(epsilon_per_query=1.0, num_queries=2)]),
])
def test_zero_noise_is_infinite_epsilon(accountant, event):
  assert accounting.epsilon(event, delta=DELTA,
                            accountant=accountant) == math.inf
  assert accounting.delta_for_epsilon(event, epsilon=10.0,
                                      accountant=accountant) == 1.0


def test_rr_tree_path_matches_pld_accountant_path():
  # A 1-bucket RR is a no-op that routes the tree through the hand-built PLDs;
  # the rest must give what PLDAccountant gives.
  rest = [accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                 steps=20),
          accounting.laplace_counts_event(epsilon_per_round=0.5, rounds=3)]
  noop_rr = dp_event.RandomizedResponseDpEvent(noise_parameter=0.5,
                                               num_buckets=1)
  with_rr = accounting.epsilon(dp_event.ComposedDpEvent(rest + [noop_rr]),
                               delta=DELTA)
  without = accounting.epsilon(dp_event.ComposedDpEvent(rest), delta=DELTA)
  assert with_rr == pytest.approx(without, abs=1e-6)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_rr_composes_with_gaussian(accountant):
  parts = [accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                  steps=4),
           accounting.srr_event(epsilon_per_query=0.5, num_queries=10)]
  eps = [accounting.epsilon(e, delta=DELTA, accountant=accountant)
         for e in parts]
  both = accounting.epsilon(dp_event.ComposedDpEvent(parts), delta=DELTA,
                            accountant=accountant)
  assert both > max(eps)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_rr_with_poisson_sampling_is_rejected(accountant):
  mixed = dp_event.ComposedDpEvent([
      accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.1, steps=3,
                             relation="add-remove"),
      accounting.srr_event(epsilon_per_query=1.0, num_queries=2)])
  with pytest.raises(ValueError, match="neighbouring relations"):
    accounting.epsilon(mixed, delta=DELTA, accountant=accountant)


@pytest.mark.parametrize("call,match", [
    (lambda: accounting.dpdfd_event(noise_multiplier=-1.0, batch_size=4,
                                    steps=1), "noise_multiplier"),
    (lambda: accounting.dpdfd_event(noise_multiplier=math.inf, batch_size=4,
                                    steps=1), "noise_multiplier"),
    (lambda: accounting.dpdfd_event(noise_multiplier=1.0, batch_size=0,
                                    steps=1), "batch_size"),
    (lambda: accounting.dpdfd_event(noise_multiplier=1.0, batch_size=4,
                                    steps=-1), "steps"),
    (lambda: accounting.dpdfd_event(noise_multiplier=1.0, batch_size=4,
                                    steps=2.5), "steps"),
    (lambda: accounting.dpdfd_event(noise_multiplier=1.0, batch_size=4,
                                    steps=1, num_teachers=0), "num_teachers"),
    (lambda: accounting.srr_event(epsilon_per_query=0.0, num_queries=1),
     "epsilon_per_query"),
    (lambda: accounting.srr_event(epsilon_per_query=1.0, num_queries=1,
                                  num_classes=1), "num_classes"),
    (lambda: accounting.laplace_counts_event(epsilon_per_round=-1.0, rounds=1),
     "epsilon_per_round"),
    (lambda: accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.0,
                                    steps=1, relation="add-remove"), "sampling_rate"),
    (lambda: accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=1.5,
                                    steps=1, relation="add-remove"), "sampling_rate"),
    (lambda: accounting.epsilon(dp_event.NoOpDpEvent(), delta=0.0), "delta"),
    (lambda: accounting.epsilon(dp_event.NoOpDpEvent(), delta=1.0), "delta"),
    (lambda: accounting.epsilon(dp_event.NoOpDpEvent(), delta=DELTA,
                                accountant="moments"), "accountant"),
    (lambda: accounting.delta_for_epsilon(dp_event.NoOpDpEvent(),
                                          epsilon=-1.0), "epsilon"),
])
def test_bad_parameters_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_a_repeated_figure_is_memoized_and_equal_to_a_fresh_one():
  """A run asks for the same ε again (calibration, ledger charges, the report): the second
  time it is a lookup, and the value is the one a fresh evaluation gives."""
  event = dp_event.ComposedDpEvent([
      accounting.dpdfd_event(noise_multiplier=50.0, batch_size=16, steps=3),
      dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(4.0), 2)])
  evaluation._evaluate_parts.cache_clear()  # pylint: disable=protected-access
  fresh = accounting.epsilon(event, delta=DELTA)
  before = evaluation._evaluate_parts.cache_info()  # pylint: disable=protected-access
  again = accounting.epsilon(event, delta=DELTA)
  after = evaluation._evaluate_parts.cache_info()  # pylint: disable=protected-access
  assert again == fresh and after.hits == before.hits + 1 and after.misses == before.misses
  assert accounting.epsilon(event, delta=DELTA / 10) > fresh  # another δ is another key
