"""Metric logging: a CSV file and TensorBoard event files side by side.

Written from process 0 only so that multi-host runs produce one log. Values are pulled to the
host lazily by the caller (log the previous step's metrics so dispatch never stalls).
"""

from __future__ import annotations

import csv
import os
from typing import Mapping

import jax
import numpy as np


class MetricsWriter:
  """Appends scalar metrics to `<workdir>/metrics.csv` and TensorBoard events in `<workdir>/tb`.

  The CSV is in long format (`step,name,value`, one row per scalar) so that metrics logged at
  different cadences (train every step, eval every epoch) share one file without header churn.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    self._active = jax.process_index() == 0
    self._csv_path = os.path.join(workdir, "metrics.csv")
    self._tb = None
    if not self._active:
      return
    os.makedirs(workdir, exist_ok=True)
    if not os.path.exists(self._csv_path):
      with open(self._csv_path, "w", newline="") as f:
        csv.writer(f).writerow(["step", "name", "value"])
    if tensorboard:
      # tensorboardX writes the event format without needing TensorFlow.
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

      self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: Mapping[str, float], *, prefix: str = "") -> None:
    """Writes the scalars of `metrics` for `step`, names prefixed (e.g. 'train/')."""
    if not self._active:
      return
    rows = [(int(step), f"{prefix}{k}", float(np.asarray(v))) for k, v in metrics.items()]
    with open(self._csv_path, "a", newline="") as f:
      csv.writer(f).writerows(rows)
    if self._tb is not None:
      for step_, name, value in rows:
        self._tb.add_scalar(name, value, step_)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """Reads `<workdir>/metrics.csv` back as {name: [(step, value), ...]}."""
  series: dict[str, list[tuple[int, float]]] = {}
  with open(os.path.join(workdir, "metrics.csv"), newline="") as f:
    for row in csv.DictReader(f):
      series.setdefault(row["name"], []).append((int(row["step"]), float(row["value"])))
  return series
