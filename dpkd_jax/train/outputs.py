"""What a run writes: released figures, private diagnostics, results.json and record.json.

A run's ε covers what it releases: the student (or labels, or samples), its accuracy on the
public test split, and anything computed from the noisy releases. Some useful numbers are
noiseless functions of the private data or of the non-private teacher (the teacher's test
accuracy, DP-SGD's loss on a private batch, ...): their ε is infinite. They are kept apart in
every output file so that publishing a run's outputs never publishes them by accident:

* results.json: released figures at top level; the others under `"private_diagnostics"`,
  whose `"_note"` says they are not covered by ε (`finish_run` moves any field that
  `released_fields` declares private there: e.g. a validation accuracy).
* metrics.csv / tb/: released curves only. Private scalars go to `private_diagnostics.csv`
  (same long format) and to `private_diagnostics_tb/` with tags prefixed `private_diagnostics/`
  (`metrics.MetricsWriter` sends a declared private name such as "validation/accuracy" there).
* record.json: the results record (`records.make_record`), released figures at top level; a
  declared private field of `extra` (the statistic a tuning table selects on) under its own
  `"private_diagnostics"` block.

`finish_run` writes results.json and record.json at the end of every `train_*`, with the
privacy warnings (ε = inf, sound ε above the target) in both, the model card built from them
(`release.model_card`: model_card.md + model_card.json), then report.md (`report`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
import time
from typing import Any, Mapping


from dpkd_jax.release import model_card
from dpkd_jax.train import distributed
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import records
from dpkd_jax.train import released_fields
from dpkd_jax.train import report
from dpkd_jax.train import workdir as workdir_lib

# Declared once in `released_fields` (which names are private, and where they go).
PRIVATE_KEY = released_fields.PRIVATE_KEY
PRIVATE_NOTE = released_fields.PRIVATE_NOTE
PRIVATE_CSV = released_fields.PRIVATE_CSV
PRIVATE_TB_DIR = released_fields.PRIVATE_TB_DIR
PRIVATE_TAG_PREFIX = released_fields.PRIVATE_TAG_PREFIX
NOT_PRIVATE = "epsilon = inf (NOT private)"


class RunClock:
  """CPU seconds (this process, all threads) and wall seconds since construction, and the
  commit of the code that started the run (read at the start: the checkout may change while a
  long run goes on, and the record must name the code that ran)."""

  def __init__(self):
    self._cpu, self._wall = time.process_time(), time.perf_counter()
    self.commit = records.current_commit()

  def seconds(self) -> tuple[float, float]:
    return time.process_time() - self._cpu, time.perf_counter() - self._wall


class PrivateDiagnosticsWriter:
  """Writes private scalars to `<workdir>/private_diagnostics.csv` (long format, as
  `metrics.csv`) and TensorBoard events in `<workdir>/private_diagnostics_tb/`, every tag
  prefixed `private_diagnostics/`. Files are created at the first write only (process 0); a
  resumed run (`resume_step`) drops the rows after its checkpoint at once, as `MetricsWriter`."""

  def __init__(self, workdir: str, *, tensorboard: bool = True, resume_step: int | None = None):
    self._workdir, self._tensorboard, self._resume_step = workdir, tensorboard, resume_step
    self._writer: metrics_lib.MetricsWriter | None = None
    self.path = os.path.join(workdir, PRIVATE_CSV)
    if distributed.is_coordinator() and resume_step is not None:
      metrics_lib.drop_rows_after(self.path, resume_step)

  def write(self, step: int, metrics: Mapping[str, Any], *, prefix: str = "") -> None:
    """Appends the scalars of `metrics` for `step`, named `private_diagnostics/<prefix><k>`."""
    if not distributed.is_coordinator() or not metrics:
      return
    if self._writer is None:
      self._writer = metrics_lib.MetricsWriter(
          self._workdir, tensorboard=self._tensorboard, resume_step=self._resume_step,
          csv_name=PRIVATE_CSV, tb_dir=PRIVATE_TB_DIR, private=True,
          drop_rows=False)  # dropped at construction: rows written since are this process's
    self._writer.write(step, metrics, prefix=f"{PRIVATE_TAG_PREFIX}{prefix}")

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()


def read_private_diagnostics(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """`<workdir>/private_diagnostics.csv` as {name: [(step, value), ...]} ({} if absent)."""
  series: dict[str, list[tuple[int, float]]] = {}
  path = os.path.join(workdir, PRIVATE_CSV)
  if not os.path.exists(path):
    return series
  with open(path, newline="") as f:
    for row in csv.DictReader(f):
      series.setdefault(row["name"], []).append((int(row["step"]), float(row["value"])))
  return series


def private_section(values: Mapping[str, Any] | None = None, *, workdir: str | None = None,
                    files: tuple[str, ...] = ()) -> dict[str, Any]:
  """The `"private_diagnostics"` block of results.json.

  Args:
    values: the private figures (e.g. the teacher's test accuracy).
    workdir: the run's directory; `private_diagnostics.csv` and `files` are listed if there.
    files: further paths under `workdir` that may hold private values (e.g. "teacher").

  Returns:
    {"_note": PRIVATE_NOTE, **values, "files": [...]} ("files" only if one exists).
  """
  section = {"_note": PRIVATE_NOTE, **(values or {})}
  listed = [f for f in (PRIVATE_CSV, *files)
            if workdir is not None and os.path.exists(os.path.join(workdir, f))]
  if listed:
    section["files"] = listed
  return section


def has_private_values(results: Mapping[str, Any]) -> bool:
  """True if results.json holds private diagnostics beyond the note."""
  return any(k != "_note" for k in results.get(PRIVATE_KEY, {}))


def _format(value: float) -> str:
  return "inf" if math.isinf(value) else f"{value:.4g}"


def privacy_warnings(*, sound_epsilon: float, target_epsilon: float | None = None,
                     accounting: str = "sound") -> list[str]:
  """The lines a user must not miss: no guarantee at all, or a sound ε above the target."""
  out = []
  if math.isinf(sound_epsilon):
    out.append(NOT_PRIVATE)
  if target_epsilon is not None and sound_epsilon > target_epsilon:
    why = (": the target bounds only the paper's formula, which is NOT a guarantee"
           if accounting == "paper" else "")
    out.append(f"sound epsilon {_format(sound_epsilon)} exceeds target_epsilon="
               f"{target_epsilon:g} (accounting={accounting}{why})")
  return out


def without_nan(value: Any, path: str = "") -> tuple[Any, list[str]]:
  """(`value` with every float NaN replaced by None, the dotted paths replaced).

  JSON has no NaN: a bare `NaN` makes results.json unreadable to strict parsers, so a
  diverged run's NaN loss is written as null and named in a warning. inf stays (ε = ∞ is
  written as Infinity, which every reader of these files accepts)."""
  if isinstance(value, float) and math.isnan(value):
    return None, [path]
  if isinstance(value, Mapping):
    out, paths = {}, []
    for key, item in value.items():
      out[key], found = without_nan(item, f"{path}.{key}" if path else str(key))
      paths += found
    return out, paths
  if isinstance(value, (list, tuple)):
    pairs = [without_nan(item, f"{path}[{i}]") for i, item in enumerate(value)]
    return type(value)(item for item, _ in pairs), [p for _, found in pairs for p in found]
  return value, []


def _diverged_warning(paths: list[str]) -> str:
  shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
  return (f"training diverged: {shown} is not a number (written as null); lower the learning "
          "rate or check the inputs")


def _write_json(path: str, payload: Mapping[str, Any]) -> None:
  """Atomically (a crash leaves the old file or the new one); inf is written as Infinity."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as f:
    json.dump(payload, f, indent=2, default=float)
  os.replace(f.name, path)


def finish_run(workdir: str, results: dict[str, Any], *, run: workdir_lib.Run | None,
               clock: RunClock, dataset: str,
               test_accuracy: float | None, sound_epsilon: float, delta: float,
               accounting: str = "sound", paper_epsilon: float | None = None,
               target_epsilon: float | None = None, neighbouring: str = "replace-one",
               selection: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """Adds the privacy warnings to `results`, writes results.json and record.json (process 0).

  The record's `cpu_seconds` / `wall_seconds` are the run's cost across resumes: the sum over
  the processes that ran it (`clock_file`), each earlier one as of its last checkpoint, plus
  this process's `clock`. Time a killed process spent after its last checkpoint is lost work
  and is NOT counted. After a resume the record also says `segments` (how many processes saved
  or finished it) and `commits` (their distinct commits, in order; `commit` stays this
  process's), and `clock_incomplete: true` if the account of the earlier processes was lost.
  A run that never resumed gets exactly its `clock`'s seconds and no further field.

  Args:
    workdir: the run's directory.
    results: the run's results (method in `results["method"]`); updated in place.
    run: the open `Run` of `workdir` (`workdir.open_run`), whose account (`Run.clock`) the
      record sums; required, so that no method forgets it. None only for a result written
      without `open_run` (the cost is then this process's `clock`).
    clock: started at the beginning of this process's run.
    dataset, test_accuracy, sound_epsilon, delta, accounting, paper_epsilon, neighbouring:
      the record's fields (`records.make_record`).
    target_epsilon: the run's target, to warn when the sound ε exceeds it.
    selection: the record's `selection`; None: "validation" if the saved config
      (`results["config"]`) holds out `validation_examples`, else "none".
    extra: further record fields.

  Returns:
    `results`.
  """
  released_fields.move_private_fields(results)  # a declared private field never at top level
  results["warnings"] = privacy_warnings(sound_epsilon=sound_epsilon,
                                         target_epsilon=target_epsilon, accounting=accounting)
  clean, nan_paths = without_nan(results)
  if nan_paths:
    results.clear()
    results.update(clean)
    results["warnings"].append(_diverged_warning(nan_paths))
  extra, _ = without_nan(extra or {})
  if test_accuracy is not None and math.isnan(test_accuracy):
    test_accuracy = None
  if run is not None and os.path.abspath(run.workdir) != os.path.abspath(workdir):
    raise ValueError(f"finish_run of {workdir!r} was handed the run of {run.workdir!r}")
  cost = _run_cost(run, clock)
  cpu, wall = cost.pop("cpu_seconds"), cost.pop("wall_seconds")
  record = records.make_record(
      method=results["method"], dataset=dataset, test_accuracy=test_accuracy,
      sound_epsilon=sound_epsilon, delta=delta, neighbouring=neighbouring,
      accounting=accounting, paper_epsilon=paper_epsilon, cpu_seconds=cpu, wall_seconds=wall,
      commit=clock.commit, extra={"warnings": results["warnings"], **(extra or {}), **cost},
      selection=selection or _selection_of(results.get("config")))
  if distributed.is_coordinator():
    _write_json(os.path.join(workdir, "results.json"), results)
    records.write_record(os.path.join(workdir, "record.json"), record)
    model_card.write_model_card(workdir)  # model_card.md + .json, from the two files above
    report.write_report(workdir)  # report.md: curves, ε spent, samples, privacy-utility
  return results


def _selection_of(config_json: Mapping[str, Any] | None) -> str:
  """"validation" if the run held out `validation_examples` records (`train.selection`)."""
  return "validation" if (config_json or {}).get("validation_examples") else "none"


def _run_cost(run: workdir_lib.Run | None, clock: RunClock) -> dict[str, Any]:
  """{cpu_seconds, wall_seconds, + segments / commits / clock_incomplete after a resume}: the
  run's cost summed over its processes (`finish_run`), or this process's alone without one."""
  cpu, wall = clock.seconds()
  account = None if run is None else run.clock  # None: process != 0, or the run is closed
  return (account.finish(cpu, wall) if account is not None
          else {"cpu_seconds": cpu, "wall_seconds": wall})


def write_non_private_record(workdir: str, *, run: workdir_lib.Run, clock: RunClock,
                             method: str, dataset: str, test_accuracy: float | None,
                             extra: dict[str, Any]) -> None:
  """`<workdir>/record.json` (coordinator only) of a run that releases no privacy guarantee
  (a teacher, a generator pretrained on one): sound ε "inf", δ 0, its cost as `finish_run`
  sums it, the starting commit of `clock`."""
  if not distributed.is_coordinator():
    return
  cost = _run_cost(run, clock)
  records.write_record(os.path.join(workdir, "record.json"), records.make_record(
      method=method, dataset=dataset, test_accuracy=test_accuracy, sound_epsilon=math.inf,
      delta=0.0, neighbouring="replace-one", accounting="sound",
      cpu_seconds=cost.pop("cpu_seconds"), wall_seconds=cost.pop("wall_seconds"),
      commit=clock.commit, extra={**extra, **cost}))
