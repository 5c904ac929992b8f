"""DP feature moments (`privacy/feature_moments.py`): clipping, noise scale, event, and their
use by DP-SGD (`standardize_noise_multiplier`): composed into ε, charged once, keys apart."""

import json
import os

import jax
import numpy as np
import pytest
from dp_accounting import dp_event

from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import run as run_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import feature_moments


def _features(n=500, seed=0):
  rng = np.random.default_rng(seed)
  scale = np.array([0.1, 1.0, 3.0, 0.01], np.float32)
  return (rng.normal(size=(n, 3, 3, 4)) * scale + np.array([0.5, -1, 2, 0])).astype(np.float32)


def test_tiny_noise_gives_the_moments_of_the_clipped_rows():
  x = _features()
  got = feature_moments.dp_feature_moments(jax.random.key(0), x, mean_clip_norm=100.0,
                                           second_moment_clip_norm=1000.0, noise_multiplier=1e-9)
  flat = x.reshape(len(x), -1, 4).astype(np.float64)
  mean = flat.mean(axis=1).mean(axis=0)
  variance = (flat ** 2).mean(axis=1).mean(axis=0) - mean ** 2
  np.testing.assert_allclose(got.mean, mean, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got.variance, np.maximum(variance, got.variance_floor), rtol=1e-4)
  standardized = got.standardize(x).reshape(-1, 4)
  np.testing.assert_allclose(standardized.mean(axis=0), 0, atol=1e-4)
  np.testing.assert_allclose(standardized.std(axis=0), 1, atol=1e-3)


def test_rows_are_clipped_to_their_norms():
  rows = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
  np.testing.assert_allclose(feature_moments.clip_to_norm(rows, 1.0),
                             [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
  # Rows far beyond the clip norm: the released mean is bounded by C_m whatever the data.
  huge = np.full((50, 2, 2, 3), 1e6, np.float32)
  got = feature_moments.dp_feature_moments(jax.random.key(0), huge, mean_clip_norm=1.0,
                                           second_moment_clip_norm=1.0, noise_multiplier=1e-9)
  assert np.linalg.norm(got.mean) <= 1.0 + 1e-6


def test_noise_std_is_z_times_the_clip_over_n():
  x = np.zeros((100, 2, 2, 8), np.float32)
  z, c_m, c_s = 3.0, 0.5, 2.0
  draws = [feature_moments.dp_feature_moments(jax.random.key(k), x, mean_clip_norm=c_m,
                                              second_moment_clip_norm=c_s, noise_multiplier=z)
           for k in range(300)]
  means = np.stack([d.mean for d in draws]).ravel()
  assert abs(means.std() / (z * c_m / 100) - 1) < 0.06
  assert draws[0].variance_floor == pytest.approx(3 * z * c_s / 100)
  assert np.all(np.stack([d.variance for d in draws]) >= draws[0].variance_floor - 1e-9)
  # The two sums use two keys: their noises are not the same draw.
  assert not np.allclose(draws[0].mean * 100 / c_m, (draws[0].variance + draws[0].mean ** 2))


def test_event_is_two_gaussians_of_z_or_z_over_two():
  for relation, per_sum in ((accounting.ADD_REMOVE, 8.0), (accounting.REPLACE_ONE, 4.0)):
    event = feature_moments.moments_event(noise_multiplier=8.0, relation=relation)
    assert accounting.relation_of(event) == relation
    expected = accounting.epsilon(
        dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(per_sum), 2), delta=1e-5)
    assert accounting.epsilon(event, delta=1e-5) == pytest.approx(expected, rel=1e-6)


def _config(**kw):
  base = dict(dataset="digits", model="scatter_linear", norm="none", features="scatternet",
              standardize_noise_multiplier=16.0, expected_batch_size=64, l2_clip_norm=0.1,
              target_epsilon=3.0, steps=6, learning_rate=4.0, momentum=0.9, seed=0,
              clipping="ghost")
  base.update(kw)
  return dpsgd.DPSGDConfig(**base)


def test_the_plan_composes_the_moments_release_into_the_calibration():
  with_moments = dpsgd.make_plan(_config(), num_examples=1442, num_devices=8)
  without = dpsgd.make_plan(_config(standardize_noise_multiplier=None, norm="group"),
                            num_examples=1442, num_devices=8)
  assert with_moments.sound_epsilon <= 3.0 and without.sound_epsilon <= 3.0
  assert with_moments.noise_multiplier > without.noise_multiplier  # the release costs budget
  whole = accounting.epsilon(with_moments.run_event(6), delta=1e-5)
  assert whole == pytest.approx(with_moments.sound_epsilon, rel=1e-6)
  steps_only = accounting.epsilon(with_moments.event(6), delta=1e-5)
  assert steps_only < whole
  assert without.setup_event() is None and without.run_event(6) == without.event(6)
  with pytest.raises(ValueError, match="give features='scatternet' too"):
    _config(features="pixels", model="lenet5")


def test_run_charges_the_release_once_even_across_a_resume(tmp_path):
  config = _config()
  one_go = dpsgd.train_dpsgd(config, str(tmp_path / "a"), progress=False)
  dpsgd.train_dpsgd(config, str(tmp_path / "b"), stop_at_step=3, progress=False)
  resumed = dpsgd.train_dpsgd(config, str(tmp_path / "b"), resume=True, progress=False)
  for name, results in (("a", one_go), ("b", resumed)):
    with open(os.path.join(tmp_path, name, "privacy_ledger.json")) as f:
      notes = [e["note"] for e in json.load(f)["entries"]]
    assert notes.count("dpsgd feature moments") == 1 and notes[0] == "dpsgd feature moments"
    assert results["epsilon"] == pytest.approx(one_go["epsilon"]) and results["epsilon"] <= 3.0
  assert resumed["test_accuracy"] == one_go["test_accuracy"]  # the same release, recomputed
  plan = dpsgd.make_plan(config, num_examples=1442, num_devices=8)
  assert one_go["epsilon_add_remove"] == pytest.approx(accounting.epsilon(
      plan.run_event(6, relation=accounting.ADD_REMOVE), delta=1e-5))


def test_the_moments_key_is_apart_from_the_runs_other_keys():
  root = jax.random.key(123)
  children = list(jax.random.split(root, 3))  # init, sample and noise streams
  keys = [jax.random.fold_in(root, run_lib.MOMENTS_KEY_TAG)] + children + [
      jax.random.fold_in(children[2], step) for step in range(50)] + [
      jax.random.fold_in(children[1], step) for step in range(50)]
  moments_key = keys[0]
  draws = [jax.random.fold_in(moments_key, tag) for tag in (1, 2)]
  data = {bytes(np.asarray(jax.random.key_data(k)).tobytes()) for k in keys + draws}
  assert len(data) == len(keys) + len(draws)
