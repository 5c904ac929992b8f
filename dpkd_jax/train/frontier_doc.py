"""The generated part of docs/CHOOSING.md: the frontier (`dpkd_jax.train.frontier`) as advice.

The file's hand-written text stays; everything between the two markers

  <!-- frontier:begin ... -->
  ...generated...
  <!-- frontier:end -->

is rewritten by `render_doc` (called by `python -m experiments.plot frontier`): per dataset,
the table ε x setting -> best method, accuracy, sound ε and record; the commands of those
records; the published anchors; and how many records are not frontier points, and why.
Numbers keep their record's digits (`records_tables.format_number`). The output depends only
on the records, so regenerating without a new record changes nothing.
"""

from __future__ import annotations

import re
from typing import Sequence

from dpkd_jax.errors import UserError
from dpkd_jax.train import frontier as frontier_lib
from dpkd_jax.train import records_tables

BEGIN = ("<!-- frontier:begin (generated from docs/results/*.json by "
         "`python -m experiments.plot frontier`; edit the text outside these markers) -->")
END = "<!-- frontier:end -->"
_BLOCK = re.compile(r"<!-- frontier:begin[^\n]*-->\n.*?<!-- frontier:end -->", re.S)
SINGLE_SEED_MARK = "¹"


def _eps_text(eps: float) -> str:
  return f"{eps:g}"


def delta_text(delta: float) -> str:
  """δ as 1e-5 rather than Python's 1e-05."""
  return f"{delta:g}".replace("e-0", "e-")


def _cell(point: frontier_lib.Point | None) -> str:
  if point is None:
    return "—"
  r = point.record
  seed = SINGLE_SEED_MARK if point.single_seed else ""
  # ε 0: a reference run that never queries the private data or teachers.
  none = " (no private query)" if point.epsilon == 0 else ""
  mark = records_tables.SELECTION_MARKS.get(r.get("selection"), "")
  return (f"**{records_tables.format_number(r['test_accuracy'])}**{mark}{seed} "
          f"{frontier_lib.METHOD_LABELS[point.method]}, ε "
          f"{records_tables.format_number(r['sound_epsilon'])}{none}: `{point.name}`")


# A record's `selection` in words (the commands table's "selected on" column).
_SELECTED_ON = {"test": "test split", "validation": "validation hold-out",
                "paper_recipe": "paper's recipe", "none": "nothing selected"}


def _code(text: str) -> str:
  # A `|` inside a table cell ends the cell even in a code span, unless escaped.
  return "`" + text.replace("|", "\\|") + "`"


def _best_table(rows: dict[str, tuple[frontier_lib.Point | None, ...]],
                grid: Sequence[float]) -> list[str]:
  keys = [s.key for s in frontier_lib.SETTINGS]
  lines = ["| ε ≤ | " + " | ".join(frontier_lib.setting_label(k) for k in keys) + " |",
           "| --- |" + " --- |" * len(keys)]
  for i, eps in enumerate(grid):
    lines.append(f"| {_eps_text(eps)} | " + " | ".join(_cell(rows[k][i]) for k in keys) + " |")
  return lines


def _commands_table(points: list[frontier_lib.Point]) -> list[str]:
  lines = ["| record | setting | method | sound ε (δ) | test accuracy | selected on | seeds | "
           "command |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for p in points:
    r = p.record
    seeds = "1" if p.single_seed else "several (mean)"
    eps = (f"{records_tables.format_number(r['sound_epsilon'])} "
           f"({records_tables.format_number(r['delta'])})")
    lines.append(
        f"| `{p.name}` | {frontier_lib.setting_label(p.setting)} | "
        f"{frontier_lib.METHOD_LABELS[p.method]} | {eps} | "
        f"{records_tables.format_number(r['test_accuracy'])} | "
        f"{_SELECTED_ON.get(r.get('selection'), 'not stated')} | {seeds} | "
        f"{_code(records_tables.command(r))} |")
  return lines


def _anchor_table(dataset: str) -> list[str]:
  anchors = frontier_lib.anchors_of(dataset)
  if not anchors:
    return ["No published anchor for this dataset."]
  lines = ["| setting | anchor | accuracy | ε (δ) | guarantee as published | source |",
           "| --- | --- | --- | --- | --- | --- |"]
  lines += [f"| {frontier_lib.setting_label(a.setting)} | {a.label} | {a.accuracy:g} | "
            f"{a.epsilon:g} ({delta_text(a.delta)}) | {a.guarantee} | {a.citation} |"
            for a in anchors]
  return lines


def _dataset_section(dataset: str, rows: dict[str, tuple[frontier_lib.Point | None, ...]],
                     records: dict[str, frontier_lib.Record], grid: Sequence[float],
                     image_dir: str) -> list[str]:
  name = records_tables.DATASET_NAMES.get(dataset, dataset)
  used = {p.name: p for row in rows.values() for p in row if p is not None}
  points = sorted(used.values(), key=lambda p: ([s.key for s in frontier_lib.SETTINGS]
                                                .index(p.setting), p.epsilon, p.name))
  image = f"{image_dir}/frontier_{dataset}.png" if image_dir else f"frontier_{dataset}.png"
  out = [f"### {name}", "", f"![{name}: sound privacy–utility frontier]({image})", "",
         f"Best sound test accuracy of a recorded run with sound ε ≤ the row's ε "
         f"(δ ≤ {delta_text(frontier_lib.DELTA)}, {frontier_lib.NEIGHBOURING}); "
         f"{SINGLE_SEED_MARK} = single seed; {records_tables.SELECTION_LEGEND}. A cell is "
         "itself a best-of by test accuracy over the recorded runs.", ""]
  out += _best_table(rows, grid) + [""]
  if points:
    out += [f"Commands of the {name} runs above (the recipe file's where one reproduces the "
            "run, else as recorded):", ""]
    out += _commands_table(points) + [""]
  out += [f"Published anchors for {name} (hollow markers in the plot; their own accounting "
          "and relation, NOT this library's sound figures):", ""]
  out += _anchor_table(dataset) + [""]
  left = frontier_lib.exclusion_counts(records, dataset)
  if left:
    out += [f"Records of {name} that are no frontier point: "
            + "; ".join(f"{n} × {reason}" for reason, n in left.items()) + ".", ""]
  return out


def render_block(records: dict[str, frontier_lib.Record], *, image_dir: str = "",
                 grid: Sequence[float] = frontier_lib.EPSILON_GRID) -> str:
  """The generated Markdown between the markers (markers included).

  Args:
    records: {name: record} of docs/results (`records_tables.load_records`).
    image_dir: the folder of the frontier PNGs relative to the document ('' : the same).
    grid: the ε rows.
  """
  table = frontier_lib.frontier(records, grid)
  lines = [BEGIN, ""]
  for dataset, rows in table.items():
    lines += _dataset_section(dataset, rows, records, grid, image_dir)
  return "\n".join(lines + [END])


def render_doc(text: str, records: dict[str, frontier_lib.Record], *, image_dir: str = "",
               path: str = "the document") -> str:
  """`text` with its generated block rewritten from `records`.

  Raises:
    UserError: `text` has no begin / end marker pair, or more than one.
  """
  found = _BLOCK.findall(text)
  if len(found) != 1:
    raise UserError(f"{path}: needs exactly one `<!-- frontier:begin -->` ... "
                    f"`{END}` block (found {len(found)}); restore the markers")
  return _BLOCK.sub(lambda _: render_block(records, image_dir=image_dir), text)
