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
  cpu_seconds, wall_seconds  of the whole run (process CPU time, wall clock), summed over the
                           processes of a resumed run (`train.clock_file`: time after a killed
                           process's last checkpoint is not counted)
  selection                how the run's settings / checkpoint were chosen (`SELECTIONS`):
                           "validation" (a validation hold-out, `train.selection`), "test" (by
                           test accuracy: the figure is overstated), "paper_recipe" (a paper's
                           fixed settings), "none" (nothing selected); every run writes it,
                           and a committed record with a table row must say it
Optional fields (`extra`) hold anything else worth keeping (seeds are never stored when secret).
A noiseless private statistic (`released_fields.is_private_field`: e.g. `validation_accuracy`,
the accuracy on a private hold-out that a tuning run selects on) is never a top-level field:
`make_record` moves it into the record's `"private_diagnostics"` block (`{"_note": ..., name:
value}`: NOT covered by ε), and `validate_record` refuses a record that has one at top level.
A resumed run adds `segments` (how many processes ran it) and `commits` (their distinct
commits, in order; `commit` is the finishing one's), and `clock_incomplete: true` if the
seconds of earlier processes are unknown (their account was lost).
Committed records (docs/results/) also carry what the tables need (`dpkd_jax.train.records_tables`):
`tables` ({table name: row position}), `columns` (settings and secondary figures), `text` (row
labels), `bold`, `single_seed`, and `regenerated` + `source`: `regenerated: false` marks a row
converted from the text of docs/RESULTS.md rather than copied from a run's record.json; only such
a legacy record may leave `cpu_seconds` / `wall_seconds` null (the text did not state them).
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

from dpkd_jax.errors import UserError
from dpkd_jax.train import released_fields

RECORD_FIELDS = (
    "method", "dataset", "command", "commit", "test_accuracy", "sound_epsilon", "delta",
    "neighbouring", "accounting", "paper_epsilon", "paper_row", "paper_accuracy",
    "cpu_seconds", "wall_seconds",
)
NEIGHBOURING = ("replace-one", "add-remove")
ACCOUNTING = ("sound", "paper")
SELECTIONS = ("validation", "test", "paper_recipe", "none")


# Environment variables that change what a run reads (dpkd_jax.data.sources: the dataset
# directory); a command that set one does not rerun without it.
_COMMAND_ENV_VARS = ("DPKD_DATA_DIR",)


def current_command() -> str:
  """The command line of this process, as a user would type it (`python -m ...`), preceded by
  the `_COMMAND_ENV_VARS` it ran with (`DPKD_DATA_DIR=../shared/data python -m ...`)."""
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  head = (["python", "-m", spec.name] if spec is not None and spec.name
          else ["python", os.path.basename(sys.argv[0] or "")])
  env = [f"{name}={shlex.quote(os.environ[name])}" for name in _COMMAND_ENV_VARS
         if os.environ.get(name)]
  return " ".join(env + [shlex.quote(a) for a in head + sys.argv[1:]])


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


def epsilon_json(value: float | str | None) -> float | str | None:
  if value is None or value == "inf":
    return value
  value = float(value)
  return "inf" if math.isinf(value) else value


def make_record(*, method: str, dataset: str, test_accuracy: float | None,
                sound_epsilon: float | str, delta: float, neighbouring: str, accounting: str,
                cpu_seconds: float, wall_seconds: float, paper_epsilon: float | None = None,
                paper_row: str | None = None, paper_accuracy: float | None = None,
                command: str | None = None, commit: str | None = None,
                selection: str = "none", extra: dict[str, Any] | None = None
                ) -> dict[str, Any]:
  """A validated results record (see the module docstring for the fields)."""
  record = {
      "method": method, "dataset": dataset,
      "command": current_command() if command is None else command,
      "commit": current_commit() if commit is None else commit,
      "test_accuracy": None if test_accuracy is None else float(test_accuracy),
      "sound_epsilon": epsilon_json(sound_epsilon), "delta": float(delta),
      "neighbouring": neighbouring, "accounting": accounting,
      "paper_epsilon": epsilon_json(paper_epsilon), "paper_row": paper_row,
      "paper_accuracy": None if paper_accuracy is None else float(paper_accuracy),
      "cpu_seconds": float(cpu_seconds), "wall_seconds": float(wall_seconds),
      "selection": selection,
  }
  if extra:
    clash = set(extra) & set(record)
    if clash:
      raise ValueError(f"extra fields clash with record fields: {sorted(clash)}")
    record.update(extra)
  return validate_record(released_fields.move_private_fields(record))


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_kinds(record: dict[str, Any]) -> None:
  """Kinds of the fields beyond the enumerations; raises ValueError naming the field."""
  for name in ("method", "dataset", "command"):
    if not isinstance(record[name], str) or not record[name]:
      raise ValueError(f"{name} must be a non-empty string, got {record[name]!r}")
  for name in ("commit", "paper_row"):
    if record[name] is not None and not isinstance(record[name], str):
      raise ValueError(f"{name} must be a string or null, got {record[name]!r}")
  for name in ("test_accuracy", "paper_accuracy"):
    value = record[name]
    if value is not None and not (_is_number(value) and 0 <= value <= 1):
      raise ValueError(f"{name} must be a number in [0, 1] or null, got {value!r}")
  if not (_is_number(record["delta"]) and 0 <= record["delta"] < 1):
    raise ValueError(f"delta must be a number in [0, 1), got {record['delta']!r}")
  paper_eps = record["paper_epsilon"]
  if not (paper_eps is None or paper_eps == "inf" or (_is_number(paper_eps) and paper_eps >= 0)):
    raise ValueError(f"paper_epsilon must be a number >= 0, 'inf' or null, got {paper_eps!r}")
  legacy = record.get("regenerated") is False  # converted from the docs' text, not from a run
  for name in ("cpu_seconds", "wall_seconds"):
    value = record[name]
    if not ((value is None and legacy) or (_is_number(value) and value >= 0)):
      allowed = "a number >= 0 or null (legacy record)" if legacy else "a number >= 0"
      raise ValueError(f"{name} must be {allowed}, got {value!r}")


def validate_record(record: dict[str, Any]) -> dict[str, Any]:
  """Checks the required fields and their kinds; returns `record`.

  `cpu_seconds` / `wall_seconds` may be null only in a record marked `regenerated: false`
  (converted from the docs' text, which did not state them).
  """
  if not isinstance(record, dict):
    raise ValueError(f"a results record is a JSON object, got {type(record).__name__}")
  missing = [f for f in RECORD_FIELDS if f not in record]
  if missing:
    raise ValueError(f"results record lacks fields {missing}")
  if record["neighbouring"] not in NEIGHBOURING:
    raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {record['neighbouring']!r}")
  if record["accounting"] not in ACCOUNTING:
    raise ValueError(f"accounting must be one of {ACCOUNTING}, got {record['accounting']!r}")
  eps = record["sound_epsilon"]
  if not (eps == "inf" or (_is_number(eps) and eps >= 0)):
    raise ValueError(f"sound_epsilon must be a finite number >= 0 or 'inf', got {eps!r}")
  if "selection" in record and record["selection"] not in SELECTIONS:
    raise ValueError(f"selection must be one of {SELECTIONS}, got {record['selection']!r}")
  _check_kinds(record)
  leaked = sorted(k for k in record if released_fields.is_private_field(k))
  if leaked:
    raise ValueError(f"private statistics at the top level: {leaked} (noiseless, not covered "
                     f"by epsilon: they belong under \"{released_fields.PRIVATE_KEY}\")")
  private = record.get(released_fields.PRIVATE_KEY, {})
  if not isinstance(private, dict):
    raise ValueError(f"{released_fields.PRIVATE_KEY} must be an object, got {private!r}")
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


def read_record(path: str, **json_kwargs: Any) -> dict[str, Any]:
  """The validated record in `path`; a missing, unparsable or invalid file raises a one-line
  `UserError` naming it. `json_kwargs` go to `json.load` (e.g. `parse_float=decimal.Decimal`
  to keep the figures' digits as written; validation then sees floats)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    record = json.loads(text, **json_kwargs)
    validate_record(json.loads(text) if json_kwargs else record)
  except OSError as e:
    raise UserError(f"{path}: cannot read the results record ({e.strerror})") from e
  except json.JSONDecodeError as e:
    raise UserError(f"{path}: not valid JSON ({e})") from e
  except ValueError as e:
    raise UserError(f"{path}: {e}") from e
  return record


def combine_seeds(records: dict[str, dict[str, Any]], *, name: str) -> dict[str, Any]:
  """One record for the same run repeated over seeds: the mean test accuracy and its spread.

  Args:
    records: seed record name -> record (at least two; the same method, dataset, δ,
      neighbouring relation and accounting).
    name: the combined record's name (each seed record then says `seed_of: name`).

  Returns:
    The combined record: `test_accuracy` the mean over the seeds, `sound_epsilon` the largest
    of theirs, cpu/wall seconds the sums, the first seed's command and commit, `single_seed`
    false, `combined_from` the seed names, every further field the seeds share (settings
    such as the noise multiplier), and `columns` accuracy_seeds (in name order), accuracy_std
    (sample standard deviation, rounded to 4 decimals), accuracy_min, accuracy_max, seeds.
  """
  if len(records) < 2:
    raise UserError(f"combining seeds needs at least two records, got {len(records)}")
  names = sorted(records)
  first = records[names[0]]
  for field in ("method", "dataset", "delta", "neighbouring", "accounting", "paper_row"):
    values = {json.dumps(records[n][field]) for n in names}
    if len(values) > 1:
      raise UserError(f"the records to combine differ in {field}: {sorted(values)}")
  accuracies = [records[n]["test_accuracy"] for n in names]
  if any(a is None for a in accuracies):
    raise UserError("every record to combine needs a test accuracy")
  epsilons = [records[n]["sound_epsilon"] for n in names]
  mean = sum(accuracies) / len(accuracies)
  std = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / (len(accuracies) - 1))
  combined = {field: first[field] for field in RECORD_FIELDS}
  # Settings every seed shares; not the publishing fields (tables, labels, sources).
  publishing = {"tables", "columns", "text", "bold", "source", "regenerated", "single_seed",
                "seed_of", "combined_from", "warnings", "segments", "commits",
                "clock_incomplete", released_fields.PRIVATE_KEY}
  combined.update({key: value for key, value in first.items()
                   if key not in combined and key not in publishing
                   and all(json.dumps(records[n].get(key)) == json.dumps(value) for n in names)})
  combined.update(
      test_accuracy=mean,
      sound_epsilon="inf" if "inf" in epsilons else max(epsilons),
      cpu_seconds=sum(records[n]["cpu_seconds"] for n in names),
      wall_seconds=sum(records[n]["wall_seconds"] for n in names),
      single_seed=False, combined_from=names,
      columns={"accuracy_seeds": accuracies, "accuracy_std": round(std, 4),
               "accuracy_min": min(accuracies),
               "accuracy_max": max(accuracies), "seeds": len(names)})
  if any(records[n].get("clock_incomplete") for n in names):  # a seed's seconds undercount
    combined["clock_incomplete"] = True
  if name in records:
    raise UserError(f"the combined record {name!r} cannot be one of its seeds")
  return validate_record(combined)
