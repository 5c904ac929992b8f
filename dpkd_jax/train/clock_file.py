"""The cost of a run across resumes: one segment per process that opened it.

A long run is killed and resumed across sessions, and each process's `outputs.RunClock` sees
only its own seconds. `<workdir>/run_clock.json` keeps the account of the run's segments, one
per process that opened it (`workdir.open_run`, process 0 only, under the run's lock; the
`Run` owns its `ClockFile` as `Run.clock`, and `outputs.finish_run` is handed that run):

  {"segments": [{"commit", "started", "start_step", "cpu_seconds", "wall_seconds",
                 "steps_to", "backend", "kernels"}, ...],
   "incomplete": false}

`commit` names the code the segment ran, `started` its ISO start time, `start_step` the
checkpoint step it resumed from (0: a fresh run), `steps_to` the last step it saved (null
before its first save), `backend` JAX's default backend and `kernels` the model-zoo ops its
steps were traced with (`dpkd_jax.kernels`: "reference" or "xla_cpu"; a speed setting, equal
values to float rounding). Its seconds run from `open_run` to that save (`Run.save` updates them),
or for the segment that finishes, are its `RunClock`'s at `outputs.finish_run`. Time a killed
process spent after its last checkpoint is lost work: nothing of it was kept, and it is not
counted (a process killed before its first save leaves no segment at all). The sum is thus the
run's cost across resumes, not the machine time its attempts took.

The file is replaced atomically (temporary file, fsync, `os.replace`) after each save and at
the end, never at `open_run`: a run that saves nothing leaves no trace. A fresh run starts a
fresh account. A resumed run continues the file's; if the file is missing, torn or corrupt it
warns in one line and starts a fresh account marked `incomplete` (the earlier seconds are
unknown; the record then says `clock_incomplete: true`): nothing else of the run is lost.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
import warnings
from typing import Any

import jax

from dpkd_jax import kernels
from dpkd_jax.train import ledger_file
from dpkd_jax.train import records

FILE_NAME = "run_clock.json"


def _valid_segment(segment: Any) -> bool:
  seconds_ok = all(isinstance(segment.get(k), (int, float)) and not isinstance(segment[k], bool)
                   and math.isfinite(segment[k]) and segment[k] >= 0
                   for k in ("cpu_seconds", "wall_seconds"))
  steps_to = segment.get("steps_to")
  return (seconds_ok and isinstance(segment.get("start_step"), int)
          and (steps_to is None or isinstance(steps_to, int))
          and (segment.get("commit") is None or isinstance(segment["commit"], str)))


def _read(path: str) -> tuple[list[dict[str, Any]], bool]:
  """(earlier segments, incomplete) of the account at `path`; ([], True) with a warning if the
  file is missing or cannot be read as an account."""
  try:
    with open(path, encoding="utf-8") as f:
      payload = json.load(f)
    segments, incomplete = payload["segments"], payload.get("incomplete", False)
    if not (isinstance(segments, list) and segments and isinstance(incomplete, bool)
            and all(isinstance(s, dict) and _valid_segment(s) for s in segments)):
      raise ValueError("not a list of segments")
    return segments, incomplete
  except FileNotFoundError:
    problem = "is missing"
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
    problem = f"is unreadable ({' '.join(str(err).split())})"
  warnings.warn(f"{path!r} {problem}: the seconds of this run's earlier processes are unknown; "
                "the run's cost counts this process's only (record: clock_incomplete)", stacklevel=4)
  return [], True


class ClockFile:
  """The account of a run's segments: the earlier ones (as of their last save) and this one."""

  def __init__(self, workdir: str, *, resuming: bool, step: int):
    """Starts this process's segment (written at its first save, or at the end).

    Args:
      workdir: the run's directory (locked by the caller).
      resuming: continue the file's account (a checkpoint is being resumed), else a fresh one.
      step: the checkpoint step being resumed (0 for a fresh run).
    """
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, FILE_NAME)
    self.earlier, self.incomplete = _read(self.path) if resuming else ([], False)
    self._resuming = resuming
    self._cpu, self._wall = time.process_time(), time.perf_counter()
    self.current: dict[str, Any] = {
        "commit": records.current_commit(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "start_step": int(step), "cpu_seconds": 0.0, "wall_seconds": 0.0, "steps_to": None,
        "backend": jax.default_backend(), "kernels": kernels.active().name}

  def _write(self) -> None:
    payload = {"segments": [*self.earlier, self.current], "incomplete": self.incomplete}
    ledger_file.write_atomically(self.path, json.dumps(payload, indent=2) + "\n")

  def saved(self, step: int) -> None:
    """Records this segment's seconds so far and its last saved `step` (after `Run.save`)."""
    self.current.update(cpu_seconds=time.process_time() - self._cpu,
                        wall_seconds=time.perf_counter() - self._wall, steps_to=int(step))
    self._write()

  def finish(self, cpu_seconds: float, wall_seconds: float) -> dict[str, Any]:
    """Ends the account with this process's seconds (its `RunClock`'s); returns the record's
    `cpu_seconds`, `wall_seconds` (sums over the segments) and, after a resume, `segments`
    (count) and `commits` (distinct, in order), and `clock_incomplete` if earlier seconds are
    unknown. The file is written if this run saved or resumed (else it leaves no trace)."""
    self.current.update(cpu_seconds=float(cpu_seconds), wall_seconds=float(wall_seconds))
    if self._resuming or self.current["steps_to"] is not None:
      self._write()
    segments = [*self.earlier, self.current]
    fields: dict[str, Any] = {
        "cpu_seconds": math.fsum(s["cpu_seconds"] for s in segments),
        "wall_seconds": math.fsum(s["wall_seconds"] for s in segments)}
    if len(segments) > 1:
      fields["segments"] = len(segments)
      fields["commits"] = list(dict.fromkeys(s["commit"] for s in segments))
    if self.incomplete:
      fields["clock_incomplete"] = True
    return fields
