"""The canary design: reproducible from its key, one fold_in tag per draw, replace-one insertion."""

import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.audit import canaries

LABELS = np.arange(500) % 10


def test_the_design_is_reproducible_from_its_seed_and_differs_across_seeds():
  a = canaries.design_canaries(LABELS, 10, 100, seed=7)
  b = canaries.design_canaries(LABELS, 10, 100, seed=7)
  c = canaries.design_canaries(LABELS, 10, 100, seed=8)
  for name in ("indices", "canary_labels", "included"):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
  assert not np.array_equal(a.included, c.included)
  assert not a.seed_secret and a.seed == 7
  again = canaries.CanaryDesign.from_json(a.to_json())
  np.testing.assert_array_equal(again.included, a.included)
  assert again.seed == 7


def test_a_secret_seed_is_drawn_when_none_is_given():
  a, b = (canaries.design_canaries(LABELS, 10, 50) for _ in range(2))
  assert a.seed_secret and a.seed != b.seed


def test_wrong_labels_never_equal_the_truth_and_inclusion_is_about_half():
  design = canaries.design_canaries(LABELS, 10, 400, seed=0)
  assert np.all(design.canary_labels != design.true_labels)
  assert np.all((design.canary_labels >= 0) & (design.canary_labels < 10))
  assert set(np.unique(design.canary_labels - design.true_labels) % 10) == set(range(1, 10))
  assert 150 < design.included.sum() < 250
  assert len(np.unique(design.indices)) == 400
  np.testing.assert_array_equal(design.true_labels, LABELS[design.indices])


def test_the_three_draws_use_distinct_fold_in_tags():
  assert len({canaries.INDEX_TAG, canaries.LABEL_TAG, canaries.INCLUSION_TAG}) == 3
  # Far above the small integers that split(key, n)'s children may equal fold_in(key, i).
  assert min(canaries.INDEX_TAG, canaries.LABEL_TAG, canaries.INCLUSION_TAG) > 2**16


def test_insert_changes_only_the_included_canaries_labels():
  train = data.load("digits", "train")
  design = canaries.design_canaries(train.labels, 10, 200, seed=1)
  inserted = canaries.insert(train, design)
  changed = np.flatnonzero(inserted.labels != train.labels)
  np.testing.assert_array_equal(np.sort(changed), np.sort(design.indices[design.included]))
  np.testing.assert_array_equal(inserted.labels[design.indices[design.included]],
                                design.canary_labels[design.included])
  np.testing.assert_array_equal(inserted.images, train.images)  # same N, same images
  images, labels = canaries.public_view(train, design)
  assert images.shape == (200, 28, 28, 1)
  np.testing.assert_array_equal(labels, design.canary_labels)


def test_a_design_of_another_split_or_too_few_canaries_is_refused():
  train = data.load("digits", "train")
  other = canaries.design_canaries((train.labels + 1) % 10, 10, 20, seed=0)
  with pytest.raises(ValueError, match="another training split"):
    canaries.insert(train, other)
  with pytest.raises(ValueError, match="canaries must be in"):
    canaries.design_canaries(LABELS, 10, 1, seed=0)


def test_the_secret_canary_files_are_owner_only_and_read_back(tmp_path):
  train, test = data.load("digits", "train"), data.load("digits", "test")
  design = canaries.design_canaries(train.labels, 10, 50, seed=3)
  secret = str(tmp_path / "canaries")
  (tmp_path / "canaries").mkdir(mode=0o755)  # an existing directory is made owner-only too
  canaries.write_dataset(secret, "mnist", canaries.insert(train, design), test)
  canaries.save_design(secret, design)
  assert (tmp_path / "canaries").stat().st_mode & 0o777 == 0o700
  for name in ("mnist.npz", canaries.DESIGN_FILE):
    assert (tmp_path / "canaries" / name).stat().st_mode & 0o777 == 0o600
  back = canaries.load_design(secret)
  np.testing.assert_array_equal(back.included, design.included)
  with np.load(tmp_path / "canaries" / "mnist.npz") as arrays:
    np.testing.assert_array_equal(arrays["y_train"], canaries.insert(train, design).labels)
