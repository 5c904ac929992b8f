"""CSV + TensorBoard metric writer, and de-duplication of replayed steps on resume."""

import csv
import glob
import os
import struct
import subprocess
import sys
import warnings

import pytest

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


_TORCH_AFTER_A_WRITER = """
import importlib.util, sys
from dpkd_jax.train import metrics
writer = metrics.MetricsWriter(sys.argv[1])
writer.write(1, {"loss": 1.0})
writer.close()
print("torch imported by the writer:", "torch" in sys.modules)
if importlib.util.find_spec("torch") is not None:
  import torch  # still importable afterwards
  from tensorboardX import x2num
  print("torch tensor logged:", x2num.make_np(torch.ones(2)).tolist())
"""


def test_the_writer_does_not_import_torch_and_leaves_it_importable(tmp_path):
  """tensorboardX imports torch for its type annotations; a metrics log does not need it."""
  done = subprocess.run([sys.executable, "-c", _TORCH_AFTER_A_WRITER, str(tmp_path)],
                        capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr
  assert "torch imported by the writer: False" in done.stdout
  if "torch tensor logged" in done.stdout:
    assert "torch tensor logged: [1.0, 1.0]" in done.stdout
  assert metrics.read_metrics(str(tmp_path))["loss"] == [(1, 1.0)]


def test_appends_across_writers(tmp_path):
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(1, {"a": 1.0})
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(2, {"a": 2.0})
  assert metrics.read_metrics(str(tmp_path))["a"] == [(1, 1.0), (2, 2.0)]


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.reader(f))


def test_resumed_writer_drops_rows_after_the_restored_step(tmp_path):
  # Before: a resumed run replaying steps 3..4 appended them a second time.
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  for step in range(1, 5):
    writer.write(step, {"loss": float(step)})
  writer.close()
  resumed = metrics.MetricsWriter(str(tmp_path), tensorboard=False, resume_step=2)
  for step in (3, 4):
    resumed.write(step, {"loss": 10.0 * step})
  assert metrics.read_metrics(str(tmp_path))["loss"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_torn_last_row_is_dropped(tmp_path):
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(1, {"a": 1.0, "b": 2.0})
  with open(tmp_path / "metrics.csv", "a") as f:
    f.write("2,a,0.12")  # a crash in the middle of a write: no end of line
  assert metrics.drop_rows_after(str(tmp_path / "metrics.csv"), 5) == 1
  assert _rows(tmp_path / "metrics.csv") == [["step", "name", "value"], ["1", "a", "1.0"],
                                             ["1", "b", "2.0"]]
  assert metrics.drop_rows_after(str(tmp_path / "nothing.csv"), 5) == 0


def _events(path):
  """Event protos of one TFRecord event file (length, crc, payload, crc)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  with open(path, "rb") as f:
    data = f.read()
  offset, events = 0, []
  while offset < len(data):
    (length,) = struct.unpack("<Q", data[offset:offset + 8])
    event = event_pb2.Event()
    event.ParseFromString(data[offset + 12:offset + 12 + length])
    events.append(event)
    offset += 12 + length + 4
  return events


def test_resumed_tensorboard_file_purges_replayed_steps(tmp_path):
  metrics.MetricsWriter(str(tmp_path)).close()
  writer = metrics.MetricsWriter(str(tmp_path), resume_step=7)
  writer.write(8, {"x": 1.0})
  writer.close()
  files = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
  starts = [e.step for path in files for e in _events(path) if e.HasField("session_log")
            and e.session_log.status == e.session_log.START]
  assert starts == [8]  # TensorBoard hides earlier events with step >= 8


def test_rows_are_on_disk_before_write_returns(tmp_path, monkeypatch):
  synced = []
  real_fsync = os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(1, {"a": 1.0})
  assert synced  # a checkpoint saved after this write cannot outlive the row


def test_torn_row_at_or_before_the_checkpoint_is_warned_after_it_is_not(tmp_path):
  path = str(tmp_path / "metrics.csv")
  metrics.MetricsWriter(str(tmp_path), tensorboard=False).write(1, {"a": 1.0})
  with open(path, "a") as f:
    f.write("3,a,0.12")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert metrics.drop_rows_after(path, 2) == 1  # step 3 is replayed: nothing lost
  with open(path, "a") as f:
    f.write("2,a,0.12")
  with pytest.warns(UserWarning, match="1 torn row.* step 2 .*cannot be rebuilt"):
    assert metrics.drop_rows_after(path, 2) == 1
