"""The cost of a run across resumes (`train.clock_file`): record.json sums the processes."""

import json
import os
import time

import jax
import jax.numpy as jnp
import pytest

from dpkd_jax.train import clock_file
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import workdir

CONFIG = {"lr": 0.1}


class _FakeTime:
  """process_time / perf_counter under the test's control: exact seconds, no sleeps."""

  def __init__(self, monkeypatch):
    self.cpu = self.wall = 0.0
    monkeypatch.setattr(time, "process_time", lambda: self.cpu)
    monkeypatch.setattr(time, "perf_counter", lambda: self.wall)

  def set(self, cpu, wall):
    self.cpu, self.wall = float(cpu), float(wall)


def _arrays(step):
  return {"w": jnp.full((2,), float(step))}


def _segment(path, fake, monkeypatch, *, commit, start, saves, killed):
  """One process: a RunClock then open_run at `start` (cpu, wall), a save at each
  (step, cpu, wall) of `saves`; then `killed` = (cpu, wall) at which the process dies (the
  lock is dropped, nothing finished), or None: (clock, run) are returned to finish."""
  monkeypatch.setattr(records, "current_commit", lambda cwd=None: commit)
  fake.set(*start)
  clock = outputs.RunClock()
  run = workdir.open_run(str(path), kind="test", config=CONFIG)
  for step, cpu, wall in saves:
    fake.set(cpu, wall)
    run.save(step, _arrays(step), {"config": CONFIG, "step": step})
  if killed is None:
    return clock, run
  fake.set(*killed)  # lost work: after the last checkpoint
  run.close()  # what the OS does to the lock of a killed process
  return None


def _finish(path, clock, run):
  with run:
    _write_results(path, clock, run)
  return records.read_record(str(path / "record.json"))


def _write_results(path, clock, run):
  outputs.finish_run(str(path), {"method": "dpsgd", "test_accuracy": 0.5}, run=run,
                     clock=clock, dataset="digits", test_accuracy=0.5, sound_epsilon=1.0,
                     delta=1e-5)


def _account(path):
  with open(path / clock_file.FILE_NAME) as f:
    return json.load(f)


def test_a_resumed_run_records_the_sum_of_its_segments(tmp_path, monkeypatch):
  # Before: the record counted the last process only (cpu 2 here, wall 4).
  fake = _FakeTime(monkeypatch)
  _segment(tmp_path, fake, monkeypatch, commit="aaaa", start=(10, 100),
           saves=[(1, 13, 105), (2, 14, 110)], killed=(50, 500))
  _segment(tmp_path, fake, monkeypatch, commit="aaaa", start=(1, 7), saves=[], killed=(9, 9))
  clock, run = _segment(tmp_path, fake, monkeypatch, commit="bbbb", start=(2, 3),
                        saves=[(3, 3, 5)], killed=None)
  assert run.resuming and run.step == 2
  fake.set(4, 7)
  record = _finish(tmp_path, clock, run)
  # 4 + 0 (killed before its first save) + 2 CPU seconds; 10 + 0 + 4 wall seconds.
  assert (record["cpu_seconds"], record["wall_seconds"]) == (6.0, 14.0)
  assert record["segments"] == 2 and record["commits"] == ["aaaa", "bbbb"]
  assert record["commit"] == "bbbb" and "clock_incomplete" not in record
  segments = _account(tmp_path)["segments"]
  assert [(s["start_step"], s["steps_to"], s["commit"]) for s in segments] == [
      (0, 2, "aaaa"), (2, 3, "bbbb")]
  assert [(s["cpu_seconds"], s["wall_seconds"]) for s in segments] == [(4, 10), (2, 4)]
  assert not _account(tmp_path)["incomplete"]


def test_commits_are_distinct_and_in_order(tmp_path, monkeypatch):
  fake = _FakeTime(monkeypatch)
  for step, commit in enumerate(("aaaa", "bbbb", "aaaa"), start=1):
    _segment(tmp_path, fake, monkeypatch, commit=commit, start=(0, 0), saves=[(step, 1, 1)],
             killed=(2, 2))
  clock, run = _segment(tmp_path, fake, monkeypatch, commit="cccc", start=(0, 0), saves=[],
                        killed=None)
  fake.set(1, 2)
  record = _finish(tmp_path, clock, run)
  assert record["segments"] == 4 and record["commits"] == ["aaaa", "bbbb", "cccc"]
  assert (record["cpu_seconds"], record["wall_seconds"]) == (4.0, 5.0)


@pytest.mark.parametrize("damage", ["torn", "missing", "not_an_account"])
def test_a_lost_account_warns_and_marks_the_record(tmp_path, monkeypatch, damage):
  fake = _FakeTime(monkeypatch)
  _segment(tmp_path, fake, monkeypatch, commit="aaaa", start=(0, 0), saves=[(1, 5, 5)],
           killed=(6, 6))
  path = tmp_path / clock_file.FILE_NAME
  if damage == "missing":  # e.g. a workdir of a run started before the account existed
    os.remove(path)
  else:
    path.write_text('{"segm' if damage == "torn" else '{"segments": [{"cpu_seconds": -1}]}')
  with pytest.warns(UserWarning, match=r"run_clock\.json.* (is missing|is unreadable).*"
                                       "clock_incomplete") as caught:
    clock, run = _segment(tmp_path, fake, monkeypatch, commit="bbbb", start=(0, 0),
                          saves=[(2, 2, 3)], killed=None)
  assert all("\n" not in str(w.message) for w in caught)
  assert run.resuming and run.step == 1  # the checkpoint and the run are intact
  fake.set(3, 4)
  record = _finish(tmp_path, clock, run)
  assert (record["cpu_seconds"], record["wall_seconds"]) == (3.0, 4.0)  # this process only
  assert record["clock_incomplete"] is True and "segments" not in record
  assert _account(tmp_path)["incomplete"]  # a later resume still knows it
  clock, run = _segment(tmp_path, fake, monkeypatch, commit="bbbb", start=(0, 0), saves=[],
                        killed=None)
  fake.set(1, 1)
  record = _finish(tmp_path, clock, run)
  assert record["clock_incomplete"] is True and record["segments"] == 2
  assert (record["cpu_seconds"], record["wall_seconds"]) == (4.0, 5.0)


def test_a_run_that_never_resumed_has_no_new_fields(tmp_path, monkeypatch):
  fake = _FakeTime(monkeypatch)
  clock, run = _segment(tmp_path, fake, monkeypatch, commit="aaaa", start=(3, 30),
                        saves=[(1, 4, 31)], killed=None)
  fake.set(5, 40)
  record = _finish(tmp_path, clock, run)
  assert set(record) == set(records.RECORD_FIELDS) | {"warnings", "selection"}
  assert (record["cpu_seconds"], record["wall_seconds"], record["commit"]) == (2.0, 10.0, "aaaa")


def test_only_process_0_writes_the_account(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    run.save(1, _arrays(1), {"config": CONFIG, "step": 1})
    assert run.clock is None
  assert not os.path.exists(tmp_path / clock_file.FILE_NAME)


def test_each_open_run_owns_its_account(tmp_path, monkeypatch):
  # Two runs open at once in one process (no module-level map): each record sums its own.
  fake = _FakeTime(monkeypatch)
  for name in ("a", "b"):
    _segment(tmp_path / name, fake, monkeypatch, commit="aaaa", start=(0, 0),
             saves=[(1, 5 if name == "a" else 7, 5)], killed=(9, 9))
  clock_a, run_a = _segment(tmp_path / "a", fake, monkeypatch, commit="bbbb", start=(0, 0),
                            saves=[], killed=None)
  clock_b, run_b = _segment(tmp_path / "b", fake, monkeypatch, commit="bbbb", start=(0, 0),
                            saves=[], killed=None)
  assert run_a.clock is not run_b.clock
  fake.set(1, 1)
  with pytest.raises(ValueError, match="was handed the run of"):
    _write_results(tmp_path / "a", clock_a, run_b)
  record_b = _finish(tmp_path / "b", clock_b, run_b)
  record_a = _finish(tmp_path / "a", clock_a, run_a)
  assert (record_a["cpu_seconds"], record_b["cpu_seconds"]) == (6.0, 8.0)
  assert record_a["segments"] == record_b["segments"] == 2


def test_a_closed_run_no_longer_writes_its_account(tmp_path, monkeypatch):
  # Once its lock is released another process may own the workdir: the account is dropped.
  fake = _FakeTime(monkeypatch)
  _segment(tmp_path, fake, monkeypatch, commit="aaaa", start=(0, 0), saves=[(1, 5, 5)],
           killed=(9, 9))
  clock, run = _segment(tmp_path, fake, monkeypatch, commit="bbbb", start=(0, 0), saves=[],
                        killed=None)
  run.close()
  assert run.clock is None
  before = _account(tmp_path)
  fake.set(2, 3)
  _write_results(tmp_path, clock, run)
  record = records.read_record(str(tmp_path / "record.json"))
  assert (record["cpu_seconds"], record["wall_seconds"]) == (2.0, 3.0)  # this process only
  assert _account(tmp_path) == before
