"""Privacy–utility plots from run directories (`results.json`, optionally `metrics.csv`).

Every method's CLI writes `<workdir>/results.json`; its ε is always the sound figure of
`dpkd_jax.privacy.accounting` (∞ for a run without a guarantee). This module reads those files
into `RunSummary` records and draws test accuracy against ε (log axis), one line per method.

* A run with ε = ∞ (non-private pipeline, DPDFD direct mode, SRR with a teacher-pretrained
  generator) has no place on an ε axis: it is drawn as a dashed horizontal reference line.
* `trajectories=True` adds each run's (spent ε, accuracy) at every evaluation, read from its
  `metrics.csv` (ε is the ledger's at that step): a single run then gives a curve.
* Paper-formula ε values are never plotted as guarantees; `paper_epsilon=True` draws them as
  hollow markers labelled "NOT a guarantee", as the results tables do.
* `plot_frontier` draws one dataset's sound frontier (`dpkd_jax.train.frontier`, from the
  committed records): a step line per setting, the published anchors as hollow markers.

Only released figures are read: top-level results.json keys and metrics.csv. The
`"private_diagnostics"` block and `private_diagnostics.csv` (noiseless functions of private data,
not covered by ε; `dpkd_jax.train.outputs`) are never plotted.

Methods name their fields differently (`student_accuracy` for reverse k-NN, the record-level ε
for SRR), so an explicit registry, `METHOD_FIELDS`, says which keys to read for each method.
matplotlib is imported lazily with the Agg backend, so this works on headless machines.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
import os
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodFields:
  """Where a method's results live.

  Attributes:
    epsilon: results.json key of the sound (record-level) ε.
    accuracy: results.json key of the student's test accuracy.
    paper_epsilon: results.json key of the paper's figure (None: the method has none).
    trajectory_epsilon: metrics.csv tag of the ε spent at each evaluation (None: not logged).
    trajectory_accuracy: metrics.csv tag of the accuracy at each evaluation.
  """

  epsilon: str = "epsilon"
  accuracy: str = "test_accuracy"
  paper_epsilon: str | None = None
  trajectory_epsilon: str | None = None
  trajectory_accuracy: str = "test/accuracy"


# Explicit registry (no string dispatch): method name in results.json -> its field names.
METHOD_FIELDS: dict[str, MethodFields] = {
    "dpdfd": MethodFields(paper_epsilon="paper_epsilon", trajectory_epsilon="train/epsilon"),
    "dpdfd_direct": MethodFields(paper_epsilon="paper_epsilon"),
    "dpsgd": MethodFields(trajectory_epsilon="test/epsilon"),
    "rknn": MethodFields(accuracy="student_accuracy", trajectory_epsilon="round/epsilon",
                         trajectory_accuracy="round/student_accuracy"),
    "srr": MethodFields(epsilon="record_level_epsilon",
                        paper_epsilon="paper_label_epsilon_per_query"),
    "rona": MethodFields(trajectory_epsilon="train/epsilon"),
}
_DEFAULT_FIELDS = MethodFields()


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSummary:
  """One run, as plotted.

  Attributes:
    label: the run directory's base name.
    method: the `method` of results.json ("unknown" if absent).
    epsilon: sound ε at `delta` (math.inf: no guarantee).
    accuracy: the student's test accuracy.
    delta: δ of `epsilon` (NaN if the file has none).
    paper_epsilon: the paper's figure, or None.
    trajectory: ((ε spent, accuracy), ...) at every evaluation, in step order (may be empty).
  """

  label: str
  method: str
  epsilon: float
  accuracy: float
  delta: float
  paper_epsilon: float | None
  trajectory: tuple[tuple[float, float], ...]

  def __post_init__(self):
    if not 0.0 <= self.accuracy <= 1.0:
      raise ValueError(f"accuracy of run {self.label!r} must be in [0, 1], got {self.accuracy!r}")
    if math.isnan(self.epsilon) or self.epsilon < 0:
      raise ValueError(f"epsilon of run {self.label!r} must be >= 0 or inf, got {self.epsilon!r}")


def _read_trajectory(run_dir: str, fields: MethodFields) -> tuple[tuple[float, float], ...]:
  """(ε, accuracy) pairs of the steps at which metrics.csv logged both tags."""
  path = os.path.join(run_dir, "metrics.csv")
  if fields.trajectory_epsilon is None or not os.path.exists(path):
    return ()
  by_step: dict[int, dict[str, float]] = collections.defaultdict(dict)
  with open(path, newline="", encoding="utf-8") as f:
    for row in csv.DictReader(f):  # columns: step, name, value
      if row["name"] in (fields.trajectory_epsilon, fields.trajectory_accuracy):
        by_step[int(row["step"])][row["name"]] = float(row["value"])
  return tuple((values[fields.trajectory_epsilon], values[fields.trajectory_accuracy])
               for _, values in sorted(by_step.items())
               if len(values) == 2 and math.isfinite(values[fields.trajectory_epsilon]))


def load_run(run_dir: str) -> RunSummary:
  """Reads `<run_dir>/results.json` (and `metrics.csv`, if present).

  Args:
    run_dir: a workdir written by one of the `experiments.*` CLIs.

  Returns:
    The run's summary.

  Raises:
    FileNotFoundError: no results.json in `run_dir`.
    ValueError: results.json lacks the method's ε or accuracy key, or holds invalid values.
  """
  path = os.path.join(run_dir, "results.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no results.json in {run_dir!r} (is it a finished run's workdir?)")
  with open(path, encoding="utf-8") as f:
    results = json.load(f)  # Python's json reads the `Infinity` that runs write for ε = ∞.
  method = str(results.get("method", "unknown"))
  fields = METHOD_FIELDS.get(method, _DEFAULT_FIELDS)
  for key in (fields.epsilon, fields.accuracy):
    if key not in results:
      raise ValueError(f"{path} ({method!r} run) has no {key!r} field")
  paper = results.get(fields.paper_epsilon) if fields.paper_epsilon else None
  return RunSummary(
      label=os.path.basename(os.path.normpath(run_dir)),
      method=method,
      epsilon=float(results[fields.epsilon]),
      accuracy=float(results[fields.accuracy]),
      delta=float(results.get("delta", math.nan)),
      paper_epsilon=None if paper is None else float(paper),
      trajectory=_read_trajectory(run_dir, fields),
  )


def load_runs(run_dirs: Sequence[str], *, skip_unfinished: bool = False) -> list[RunSummary]:
  """`load_run` of every directory, in the given order.

  Args:
    run_dirs: workdirs (e.g. a shell glob `runs/dpdfd/*`).
    skip_unfinished: skip directories without results.json instead of raising.

  Returns:
    The summaries.

  Raises:
    ValueError: no directory given, or none left after skipping.
  """
  summaries = []
  for run_dir in run_dirs:
    if skip_unfinished and not os.path.isfile(os.path.join(run_dir, "results.json")):
      continue
    summaries.append(load_run(run_dir))
  if not summaries:
    raise ValueError(f"no run with a results.json among {list(run_dirs)!r}")
  return summaries


def plot_privacy_utility(runs: Sequence[RunSummary], out_path: str, *,
                         title: str | None = None, trajectories: bool = False,
                         paper_epsilon: bool = False) -> str:
  """Draws test accuracy against sound ε and writes a PNG.

  Args:
    runs: summaries from `load_runs`.
    out_path: the PNG to write (its directory must exist).
    title: figure title; default "privacy–utility (δ = ...)".
    trajectories: also draw each run's per-evaluation (ε spent, accuracy) curve.
    paper_epsilon: also draw the papers' figures, as hollow markers marked NOT a guarantee.

  Returns:
    `out_path`.

  Raises:
    ValueError: `runs` is empty.
  """
  if not runs:
    raise ValueError("runs must hold at least one RunSummary")
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # Headless: CI and notebooks on machines without a display.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import collections as collections_lib  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  by_method: dict[str, list[RunSummary]] = collections.defaultdict(list)
  for run in runs:
    by_method[run.method].append(run)
  finite_epsilons = [r.epsilon for r in runs if math.isfinite(r.epsilon)]
  finite_epsilons += [e for r in runs if trajectories for e, _ in r.trajectory]
  palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for index, (method, method_runs) in enumerate(sorted(by_method.items())):
    color = palette[index % len(palette)]  # One colour per method, whatever it draws.
    private = sorted((r for r in method_runs if math.isfinite(r.epsilon)), key=lambda r: r.epsilon)
    if private:
      ax.plot([r.epsilon for r in private], [r.accuracy for r in private], "o-", color=color,
              label=f"{method} (sound ε)")
    # One artist per method and kind, not per run (a dataset has hundreds of records, and
    # matplotlib's cost is per artist); a legend entry per method and kind.
    unbounded = [r.accuracy for r in method_runs if not math.isfinite(r.epsilon)]
    if unbounded:
      # ε = ∞ has no x position: a reference line across the axes at the run's accuracy
      # (record names mean nothing to a reader).
      lines = collections_lib.LineCollection(
          [[(0.0, acc), (1.0, acc)] for acc in unbounded], transform=ax.get_yaxis_transform(),
          linestyles="--", linewidths=1, colors=color,
          label=f"{method}: ε = ∞, no guarantee"
          + (f" ({len(unbounded)} runs)" if len(unbounded) > 1 else ""))
      ax.add_collection(lines, autolim=False)
      ax.dataLim.update_from_data_y(np.asarray(unbounded), ignore=False)  # y limits hold them
    if trajectories:
      # The runs' curves in one line, NaN between runs (a break, not a segment).
      curves = [[*run.trajectory, (math.nan, math.nan)] for run in method_runs if run.trajectory]
      if curves:
        eps, acc = zip(*[point for curve in curves for point in curve])
        ax.plot(eps, acc, ".:", color=color, alpha=0.7,
                label=f"{method} during training (ε spent)")
    paper = [(r.paper_epsilon, r.accuracy) for r in method_runs
             if paper_epsilon and r.paper_epsilon is not None and r.paper_epsilon > 0]
    if paper:
      ax.plot(*zip(*paper), "o", mfc="none", color=color, linestyle="none",
              label=f"{method}: paper-formula ε (NOT a guarantee)")
      finite_epsilons += [e for e, _ in paper]
  if finite_epsilons:
    ax.set_xscale("log")
  ax.set_xlabel("ε (sound, dp_accounting)")
  ax.set_ylabel("student test accuracy")
  deltas = sorted({r.delta for r in runs if math.isfinite(r.delta) and r.delta > 0})
  delta_text = ", ".join(f"{d:g}" for d in deltas) or "n/a"
  ax.set_title(title or f"privacy–utility (δ = {delta_text})")
  ax.grid(True, which="both", alpha=0.3)
  # Outside the axes: sweeps have many entries, which would hide the points.
  ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
  fig.savefig(out_path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return out_path


_ANCHOR_MARKERS = ("s", "^", "v", "p", "h", "*")
_ACCURACY_TICKS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)


def _frontier_lines(ax, rows, grid, anchors, palette) -> None:
  """One step line per setting (best at or below each grid ε), its anchors hollow."""
  from dpkd_jax.train import frontier  # pylint: disable=g-import-not-at-top
  anchor_index = 0
  for index, setting in enumerate(frontier.SETTINGS):
    color = palette[index % len(palette)]
    cells = [(eps, p) for eps, p in zip(grid, rows.get(setting.key, ())) if p is not None]
    if cells:
      # Best-at-or-below is a step function of ε: it holds from a grid ε to the next.
      ax.plot([e for e, _ in cells], [p.accuracy for _, p in cells], "-", color=color,
              drawstyle="steps-post", label=setting.label)
      for single, marker in ((True, "D"), (False, "o")):
        chosen = [(e, p.accuracy) for e, p in cells if p.single_seed == single]
        if chosen:
          ax.plot(*zip(*chosen), marker, color=color, linestyle="none")
    for anchor in (a for a in anchors if a.setting == setting.key):
      marker = _ANCHOR_MARKERS[anchor_index % len(_ANCHOR_MARKERS)]
      anchor_index += 1
      ax.plot([anchor.epsilon], [anchor.accuracy], marker, mfc="none", mew=1.5, ms=9,
              color=color, linestyle="none",
              label=f"anchor: {anchor.label} (ε {anchor.epsilon:g})")


def plot_frontier(rows, out_path: str, *, grid: Sequence[float], anchors=(),
                  paper_points=(), title: str | None = None) -> str:
  """Draws the sound frontier of one dataset (`dpkd_jax.train.frontier`) and writes a PNG.

  Args:
    rows: {setting key: best point (or None) at or below each ε of `grid`}
      (`frontier.frontier(...)[dataset]`).
    out_path: the PNG to write (its directory must exist).
    grid: the ε of the frontier (x ticks).
    anchors: `frontier.Anchor`s of the dataset: hollow markers, never on a line.
    paper_points: paper-accounting runs at their paper's ε: grey crosses marked NOT a
      guarantee, never on a line.
    title: figure title.

  Returns:
    `out_path`.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # Headless: CI and notebooks on machines without a display.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(7.2, 4.6))
  palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  _frontier_lines(ax, rows, grid, anchors, palette)
  if paper_points:
    ax.plot([p.epsilon for p in paper_points], [p.accuracy for p in paper_points], "x",
            color="0.5", linestyle="none",
            label="paper-accounting run at its paper's ε (NOT a guarantee)")
  handles, _ = ax.get_legend_handles_labels()
  points = [p for row in rows.values() for p in row if p is not None]
  handles += [Line2D([], [], marker=m, color="0.3", linestyle="none", label=text)
              for m, text, present in (("D", "single seed", any(p.single_seed for p in points)),
                                       ("o", "mean of several seeds",
                                        any(not p.single_seed for p in points)))
              if present]
  ax.set_xscale("log")
  ax.set_xticks(list(grid))
  ax.set_xticklabels([f"{e:g}" for e in grid])
  ax.set_xlim(min(grid) * 0.7, max(grid) * 1.4)
  ax.set_xlabel("sound ε (dp_accounting; a run counts at every ε ≥ its own)")
  # Logit scale: 0.95 and 0.99 are far apart (as are 0.1 and 0.3) instead of squeezed at the top.
  ax.set_yscale("logit")
  low, high = ax.get_ylim()
  low, high = min(low, 0.05), max(high, 0.99)  # the same span for every dataset, and ticks
  ax.set_ylim(low, high)
  ticks = [t for t in _ACCURACY_TICKS if low <= t <= high]
  ax.set_yticks(ticks)
  ax.set_yticklabels([f"{t:g}" for t in ticks])
  ax.set_ylabel("best student test accuracy (logit scale)")
  ax.set_title(title or "sound privacy–utility frontier")
  ax.minorticks_off()
  ax.grid(True, alpha=0.3)
  # Outside the axes: the anchors' entries would hide the points.
  ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
  fig.savefig(out_path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return out_path
