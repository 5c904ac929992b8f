"""dpkd_jax.privacy.secure_gaussian: the grid mechanism, its rounding-aware sensitivity, its
zCDP event (and DPDFD's secure mode in mechanisms / accounting)."""

import math

from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import discrete_gaussian
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import secure_gaussian

DELTA = 1e-5


def _release(sigma, grads, key=1, **kw):
  return mechanisms.output_gradient_mechanism(
      jax.random.key(key), grads, l2_clip_norm=2.0, noise_multiplier=sigma,
      secure_noise=True, **kw)


def test_output_lies_on_the_grid_and_noise_has_std_sigma_c():
  grads = jax.random.normal(jax.random.key(0), (256, 10))
  sigma = 3.0
  release = _release(sigma, grads)
  grid = secure_gaussian.choose_grid(noise_multiplier=sigma, bound=2.0)
  units = np.asarray(release.noisy, np.float64) / grid.step
  np.testing.assert_array_equal(units, np.round(units))  # |units| < 2^24: exact in float32
  noise = np.asarray(release.noisy) - np.asarray(mechanisms.normalize_rows(grads, 2.0))
  assert abs(noise.std() / (sigma * 2.0) - 1) < 4 * math.sqrt(2 / noise.size)
  assert abs(noise.mean()) < 4 * sigma * 2.0 / math.sqrt(noise.size)
  assert float(release.noise_stddev) == pytest.approx(sigma * 2.0)
  assert grid.grid_sigma == round(sigma * 2**grid.bits) and grid.bits == 16
  assert grid.step * grid.grid_sigma == pytest.approx(sigma * 2.0, rel=1e-12)


def test_default_mode_is_the_float_gaussian_bit_for_bit():
  # secure_noise=False runs the same float program as before the keyword existed.
  grads = jax.random.normal(jax.random.key(0), (16, 10))
  key = jax.random.key(5)
  out = mechanisms.output_gradient_mechanism(key, grads, l2_clip_norm=1.5, noise_multiplier=2.0)
  bounded = mechanisms.normalize_rows(grads, 1.5)
  expected = (bounded + 2.0 * 1.5 * jax.random.normal(key, (16, 10))) / 1
  np.testing.assert_array_equal(np.asarray(out.noisy), np.asarray(expected))
  off = mechanisms.output_gradient_mechanism(key, grads, l2_clip_norm=1.5, noise_multiplier=2.0,
                                             secure_noise=False, grid_bits=3)
  np.testing.assert_array_equal(np.asarray(off.noisy), np.asarray(out.noisy))


@pytest.mark.parametrize("bits", [2, 6, 16])
def test_rounding_keeps_the_grid_sensitivity_bound(bits):
  # Worst neighbours for rounding: rows at +C and -C with coordinates just off half a unit.
  batch, k, c = 32, 10, 1.0
  grid = secure_gaussian.choose_grid(noise_multiplier=0.7, bound=c, grid_bits=bits)
  rng = np.random.default_rng(0)
  for _ in range(20):
    x = mechanisms.normalize_rows(jnp.asarray(rng.normal(size=(batch, k)), jnp.float32), c)
    x2 = mechanisms.normalize_rows(jnp.asarray(rng.normal(size=(batch, k)), jnp.float32), c)
    scaled = [np.round(np.asarray(v * jnp.float32(1.0 / grid.step))) for v in (x, x2)]
    moved = np.linalg.norm((scaled[0] - scaled[1]).ravel())
    bound = secure_gaussian.grid_l2_sensitivity(
        l2_sensitivity=2 * c * math.sqrt(batch), l2_bound=c * math.sqrt(batch),
        dims=batch * k, step=grid.step)
    assert moved <= bound
  # The rounding term is what the bound adds to Δ/γ: √d, a small part of it at the default k.
  default = secure_gaussian.choose_grid(noise_multiplier=0.7, bound=c)
  ratio = math.sqrt(batch * k) / (2 * c * math.sqrt(batch) / default.step)
  assert ratio < 1e-3


@pytest.mark.parametrize("sigma,max_abs", [(1e-3, 1.0), (3.0, 1.0), (900.0, 1.0), (50.0, 250.0)])
def test_the_grid_never_overflows_int32(sigma, max_abs):
  grid = secure_gaussian.choose_grid(noise_multiplier=sigma, bound=1.0, max_abs=max_abs)
  largest = max_abs / grid.step + 1 + discrete_gaussian.max_abs_draw(grid.grid_sigma)
  assert largest < 2**31 - 1 and grid.bits >= secure_gaussian.MIN_GRID_BITS


def test_bad_grids_are_refused():
  with pytest.raises(ValueError, match="noise multiplier > 0"):
    secure_gaussian.choose_grid(noise_multiplier=0.0, bound=1.0)
  with pytest.raises(ValueError, match="no int32 grid"):
    secure_gaussian.choose_grid(noise_multiplier=1e8, bound=1.0)
  with pytest.raises(ValueError, match="grid_bits"):
    secure_gaussian.choose_grid(noise_multiplier=1.0, bound=1.0, grid_bits=0)


@pytest.mark.parametrize("sigma", [0.5, 5.0, 40.0, 400.0])
@pytest.mark.parametrize("teachers,reach", [(1, 1), (3, 1), (3, 3)])
def test_secure_epsilon_is_never_below_the_float_one(sigma, teachers, reach):
  shape = dict(noise_multiplier=sigma, batch_size=64, steps=500, num_teachers=teachers,
               teachers_per_record=reach)
  secure = accounting.dpdfd_event(**shape, secure_noise=True, num_outputs=10)
  continuous = accounting.dpdfd_event(**shape)
  assert neighbouring.relation_of(secure) == neighbouring.REPLACE_ONE
  rho = secure.event.rho
  assert rho >= 1 / (2 * continuous.event.noise_multiplier**2)
  assert accounting.epsilon(secure, delta=DELTA) >= accounting.epsilon(continuous, delta=DELTA)
  assert accounting.epsilon(secure, delta=DELTA) >= accounting.epsilon(
      continuous, delta=DELTA, accountant="rdp")


def test_zcdp_epsilon_is_dp_accountings_rdp_of_the_composed_rho():
  event = neighbouring.tag(dp_event.ZCDpEvent(0.01), neighbouring.REPLACE_ONE, 300)
  reference = rdp_privacy_accountant.RdpAccountant()
  reference.compose(dp_event.ZCDpEvent(3.0))
  assert accounting.epsilon(event, delta=DELTA) == pytest.approx(
      reference.get_epsilon(DELTA), rel=1e-9)
  # Beside a float Gaussian, the whole tree goes to RDP too (no PLD of a zCDP bound).
  mixed = dp_event.ComposedDpEvent([event, neighbouring.tag(
      dp_event.GaussianDpEvent(10.0), neighbouring.REPLACE_ONE, 2)])
  assert accounting.epsilon(mixed, delta=DELTA) > accounting.epsilon(event, delta=DELTA)
  assert accounting.delta_for_epsilon(event, epsilon=accounting.epsilon(
      event, delta=DELTA)) <= DELTA * (1 + 1e-6)
  # The ledger writes and reads it back.
  assert ledger_lib.event_from_dict(ledger_lib.event_to_dict(event)) == event


def test_secure_event_needs_the_row_length():
  with pytest.raises(ValueError, match="num_outputs"):
    accounting.dpdfd_event(noise_multiplier=1.0, batch_size=8, steps=1, secure_noise=True)


def test_multi_teacher_secure_release_is_the_grid_sum_over_n():
  # n = 3 teachers: the summed rows (|coordinate| <= 3C) on the grid, noise std σC on the sum.
  grads = jax.random.normal(jax.random.key(0), (3, 64, 10))
  release = mechanisms.multi_teacher_output_gradients(
      jax.random.key(4), grads, l2_clip_norm=1.0, noise_multiplier=4.0, secure_noise=True)
  grid = secure_gaussian.choose_grid(noise_multiplier=4.0, bound=1.0, max_abs=3.0)
  units = np.asarray(release.noisy, np.float64) * 3 / grid.step
  np.testing.assert_allclose(units, np.round(units), atol=1e-3)
  summed = np.asarray(jax.vmap(lambda g: mechanisms.normalize_rows(g, 1.0))(grads)).sum(0)
  noise = np.asarray(release.noisy) * 3 - summed
  assert abs(noise.std() / 4.0 - 1) < 4 * math.sqrt(2 / noise.size)
  assert float(release.noise_stddev) == pytest.approx(4.0 / 3)
