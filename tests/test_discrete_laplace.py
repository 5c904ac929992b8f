"""Exact discrete Laplace sampler (`privacy/discrete_laplace.py`): pmf, Bernoulli(exp(−γ)),
uniform integers, keys, integer dtype, the rational scale and the ε it is charged."""

import fractions
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpkd_jax.privacy import discrete_laplace as dl
from user_opt_level import jit  # the samplers' loops at the users' optimisation level

F = fractions.Fraction


def _chi_square_p_value(draws, scale):
  """Pearson χ² of the draws against the exact pmf; cells with expectation < 20 are lumped."""
  values, observed = np.unique(draws, return_counts=True)
  expected = dl.pmf(values, scale) * draws.size
  tail = draws.size - expected.sum()  # mass of the values never drawn
  keep = expected >= 20
  observed_cells = np.append(observed[keep], observed[~keep].sum())
  expected_cells = np.append(expected[keep], expected[~keep].sum() + tail)
  return stats.chisquare(observed_cells, expected_cells).pvalue


@pytest.mark.parametrize("scale", [F(2), F(5, 3), F(1, 4), F(40)])
def test_sample_matches_the_exact_pmf(scale):
  draws = np.asarray(jit(lambda key: dl.sample(key, (50_000,), scale))(jax.random.key(0)))
  assert draws.dtype == np.int32
  assert _chi_square_p_value(draws, scale) > 1e-4
  q = math.exp(-1 / float(scale))
  variance = 2 * q / (1 - q) ** 2
  assert abs(draws.mean()) < 5 * math.sqrt(variance / draws.size)
  np.testing.assert_allclose(draws.var(), variance, rtol=0.05)
  # Total variation to the pmf on the drawn values (+ the mass never drawn), against its size
  # under exact sampling: E|p̂ − p| ≈ sqrt(2 p / (π N)) per value.
  values, observed = np.unique(draws, return_counts=True)
  pmf = dl.pmf(values, scale)
  total_variation = 0.5 * (np.abs(observed / draws.size - pmf).sum() + (1 - pmf.sum()))
  assert total_variation < 1.5 * 0.5 * np.sqrt(2 * pmf / (math.pi * draws.size)).sum() + 1e-3


def test_a_wrong_scale_is_rejected_by_the_same_test():
  draws = np.asarray(jit(lambda key: dl.sample(key, (100_000,), F(2)))(jax.random.key(1)))
  assert _chi_square_p_value(draws, F(21, 10)) < 1e-6


@pytest.mark.parametrize("numerator,denominator", [(0, 1), (1, 3), (1, 1), (7, 3), (5, 2)])
def test_bernoulli_exp_has_rate_exp_minus_gamma(numerator, denominator):
  n = 40_000
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(2), i))(jnp.arange(n))
  draws = np.asarray(jax.jit(jax.vmap(lambda key: dl.bernoulli_exp(key, numerator,
                                                                   denominator)))(keys))
  rate = math.exp(-numerator / denominator)
  assert abs(draws.mean() - rate) <= 5 * math.sqrt(rate * (1 - rate) / n) + 1e-12


@pytest.mark.parametrize("bound", [1, 2, 3, 6, 1000])
def test_uniform_below_is_uniform(bound):
  n = 30_000
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(3), i))(jnp.arange(n))
  draws = np.asarray(jax.vmap(lambda key: dl.uniform_below(key, bound))(keys)).astype(np.int64)
  assert draws.min() >= 0 and draws.max() < bound
  if 1 < bound <= 6:
    assert stats.chisquare(np.bincount(draws, minlength=bound)).pvalue > 1e-4
  if bound == 1000:
    assert abs(draws.mean() - 499.5) < 5 * math.sqrt((bound ** 2 - 1) / 12 / n)


def test_keys_cells_and_transforms():
  key = jax.random.key(4)
  a = dl.sample(key, (4, 5), F(3))
  np.testing.assert_array_equal(a, dl.sample(key, (4, 5), F(3)))  # same key, same draws
  assert not np.array_equal(a, dl.sample(jax.random.key(5), (4, 5), F(3)))
  # Cell j draws from fold_in(key, j): the shape only arranges the cells.
  np.testing.assert_array_equal(a.reshape(-1), dl.sample(key, (20,), F(3)))
  # Neighbouring cells are independent: no lag-1 correlation over many cells.
  many = np.asarray(dl.sample(key, (20_000,), F(3)), np.float64)
  assert abs(np.corrcoef(many[:-1], many[1:])[0, 1]) < 5 / math.sqrt(many.size)
  keys = jax.random.split(key, 3)
  batched = jax.jit(jax.vmap(lambda k: dl.sample(k, (5,), F(3))))(keys)
  np.testing.assert_array_equal(batched[1], dl.sample(keys[1], (5,), F(3)))
  assert batched.dtype == jnp.int32


@pytest.mark.parametrize("l1_sensitivity,epsilon", [(1, 1.0), (2, 0.1), (6, 0.7), (4, 3.0)])
def test_rational_scale_rounds_up_and_the_charge_covers_the_executed_epsilon(l1_sensitivity,
                                                                            epsilon):
  scale = dl.rational_scale(l1_sensitivity, epsilon)
  exact = F(l1_sensitivity) / F(epsilon)
  assert exact <= scale <= exact + F(1, dl.MAX_DENOMINATOR)
  assert scale.denominator <= dl.MAX_DENOMINATOR
  a = dl.noise_parameter(scale)
  assert F(a) >= 1 / scale and a <= math.nextafter(float(1 / scale), math.inf)
  executed = dl.pure_epsilon(scale, l1_sensitivity)
  assert F(executed) >= l1_sensitivity / scale and executed <= epsilon


@pytest.mark.parametrize("call,match", [
    (lambda: dl.rational_scale(1.5, 1.0), "whole number"),
    (lambda: dl.rational_scale(0, 1.0), "l1_sensitivity"),
    (lambda: dl.rational_scale(1, 0.0), "epsilon"),
    (lambda: dl.rational_scale(2, 1e-7), "outside the exact sampler's range"),
    (lambda: dl.sample(jax.random.key(0), (3,), 2.0), "Fraction"),
    (lambda: dl.sample(jax.random.key(0), (3,), F(1, 2048)), "denominator"),
])
def test_bad_parameters_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()
