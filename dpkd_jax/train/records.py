"""Results records: one JSON file per run, the only source of every reported figure.

Every private run writes `<workdir>/record.json`; a record that backs a figure in the docs is
copied to `docs/results/<name>.json` and the docs tables and notebooks are generated from those
files, so that no figure is typed twice. Fields (all required; null where not applicable):

  method, dataset          e.g. "dpdfd", "mnist"
  command                  the command line that produced the run
  commit                   `git rev-parse HEAD` of the code that ran ("-dirty" if uncommitted)
  test_accuracy            the released student's test accuracy
  sound_epsilon            ε from dp_accounting events of the executed noise: a number or "inf"
  delta                    δ of that ε
  neighbouring             "replace-one" or "add-remove"
  accounting               "sound" or "paper": which accounting chose the noise / budget
  paper_epsilon            the paper's own figure for this same run, or null
  paper_row                e.g. "DPDFD Table 1, MNIST, eps=10", or null
  paper_accuracy           the paper's accuracy for that row, or null
  cpu_seconds, wall_seconds  of the whole run (process CPU time, wall clock)
Optional fields (`extra`) hold anything else worth keeping (seeds are never stored when secret).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from typing import Any

RECORD_FIELDS = (
    "method", "dataset", "command", "commit", "test_accuracy", "sound_epsilon", "delta",
    "neighbouring", "accounting", "paper_epsilon", "paper_row", "paper_accuracy",
    "cpu_seconds", "wall_seconds",
)
NEIGHBOURING = ("replace-one", "add-remove")
ACCOUNTING = ("sound", "paper")


def current_command() -> str:
  """The command line of this process, as a user would type it (`python -m ...`)."""
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  head = (["python", "-m", spec.name] if spec is not None and spec.name
          else ["python", os.path.basename(sys.argv[0] or "")])
  return " ".join(shlex.quote(a) for a in head + sys.argv[1:])


def current_commit(cwd: str | None = None) -> str | None:
  """`git rev-parse HEAD` of the library's checkout, with "-dirty" if it has changes; None
  outside a git checkout."""
  cwd = cwd or os.path.dirname(os.path.abspath(__file__))
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return head + ("-dirty" if dirty else "")


def _epsilon_json(value: float | str | None) -> float | str | None:
  if value is None or value == "inf":
    return value
  value = float(value)
  return "inf" if math.isinf(value) else value


def make_record(*, method: str, dataset: str, test_accuracy: float | None,
                sound_epsilon: float | str, delta: float, neighbouring: str, accounting: str,
                cpu_seconds: float, wall_seconds: float, paper_epsilon: float | None = None,
                paper_row: str | None = None, paper_accuracy: float | None = None,
                command: str | None = None, commit: str | None = None,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """A validated results record (see the module docstring for the fields)."""
  record = {
      "method": method, "dataset": dataset,
      "command": current_command() if command is None else command,
      "commit": current_commit() if commit is None else commit,
      "test_accuracy": None if test_accuracy is None else float(test_accuracy),
      "sound_epsilon": _epsilon_json(sound_epsilon), "delta": float(delta),
      "neighbouring": neighbouring, "accounting": accounting,
      "paper_epsilon": _epsilon_json(paper_epsilon), "paper_row": paper_row,
      "paper_accuracy": None if paper_accuracy is None else float(paper_accuracy),
      "cpu_seconds": float(cpu_seconds), "wall_seconds": float(wall_seconds),
  }
  if extra:
    clash = set(extra) & set(record)
    if clash:
      raise ValueError(f"extra fields clash with record fields: {sorted(clash)}")
    record.update(extra)
  return validate_record(record)


def validate_record(record: dict[str, Any]) -> dict[str, Any]:
  """Checks the required fields and their kinds; returns `record`."""
  missing = [f for f in RECORD_FIELDS if f not in record]
  if missing:
    raise ValueError(f"results record lacks fields {missing}")
  if record["neighbouring"] not in NEIGHBOURING:
    raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {record['neighbouring']!r}")
  if record["accounting"] not in ACCOUNTING:
    raise ValueError(f"accounting must be one of {ACCOUNTING}, got {record['accounting']!r}")
  eps = record["sound_epsilon"]
  if not (eps == "inf" or (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0)):
    raise ValueError(f"sound_epsilon must be a finite number >= 0 or 'inf', got {eps!r}")
  return record


def write_record(path: str, record: dict[str, Any]) -> None:
  """Writes `record` as JSON atomically (a crash leaves the old file or the new one)."""
  validate_record(record)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as f:
    json.dump(record, f, indent=2, sort_keys=False)
    f.write("\n")
  os.replace(f.name, path)


def read_record(path: str) -> dict[str, Any]:
  with open(path) as f:
    return validate_record(json.load(f))
