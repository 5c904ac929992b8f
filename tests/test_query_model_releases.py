"""Tests of privacy/query_model_releases.py: DF-PATE's query-model releases and sensitivities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import query_model_releases as releases


def _upper(m):
  return m[np.triu_indices(m.shape[0])]


def test_sigma_zero_second_moment_is_exact_and_noise_is_symmetric_with_std():
  x = jax.random.uniform(jax.random.key(0), (50, 6))
  exact = np.asarray(x.T @ x)
  np.testing.assert_allclose(releases.noisy_second_moment(jax.random.key(1), x, 0.0), exact,
                             rtol=1e-5)
  std = 3.0
  noisy = np.asarray(releases.noisy_second_moment(jax.random.key(2), jnp.zeros((2, 300)), std))
  np.testing.assert_array_equal(noisy, noisy.T)
  assert np.std(_upper(noisy)) == pytest.approx(std, rel=0.02)  # 45,150 draws


def test_second_moment_release_clips_extends_and_noises_with_z_times_sensitivity():
  rows = jnp.array([[3.0, 4.0], [0.3, 0.4]])  # norms 5 (clipped to 1) and 0.5
  exact = releases.second_moment_release(jax.random.key(0), rows, l2_clip_norm=1.0,
                                         constant=2.0, noise_multiplier=0.0)
  ext = np.array([[0.6, 0.8, 2.0], [0.3, 0.4, 2.0]])
  np.testing.assert_allclose(exact, ext.T @ ext, rtol=1e-6)
  z = 0.5
  noisy = releases.second_moment_release(jax.random.key(1), jnp.zeros((2, 299)),
                                         l2_clip_norm=1.0, constant=1.0, noise_multiplier=z)
  noise = _upper(np.asarray(noisy))
  noise[-1] -= 2.0  # the (c, c) entry of the two rows
  expected = z * releases.second_moment_sensitivity(1.0, 1.0)  # z sqrt(2) (1 + 1)
  assert np.std(noise) == pytest.approx(expected, rel=0.02)


def test_cluster_sums_exact_at_sigma_zero_and_noise_std_matches():
  y = jnp.array([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0]])
  centroids = jnp.array([[1.0, 0.0], [-1.0, 0.0]])
  sums, counts = releases.noisy_cluster_sums(jax.random.key(0), y, centroids,
                                             noise_multiplier=0.0, bound=2.0)
  np.testing.assert_allclose(sums, [[1.9, 0.1], [-1.0, 0.0]], rtol=1e-6)
  np.testing.assert_array_equal(counts, [2.0, 1.0])
  z, bound = 1.5, 4.0
  many = jnp.zeros((4000, 8))
  sums, counts = releases.noisy_cluster_sums(jax.random.key(1), jnp.zeros((5, 8)), many,
                                             noise_multiplier=z, bound=bound)
  assert float(jnp.std(sums)) == pytest.approx(z * 2 * bound, rel=0.03)
  assert float(jnp.std(counts)) == pytest.approx(z * 2, rel=0.05)


def _released(x, centroids, *, bound, constant, projection_bound, residual_bound):
  """The three releases at z = 0 for private rows x, as flat vectors (kmeans: counts * R_y)."""
  key, m = jax.random.key(0), centroids.shape[1]
  moment = releases.second_moment_release(key, x, l2_clip_norm=bound, constant=constant,
                                          noise_multiplier=0.0)
  sums, counts = releases.noisy_cluster_sums(key, x[:, :m], centroids, noise_multiplier=0.0,
                                             bound=projection_bound)
  squares = releases.noisy_cluster_variances(
      key, x[:, :m], centroids, noise_multiplier=0.0, projection_bound=projection_bound,
      residual_bound=residual_bound)
  kmeans = np.concatenate([np.ravel(sums), projection_bound * np.asarray(counts)])
  return _upper(np.asarray(moment)), kmeans, np.ravel(squares)


@pytest.mark.parametrize("seed", range(5))
def test_replacing_one_record_moves_each_release_by_at_most_its_sensitivity(seed):
  # The declared L2 sensitivities, checked on the mechanisms themselves with adversarial-ish
  # random replacements: large unclipped records (the mechanisms' own clips must bound them),
  # in different or equal clusters.
  bounds = dict(bound=3.0, constant=1.0, projection_bound=2.0, residual_bound=1.5)
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  rows = 10.0 * jax.random.normal(k1, (12, 5))
  centroids = jax.random.normal(k2, (3, 4))
  other = 10.0 * jax.random.normal(k3, (12, 5))
  sensitivities = (releases.second_moment_sensitivity(3.0, 1.0),
                   releases.kmeans_sensitivity(2.0), releases.variance_sensitivity(1.5))
  before = _released(rows, centroids, **bounds)
  for i in range(12):
    after = _released(rows.at[0].set(other[i]), centroids, **bounds)
    for b, a, sensitivity in zip(before, after, sensitivities):
      assert np.linalg.norm(a - b) <= sensitivity * (1 + 1e-5)


def test_variance_noise_std_and_parameter_errors():
  z, residual_bound = 2.0, 0.5
  squares = releases.noisy_cluster_variances(
      jax.random.key(3), jnp.zeros((4, 10)), jnp.zeros((2000, 10)), noise_multiplier=z,
      projection_bound=1.0, residual_bound=residual_bound)
  assert float(jnp.std(squares)) == pytest.approx(
      z * np.sqrt(2) * residual_bound ** 2, rel=0.03)
  with pytest.raises(ValueError, match="noise_multiplier"):
    releases.noisy_cluster_sums(jax.random.key(0), jnp.zeros((2, 2)), jnp.zeros((1, 2)),
                                noise_multiplier=-1.0, bound=1.0)
  with pytest.raises(ValueError, match="residual_bound"):
    releases.noisy_cluster_variances(jax.random.key(0), jnp.zeros((2, 2)), jnp.zeros((1, 2)),
                                     noise_multiplier=1.0, projection_bound=1.0,
                                     residual_bound=0.0)
