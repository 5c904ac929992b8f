"""DP-SGD with augmentation multiplicity (`augmult`): the views, the averaged-before-clipping
gradient, the unchanged plan, the config checks and a short run on the digits."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import augmult
from dpkd_jax.methods.dpsgd import run as run_lib
from dpkd_jax.methods.dpsgd import step as step_lib
from dpkd_jax.train import outputs

CLIP = 0.1


def _config(**kw):
  base = dict(dataset="digits", model="scatter_linear", features="scatternet",
              expected_batch_size=64, l2_clip_norm=CLIP, noise_multiplier=1.0, steps=4,
              learning_rate=4.0, momentum=0.9, seed=0, clipping="vmap", augmult=3)
  base.update(kw)
  return dpsgd.DPSGDConfig(**base)


@pytest.fixture(scope="module")
def head():
  """A scatter_linear head on (7, 7, 81) features, its params perturbed off the zero init."""
  parts = dpsgd.init_model(_config(), jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape),
                        parts.params)
  return parts.graphdef, params, parts.batch_stats


def _views(batch=5, views=3, seed=0):
  """(B, V, 7, 7, 81) distinct random views, (B,) labels, (B,) mask (the last row padding)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(batch, views, 7, 7, 81)).astype(np.float32)
  labels = rng.integers(0, 10, size=batch).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(labels), jnp.arange(batch) < batch - 1


def test_identical_views_give_the_clipped_sum_without_views(head):
  x, labels, mask = _views()
  single = x[:, 0]
  same = jnp.repeat(single[:, None], 4, axis=1)  # (B, 4, ...): four copies of each example
  plain = step_lib.clipped_sum(*head, single, labels, mask, l2_clip_norm=CLIP, clipping="vmap")
  views = step_lib.clipped_sum(*head, same, labels, mask, l2_clip_norm=CLIP, clipping="vmap",
                               augmult=True)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(views)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_augmented_gradient_is_the_mean_of_the_view_gradients(head):
  x, labels, _ = _views()
  losses, logits, grads = step_lib.per_example_gradients(*head, x, labels, augmult=True)
  per_view = [step_lib.per_example_gradients(*head, x[:, v], labels) for v in range(3)]
  np.testing.assert_allclose(losses, np.mean([out[0] for out in per_view], axis=0), rtol=1e-5)
  np.testing.assert_allclose(logits, per_view[0][1], rtol=1e-5)  # view 0's logits
  mean = jax.tree.map(lambda *g: sum(g) / 3, *[out[2] for out in per_view])
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(mean)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_each_contribution_is_clipped_once_to_c(head):
  x, labels, mask = _views(batch=6)
  x = x * 50.0  # large inputs: every example's averaged gradient is above C
  _, _, grads = step_lib.per_example_gradients(*head, x, labels, augmult=True)
  norms = np.sqrt(sum(np.sum(np.reshape(g, (6, -1)) ** 2, axis=1)
                      for g in jax.tree.leaves(grads)))
  assert (norms > CLIP).all()
  clipped_sum = jax.jit(lambda m: step_lib.clipped_sum(
      *head, x, labels, m, l2_clip_norm=CLIP, clipping="vmap", augmult=True)[0])
  singles = [clipped_sum(jnp.arange(6) == i) for i in range(5)]
  for one in singles:
    norm = float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(one))))
    assert CLIP * (1 - 1e-5) <= norm <= CLIP * (1 + 1e-5)
  # Row 5 is padding (mask False): the batch's sum is that of the five real rows alone.
  total = clipped_sum(mask)
  for a, *b in zip(jax.tree.leaves(total), *map(jax.tree.leaves, singles)):
    np.testing.assert_allclose(a, sum(b), rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match="clipping='vmap' only"):
    step_lib.clipped_sum(*head, x, labels, mask, l2_clip_norm=CLIP, clipping="ghost",
                         augmult=True)


def test_augmult_leaves_the_plan_and_epsilon_unchanged():
  plans = [dpsgd.make_plan(c, num_examples=1342, num_devices=8)
           for c in (_config(), _config(augmult=0), _config(augmult=8, augmult_max_shift=4))]
  assert plans[0] == plans[1] == plans[2]
  assert plans[0].to_json() == plans[1].to_json()
  target = [dpsgd.make_plan(_config(noise_multiplier=None, target_epsilon=1.0, augmult=k),
                            num_examples=1342, num_devices=8) for k in (0, 4)]
  assert target[0].noise_multiplier == target[1].noise_multiplier
  assert target[0].sound_epsilon == target[1].sound_epsilon


def test_config_checks_and_saved_config():
  plain = _config(augmult=0)
  assert "augmult" not in plain.to_json() and "augmult_max_shift" not in plain.to_json()
  assert not plain.augmented and not _config(augmult=1).augmented and _config().augmented
  assert _config().to_json()["augmult"] == 3
  assert _config(augmult_max_shift=3).to_json()["augmult_max_shift"] == 3
  for bad, message in (
      (dict(features="pixels", model="lenet5"), "give features='scatternet'"),
      (dict(clipping="ghost"), "give clipping='vmap'"),
      (dict(augmult=0, augmult_max_shift=3), "shifts views that are off"),
      (dict(augmult=-1), "augmult"),
      (dict(augmult_max_shift=0), "augmult_max_shift"),
      (dict(augmult_max_shift=28), "out of their 28x28 frame"),
      (dict(augmult=2.0), "augmult")):
    with pytest.raises(ValueError, match=message):
      _config(**bad)


def test_view_shifts_are_deterministic_and_view_0_is_the_identity():
  shifts = augmult.view_shifts(50, 4, 2, seed=7)
  assert shifts.shape == (50, 4, 2) and shifts.dtype == np.int32
  np.testing.assert_array_equal(shifts, augmult.view_shifts(50, 4, 2, seed=7))
  assert not np.array_equal(shifts, augmult.view_shifts(50, 4, 2, seed=8))
  assert (shifts[:, 0] == 0).all() and np.abs(shifts).max() == 2
  np.testing.assert_array_equal(augmult.view_shifts(50, 6, 2, seed=7)[:, :1], shifts[:, :1])
  images = np.arange(2 * 4 * 5, dtype=np.uint8).reshape(2, 4, 5, 1) + 1
  same = augmult.shift_images(images, np.zeros((2, 2), np.int32))
  np.testing.assert_array_equal(same, images)
  moved = augmult.shift_images(images, np.array([[1, 0], [-1, 2]], np.int32))
  np.testing.assert_array_equal(moved[0, 1:], images[0, :-1])  # down by one row
  assert (moved[0, 0] == 0).all()  # zero-filled
  np.testing.assert_array_equal(moved[1, :-1, 2:], images[1, 1:, :-2])  # up one, right two
  assert (moved[1, -1] == 0).all() and (moved[1, :, :2] == 0).all()


def test_augmented_features_view_0_are_the_image_features():
  train = data.load("digits", "train").subset(np.arange(20))
  views = augmult.augmented_features(train, views=3, max_shift=2, seed=0)
  assert views.images.shape == (20, 3, 7, 7, 81) and len(views) == 20
  np.testing.assert_allclose(views.images[:, 0], run_lib.featurized(train, "scatternet").images,
                             rtol=1e-6, atol=1e-6)
  shifted = ~np.isclose(views.images[:, 1:], views.images[:, :1]).all(axis=(2, 3, 4))
  assert shifted.mean() > 0.8  # most non-zero shifts change the features


def test_a_run_with_views_trains_and_records_augmult(tmp_path):
  # Its resume is test_dpsgd_features.py's: the views are made once before the first step from
  # the dataset and the (here public) seed, so a resumed run makes the same ones.
  config = _config(validation_examples=100)
  one_go = dpsgd.train_dpsgd(config, str(tmp_path / "a"), progress=False)
  assert one_go["finished"] and one_go["test_accuracy"] > 0.3
  # The views cost nothing: the run is charged the plan of the same run without views
  # (1342 = 1442 records less the 100 held out, on the 8 test devices).
  plain = dpsgd.make_plan(dataclasses.replace(config, augmult=0), num_examples=1342,
                          num_devices=8)
  assert one_go["epsilon"] == pytest.approx(plain.sound_epsilon, rel=1e-12)
  assert one_go["noise_multiplier"] == plain.noise_multiplier
  assert 0.0 <= one_go[outputs.PRIVATE_KEY]["validation_accuracy"] <= 1.0
  with open(os.path.join(tmp_path, "a", "record.json")) as f:
    record = json.load(f)
  assert (record["augmult"], record["augmult_max_shift"]) == (3, 2)
  # A run without views records no augmult: test_dpsgd_run.py's records.
