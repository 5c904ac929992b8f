"""The random-search bound (dpkd_jax/privacy/tuning.py): Papernot & Steinke's Theorem 2 as
written, checked against dp_accounting's implementation, and its refusals."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import tuning

_RUN = neighbouring.tag(dp_accounting.GaussianDpEvent(5.0), neighbouring.REPLACE_ONE, 10)


def _single_rdp(orders):
  accountant = rdp_privacy_accountant.RdpAccountant(
      list(orders), dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(_RUN)
  return np.asarray(accountant._rdp)  # pylint: disable=protected-access


def test_geometric_search_matches_theorem_2_by_hand():
  # η = 1 (geometric K, E[K] = 1/γ):
  #   ε'(λ) = ε(λ) + 2 min_λ̂ [(1 − 1/λ̂) ε(λ̂) + log(1/γ)/λ̂] + log E[K] / (λ − 1),
  # then ε at δ by the accountant's conversion at the best order.
  orders, mean, delta = tuning.ORDERS, 10.0, 1e-5
  rdp = _single_rdp(orders)
  lam = np.asarray(orders)
  gamma = 1 / mean
  tnb = rdp + 2 * np.min((1 - 1 / lam) * rdp + math.log(1 / gamma) / lam) + (
      math.log(mean) / (lam - 1))
  tnb = np.array([tnb[lam >= o].min() for o in lam])  # monotone in the order
  by_hand, _ = rdp_privacy_accountant.compute_epsilon(orders, tnb, delta)
  got = tuning.search_epsilon(_RUN, mean_trials=mean, shape=tuning.GEOMETRIC, delta=delta)
  assert got == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize("shape", [tuning.GEOMETRIC, tuning.LOGARITHMIC, 0.5, tuning.POISSON])
def test_the_search_costs_more_than_one_run_and_grows_with_its_trials(shape):
  single = tuning.single_run_epsilon(_RUN, delta=1e-5)
  eps = [tuning.search_epsilon(_RUN, mean_trials=m, shape=shape, delta=1e-5)
         for m in (2, 10, 50)]
  assert single < eps[0] < eps[1] < eps[2]


def test_an_add_remove_run_is_bounded_under_add_remove():
  run = accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.01, steps=100,
                               relation=accounting.ADD_REMOVE)
  assert tuning.search_epsilon(run, mean_trials=5, shape=1, delta=1e-5) > (
      tuning.single_run_epsilon(run, delta=1e-5))


def test_refuses_what_it_cannot_bound():
  replace_one_sgd = accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.01, steps=10,
                                           relation=accounting.REPLACE_ONE)
  with pytest.raises(ValueError, match="cannot bound"):
    tuning.search_epsilon(replace_one_sgd, mean_trials=5, shape=1, delta=1e-5)
  for bad in (dict(mean_trials=0.5, shape=1), dict(mean_trials=5, shape=-1)):
    with pytest.raises(ValueError):
      tuning.search_epsilon(_RUN, delta=1e-5, **bad)
