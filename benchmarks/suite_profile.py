"""Where the test suite's CPU goes: JAX's trace, lowering and compile seconds per test file.

A pytest plugin that listens to JAX's own duration events (`jax.monitoring`:
`/jax/core/compile/jaxpr_trace_duration`, `jaxpr_to_mlir_module_duration`,
`backend_compile_duration`, the last one a persistent-cache hit or an XLA compile) and charges
each to the test file that was running; it observes only, nothing it does changes what a test
computes. Each pytest process (each xdist worker) writes its own JSON file; `summarize` joins
them with the suite's `--durations=0` report into one record.

    python -m pytest -q -n 2 --dist loadfile --durations=0 -p benchmarks.suite_profile \
        > suite.txt                      # writes $SUITE_PROFILE_DIR/profile_<worker>.json
    python -m benchmarks.suite_profile --dir=$SUITE_PROFILE_DIR --durations=suite.txt \
        --time=time_v.txt --out=docs/results/benchmarks/test_suite_profile__cpu.json

`--time` is `/usr/bin/time -v`'s report of the pytest command (its CPU seconds). Subprocesses
the tests start (CLI runs, the fault-injection runs, the distributed launches, notebook
kernels) are not listened to: their CPU is in `--time`'s figure, not in the stages.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys

_STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile"}
# {(stage, test file): [events, seconds]} of this process.
_SECONDS: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
_RUNNING = ["<collection>"]


def _listen(event: str, duration: float, **kwargs) -> None:
  del kwargs
  stage = _STAGES.get(event)
  if stage is not None:
    entry = _SECONDS[(stage, _RUNNING[0])]
    entry[0] += 1
    entry[1] += duration


def pytest_configure(config) -> None:
  del config
  from jax import monitoring  # pylint: disable=g-import-not-at-top
  monitoring.register_event_duration_secs_listener(_listen)


def pytest_runtest_logstart(nodeid: str, location) -> None:
  del location
  _RUNNING[0] = nodeid.split("::", 1)[0]


def pytest_sessionfinish(session) -> None:
  del session
  out = os.environ.get("SUITE_PROFILE_DIR", "suite_profile")
  os.makedirs(out, exist_ok=True)
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  with open(os.path.join(out, f"profile_{worker}.json"), "w", encoding="utf-8") as f:
    json.dump([[stage, path, n, s] for (stage, path), (n, s) in _SECONDS.items()], f)


_DURATION = re.compile(r"\s*([\d.]+)s (setup|call|teardown)\s+(\S+?)::")
_TIME = {"User time (seconds)": "user", "System time (seconds)": "system",
         "Elapsed (wall clock) time (h:mm:ss or m:ss)": "wall"}


def _wall_seconds(text: str) -> float:
  parts = [float(p) for p in text.split(":")]
  return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def summarize(directory: str, durations_path: str, time_path: str, top: int = 30
              ) -> dict:
  """The record: the suite's CPU, the in-process stages, and the files that cost most."""
  stages: dict = collections.defaultdict(lambda: [0, 0.0])
  per_file: dict = collections.defaultdict(lambda: collections.defaultdict(float))
  for path in sorted(glob.glob(os.path.join(directory, "profile_*.json"))):
    with open(path, encoding="utf-8") as f:
      for stage, test_file, n, seconds in json.load(f):
        stages[stage][0] += n
        stages[stage][1] += seconds
        per_file[test_file][stage] += seconds
  with open(durations_path, encoding="utf-8") as f:
    for line in f:
      match = _DURATION.match(line)
      if match:
        per_file[match.group(3)]["test_seconds"] += float(match.group(1))
  cpu = {}
  with open(time_path, encoding="utf-8") as f:
    for line in f:
      name, _, value = line.strip().partition(": ")
      if name in _TIME:
        cpu[_TIME[name]] = (_wall_seconds(value) if _TIME[name] == "wall"
                            else float(value))
  rows = sorted(per_file.items(), key=lambda kv: -kv[1]["test_seconds"])
  return {
      "benchmark": "test_suite_profile",
      "cpu_seconds": round(cpu.get("user", 0.0) + cpu.get("system", 0.0), 1),
      "wall_seconds": round(cpu.get("wall", 0.0), 1),
      "test_seconds": round(sum(v["test_seconds"] for v in per_file.values()), 1),
      "stages": {stage: {"events": n, "seconds": round(s, 1)}
                 for stage, (n, s) in sorted(stages.items())},
      "files": [{"file": name, **{k: round(v, 1) for k, v in sorted(row.items())}}
                for name, row in rows[:top]],
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dir", required=True, help="the SUITE_PROFILE_DIR of the run")
  parser.add_argument("--durations", required=True, help="pytest's output (--durations=0)")
  parser.add_argument("--time", required=True, help="/usr/bin/time -v's report of pytest")
  parser.add_argument("--out", required=True, help="the JSON record to write")
  parser.add_argument("--extra", default="{}", help="JSON object merged into the record "
                      "(date, host, conditions, commit, command)")
  args = parser.parse_args(argv)
  record = {**summarize(args.dir, args.durations, args.time), **json.loads(args.extra)}
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1, ensure_ascii=False)
    f.write("\n")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
