"""Metric logging: a CSV file and TensorBoard event files side by side.

Written from process 0 only so that multi-host runs produce one log. Values are pulled to the
host lazily by the caller (log the previous step's metrics so dispatch never stalls).

A resumed run replays the steps after its checkpoint, so it passes `resume_step` (the restored
step, 0 for a fresh run): rows with a larger step are dropped from the CSV before anything is
appended, and TensorBoard is told to purge events after that step (the `purge_step` of the new
event file; TensorBoard hides older events at or beyond it). The log then holds each step once.

Every append is flushed and fsynced before `write` returns, so the rows of a step are on disk
before the checkpoint of that step is saved: a crash (or a power loss) can then tear only rows
after the last checkpoint, which the resumed run writes again. A torn or unreadable row at or
before the checkpoint (the file damaged otherwise) cannot be rebuilt; dropping it is warned.
"""

from __future__ import annotations

import csv
import glob
import os
import sys
import tempfile
import warnings
from typing import Mapping

import jax
import numpy as np

from dpkd_jax.train import released_fields

_HEADER = ["step", "name", "value"]


def _summary_writer_class():
  """tensorboardX's `SummaryWriter`, imported without importing PyTorch.

  `tensorboardX.writer` imports torch where it is installed (the `[import]` extra), only to
  name `torch.Tensor` in its type annotations: about 1.5 CPU-s and a few hundred MB in every
  process that logs metrics, which never hands it a torch tensor. If nothing has imported
  torch yet, torch is marked absent for the length of that import and unmarked after it;
  torch imports as usual afterwards, and tensorboardX converts torch tensors through its
  `x2num`, which imports torch when it meets one. (Another thread importing torch during
  that one import, at a process's first writer, would see it absent.)
  """
  if "tensorboardX.writer" in sys.modules or "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    if "torch" in sys.modules and sys.modules["torch"] is None:
      del sys.modules["torch"]
  return SummaryWriter


def _is_whole(row: list[str]) -> bool:
  """False for a row torn by a crash in the middle of a write."""
  try:
    return len(row) == 3 and int(row[0]) >= 0 and bool(row[1]) and float(row[2]) is not None
  except ValueError:
    return False


def _step_after(row: list[str], step: int) -> bool:
  """True if `row` (whole or torn) names a step after `step`: the resumed run rewrites it."""
  try:
    return int(row[0]) > step
  except (ValueError, IndexError):
    return False


def drop_rows_after(path: str, step: int) -> int:
  """Rewrites the long-format CSV `path` without rows whose step exceeds `step` (atomically).

  Rows torn by a crash mid-write are dropped too.

  Returns:
    How many rows were dropped (0 if the file does not exist).
  """
  if not os.path.exists(path):
    return 0
  with open(path, newline="") as f:
    text = f.read()
  torn = bool(text) and not text.endswith("\n")  # the last row was cut short, even if it parses
  rows = list(csv.reader(text.splitlines()))
  rows, cut = (rows[:-1], rows[-1:]) if torn else (rows, [])
  if rows and rows[0] != _HEADER:
    raise ValueError(f"{path!r} is not a metrics CSV (header {rows[0]}, expected {_HEADER})")
  kept = [row for row in rows[1:] if _is_whole(row) and int(row[0]) <= step]
  dropped = max(len(rows) - 1, 0) - len(kept) + torn
  lost = [row for row in [*rows[1:], *cut]
          if (not _is_whole(row) or row in cut) and not _step_after(row, step)]
  if lost:  # rows of steps the resumed run does not write again
    warnings.warn(f"{path}: dropped {len(lost)} torn row(s) of step {step} (the checkpoint) "
                  "or before, which cannot be rebuilt", stacklevel=2)
  if dropped:
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(path)),
                                     delete=False, suffix=".tmp", newline="") as f:
      csv.writer(f).writerows([_HEADER, *kept])
    os.replace(f.name, path)  # a crash leaves the old file whole
  return dropped


class MetricsWriter:
  """Appends scalar metrics to `<workdir>/<csv_name>` and TensorBoard events in `<workdir>/<tb_dir>`.

  The CSV is in long format (`step,name,value`, one row per scalar) so that metrics logged at
  different cadences (train every step, eval every epoch) share one file without header churn.
  A released log (`private=False`) sends every private metric name
  (`released_fields.is_private_metric`, e.g. "validation/accuracy") to the run's private
  diagnostics instead (`released_fields.PRIVATE_CSV` / `PRIVATE_TB_DIR`, named
  `private_diagnostics/<name>`), opened at its first such write.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, resume_step: int | None = None,
               csv_name: str = "metrics.csv", tb_dir: str = "tb", private: bool = False,
               drop_rows: bool = True):
    """Opens the log.

    Args:
      workdir: run directory (created).
      tensorboard: also write TensorBoard events.
      resume_step: the step the run (re)starts from; rows and events after it are dropped.
        None keeps everything (plain append).
      csv_name, tb_dir: file and directory names inside `workdir`.
      private: this log holds private diagnostics (it keeps every name it is given).
      drop_rows: drop the CSV's rows after `resume_step` now (False: the caller did, before
        this process wrote any row; TensorBoard is still told to purge).
    """
    self._active = jax.process_index() == 0
    self._workdir, self._tensorboard, self._resume_step = workdir, tensorboard, resume_step
    self._csv_path = os.path.join(workdir, csv_name)
    self._tb = None
    self._routes_private = not private  # a released log sends private names to its sink
    self._private_writer: MetricsWriter | None = None  # that sink, opened at its first write
    if not self._active:
      return
    os.makedirs(workdir, exist_ok=True)
    if resume_step is not None and drop_rows:
      drop_rows_after(self._csv_path, resume_step)
      if not private:  # the private rows of the steps to replay go too (before any write)
        drop_rows_after(os.path.join(workdir, released_fields.PRIVATE_CSV), resume_step)
    if not os.path.exists(self._csv_path):
      with open(self._csv_path, "w", newline="") as f:
        csv.writer(f).writerow(_HEADER)
    if tensorboard:
      # tensorboardX writes the event format without needing TensorFlow.
      SummaryWriter = _summary_writer_class()  # pylint: disable=invalid-name

      tb_path = os.path.join(workdir, tb_dir)
      earlier = glob.glob(os.path.join(tb_path, "events.out.tfevents.*"))
      purge = resume_step + 1 if resume_step is not None and earlier else None
      self._tb = SummaryWriter(tb_path, purge_step=purge)

  def write(self, step: int, metrics: Mapping[str, float], *, prefix: str = "") -> None:
    """Writes the scalars of `metrics` for `step`, names prefixed (e.g. 'train/')."""
    if not self._active:
      return
    rows = [(int(step), f"{prefix}{k}", float(np.asarray(v))) for k, v in metrics.items()]
    if self._routes_private:
      private = {n[len(prefix):]: v for _, n, v in rows if released_fields.is_private_metric(n)}
      if private:
        self._private_sink().write(
            step, private, prefix=f"{released_fields.PRIVATE_TAG_PREFIX}{prefix}")
        rows = [row for row in rows if not released_fields.is_private_metric(row[1])]
    with open(self._csv_path, "a", newline="") as f:
      csv.writer(f).writerows(rows)
      f.flush()
      os.fsync(f.fileno())  # on disk before the step's checkpoint (module docstring)
    if self._tb is not None:
      for step_, name, value in rows:
        self._tb.add_scalar(name, value, step_)

  def _private_sink(self) -> "MetricsWriter":
    if self._private_writer is None:
      self._private_writer = MetricsWriter(
          self._workdir, tensorboard=self._tensorboard, resume_step=self._resume_step,
          csv_name=released_fields.PRIVATE_CSV, tb_dir=released_fields.PRIVATE_TB_DIR,
          private=True, drop_rows=False)
    return self._private_writer

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
    if self._private_writer is not None:
      self._private_writer.close()


def read_metrics(workdir: str, csv_name: str = "metrics.csv") -> dict[str, list[tuple[int, float]]]:
  """Reads `<workdir>/metrics.csv` back as {name: [(step, value), ...]}."""
  series: dict[str, list[tuple[int, float]]] = {}
  with open(os.path.join(workdir, csv_name), newline="") as f:
    for row in csv.DictReader(f):
      series.setdefault(row["name"], []).append((int(row["step"]), float(row["value"])))
  return series
