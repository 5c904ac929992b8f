"""Tables of docs/RESULTS.md and the paper-tables notebook's data, generated from records.

Every reported run is one JSON record in docs/results/ (`dpkd_jax.train.records`). A table in a
Markdown file sits between two markers; the begin marker holds the row template, the two lines
after it (header and `| --- |` separator) are hand-written and kept, and every row below them
is generated:

  <!-- results-table:NAME begin | {name} | {sound_epsilon} | {test_accuracy:b} | -->
  | run | sound ε | test accuracy |
  | --- | --- | --- |
  ...generated rows...
  <!-- results-table:NAME end -->

A template line without `@` is repeated for every record whose `tables` maps NAME to a row
position, in that order. A template line whose placeholders name records (`{@record.key}`,
record = file name without .json) is rendered once: pivot tables, one line per line of the
begin comment. A placeholder `{key:flags}` looks `key` up in the record: first
`text["NAME/key"]`, then `text[key]` (labels, written as they are, flags ignored), then
`columns[key]`, then the record's own field; `{ref>key}` follows `ref` to another record and
`{a|b}` takes the first of `a`, `b` that is not null. `{private_diagnostics.key}` reads the
record's private block (a noiseless statistic, NOT covered by ε: its column says PRIVATE); no
other placeholder does.
Flags: `,` thousands separators, `b` bold if "NAME/key" is in the record's `bold` list, `B` always
bold, `L` bold the last element of a list, `/` `;` `p` join a list with " / ", ", " or table
cells, `` ` `` code span, `D` dataset display name, `?` empty (not "—") when missing or null,
`_` a leading space when not empty, `e` a number of at least 1e5 as "7.9·10²²". A test
accuracy is followed by the mark of its record's `selection` (`SELECTION_MARKS`: ᵗ chosen by
test accuracy, ᵛ on a validation hold-out, ᵖ a paper's recipe).

Numbers are read with `decimal.Decimal`, so a figure is written with exactly the digits of its
record (0.4670 stays 0.4670); floats of a run's own record (more than 6 significant digits, as
a run writes them) are rounded to 4 significant digits.
"""

from __future__ import annotations

import decimal
import glob
import json
import math
import os
import re
from typing import Any

from dpkd_jax.errors import UserError
from dpkd_jax.train import records as records_lib
from dpkd_jax.train import released_fields

Record = dict[str, Any]

_TABLE = re.compile(r"<!-- results-table:(?P<name>[\w.:-]+) begin(?P<template>.*?)-->\n"
                    r"(?P<body>.*?)<!-- results-table:(?P=name) end -->", re.S)
_PLACEHOLDER = re.compile(r"\{(?P<key>[^{}:]+)(?::(?P<flags>[^{}]*))?\}")
_DATASETS = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "digits": "digits",
             "cifar10": "CIFAR-10"}
_JOINS = {"/": " / ", ";": ", ", "p": " | "}
# `{private_diagnostics.KEY}`: a value of the record's private block (NOT covered by ε); a
# table that shows one labels its column PRIVATE. No other placeholder reads that block.
_PRIVATE_PREFIX = released_fields.PRIVATE_KEY + "."
DATASET_NAMES = _DATASETS  # display names, for other generated docs (train/frontier_doc)
# After every test accuracy: how its row was selected (the record's `selection`; "none", a
# run that selected nothing, has no mark). The legend is SELECTION_LEGEND.
SELECTION_MARKS = {"test": "ᵗ", "validation": "ᵛ", "paper_recipe": "ᵖ"}
SELECTION_LEGEND = ("ᵗ = settings chosen by test accuracy (the figure is optimistic), ᵛ = chosen "
                    "on a validation hold-out, ᵖ = a paper's fixed recipe; no mark = nothing "
                    "selected")


def load_records(directory: str,
                 recipes: dict[str, str] | None = None) -> dict[str, Record]:
  """{file stem: record} of every `*.json` in `directory`, numbers as `Decimal`.

  `recipes`: {record name: the recipe command that reproduces it} (`configs.record_commands`):
  such a record's `command` placeholder shows that command (`RECIPE_KEY`), its own stays in
  the file.
  """
  found = {}
  for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
    record = records_lib.read_record(path, parse_float=decimal.Decimal)
    tables = record.get("tables", {})
    if not isinstance(tables, dict) or not all(isinstance(v, int) for v in tables.values()):
      raise UserError(f"{path}: tables must map table names to row positions (integers)")
    name = os.path.splitext(os.path.basename(path))[0]
    if recipes and name in recipes:
      record[RECIPE_KEY] = recipes[name]
    found[name] = record
  return found


RECIPE_KEY = "recipe_command"  # in memory only: the command of the recipe file of a record


def command(record: Record) -> str:
  """The command the docs show for `record`: its recipe's, else the recorded one."""
  return record.get(RECIPE_KEY) or record["command"]


class _Missing(Exception):
  pass


def _lookup(record: Record, table: str, key: str) -> tuple[Any, bool]:
  """(value, is_label) of `key` for `table`; raises _Missing."""
  if key.startswith(_PRIVATE_PREFIX):  # only where the template names the private block
    private = record.get(released_fields.PRIVATE_KEY, {})
    if key[len(_PRIVATE_PREFIX):] not in private:
      raise _Missing(key)
    return private[key[len(_PRIVATE_PREFIX):]], False
  text = record.get("text", {})
  for name in (f"{table}/{key}", key):
    if name in text:
      return text[name], True
  columns = record.get("columns", {})
  if key in columns:
    return columns[key], False
  if key == "command" and RECIPE_KEY in record:
    return record[RECIPE_KEY], False
  if key in record:
    return record[key], False
  block, _, field = key.partition(".")  # a field of a block the run wrote (e.g. audit.auroc)
  if field and isinstance(record.get(block), dict) and field in record[block]:
    return record[block][field], False
  raise _Missing(key)


# More significant digits than any figure typed into a record: a float a run wrote itself.
_TYPED_DIGITS = 6


def _number(value: Any, grouping: bool) -> str:
  """Exactly the record's digits for Decimal / int; 4 significant digits for a run's float."""
  if value == "inf" or (isinstance(value, float) and math.isinf(value)):
    return "∞"
  if isinstance(value, decimal.Decimal) and len(value.as_tuple().digits) > _TYPED_DIGITS:
    value = float(value)  # a run's full-precision float, read from its record file
  if isinstance(value, float):
    value = decimal.Decimal(f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}")
  text = str(value) if isinstance(value, int) else format(value, "f")
  sign, text = ("−", text[1:]) if text.startswith("-") else ("", text)
  if grouping:
    whole, dot, frac = text.partition(".")
    text = f"{int(whole):,}" + dot + frac
  return sign + text


def format_number(value: Any) -> str:
  """A record's number as the tables print it: its own digits (4 significant for a run's
  full-precision float), ∞ for "inf"."""
  return _number(value, False)


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _power_of_ten(value: Any) -> str | None:
  """`value` as "7.9·10²²" when it is at least 1e5 (flag `e`), else None."""
  if value == "inf" or abs(float(value)) < 1e5 or math.isinf(float(value)):
    return None
  mantissa, exponent = f"{float(value):.1e}".split("e")
  return f"{mantissa}·10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _scalar(value: Any, flags: str, bold: bool) -> str:
  if value is None:
    return "—"
  if isinstance(value, (int, float, decimal.Decimal)) or value == "inf":
    text = ("e" in flags and _power_of_ten(value)) or _number(value, "," in flags)
  else:
    text = _DATASETS.get(value, value) if "D" in flags else str(value)
  if "`" in flags:
    text = f"`{text}`"
  return f"**{text}**" if bold else text


def _format(value: Any, flags: str, bold: bool) -> str:
  """One placeholder's text (see the module docstring for the flags)."""
  if isinstance(value, list):
    parts = [_scalar(v, flags, bold or ("L" in flags and i == len(value) - 1 and v is not None))
             for i, v in enumerate(value)]
    joiner = next((j for f, j in _JOINS.items() if f in flags), None)
    if joiner is None:
      raise ValueError("a list value needs a join flag (/ ; p) in its placeholder")
    return joiner.join(parts)
  return _scalar(value, flags, bold)


def _resolve(key: str, table: str, record: Record | None,
             records: dict[str, Record]) -> tuple[Any, bool, Record, str]:
  """(value, is_label, record, key) of a placeholder key: `@record.key`, `ref>key`, `a|b` (the
  first not null); the record and key are those the value came from."""
  if key.startswith("@"):  # a record name may hold dots (eps0.1): the longest known name
    name, _, key = key[1:].partition(".")
    for dot in [i for i, c in enumerate(key) if c == "."]:
      if f"{name}.{key[:dot]}" in records:
        name, key = f"{name}.{key[:dot]}", key[dot + 1:]
    if name not in records:
      raise UserError(f"table {table}: no record docs/results/{name}.json")
    record = records[name]
  if ">" in key:
    ref, _, key = key.partition(">")
    target, _ = _lookup(record, table, ref)
    if not isinstance(target, str) or target not in records:
      raise _Missing(f"{ref} (names no record: {target!r})")
    record = records[target]
  found = None
  for alternative in key.split("|"):
    try:
      found = (*_lookup(record, table, alternative), record, alternative)
    except _Missing:
      continue
    if found[0] is not None:
      return found
  if found is None:
    raise _Missing(key)
  return found


def _placeholder(match: re.Match, table: str, record: Record | None,
                 records: dict[str, Record]) -> str:
  key, flags = match["key"].strip(), match["flags"] or ""
  try:
    value, is_label, source, key = _resolve(key, table, record, records)
  except _Missing:
    if "?" in flags:
      return ""
    raise
  if is_label:
    text = str(value)
  elif value is None and "?" in flags:
    text = ""
  else:
    bold = "B" in flags or ("b" in flags and f"{table}/{key}" in source.get("bold", []))
    text = _format(value, flags, bold)
    if key == "test_accuracy" and value is not None:  # how the row was chosen
      text += SELECTION_MARKS.get(source.get("selection"), "")
  return " " + text if "_" in flags and text else text


def _fill(line: str, table: str, record: Record | None, records: dict[str, Record],
          where: str) -> str:
  try:
    return _PLACEHOLDER.sub(lambda m: _placeholder(m, table, record, records), line)
  except _Missing as e:
    raise UserError(f"{where}: lacks `{e}`, needed by table {table} (add it to the record's "
                    "columns or text, or mark the placeholder optional with ?)") from None
  except UserError:
    raise
  except ValueError as e:  # a list placeholder without a join flag
    raise UserError(f"{where}, table {table}: {e}") from None


def table_records(records: dict[str, Record], table: str) -> list[tuple[str, Record]]:
  """(name, record) of the rows of `table`, in row order."""
  rows = [(r["tables"][table], name, r) for name, r in records.items()
          if table in r.get("tables", {})]
  positions = [p for p, _, _ in rows]
  if len(set(positions)) != len(positions):
    clash = sorted(n for p, n, _ in rows if positions.count(p) > 1)
    raise UserError(f"table {table}: records {clash} claim the same row position")
  return [(name, r) for _, name, r in sorted(rows, key=lambda t: t[0])]


def render_table(name: str, template: str, records: dict[str, Record]) -> list[str]:
  """The generated rows of table `name` from its template lines."""
  lines = [t.strip() for t in template.strip().splitlines() if t.strip()]
  out = []
  for line in lines:
    if "{@" in line:
      out.append(_fill(line, name, None, records, f"table {name}"))
    else:
      rows = table_records(records, name)
      if not rows:
        raise UserError(f"table {name}: no record in docs/results/ lists it in `tables`")
      out += [_fill(line, name, r, records, f"docs/results/{n}.json") for n, r in rows]
  return out


def render_markdown(text: str, records: dict[str, Record]) -> tuple[str, list[str]]:
  """(`text` with every marked table regenerated, the table names found)."""
  names = []

  def replace(match: re.Match) -> str:
    name = match["name"]
    names.append(name)
    head = match["body"].split("\n")[:2]
    if len(head) < 2 or not head[1].startswith("|"):
      raise UserError(f"table {name}: the begin marker must be followed by a header line and a "
                      "| --- | separator line")
    body = render_table(name, match["template"], records)
    return (f"<!-- results-table:{name} begin{match['template']}-->\n" + "\n".join(head + body)
            + f"\n<!-- results-table:{name} end -->")

  new = _TABLE.sub(replace, text)
  begun = re.findall(r"<!-- results-table:([\w.:-]+) begin", text)
  unended = sorted(set(begun) - set(names))
  if unended:
    raise UserError(f"tables {unended}: a begin marker without its "
                    "`<!-- results-table:NAME end -->`")
  return new, names


def _plain(value: Any) -> Any:
  """JSON-ready copy: Decimal -> float."""
  if isinstance(value, decimal.Decimal):
    return float(value)
  if isinstance(value, list):
    return [_plain(v) for v in value]
  return value


def render_notebook_data(data: dict[str, Any], records: dict[str, Record]) -> dict[str, Any]:
  """`data` (dpkd_jax/resources/paper_results.json) with every table's `rows` regenerated.

  Each table maps the notebook's row fields to record keys in `row_fields` (a key ending in
  `?` is left out of a row whose record lacks it); its rows are the records listing
  `notebook:<id>` in `tables`.
  """
  out = dict(data)
  out["tables"] = []
  for table in data["tables"]:
    name = f"notebook:{table['id']}"
    rows = []
    for rec_name, record in table_records(records, name):
      row = {}
      for field, key in table["row_fields"].items():
        try:
          row[field] = _plain(_lookup(record, name, key.rstrip("?"))[0])
        except _Missing:
          if key.endswith("?"):
            continue
          raise UserError(f"docs/results/{rec_name}.json: lacks `{key}`, needed by the "
                          f"notebook table {table['id']}") from None
      rows.append(row)
    out["tables"].append({**table, "rows": rows})
  return out


def notebook_json(data: dict[str, Any]) -> str:
  """The file text of the notebook data: one row per line, so a diff shows the changed run."""
  head = {k: v for k, v in data.items() if k != "tables"}
  lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},"
                   for k, v in head.items()]
  lines.append('  "tables": [')
  for i, table in enumerate(data["tables"]):
    meta = {k: v for k, v in table.items() if k != "rows"}
    lines.append("    " + json.dumps(meta, ensure_ascii=False)[:-1] + ', "rows": [')
    rows = [json.dumps(r, ensure_ascii=False) for r in table["rows"]]
    lines += [f"      {r}," for r in rows[:-1]] + [f"      {r}" for r in rows[-1:]]
    lines.append("    ]}" + ("," if i < len(data["tables"]) - 1 else ""))
  return "\n".join(lines + ["  ]", "}"]) + "\n"


def unused_tables(records: dict[str, Record], rendered: set[str]) -> list[str]:
  """'record: table' for every table a record lists that no rendered file holds."""
  return sorted(f"{n}: {t}" for n, r in records.items() for t in r.get("tables", {})
                if t not in rendered)


def render_files(results_dir: str, markdown_paths: list[str], notebook_path: str | None,
                 recipes: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
  """{path: (current text, text generated from the records)} of every generated file.

  Raises UserError when a record lists a table that none of the files holds (a typo in
  `tables`, or a table deleted from the docs while its records stayed).
  """
  records = load_records(results_dir, recipes)
  if not records:
    raise UserError(f"{results_dir}: no results records (*.json)")
  out, rendered = {}, set()
  for path in markdown_paths:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    new, names = render_markdown(text, records)
    out[path] = (text, new)
    rendered.update(names)
  if notebook_path is not None:
    with open(notebook_path, encoding="utf-8") as f:
      text = f.read()
    data = json.loads(text)
    out[notebook_path] = (text, notebook_json(render_notebook_data(data, records)))
    rendered.update(f"notebook:{t['id']}" for t in data["tables"])
  orphans = unused_tables(records, rendered)
  if orphans:
    raise UserError(f"records list tables that no generated file holds: {', '.join(orphans)}")
  return out
