"""Tests for dpkd_jax.privacy.calibration: round trips of σ and step calibration."""

import math

from dp_accounting import dp_event
import pytest
from scipy import optimize

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from test_accounting import DELTA, analytic_gaussian_delta


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibrated_dpdfd_noise_meets_target_closely(accountant):
  sigma = calibration.calibrate_dpdfd_noise_multiplier(
      target_epsilon=2.0, delta=DELTA, batch_size=256, steps=50,
      accountant=accountant)
  eps = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=sigma, batch_size=256, steps=50), delta=DELTA,
                           accountant=accountant)
  assert 1.98 <= eps <= 2.0


def test_calibrated_single_step_matches_analytic_gaussian():
  batch = 64
  sigma = calibration.calibrate_dpdfd_noise_multiplier(
      target_epsilon=1.0, delta=DELTA, batch_size=batch, steps=1)
  z_exact = optimize.brentq(lambda z: analytic_gaussian_delta(1.0, z) - DELTA,
                            0.1, 100.0)
  assert sigma / (2 * math.sqrt(batch)) == pytest.approx(z_exact, rel=1e-2)


def test_calibrated_dpdfd_steps_is_the_maximum_that_fits():
  kwargs = dict(noise_multiplier=2000.0, batch_size=256)
  steps = calibration.calibrate_dpdfd_steps(target_epsilon=2.0, delta=DELTA,
                                           max_steps=10_000, **kwargs)
  eps = [accounting.epsilon(accounting.dpdfd_event(steps=t, **kwargs),
                            delta=DELTA) for t in (steps, steps + 1)]
  assert 1 <= steps < 10_000
  assert eps[0] <= 2.0 < eps[1]
  assert calibration.calibrate_dpdfd_steps(
      target_epsilon=100.0, delta=DELTA, max_steps=50, **kwargs) == 50


def test_dpdfd_calibration_charges_each_teacher_a_record_reaches():
  # m teachers per record: m times the noise for the same epsilon, and m times fewer steps'
  # worth of budget at a given sigma.
  kw = dict(target_epsilon=2.0, delta=DELTA, batch_size=64)
  one = calibration.calibrate_dpdfd_noise_multiplier(steps=10, **kw)
  three = calibration.calibrate_dpdfd_noise_multiplier(steps=10, num_teachers=3,
                                                       teachers_per_record=3, **kw)
  assert three == pytest.approx(3 * one, rel=1e-2)
  assert accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=three, batch_size=64, steps=10, num_teachers=3, teachers_per_record=3),
      delta=DELTA) <= 2.0
  steps = dict(noise_multiplier=3 * one, max_steps=100, **kw)
  assert calibration.calibrate_dpdfd_steps(**steps, num_teachers=3, teachers_per_record=3) == 10
  assert calibration.calibrate_dpdfd_steps(**steps) > 10


def test_calibrated_srr_queries_is_the_maximum_that_fits():
  def make(n):
    return accounting.srr_event(epsilon_per_query=0.2, num_queries=n)
  n = calibration.calibrate_steps(make, target_epsilon=3.0, delta=DELTA,
                                 max_steps=5000)
  assert (accounting.epsilon(make(n), delta=DELTA) <= 3.0
          < accounting.epsilon(make(n + 1), delta=DELTA))


def test_unreachable_targets_raise():
  fixed_rr = accounting.srr_event(epsilon_per_query=1.0, num_queries=100)

  def make(sigma):
    return dp_event.ComposedDpEvent([fixed_rr, accounting.dpdfd_event(
        noise_multiplier=sigma, batch_size=16, steps=1)])

  with pytest.raises(ValueError, match="unreachable"):
    calibration.calibrate_noise_multiplier(make, target_epsilon=1.0, delta=DELTA)
  with pytest.raises(ValueError, match="unreachable"):
    calibration.calibrate_dpdfd_steps(target_epsilon=0.01, delta=DELTA,
                                     noise_multiplier=10.0, batch_size=256,
                                     max_steps=100)


@pytest.mark.parametrize("call,match", [
    (lambda: calibration.calibrate_dpdfd_noise_multiplier(
        target_epsilon=0.0, delta=DELTA, batch_size=4, steps=1),
     "target_epsilon"),
    (lambda: calibration.calibrate_dpdfd_steps(
        target_epsilon=1.0, delta=DELTA, noise_multiplier=1.0, batch_size=4,
        max_steps=0), "max_steps"),
])
def test_bad_parameters_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_dpsgd_calibration_targets_the_replace_one_figure():
  # No RDP exists for replace-one Poisson sampling; the relation must survive calibration
  # (dp_accounting's DpEventBuilder would turn the tag into a plain, add/remove, event).
  q, steps = 16 / 1442, 200

  def make(relation):
    return lambda z: accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps,
                                            relation=relation)

  z = calibration.calibrate_noise_multiplier(make(accounting.REPLACE_ONE), target_epsilon=2.0,
                                             delta=DELTA)
  assert 0.97 * 2.0 <= accounting.epsilon(make(accounting.REPLACE_ONE)(z), delta=DELTA) <= 2.0
  z_add_remove = calibration.calibrate_noise_multiplier(make(accounting.ADD_REMOVE),
                                                        target_epsilon=2.0, delta=DELTA)
  assert z > 1.03 * z_add_remove  # replace-one needs more noise for the same ε
  steps_fit = calibration.calibrate_steps(
      lambda t: accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=t,
                                       relation=accounting.REPLACE_ONE),
      target_epsilon=2.0, delta=DELTA, max_steps=1000)
  assert steps <= steps_fit < 1.2 * steps


def test_calibration_at_tiny_noise_stays_bounded():
  # σ is bracketed down to where ε >> target: every evaluation is bounded (closed form or
  # bounded grid), so a mixed tree calibrates without a memory blow-up.
  def make(sigma):
    return dp_event.ComposedDpEvent([
        accounting.laplace_counts_event(epsilon_per_round=0.1, rounds=3),
        accounting.dpdfd_event(noise_multiplier=sigma, batch_size=256, steps=100)])
  sigma = calibration.calibrate_noise_multiplier(make, target_epsilon=1e5, delta=DELTA)
  assert 0.9e5 <= accounting.epsilon(make(sigma), delta=DELTA) <= 1e5
