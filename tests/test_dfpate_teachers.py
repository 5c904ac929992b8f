"""Tests of data-free PATE's teacher ensemble (`dfpate.teachers`: self-training on top of
`teacher_ensemble`) on the embedded digits."""

import chex
import jax
import numpy as np
import pytest
from teacher_fixtures import ENSEMBLE_CONFIG

from dpkd_jax import data
from dpkd_jax import teacher_ensemble as ensemble_lib
from dpkd_jax.methods import dfpate
from dpkd_jax.methods.dfpate import teachers as teachers_lib


@pytest.mark.parametrize("self_training", [False, True])
def test_one_record_changes_exactly_one_teacher(self_training):
  train = data.load("digits", "train")
  num_teachers = 3
  images, labels = ensemble_lib.equal_shards(train, num_teachers, seed=0)
  # Neighbouring dataset: record 0 replaced (another image and label).
  changed = data.ArrayDataset(images=train.images.copy(), labels=train.labels.copy(),
                              info=train.info)
  changed.images[0] = 255 - changed.images[0]
  changed.labels[0] = (changed.labels[0] + 1) % 10
  images2, labels2 = ensemble_lib.equal_shards(changed, num_teachers, seed=0)
  init = ensemble_lib.init_ensemble("mlp", num_teachers, train.info, jax.random.key(0))
  kwargs = dict(epochs=1, batch_size=32, learning_rate=1e-3)
  a, _ = ensemble_lib.train_ensemble(init, images, labels, train.info, jax.random.key(1),
                                     **kwargs)
  b, _ = ensemble_lib.train_ensemble(init, images2, labels2, train.info, jax.random.key(1),
                                     **kwargs)
  if self_training:  # then each teacher labels a public pool itself and trains on it too
    pool = train.images[::7][:40]
    a, _ = teachers_lib.self_train(a, images, labels, pool, train.info, jax.random.key(2),
                                   threshold=0.2, **kwargs)
    b, _ = teachers_lib.self_train(b, images2, labels2, pool, train.info,
                                   jax.random.key(2), threshold=0.2, **kwargs)
  differs = [not all(np.array_equal(x[i], y[i]) for x, y in zip(jax.tree.leaves(a.params),
                                                                 jax.tree.leaves(b.params)))
             for i in range(num_teachers)]
  # Record 0 may have been cut by the equal-size trim: then no teacher changes.
  in_a_shard = (images != images2).any(axis=(2, 3, 4)).any(axis=1)  # (n,)
  assert in_a_shard.sum() <= 1
  assert differs == list(in_a_shard)


def test_own_pseudo_labels_threshold_and_unlabelled_images_carry_no_loss():
  train = data.load("digits", "train")
  init = ensemble_lib.init_ensemble("mlp", 2, train.info, jax.random.key(0))
  pool = train.images[:30]
  logits = ensemble_lib.ensemble_logits(init, pool, train.info)  # (2, 30, K)
  probs = np.asarray(jax.nn.softmax(logits, -1))
  threshold = float(np.median(probs.max(-1)))
  got = teachers_lib.own_pseudo_labels(init, pool, train.info, threshold=threshold)
  expected = np.where(probs.max(-1) >= threshold, probs.argmax(-1), -1)
  np.testing.assert_array_equal(got, expected)
  assert (got == -1).any() and (got >= 0).any()
  # Every label -1: no gradient, so training leaves the teachers where they are.
  images = np.broadcast_to(pool, (2, *pool.shape))
  unchanged, _ = ensemble_lib.train_ensemble(init, images, np.full((2, 30), -1, np.int32),
                                             train.info, jax.random.key(1), epochs=1,
                                             batch_size=10, learning_rate=1e-2)
  chex.assert_trees_all_close(unchanged.params, init.params)


def test_an_ensemble_saved_by_experiments_teacher_ensemble_is_reused(ensemble_dir, monkeypatch):
  # Same teacher flags as the `ensemble_dir` fixture: the identities match, nothing is trained.
  config = dfpate.DFPATEConfig(**ENSEMBLE_CONFIG, teachers_dir=ensemble_dir)
  saved, meta = ensemble_lib.load(ensemble_dir, flag="--teachers_dir")
  assert config.teacher_identity() == meta["identity"]
  monkeypatch.setattr(ensemble_lib, "fit", None)  # training would fail loudly
  train, test = data.load("digits", "train"), data.load("digits", "test")
  ensemble, seconds, report = teachers_lib.get_teachers(
      config, train, test, init_key=jax.random.key(5), train_key=jax.random.key(6))
  chex.assert_trees_all_equal(ensemble.params, saved.params)
  assert (seconds, report) == (meta["train_seconds"], meta["report"])
