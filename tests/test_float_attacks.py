"""Floating-point attacks on every count and vote release (Mironov, CCS 2012).

A count c in {0, 1} is released with noise of L1 sensitivity 1 at a claimed ε. From the
released value o the attacker computes, in float32:
* `mironov`: s = |o − 1| − |o| > 1. With float Laplace noise o is a float32 sum whose rounding
  depends on c: the event has probability about 0.03 for c = 0 and 0 for c = 1.
* `off_grid`: o · 2^24 is not an integer. For c = 1, fl(1 + n) is always a multiple of 2^−24
  (the float32 spacing in [0.5, 2)); for c = 0, o = n keeps the finer bits of small noise.
`privacy.audit.audit_mechanism` turns the two error rates into a Clopper-Pearson lower bound
on ε (95%); a sound release stays at or below its claim, and a float Laplace variant (a local
helper, never part of the library) is caught far above it, which shows the test has power.
"""

import jax
import jax.numpy as jnp
import pytest

from dpkd_jax.methods import rknn
from dpkd_jax.methods.rknn import votes
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import aggregation
from dpkd_jax.privacy import audit
from dpkd_jax.privacy import counts

NUM_SAMPLES = 20_000  # per input; half select the threshold, half evaluate it
DELTA = 1e-5


def mironov(released):
  """1 if |o − 1| − |o| > 1 in float32 (o: the first released cell), else 0."""
  o = jnp.asarray(released, jnp.float32).reshape(-1)[0]
  return (jnp.abs(o - 1.0) - jnp.abs(o) > 1.0).astype(jnp.float32)


def off_grid(released):
  """1 if the first released cell o is not a multiple of 2^−24 in float32, else 0."""
  scaled = jnp.asarray(released, jnp.float32).reshape(-1)[0] * jnp.float32(2.0 ** 24)
  return (jnp.floor(scaled) != scaled).astype(jnp.float32)


STATISTICS = {"mironov": mironov, "off_grid": off_grid}


def _float_laplace(scale):
  """The defect under test: integer counts + float32 Laplace(scale) noise."""
  return lambda key, cells: (cells.astype(jnp.float32)
                             + scale * jax.random.laplace(key, cells.shape, jnp.float32))


def _rknn_plan(epsilon_per_round):
  """A one-round central plan with k = 1 (the release reads mode, k and ε_r only)."""
  return rknn.RKNNPlan(releases=1, delta=DELTA, budget_epsilon=epsilon_per_round,
                       sound_epsilon=epsilon_per_round, mode="central", k=1,
                       epsilon_per_round=epsilon_per_round)


def _rknn_central():
  plan = _rknn_plan(1.0)  # k = 1: Δ₁ = 2, scale t = 2, ε_r = 1
  return lambda key, cells: votes.central_noisy_counts(key, cells, plan)


def _dfpate_votes(sigma):
  return lambda key, cells: aggregation.noisy_histogram(key, cells, sigma).histogram


def _pate_claim(sigma):
  return accounting.epsilon(accounting.pate_event(noise_std=sigma, num_queries=1), delta=DELTA)


def _one_cell(count):
  return jnp.array([count], jnp.int32)


def _matrix(count):
  return jnp.array([[count, 0]], jnp.int32)  # (1 query, 2 classes): the first cell moves


# name -> (mechanism, input with count 1, neighbour with count 0, delta, claimed ε).
# The library's releases: exact discrete Laplace on counts (public `laplace_counts`, reverse
# k-NN central votes: a shift of 1 <= Δ₁ = 2 costs at most ε_r); DF-PATE's Gaussian vote
# histograms (float noise; its claim is the Gaussian ε at δ).
SOUND = {
    "laplace_counts": (lambda key, cells: counts.laplace_counts(
        key, cells, l1_sensitivity=1, epsilon=1.0), _one_cell(1), _one_cell(0), 0.0, 1.0),
    "rknn_central_counts": (_rknn_central(), _matrix(1), _matrix(0), 0.0, 1.0),
    "dfpate_vote_histogram": (_dfpate_votes(3.0), _matrix(1), _matrix(0), DELTA,
                              _pate_claim(3.0)),
}
# The float32 Laplace these releases used to add, at the same scales and claims.
FLOAT_LAPLACE = {
    "laplace_counts": (_float_laplace(1.0), _one_cell(1), _one_cell(0), 0.0, 1.0),
    "rknn_central_counts": (_float_laplace(2.0), _matrix(1), _matrix(0), 0.0, 1.0),
}


def _audit(case, statistic, seed):
  mechanism, x, x_prime, delta, _ = case
  return audit.audit_mechanism(jax.random.key(seed), mechanism, x, x_prime,
                               num_samples=NUM_SAMPLES, delta=delta,
                               statistic=STATISTICS[statistic])


@pytest.mark.parametrize("statistic", sorted(STATISTICS))
@pytest.mark.parametrize("name", sorted(SOUND))
def test_release_resists_float_attack(name, statistic):
  claimed = SOUND[name][-1]
  result = _audit(SOUND[name], statistic, seed=21)
  assert 0.0 <= result.epsilon_lower_bound <= claimed, (result, claimed)


@pytest.mark.parametrize("statistic", sorted(STATISTICS))
@pytest.mark.parametrize("name", sorted(FLOAT_LAPLACE))
def test_float_laplace_variant_is_caught(name, statistic):
  claimed = FLOAT_LAPLACE[name][-1]
  result = _audit(FLOAT_LAPLACE[name], statistic, seed=22)
  assert result.epsilon_lower_bound > 3.0 * claimed, (result, claimed)


@pytest.mark.parametrize("name", ["laplace_counts", "rknn_central_counts"])
def test_released_counts_are_integers(name):
  mechanism, x, _, _, _ = SOUND[name]
  released = mechanism(jax.random.key(3), x)
  assert jnp.issubdtype(released.dtype, jnp.integer)


def test_rknn_plan_claim_matches_the_executed_scale():
  plan = _rknn_plan(1.0)
  assert plan.l1_sensitivity == 2 and plan.laplace_scale == 2
  event = plan.event(1).event
  assert event.noise_parameter == 0.5 and event.sensitivity == 2
