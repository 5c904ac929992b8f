"""benchmarks/suite_profile: JAX's stage events are charged to the running test file, and the
summary joins them with pytest's durations and /usr/bin/time's CPU."""

import json

import jax
import jax.numpy as jnp
from jax import monitoring

from benchmarks import suite_profile


def test_a_compile_is_charged_to_the_running_file(monkeypatch):
  monkeypatch.setattr(suite_profile, "_SECONDS", type(suite_profile._SECONDS)(
      suite_profile._SECONDS.default_factory))
  monkeypatch.setattr(suite_profile, "_RUNNING", ["<collection>"])
  suite_profile.pytest_configure(None)
  try:
    suite_profile.pytest_runtest_logstart("tests/test_x.py::test_y", None)
    jax.jit(lambda x: x * 3.0 + 1.0)(jnp.arange(7.0))  # a program no other test compiles
  finally:
    monitoring.unregister_event_duration_listener(suite_profile._listen)
  stages = {stage for stage, path in suite_profile._SECONDS if path == "tests/test_x.py"}
  assert stages == {"trace", "lower", "compile"}
  assert all(n >= 1 and s >= 0 for n, s in suite_profile._SECONDS.values())


def test_summary_joins_stages_durations_and_cpu(tmp_path):
  (tmp_path / "profile_gw0.json").write_text(json.dumps(
      [["compile", "tests/test_a.py", 3, 1.5], ["trace", "tests/test_a.py", 3, 0.5]]))
  (tmp_path / "profile_gw1.json").write_text(json.dumps([["compile", "tests/test_b.py", 1, 0.25]]))
  durations = tmp_path / "out.txt"
  durations.write_text("4.00s call     tests/test_a.py::test_one\n"
                       "1.00s setup    tests/test_a.py::test_two\n"
                       "2.00s call     tests/test_b.py::test_three[x]\n")
  time_v = tmp_path / "time.txt"
  time_v.write_text("\tUser time (seconds): 10.5\n\tSystem time (seconds): 1.5\n"
                    "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02.50\n")
  record = suite_profile.summarize(str(tmp_path), str(durations), str(time_v))
  assert record["cpu_seconds"] == 12.0 and record["wall_seconds"] == 62.5
  assert record["test_seconds"] == 7.0
  assert record["stages"] == {"compile": {"events": 4, "seconds": 1.8},
                              "trace": {"events": 3, "seconds": 0.5}}
  assert record["files"][0] == {"file": "tests/test_a.py", "compile": 1.5, "trace": 0.5,
                                "test_seconds": 5.0}
