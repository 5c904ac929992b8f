"""Tests for dpkd_jax.privacy.discrete_gaussian: the exact N_Z(0, σ²) sampler against its pmf."""

import fractions

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpkd_jax.privacy import discrete_gaussian
from user_opt_level import jit  # the samplers' loops at the users' optimisation level


def _pmf(sigma: float, support: np.ndarray) -> np.ndarray:
  """Exact N_Z(0, σ²) probabilities on `support` (normalised over ±60σ)."""
  wide = np.arange(-int(60 * sigma) - 2, int(60 * sigma) + 3)
  norm = np.exp(-wide.astype(np.float64) ** 2 / (2 * sigma**2)).sum()
  return np.exp(-support.astype(np.float64) ** 2 / (2 * sigma**2)) / norm


def _chi_square_pvalue(draws: np.ndarray, sigma: float) -> float:
  """Pearson χ² of the draws against the pmf, tails pooled into two bins."""
  edge = int(np.floor(sigma * 3))
  support = np.arange(-edge, edge + 1)
  inside = _pmf(sigma, support)
  tail = (1.0 - inside.sum()) / 2
  expected = np.concatenate([[tail], inside, [tail]]) * draws.size
  observed = np.concatenate([[np.sum(draws < -edge)],
                             [np.sum(draws == y) for y in support],
                             [np.sum(draws > edge)]])
  return stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize("sigma", [1, 3, fractions.Fraction(5, 2), fractions.Fraction(7, 3)])
def test_draws_follow_the_exact_pmf(sigma):
  draws = np.asarray(jit(lambda k: discrete_gaussian.sample(k, (40000,), sigma))(
      jax.random.key(11)))
  s = float(sigma)
  assert draws.dtype == np.int32
  assert _chi_square_pvalue(draws, s) > 1e-4
  # Variance of N_Z(0, σ²) (slightly below σ² for small σ), within 4 standard errors.
  support = np.arange(-int(60 * s), int(60 * s) + 1)
  variance = float(np.sum(_pmf(s, support) * support.astype(np.float64) ** 2))
  assert abs(draws.var() - variance) < 4 * variance * np.sqrt(2 / draws.size)
  # Total variation distance to the pmf: sampling noise only.
  values, counts = np.unique(draws, return_counts=True)
  empirical = dict(zip(values.tolist(), (counts / draws.size).tolist()))
  tv = 0.5 * sum(abs(empirical.get(y, 0.0) - p) for y, p in zip(support, _pmf(s, support)))
  assert tv < 0.02


def test_large_sigma_keeps_its_variance_and_range():
  sigma = 40000
  draws = np.asarray(jit(lambda k: discrete_gaussian.sample(k, (20000,), sigma))(
      jax.random.key(3)))
  assert abs(draws.var() / sigma**2 - 1) < 4 * np.sqrt(2 / draws.size)
  assert abs(draws.mean()) < 4 * sigma / np.sqrt(draws.size)
  assert np.abs(draws).max() <= discrete_gaussian.max_abs_draw(sigma)


def test_shape_keys_jit_and_vmap():
  sample = jax.jit(lambda k: discrete_gaussian.sample(k, (3, 5), 4))
  first = sample(jax.random.key(0))
  assert first.shape == (3, 5) and first.dtype == jnp.int32
  np.testing.assert_array_equal(first, sample(jax.random.key(0)))  # deterministic in the key
  assert not np.array_equal(first, sample(jax.random.key(1)))
  keys = jax.random.split(jax.random.key(0), 4)
  # Jitted (the sampler's while loops eagerly compile op by op); `sample` is the unbatched one.
  batched = jax.jit(jax.vmap(lambda k: discrete_gaussian.sample(k, (3, 5), 4)))(keys)
  assert batched.shape == (4, 3, 5)
  np.testing.assert_array_equal(batched[2], sample(keys[2]))


def test_uniforms_are_exact_below_n():
  # Every n: the accepted bits are exactly (2^32 - 2^32 mod n), a multiple of n.
  for n in [1, 2, 3, 7, 1000, 2**25 - 1, 2**31 - 1]:
    limit = 0xFFFFFFFF - (2**32 % n)
    bits = jnp.asarray([0, limit, limit + 1, 0xFFFFFFFF][: 4 if limit < 0xFFFFFFFF else 2],
                       jnp.uint32)
    values, valid = discrete_gaussian._uniforms(bits, jnp.full(bits.shape, n, jnp.int32))
    assert (limit + 1) % n == 0
    assert valid.tolist()[:2] == [True, True] and not any(valid.tolist()[2:])
    assert int(values[1]) == limit % n


@pytest.mark.parametrize("bad", [0, -2, fractions.Fraction(1, 1000), 2**25, 0.5, True])
def test_bad_sigma_is_refused(bad):
  with pytest.raises((ValueError, TypeError)):
    discrete_gaussian.check_sigma(bad)
