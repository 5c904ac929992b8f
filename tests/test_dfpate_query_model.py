"""Tests of the DP query model (methods/dfpate_query_model.py) and its use by data-free PATE."""

import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import dp_event

from dpkd_jax import data
from dpkd_jax.methods import dfpate
from dpkd_jax.methods import dfpate_query_model as qm
from dpkd_jax.methods import dfpate_student
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint

_NO_NOISE = dict(pca_noise_multiplier=0.0, kmeans_noise_multiplier=0.0,
                 variance_noise_multiplier=0.0)


@pytest.fixture(scope="module")
def digits():
  return data.load("digits", "train")


def _upper(m):
  return m[np.triu_indices(m.shape[0])]


# ------------------------------------------------------------------------ the mechanisms


def test_sigma_zero_second_moment_is_exact_and_noise_is_symmetric_with_std():
  x = jax.random.uniform(jax.random.key(0), (50, 6))
  exact = np.asarray(x.T @ x)
  np.testing.assert_allclose(qm.noisy_second_moment(jax.random.key(1), x, 0.0), exact,
                             rtol=1e-5)
  std = 3.0
  noisy = np.asarray(qm.noisy_second_moment(jax.random.key(2), jnp.zeros((2, 300)), std))
  np.testing.assert_array_equal(noisy, noisy.T)
  assert np.std(_upper(noisy)) == pytest.approx(std, rel=0.02)  # 45,150 draws


def test_cluster_sums_exact_at_sigma_zero_and_noise_std_matches():
  y = jnp.array([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0]])
  centroids = jnp.array([[1.0, 0.0], [-1.0, 0.0]])
  sums, counts = qm.noisy_cluster_sums(jax.random.key(0), y, centroids, noise_multiplier=0.0,
                                       bound=2.0)
  np.testing.assert_allclose(sums, [[1.9, 0.1], [-1.0, 0.0]], rtol=1e-6)
  np.testing.assert_array_equal(counts, [2.0, 1.0])
  z, bound = 1.5, 4.0
  many = jnp.zeros((4000, 8))
  sums, counts = qm.noisy_cluster_sums(jax.random.key(1), jnp.zeros((5, 8)), many,
                                       noise_multiplier=z, bound=bound)
  assert float(jnp.std(sums)) == pytest.approx(z * 2 * bound, rel=0.03)
  assert float(jnp.std(counts)) == pytest.approx(z * 2, rel=0.05)


def _released(config, x, centroids):
  """The three exact released quantities for rows x (before noise), as flat vectors."""
  x = qm._clip_rows(jnp.asarray(x), config.l2_norm_bound)
  ext = jnp.concatenate([x, jnp.full((len(x), 1), config.constant)], -1)
  moment = _upper(np.asarray(ext.T @ ext))
  y = qm._clip_rows(x[:, :centroids.shape[1]], config.projection_bound)
  onehot = jax.nn.one_hot(qm._assign(y, centroids), len(centroids))
  kmeans = np.concatenate([np.ravel(onehot.T @ y),
                           config.projection_bound * np.asarray(onehot.sum(0))])
  residual = qm._clip_rows(y - onehot @ centroids, config.residual_bound)
  variance = np.ravel(onehot.T @ residual ** 2)
  return moment, kmeans, variance


@pytest.mark.parametrize("seed", range(5))
def test_replacing_one_record_moves_each_release_by_at_most_its_sensitivity(seed):
  # The documented L2 sensitivities, checked on adversarial-ish random replacements (large
  # records, which the clip must bound, and records in different or equal clusters).
  config = qm.QueryModelConfig(l2_norm_bound=3.0, projection_bound=2.0, residual_bound=1.5)
  key = jax.random.key(seed)
  k1, k2, k3 = jax.random.split(key, 3)
  rows = 10.0 * jax.random.normal(k1, (12, 5))
  centroids = jax.random.normal(k2, (3, 5))
  other = 10.0 * jax.random.normal(k3, (12, 5))
  for i in range(12):
    changed = rows.at[0].set(other[i])
    before, after = _released(config, rows, centroids), _released(config, changed, centroids)
    for (b, a), bound in zip(zip(before, after), (config.moment_sensitivity,
                                                  config.kmeans_sensitivity,
                                                  config.variance_sensitivity)):
      assert np.linalg.norm(a - b) <= bound * (1 + 1e-5)


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
  config = qm.QueryModelConfig(num_components=8, num_clusters=5, l2_norm_bound=100.0,
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
    (dict(l2_norm_bound=0.0), "l2_norm_bound"),
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


# ------------------------------------------------------------------------ in data-free PATE

_TINY = dict(dataset="digits", num_teachers=4, teacher_epochs=1, teacher_batch_size=32,
             rounds=2, queries_per_round=16, pool_factor=2, student_model="lenet5_half",
             student_epochs=1, student_batch_size=16, seed=0, query_source="dp_model",
             query_model_components=6, query_model_clusters=4)


def test_dfpate_with_the_query_model_charges_it_and_meets_the_target(tmp_path):
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=8.0)
  results = dfpate.train_dfpate(config, str(tmp_path / "run"), progress=False)
  sigma = results["noise_std"]
  total = accounting.epsilon(config.total_event(sigma), delta=1e-5)
  votes_only = accounting.epsilon(accounting.pate_event(noise_std=sigma, num_queries=32),
                                  delta=1e-5)
  assert results["epsilon"] == pytest.approx(total, rel=1e-9)
  assert votes_only < total <= 8.0 and total > 7.9
  meta = checkpoint.restore_metadata(str(tmp_path / "run" / "checkpoints"))
  ledger = ledger_lib.PrivacyLedger.from_json(meta["ledger"])
  assert len(ledger.entries) == 3  # the query model, then one entry per round
  assert ledger.spent_epsilon() == pytest.approx(total, rel=1e-6)
  assert os.path.exists(tmp_path / "run" / "samples.png")


def test_teacher_self_training_runs_and_reports_both_ensembles(tmp_path):
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=8.0, teacher_self_training_pool=24,
                               teacher_self_training_epochs=1, teacher_pseudo_threshold=0.0)
  results = dfpate.train_dfpate(config, str(tmp_path / "run"), progress=False)
  private = results["private_diagnostics"]  # noiseless functions of the teachers
  assert "teachers" not in results and set(private["teachers"]) == set(
      private["teachers_before_self_training"])
  assert results["epsilon"] <= 8.0  # self-training is post-processing of the query model
  with pytest.raises(ValueError, match="dp_model"):
    dfpate.DFPATEConfig(**{**_TINY, "query_source": "procedural"},
                        teacher_self_training_pool=10)


def test_student_self_training_uses_only_confident_own_labels(tmp_path):
  probs = np.array([[0.97, 0.03], [0.6, 0.4], [0.01, 0.99]])
  targets, weights = dfpate_student.pseudo_label_targets(probs, threshold=0.95)
  np.testing.assert_array_equal(targets, [[1, 0], [1, 0], [0, 1]])
  np.testing.assert_array_equal(weights, [1, 0, 1])
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=8.0, student_pseudo_pool=32,
                               student_pseudo_threshold=0.0)
  results = dfpate.train_dfpate(config, str(tmp_path / "run"), progress=False)
  assert results["num_queries"] == 32 and results["epsilon"] <= 8.0  # pool is not queried


def test_query_model_spending_the_whole_target_is_refused():
  with pytest.raises(ValueError, match="query_model_noise"):
    dfpate.DFPATEConfig(**_TINY, target_epsilon=0.05).resolved_noise_std()
  with pytest.raises(ValueError, match="query_source"):
    dfpate.DFPATEConfig(**{**_TINY, "query_source": "web"})
