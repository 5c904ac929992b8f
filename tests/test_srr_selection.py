"""Balanced query choice: distinct indices, n / K per class when the pool allows, every row of a
rare class, a pool of n rows kept whole (that a stage with a pool still asks the teacher once
about N queries: test_srr_step's stage-loop test)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import selection


def _one_hot_pool(classes, k=10):
  return jax.nn.one_hot(jnp.asarray(classes), k) * 0.9 + 0.01


def test_frequent_classes_get_n_over_k_each():
  classes = np.random.default_rng(0).integers(0, 10, 4000)
  keep = np.asarray(selection.balanced_subset(jax.random.key(1), _one_hot_pool(classes), 500))
  assert keep.shape == (500,) and keep.dtype == np.int32 and len(set(keep)) == 500
  np.testing.assert_array_equal(np.bincount(classes[keep], minlength=10), 50)


def test_a_rare_class_keeps_every_row_and_the_rest_is_filled():
  classes = np.array([8] * 7 + [0] * 700 + [1] * 300)  # 8 is rare, 2..7 and 9 absent
  pool = _one_hot_pool(np.random.default_rng(0).permutation(classes))
  keep = np.asarray(selection.balanced_subset(jax.random.key(2), pool, 200))
  kept = np.asarray(jnp.argmax(pool, -1))[keep]
  assert len(set(keep)) == 200
  assert np.sum(kept == 8) == 7  # all of them (quota 20)
  assert np.sum(kept == 0) >= 20 and np.sum(kept == 1) >= 20  # quota first, then fill


def test_a_pool_of_n_rows_is_kept_whole_and_the_key_decides_the_order():
  pool = _one_hot_pool(np.random.default_rng(0).integers(0, 10, 64))
  a = np.asarray(selection.balanced_subset(jax.random.key(3), pool, 64))
  np.testing.assert_array_equal(np.sort(a), np.arange(64))
  b = np.asarray(jax.jit(selection.balanced_subset, static_argnames="n")(
      jax.random.key(3), pool, n=64))
  np.testing.assert_array_equal(a, b)  # jittable, deterministic in its key
  assert not np.array_equal(a, np.asarray(selection.balanced_subset(jax.random.key(4), pool, 64)))


def test_more_rows_than_the_pool_is_refused():
  with pytest.raises(ValueError, match="pool of 8"):
    selection.balanced_subset(jax.random.key(0), jnp.ones((8, 10)) / 10, 9)


def test_the_pool_flag_is_left_out_of_saved_configs_at_its_default():
  base = dict(dataset="digits", teacher_dir="t", epsilon=1.0)
  assert srr.SRRConfig(**base).to_json()["engine"]["query_pool"] == 1  # older: the migration
  saved = srr.SRRConfig(**base, engine=srr.EngineOptions(query_pool=4)).to_json()
  assert srr.SRRConfig.from_json(saved).engine.query_pool == 4
  with pytest.raises(ValueError, match="query_pool"):
    srr.EngineOptions(query_pool=0)
