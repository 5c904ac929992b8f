"""The run report: `<workdir>/report.md`, with its figures beside it, for every method.

`write_report(workdir)` (called by `outputs.finish_run` at the end of every run, and by
`python -m experiments.results report --run=<workdir>`) reads only the run's files:

  results.json, record.json     the summary table (released figures: accuracy, sound ε with
                                δ and relation, the paper's figure marked NOT a guarantee)
  metrics.csv                   report_curves.png: every released curve, one panel per name
  privacy_ledger.json           report_privacy.png: the sound ε spent over the steps (the
                                ledger's ε logged in metrics.csv where the method logs it,
                                else recomputed from the ledger's events), its budget
  samples.png                   the synthetic sample grid, where the method draws one
  docs/results/*.json           report_privacy_utility.png: this run's point
                                (`plotting.plot_privacy_utility`) beside the committed records
                                of the same dataset, when the checkout has them

Private diagnostics (results.json's "private_diagnostics": noiseless functions of private data
or of the non-private teacher, e.g. a tuning run's validation accuracy) appear only in the last
section, every value marked PRIVATE and not covered by ε; private_diagnostics.csv is named, never
plotted, and a private metric (`released_fields.is_private_metric`) is never a curve.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from typing import Any, Sequence

from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax import plotting
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import records
from dpkd_jax.train import released_fields

FILE_NAME = "report.md"
CURVES_PNG, PRIVACY_PNG, UTILITY_PNG = ("report_curves.png", "report_privacy.png",
                                        "report_privacy_utility.png")
PRIVATE_KEY = released_fields.PRIVATE_KEY
_REPO_RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "results")
_MAX_LEDGER_POINTS = 20  # ε recomputed from the ledger at most this many times


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # headless: CI, notebooks, remote machines
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _fmt(value: Any) -> str:
  if value is None:
    return "—"
  if value == "inf" or (isinstance(value, float) and math.isinf(value)):
    return "∞"
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def _read_json(path: str) -> dict[str, Any] | None:
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      payload = json.load(f)  # reads the Infinity that runs write for ε = ∞
  except ValueError as error:  # not UTF-8 (UnicodeDecodeError) or not JSON
    raise errors.UserError(f"{path} is not readable JSON ({type(error).__name__}: "
                           f"{str(error)[:120]}); rerun or restore the run") from error
  if not isinstance(payload, dict):
    raise errors.UserError(f"{path} holds {type(payload).__name__}, not a JSON object; rerun "
                           "or restore the run")
  return payload


def summary_rows(results: dict[str, Any], record: dict[str, Any] | None) -> list[str]:
  """The summary table: released figures only (record.json's fields where it exists)."""
  fields = plotting.METHOD_FIELDS.get(results.get("method"), plotting.MethodFields())
  rec = record or {}
  dataset = rec.get("dataset") or results.get("config", {}).get("dataset")
  rows = [("method", results.get("method")), ("dataset", dataset),
          ("student test accuracy", rec.get("test_accuracy", results.get(fields.accuracy))),
          ("sound ε (dp_accounting)", rec.get("sound_epsilon", results.get(fields.epsilon))),
          ("δ", rec.get("delta", results.get("delta"))),
          ("neighbouring relation", rec.get("neighbouring")),
          ("accounting that chose the noise", rec.get("accounting"))]
  paper = rec.get("paper_epsilon")
  if paper is not None:
    rows.append(("paper-formula ε (NOT a valid guarantee)", paper))
  rows += [("warnings", "; ".join(results.get("warnings", [])) or "none"),
           ("command", f"`{rec['command']}`" if rec.get("command") else None),
           ("commit", rec.get("commit")), ("CPU / wall seconds",
           f"{_fmt(rec.get('cpu_seconds'))} / {_fmt(rec.get('wall_seconds'))}")]
  cell = lambda v: _fmt(v).replace("|", "\\|")  # noqa: E731  (a `|` would end the cell)
  return ["| field | value |", "| --- | --- |"] + [f"| {k} | {cell(v)} |" for k, v in rows]


def released_series(series: dict[str, list[tuple[int, float]]]
                    ) -> dict[str, list[tuple[int, float]]]:
  """The curves of metrics.csv that may be plotted: non-empty and not a private metric
  (`released_fields.is_private_metric`; a run written before the metrics writer sent them to
  private_diagnostics.csv may still hold "validation/accuracy" in metrics.csv)."""
  return {k: v for k, v in series.items() if v and not released_fields.is_private_metric(k)}


def plot_curves(series: dict[str, list[tuple[int, float]]], out_path: str) -> str:
  """One panel per metrics.csv name (value against step); writes `out_path`."""
  plt = _pyplot()
  names = sorted(series)
  cols = min(3, len(names))
  rows = math.ceil(len(names) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.0 * cols, 2.6 * rows), squeeze=False)
  for ax, name in zip(axes.flat, names):
    steps, values = zip(*sorted(series[name]))
    ax.plot(steps, values, ".-" if len(steps) < 50 else "-")
    ax.set_title(name, fontsize="small")
    ax.set_xlabel("step", fontsize="small")
    ax.grid(True, alpha=0.3)
  for ax in list(axes.flat)[len(names):]:
    ax.axis("off")
  height = 2.6 * rows  # inches; fixed margins (tight_layout draws the figure twice)
  fig.subplots_adjust(left=0.08, right=0.98, bottom=0.45 / height, top=1 - 0.3 / height,
                      hspace=0.7, wspace=0.3)
  fig.savefig(out_path, dpi=80)
  plt.close(fig)
  return out_path


def ledger_series(ledger_json: dict[str, Any]) -> list[tuple[int, float]]:
  """(step, sound ε spent once the charge at that step is made) from a ledger file's events;
  at most `_MAX_LEDGER_POINTS` prefixes are recomputed (the last one always)."""
  entries = ledger_json.get("entries", [])
  events = [ledger_lib.event_from_dict(e["event"]) for e in entries]
  count = len(events)
  stride = max(1, math.ceil(count / _MAX_LEDGER_POINTS))
  ends = sorted({*range(stride, count + 1, stride), count} - {0})
  return [(int(entries[n - 1]["step"]), accounting.epsilon(
      dp_event.ComposedDpEvent(events[:n]), delta=ledger_json["delta"],
      accountant=ledger_json.get("accountant", "pld"))) for n in ends]


def privacy_series(workdir: str, results: dict[str, Any],
                   series: dict[str, list[tuple[int, float]]]) -> tuple[list, str]:
  """(step, ε spent) of the run and where they come from; ([], why) if there are none."""
  fields = plotting.METHOD_FIELDS.get(results.get("method"), plotting.MethodFields())
  logged = [(s, v) for s, v in series.get(fields.trajectory_epsilon or "", [])
            if math.isfinite(v)]
  if logged:
    return logged, f"the ledger's ε logged in metrics.csv (`{fields.trajectory_epsilon}`)"
  ledger_json = _read_json(os.path.join(workdir, "privacy_ledger.json"))
  if ledger_json and ledger_json.get("entries"):
    return ledger_series(ledger_json), "recomputed from the events of privacy_ledger.json"
  return [], "no privacy ledger in this run (no noisy release was charged)"


def plot_privacy(points: Sequence[tuple[int, float]], budget: float | None,
                 out_path: str) -> str:
  """The sound ε spent against the step, with the ledger's budget; writes `out_path`."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(5.6, 3.4))
  steps, eps = zip(*points)
  ax.plot(steps, eps, "o-", label="sound ε spent")
  if budget is not None and math.isfinite(budget):
    ax.axhline(budget, linestyle="--", color="gray", label=f"budget ε = {budget:.4g}")
  ax.set_xlabel("step")
  ax.set_ylabel("ε (dp_accounting)")
  ax.set_ylim(bottom=0)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize="small")
  fig.subplots_adjust(bottom=0.15, left=0.12)
  fig.savefig(out_path, dpi=80)
  plt.close(fig)
  return out_path


def committed_runs(results_dir: str | None, dataset: str | None
                   ) -> tuple[list[plotting.RunSummary], list[str]]:
  """The committed student records of `dataset` in `results_dir`, as plot points, and the
  names of unreadable ones (teacher records are not students: left out)."""
  runs, unreadable = [], []
  if not results_dir or not dataset or not os.path.isdir(results_dir):
    return runs, unreadable
  for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
    name = os.path.splitext(os.path.basename(path))[0]
    try:
      rec = records.read_record(path)
    except errors.UserError:
      unreadable.append(name)
      continue
    if (rec["dataset"] != dataset or rec["method"] == "teacher"
        or rec["test_accuracy"] is None):
      continue
    paper = rec["paper_epsilon"]
    runs.append(plotting.RunSummary(
        label=name, method=rec["method"], epsilon=float(rec["sound_epsilon"]),
        accuracy=rec["test_accuracy"], delta=rec["delta"],
        paper_epsilon=None if paper in (None, "inf") else float(paper), trajectory=()))
  return runs, unreadable


def _utility_section(workdir: str, dataset: str | None, results_dir: str | None) -> list[str]:
  try:
    this = plotting.load_run(workdir)
  except ValueError as error:  # e.g. a method without an accuracy
    return [f"No point for this run ({error})."]
  this = dataclasses.replace(this, method=f"{this.method} (this run)")
  others, unreadable = committed_runs(results_dir, dataset)
  plotting.plot_privacy_utility([this, *others], os.path.join(workdir, UTILITY_PNG),
                                trajectories=True, paper_epsilon=True,
                                title=f"{dataset}: this run and {len(others)} committed records")
  where = (f"the {len(others)} committed records of {dataset} in docs/results/" if others
           else "no committed record of this dataset (docs/results/ not found or none match)")
  lines = [f"![privacy-utility]({UTILITY_PNG})", "",
           f"This run's sound ε and accuracy (ε = ∞ is a dashed line) beside {where}; "
           "hollow markers are the papers' own figures, NOT guarantees."]
  if unreadable:
    lines.append(f"Unreadable records skipped: {', '.join(unreadable)}.")
  return lines


def private_lines(results: dict[str, Any]) -> list[str]:
  """The private diagnostics, every value marked PRIVATE (none: a line saying so)."""
  section = results.get(PRIVATE_KEY, {})
  note = section.get("_note", "NOT covered by epsilon, do not publish")
  values = {k: v for k, v in section.items() if k not in ("_note", "files")}
  if not values and not section.get("files"):
    return ["This run recorded no private diagnostic."]
  lines = [f"> **PRIVATE, not covered by ε: {note}.** Remove this section before sharing "
           "the report.", ""]
  lines += [f"- PRIVATE `{k}`: {json.dumps(v)}" for k, v in values.items()]
  lines += [f"- PRIVATE file (not plotted): `{f}`" for f in section.get("files", [])]
  return lines


def _section(title: str, body: list[str]) -> list[str]:
  return ["", f"## {title}", "", *body]


def write_report(workdir: str, *, results_dir: str | None = _REPO_RESULTS) -> str:
  """Writes `<workdir>/report.md` and its PNGs (module docstring); returns the path.

  Args:
    workdir: a finished run's directory (holds results.json).
    results_dir: the committed records to place the run among (None: none).

  Raises:
    errors.UserError: `workdir` holds no results.json (not a finished run).
  """
  results = _read_json(os.path.join(workdir, "results.json"))
  if results is None:
    raise errors.UserError(f"{workdir!r} has no results.json: give the workdir of a finished "
                           "run")
  record = _read_json(os.path.join(workdir, "record.json"))
  dataset = (record or {}).get("dataset") or results.get("config", {}).get("dataset")
  metrics_path = os.path.join(workdir, "metrics.csv")
  series = metrics_lib.read_metrics(workdir) if os.path.isfile(metrics_path) else {}
  series = released_series(series)
  lines = [f"# Run report: {results.get('method', 'run')} on {dataset}", "",
           f"`{workdir}`. Released figures only, except the last section (PRIVATE)."]
  lines += _section("Summary", summary_rows(results, record))
  curves = ["No metrics.csv in this run."]
  if series:
    plot_curves(series, os.path.join(workdir, CURVES_PNG))
    curves = [f"![learning curves]({CURVES_PNG})", "",
              "From metrics.csv (released quantities only)."]
  lines += _section("Learning curves", curves)
  points, source = privacy_series(workdir, results, series)
  ledger_json = _read_json(os.path.join(workdir, "privacy_ledger.json")) or {}
  budget = ledger_json.get("target_epsilon")
  privacy = [source + "."]
  if points:
    plot_privacy(points, budget, os.path.join(workdir, PRIVACY_PNG))
    privacy = [f"![privacy spent]({PRIVACY_PNG})", "",
               f"Sound ε spent over the steps: {source}; δ = {_fmt(ledger_json.get('delta'))}"
               f", {ledger_json.get('relation') or 'relation as in the summary'}, budget "
               f"{_fmt(budget)}, {ledger_json.get('num_entries', '?')} charges."]
  lines += _section("Privacy spent", privacy)
  if os.path.isfile(os.path.join(workdir, "samples.png")):
    lines += _section("Synthetic samples", [
        "![samples](samples.png)", "", "Generator outputs: post-processing of the noisy "
        "releases, covered by the run's ε."])
  lines += _section("Privacy–utility", _utility_section(workdir, dataset, results_dir))
  lines += _section("Private diagnostics (NOT covered by ε)", private_lines(results))
  path = os.path.join(workdir, FILE_NAME)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return path
