"""CSV + TensorBoard metric writer."""

import os

from dpkd_jax.train import metrics


def test_csv_long_format_and_tensorboard_files(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path))
  writer.write(1, {"loss": 2.5, "accuracy": 0.25}, prefix="train/")
  writer.write(10, {"accuracy": 0.5}, prefix="test/")
  writer.write(2, {"loss": 1.5}, prefix="train/")
  writer.close()
  series = metrics.read_metrics(str(tmp_path))
  assert series["train/loss"] == [(1, 2.5), (2, 1.5)]
  assert series["test/accuracy"] == [(10, 0.5)]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tb"))


def test_appends_across_writers(tmp_path):
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(1, {"a": 1.0})
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(2, {"a": 2.0})
  assert metrics.read_metrics(str(tmp_path))["a"] == [(1, 1.0), (2, 2.0)]
