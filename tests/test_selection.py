"""The validation hold-out and the evaluations during training (dpkd_jax/train/selection.py):
one fixed split shared by every method (DP-SGD's), private figures kept out of the released
curves, the test split read as before without a hold-out."""

import os

import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.errors import UserError
from dpkd_jax.methods.dpsgd import run as dpsgd_run
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import selection


def _dataset(n):
  info = data.DATASETS["digits"]
  return data.ArrayDataset(images=np.arange(n, dtype=np.uint8).reshape(n, 1, 1, 1) * np.ones(
      (1, *info.image_shape), np.uint8), labels=np.arange(n, dtype=np.int32) % 10, info=info)


def test_the_hold_out_is_dpsgds_split_and_disjoint():
  train = _dataset(50)
  kept, held = selection.hold_out(train, 7)
  old_kept, old_held = dpsgd_run.hold_out(train, 7)
  np.testing.assert_array_equal(held.images, old_held.images)
  np.testing.assert_array_equal(kept.images, old_kept.images)
  kept_idx, held_idx = selection.hold_out_indices(50, 7)
  assert len(held_idx) == 7 and not set(kept_idx) & set(held_idx)
  assert sorted([*kept_idx, *held_idx]) == list(range(50))
  assert selection.hold_out(train, 0) == (train, None)


@pytest.mark.parametrize("count,error", [(50, UserError), (-1, ValueError), (2.5, ValueError)])
def test_a_bad_hold_out_is_refused(count, error):
  with pytest.raises(error):
    selection.hold_out_indices(50, count)


def test_config_json_leaves_a_zero_hold_out_out():
  assert "validation_examples" not in selection.omit_default({"validation_examples": 0, "a": 1})
  assert selection.omit_default({"validation_examples": 5})["validation_examples"] == 5


def _released(workdir):
  path = os.path.join(workdir, "metrics.csv")
  return list(metrics_lib.read_metrics(workdir)) if os.path.exists(path) else []


def test_with_a_hold_out_nothing_of_it_is_released(tmp_path):
  workdir = str(tmp_path)
  test, validation = _dataset(20), _dataset(10)
  seen = []
  evaluate = lambda split: seen.append(len(split)) or {"accuracy": 0.5, "loss": 1.0}
  monitor = selection.Monitor(workdir, test, validation, resume_step=0)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=0, tensorboard=False)
  assert monitor.during(evaluate, 1, writer) is None
  assert monitor.accuracy(evaluate, 2, writer) == 0.5
  writer.close()
  monitor.close()
  assert seen == [10, 10]  # the hold-out only: the test split is not read during training
  assert not any("test/" in n or "validation" in n for n in _released(workdir))
  assert "private_diagnostics/validation/accuracy" in outputs.read_private_diagnostics(workdir)
  assert monitor.selection == "validation"
  assert monitor.private_values() == {"validation_accuracy": 0.5, "validation_loss": 1.0,
                                      "validation_examples": 10}


def test_without_a_hold_out_the_test_split_is_evaluated_as_before(tmp_path):
  workdir = str(tmp_path)
  monitor = selection.Monitor(workdir, _dataset(20), None)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=0, tensorboard=False)
  metrics = monitor.during(lambda split: {"accuracy": len(split) / 40}, 3, writer)
  writer.close()
  assert metrics == {"accuracy": 0.5} and monitor.selection == "none"
  assert "test/accuracy" in _released(workdir) and monitor.private_values() == {}
  assert not os.path.exists(os.path.join(workdir, outputs.PRIVATE_CSV))
