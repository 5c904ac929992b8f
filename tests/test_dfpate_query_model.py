"""Tests of the DP query model of data-free PATE (`dfpate.query_model`).

Its three releases (clipping, noise, sensitivity) are tested in test_query_model_releases.py.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import dp_event

from dpkd_jax import data
from dpkd_jax.methods.dfpate import query_model as qm
from dpkd_jax.privacy import accounting

_NO_NOISE = dict(pca_noise_multiplier=0.0, kmeans_noise_multiplier=0.0,
                 variance_noise_multiplier=0.0)


@pytest.fixture(scope="module")
def digits():
  return data.load("digits", "train")


def test_event_composes_every_release_and_costs_less_with_more_noise():
  config = qm.QueryModelConfig(kmeans_iterations=3)
  event = qm.query_model_event(config)
  assert isinstance(event, dp_event.ComposedDpEvent) and len(event.events) == 5
  eps = accounting.epsilon(event, delta=1e-5)
  noisier = qm.QueryModelConfig(kmeans_iterations=3, pca_noise_multiplier=4.0,
                                kmeans_noise_multiplier=8.0, variance_noise_multiplier=6.0)
  assert 0 < accounting.epsilon(qm.query_model_event(noisier), delta=1e-5) < eps
  more_steps = qm.QueryModelConfig(kmeans_iterations=6)
  assert accounting.epsilon(qm.query_model_event(more_steps), delta=1e-5) > eps
  assert math.isinf(accounting.epsilon(qm.query_model_event(qm.QueryModelConfig(**_NO_NOISE)),
                                       delta=1e-5))


# ------------------------------------------------------------------------ fit and sample


def test_noiseless_fit_recovers_the_data_statistics(digits):
  config = qm.QueryModelConfig(num_components=8, num_clusters=5, l2_clip_norm=100.0,
                               projection_bound=100.0, residual_bound=100.0, **_NO_NOISE)
  model = qm.fit_query_model(jax.random.key(0), digits.images, config)
  x = digits.images.reshape(len(digits.images), -1).astype(np.float32) / 255.0
  np.testing.assert_allclose(model.mean, x.mean(0), atol=1e-4)
  v = np.asarray(model.components)
  np.testing.assert_allclose(v.T @ v, np.eye(8), atol=1e-4)
  top = np.linalg.eigh(np.cov(x.T, bias=True))[1][:, -1]
  assert abs(float(top @ v[:, 0])) > 0.99  # first axis = the data's first principal axis
  assert float(model.counts.sum()) == len(x)
  assert bool(jnp.all(model.variances >= 0))


def test_fit_is_deterministic_per_key_and_noise_changes_it(digits):
  config = qm.QueryModelConfig(num_components=6, num_clusters=4, kmeans_iterations=2)
  a = qm.fit_query_model(jax.random.key(3), digits.images, config)
  b = qm.fit_query_model(jax.random.key(3), digits.images, config)
  c = qm.fit_query_model(jax.random.key(4), digits.images, config)
  chex.assert_trees_all_equal(a, b)
  assert not np.allclose(a.centroids, c.centroids)


def test_samples_come_only_from_clusters_with_positive_count():
  d, m = 16, 2
  model = qm.QueryModel(mean=jnp.full((d,), 0.5), components=jnp.eye(d)[:, :m],
                        centroids=jnp.array([[0.3, 0.0], [-0.4, 0.2]]),
                        counts=jnp.array([0.0, 7.0]), variances=jnp.zeros((2, m)))
  images = qm.sample_queries(jax.random.key(0), model, 20, (4, 4, 1))
  assert images.shape == (20, 4, 4, 1) and images.dtype == np.uint8
  expected = np.round(np.clip(0.5 + np.eye(d)[:, :m] @ np.array([-0.4, 0.2]), 0, 1) * 255)
  np.testing.assert_array_equal(images.reshape(20, d), np.tile(expected, (20, 1)))
  with pytest.raises(ValueError, match="positive noisy count"):
    qm.sample_queries(jax.random.key(0), model._replace(counts=jnp.zeros(2)), 3, (4, 4, 1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_components=0), "num_components"),
    (dict(l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(kmeans_noise_multiplier=-1.0), "kmeans_noise_multiplier"),
    (dict(temperature=0.0), "temperature"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    qm.QueryModelConfig(**kwargs)


def test_bad_images_and_too_many_components(digits):
  with pytest.raises(ValueError, match="uint8"):
    qm.fit_query_model(jax.random.key(0), digits.images.astype(np.float32),
                       qm.QueryModelConfig())
  with pytest.raises(ValueError, match="num_components"):
    qm.fit_query_model(jax.random.key(0), digits.images, qm.QueryModelConfig(num_components=785))
