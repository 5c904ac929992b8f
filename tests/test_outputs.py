"""Run outputs: private diagnostics kept apart, privacy warnings, results.json + record.json."""

import json
import math
import os

import pytest

from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records


def test_private_writer_keeps_private_scalars_out_of_metrics(tmp_path):
  workdir = str(tmp_path)
  released = metrics_lib.MetricsWriter(workdir, tensorboard=False)
  released.write(1, {"accuracy": 0.5}, prefix="test/")
  released.close()
  private = outputs.PrivateDiagnosticsWriter(workdir)
  assert not os.path.exists(private.path)  # nothing written: no file
  private.write(1, {"loss": 2.5, "grad_norm": 3.0}, prefix="train/")
  private.write(2, {"loss": 1.5}, prefix="train/")
  private.close()
  assert outputs.read_private_diagnostics(workdir) == {
      "private_diagnostics/train/loss": [(1, 2.5), (2, 1.5)],
      "private_diagnostics/train/grad_norm": [(1, 3.0)]}
  assert metrics_lib.read_metrics(workdir) == {"test/accuracy": [(1, 0.5)]}
  tb = os.listdir(tmp_path / outputs.PRIVATE_TB_DIR)
  assert tb and not os.path.exists(tmp_path / "tb")  # private events in their own directory
  assert outputs.read_private_diagnostics(str(tmp_path / "none")) == {}


def test_private_section_lists_only_existing_files(tmp_path):
  section = outputs.private_section({"teacher_test_accuracy": 0.9}, workdir=str(tmp_path),
                                    files=("teacher",))
  assert section == {"_note": outputs.PRIVATE_NOTE, "teacher_test_accuracy": 0.9}
  os.makedirs(tmp_path / "teacher")
  (tmp_path / outputs.PRIVATE_CSV).write_text("step,name,value\n")
  section = outputs.private_section(workdir=str(tmp_path), files=("teacher",))
  assert section["files"] == [outputs.PRIVATE_CSV, "teacher"]
  assert "NOT covered by epsilon" in section["_note"]
  assert not outputs.has_private_values({outputs.PRIVATE_KEY: outputs.private_section()})
  assert outputs.has_private_values({outputs.PRIVATE_KEY: section})


@pytest.mark.parametrize("sound,target,accounting,expected", [
    (1.0, None, "sound", []),
    (0.9, 1.0, "sound", []),
    (math.inf, None, "sound", [outputs.NOT_PRIVATE]),
    (11.65, 1.0, "paper", ["sound epsilon 11.65 exceeds target_epsilon=1 (accounting=paper"]),
    (math.inf, 1.0, "sound", [outputs.NOT_PRIVATE, "sound epsilon inf exceeds target_epsilon=1"]),
])
def test_privacy_warnings(sound, target, accounting, expected):
  got = outputs.privacy_warnings(sound_epsilon=sound, target_epsilon=target,
                                 accounting=accounting)
  assert len(got) == len(expected)
  for line, start in zip(got, expected):
    assert line.startswith(start)


def test_finish_run_writes_results_and_a_valid_record(tmp_path):
  clock = outputs.RunClock()
  results = {"method": "dfpate", "test_accuracy": 0.5, "epsilon": math.inf,
             outputs.PRIVATE_KEY: outputs.private_section({"teachers": {"mean": 0.8}})}
  outputs.finish_run(str(tmp_path), results, run=None, clock=clock, dataset="digits",
                     test_accuracy=0.5, sound_epsilon=math.inf, delta=1e-5,
                     extra={"note": "x"})
  assert results["warnings"] == [outputs.NOT_PRIVATE]
  with open(tmp_path / "results.json") as f:
    assert json.load(f) == results  # json reads Infinity back as inf
  record = records.read_record(str(tmp_path / "record.json"))
  assert record["method"] == "dfpate" and record["dataset"] == "digits"
  assert record["sound_epsilon"] == "inf" and record["neighbouring"] == "replace-one"
  assert record["accounting"] == "sound" and record["paper_epsilon"] is None
  assert record["warnings"] == [outputs.NOT_PRIVATE] and record["note"] == "x"
  assert record["cpu_seconds"] >= 0 and record["wall_seconds"] >= 0
  assert "teachers" not in json.dumps(record)  # the record holds released figures only


def test_record_names_the_commit_that_started_the_run(tmp_path, monkeypatch):
  # A long run outlives commits to its checkout: the record names the code that ran.
  monkeypatch.setattr(records, "current_commit", lambda cwd=None: "aaaa")
  clock = outputs.RunClock()
  monkeypatch.setattr(records, "current_commit", lambda cwd=None: "bbbb")
  outputs.finish_run(str(tmp_path), {"method": "dpsgd", "test_accuracy": 0.5}, run=None,
                     clock=clock, dataset="digits", test_accuracy=0.5, sound_epsilon=1.0, delta=1e-5)
  assert records.read_record(str(tmp_path / "record.json"))["commit"] == "aaaa"


def test_nan_is_written_as_null_and_named():
  clean, paths = outputs.without_nan({"test_loss": float("nan"), "epsilon": float("inf"),
                                      "curve": [1.0, float("nan")], "config": {"lr": 1e30}})
  assert clean == {"test_loss": None, "epsilon": float("inf"), "curve": [1.0, None],
                   "config": {"lr": 1e30}}
  assert paths == ["test_loss", "curve[1]"]
  assert "training diverged: test_loss, curve[1] is not a number" in (
      outputs._diverged_warning(paths))  # pylint: disable=protected-access
