"""benchmarks/protocol.py: the idle check, the peak check and the intervals (no timing)."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import protocol  # noqa: E402


def test_require_idle_refuses_a_busy_machine_with_exit_2(capsys):
  with pytest.raises(SystemExit) as exc:
    protocol.require_idle(load=lambda: 1.7, max_wait_s=10, poll_s=5, sleep=lambda s: None)
  assert exc.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "load average 1.70" in err


def test_require_idle_waits_for_the_load_to_drop():
  loads = iter([0.9, 0.7, 0.4])
  slept = []
  assert protocol.require_idle(load=lambda: next(loads), max_wait_s=60, poll_s=5,
                               sleep=slept.append) == 0.4
  assert slept == [5, 5]


def test_check_peak_flags_a_peak_far_below_the_best():
  assert protocol.check_peak(300e9, None) is None
  assert protocol.check_peak(250e9, 300e9) is None
  assert "below" in protocol.check_peak(200e9, 300e9)


def test_record_peak_keeps_the_best(tmp_path: pathlib.Path):
  path = tmp_path / "peak.json"
  protocol.record_peak(100e9, path)
  protocol.record_peak(90e9, path)
  assert protocol.best_peak(path) == 100e9
  protocol.record_peak(120e9, path)
  assert json.loads(path.read_text())[protocol.host_id()] == 120e9


def test_ratio_interval_brackets_the_ratio_of_medians():
  a = [1.0, 1.1, 0.9, 1.0, 1.05]
  b = [2.0, 2.2, 1.8, 2.0, 2.1]
  ratio, low, high = protocol.ratio_interval(a, b)
  assert ratio == pytest.approx(2.0)
  assert low <= ratio <= high
  with pytest.raises(ValueError):
    protocol.ratio_interval([1.0], [1.0, 2.0])


def test_time_until_tight_stops_once_the_ratio_is_stable():
  ticks = iter(range(10_000))
  clock = lambda: float(next(ticks))  # noqa: E731  (every call lasts exactly one tick)
  steps = {"a": lambda i: None, "b": lambda i: None}
  times, tight = protocol.time_until_tight(steps, [("a", "b")], warmup=0, min_rounds=3,
                                           max_rounds=10, clock=clock)
  assert tight and len(times["a"]) == 3


def test_conditions_invalid_when_the_peak_drops_during_the_run(tmp_path: pathlib.Path):
  c = protocol.Conditions(load_before=0.1, peak=300e9, best_peak=300e9,
                          peak_file=tmp_path / "peak.json")
  c.finish(1.2, 290e9)
  assert c.valid and protocol.best_peak(tmp_path / "peak.json") == 290e9
  c.finish(1.2, 150e9)
  assert not c.valid and "INVALID" in c.line()
