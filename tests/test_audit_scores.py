"""Canary scores: the generator-samples score's nearest distance, the threat models named."""

import numpy as np

from dpkd_jax.audit import scores


def test_nearest_distance_matches_brute_force_in_unit_pixels():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (7, 4, 4, 1), dtype=np.uint8)
  samples = np.concatenate([images[:2], rng.integers(0, 256, (50, 4, 4, 1), dtype=np.uint8)])
  got = scores.nearest_distances(images, samples, chunk=16)  # several chunks
  x = images.reshape(7, -1) / 255.0
  g = samples.reshape(len(samples), -1) / 255.0
  want = np.sqrt(((x[:, None] - g[None]) ** 2).sum(-1)).min(axis=1)
  np.testing.assert_allclose(got, want, atol=1e-6)  # |x|^2 + |g|^2 - 2 x.g cancels


def test_every_kind_names_its_score_threat_model_and_table_label():
  assert set(scores.SCORES) == set(scores.THREAT_MODELS) == set(scores.THREATS)
  assert {scores.THREATS[k] for k in ("student", "white_box", "generator")} == {
      "black-box final model", "white-box last iterate", "generator samples"}
