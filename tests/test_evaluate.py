"""Batched evaluation: padding/masking gives the exact unpadded answer."""

import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.models import core
from dpkd_jax.train import evaluate


@pytest.fixture(scope="module")
def setup():
  test = data.load("digits", "test")
  model = models.create_classifier("lenet5", num_classes=10, input_shape=(28, 28, 1), seed=0)
  return core.split(model), test


def test_padding_does_not_change_accuracy(setup):
  parts, test = setup
  logits = evaluate.predict_logits(parts, test.images, test.info, batch_size=len(test))
  expected = float(np.mean(np.argmax(logits, -1) == test.labels))
  for batch_size in (len(test), 100, 64):  # 355 examples: 1, 4 and 6 (padded) batches
    got = evaluate.evaluate(parts, test, batch_size=batch_size)
    assert got["accuracy"] == pytest.approx(expected, abs=1e-9)
    assert np.isfinite(got["loss"])


def test_a_batch_larger_than_the_dataset_shrinks_to_fit_it(setup, monkeypatch):
  parts, test = setup
  expected = evaluate.evaluate(parts, test, batch_size=len(test))
  shapes = []
  batch_stats = evaluate._batch_stats  # pylint: disable=protected-access

  def recording(graphdef, params, stats, images, *args):
    shapes.append(images.shape[0])
    return batch_stats(graphdef, params, stats, images, *args)

  monkeypatch.setattr(evaluate, "_batch_stats", recording)
  got = evaluate.evaluate(parts, test, batch_size=1000)
  assert got["accuracy"] == expected["accuracy"]
  assert got["loss"] == pytest.approx(expected["loss"], rel=1e-6)
  assert shapes == [512]  # 355 test images: one batch of the next power of two, not of 1,000


def test_accuracy_per_class_matches_the_predictions_and_averages_to_the_accuracy(setup):
  parts, test = setup
  predicted = np.argmax(evaluate.predict_logits(parts, test.images, test.info), -1)
  expected = [float(np.mean(predicted[test.labels == k] == k)) for k in range(10)]
  for batch_size in (len(test), 64):  # one batch; six, the last one padded
    got = evaluate.accuracy_per_class(parts, test, batch_size=batch_size)
    np.testing.assert_allclose(got, expected, atol=1e-9)
  counts = np.bincount(test.labels, minlength=10)
  assert np.dot(got, counts) / counts.sum() == pytest.approx(
      evaluate.evaluate(parts, test)["accuracy"], abs=1e-9)


def test_accuracy_per_class_says_none_for_a_class_without_examples(setup):
  parts, test = setup
  no_nines = test.subset(np.flatnonzero(test.labels != 9))
  got = evaluate.accuracy_per_class(parts, no_nines)
  assert got[9] is None and all(v is not None for v in got[:9])


def test_predict_logits_batching_is_exact(setup):
  parts, test = setup
  a = evaluate.predict_logits(parts, test.images, test.info, batch_size=len(test))
  b = evaluate.predict_logits(parts, test.images, test.info, batch_size=50)
  assert a.shape == (len(test), 10)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_empty_dataset_raises(setup):
  parts, test = setup
  with pytest.raises(ValueError, match="empty"):
    evaluate.evaluate(parts, test.subset(np.zeros(0, np.int64)))


@pytest.mark.parametrize("axis", [0, 1])
def test_map_padded_equals_one_call_and_pads_to_one_shape(axis):
  images = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)
  shapes = []

  def fn(x):
    shapes.append(x.shape)
    out = x * 2.0  # (chunk, 2)
    return np.stack([out, out + 1]) if axis == 1 else out  # (2, chunk, 2) for axis 1

  got = evaluate.map_padded(fn, images, 3, axis=axis)
  expected = np.stack([images * 2, images * 2 + 1]) if axis == 1 else images * 2
  np.testing.assert_array_equal(got, expected)
  assert set(shapes) == {(3, 2)}  # the last chunk (1 image) was padded to 3


def test_fitted_chunk_pads_small_inputs_to_a_power_of_two_only():
  assert [evaluate.fitted_chunk(1000, n) for n in (1, 2, 3, 64, 65, 355, 1000, 5000)] == [
      1, 2, 4, 64, 128, 512, 1000, 1000]
  assert evaluate.fitted_chunk(3, 7) == 3


def test_map_padded_runs_few_inputs_in_one_small_chunk():
  shapes = []

  def fn(x):
    shapes.append(x.shape)
    return x + 1.0

  got = evaluate.map_padded(fn, np.arange(5, dtype=np.float32), 1000)
  np.testing.assert_array_equal(got, np.arange(5) + 1.0)
  assert shapes == [(8,)]
