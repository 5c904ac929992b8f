"""Tests for dpkd_jax.privacy.gaussian_exact: the analytic Gaussian mechanism in log space."""

import math

from dp_accounting import gaussian_mechanism
import pytest

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import gaussian_exact
from test_accounting import DELTA, analytic_gaussian_delta


@pytest.mark.parametrize("z", [1e4, 100.0, 3.125, 1.0, 0.3, 0.03, 1 / 320])
def test_epsilon_is_dp_accountings_analytic_gaussian(z):
  # An independent implementation (dp_accounting.gaussian_mechanism, Balle & Wang 2018).
  ours = gaussian_exact.epsilon_for_delta(DELTA, z)
  assert ours == pytest.approx(gaussian_mechanism.get_epsilon_gaussian(z, DELTA),
                               rel=1e-9, abs=1e-11)
  # ...and on the sound side of the root: δ(ε) <= δ.
  assert gaussian_exact.delta_for_epsilon(ours, z) <= DELTA


@pytest.mark.parametrize("z", [10.0, 1.0, 0.3])
@pytest.mark.parametrize("eps", [0.0, 0.5, 3.0])
def test_delta_is_the_textbook_formula(z, eps):
  assert gaussian_exact.delta_for_epsilon(eps, z) == pytest.approx(
      analytic_gaussian_delta(eps, z), rel=1e-9, abs=1e-300)


def test_tiny_noise_does_not_overflow():
  # σ = 0.01, B = 256, T = 100 in DPDFD: z = 3.1e-5, ε about 1/(2z²) = 5e8; e^ε overflows.
  z = 0.01 / (2 * math.sqrt(256)) / math.sqrt(100)
  eps = gaussian_exact.epsilon_for_delta(DELTA, z)
  assert 0.5 / z**2 < eps < 0.5 / z**2 + 10 / z
  assert gaussian_exact.delta_for_epsilon(eps, z) <= DELTA
  assert gaussian_exact.delta_for_epsilon(eps * (1 - 1e-6), z) > DELTA
  assert gaussian_exact.epsilon_for_delta(DELTA, 1e-9) < math.inf


def test_huge_noise_is_free():
  assert gaussian_exact.epsilon_for_delta(0.5, 1e6) == 0.0
  assert gaussian_exact.epsilon_for_delta(DELTA, math.inf) == 0.0


def test_gaussians_compose_in_closed_form():
  # Gaussians with multipliers z_i compose to one with z = 1/sqrt(Σ 1/z_i²), exactly.
  event = accounting.epsilon(
      accounting.dp_event.ComposedDpEvent([
          accounting.dpdfd_event(noise_multiplier=50.0, batch_size=64, steps=30),
          accounting.rona_event(noise_multiplier=8.0, num_queries=7),
          accounting.pate_event(noise_std=20.0, num_queries=11)]), delta=DELTA)
  precision = 30 / (50.0 / 16) ** 2 + 7 / 4.0**2 + 11 / (20.0 / math.sqrt(2)) ** 2
  assert event == pytest.approx(
      gaussian_mechanism.get_epsilon_gaussian(1 / math.sqrt(precision), DELTA), rel=1e-9)
