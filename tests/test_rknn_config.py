"""Reverse k-NN configs (`rknn/config.py`): validation, defaults, no derived noise."""

import pytest

from dpkd_jax.methods import rknn
from dpkd_jax.representations import pca

TINY_STUDENT = rknn.StudentConfig(model="lenet5_half", epochs=1, batch_size=32)


def _config(**kw):
  base = dict(dataset="digits", num_queries=10, k=1, epsilon=2.0, kmeans_restarts=1,
              kmeans_iterations=10, student=TINY_STUDENT, seed=0)
  base.update(kw)
  return rknn.RKNNConfig(**base)


@pytest.mark.parametrize("kw,match", [
    (dict(k=0), "k must be >= 1"),
    (dict(k=11), "k=11 exceeds num_queries=10"),
    (dict(epsilon=0.0), "epsilon must be"),
    (dict(epsilon=-1.0), "epsilon must be"),
    (dict(epsilon=1e-6), "outside the exact sampler's range"),
    (dict(num_queries=1), "num_queries must be >= 2"),
    (dict(representation="hog"), "unknown representation 'hog'"),
    (dict(dataset="imagenet"), "unknown dataset 'imagenet'"),
    (dict(mode="shuffle"), r"unknown mode 'shuffle'; known: \['central', 'local'\]"),
    (dict(rounds=0), "rounds must be >= 1"),
    (dict(representation="simclr", representation_config=pca.PCAConfig()), "needs a"),
    (dict(num_public=5), "num_public must be >= 10"),
    (dict(rounds=2, num_public=40, uncertain_fraction=0.1), "fewer than num_queries"),
    (dict(uncertain_fraction=0.0), r"uncertain_fraction must be in \(0, 1\]"),
    (dict(delta=1.0), r"delta must be in \(0, 1\)"),
    (dict(chunk_size=0), "chunk_size must be >= 1"),
    (dict(seed=-1), "seed must be >= 0"),
])
def test_config_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    _config(**kw)


def test_student_config_errors():
  with pytest.raises(ValueError, match="unknown student model"):
    rknn.StudentConfig(model="alexnet")
  with pytest.raises(ValueError, match="label_smoothing"):
    rknn.StudentConfig(label_smoothing=1.0)
  with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0"):
    rknn.StudentConfig(weight_decay=-1e-4)
  rknn.StudentConfig(label_smoothing=0.0, weight_decay=0.0)  # the closed ends are allowed


def test_config_defaults_and_no_derived_noise():
  config = _config(rounds=4, epsilon=1.0, seed=None)
  assert isinstance(config.representation_config, pca.PCAConfig)
  assert config.seed is None
  # The per-round ε is the plan's (test_rknn_privacy), not the config's.
  assert not hasattr(config, "epsilon_per_round")
  assert config.uncertain_fraction == 0.2 and config.num_relabelled(177) == 36


def test_validation_examples_is_checked():
  assert _config(validation_examples=10).validation_examples == 10
  with pytest.raises(ValueError, match="validation_examples"):
    _config(validation_examples=-1)
