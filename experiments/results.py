"""Results tables generated from records: `python -m experiments.results render [--check]`.

Every reported run is one JSON record in docs/results/ (schema: dpkd_jax/train/records.py).

  render            regenerates every marked table of the generated docs (DOCS: docs/RESULTS.md,
                    docs/SUPPORTING_RUNS.md, README.md's headline table, docs/privacy.md's
                    "Claimed and measured") and the rows of
                    dpkd_jax/resources/paper_results.json (the paper-tables notebook's data) from the records
  render --check    writes nothing; exits 1 if a generated file differs from its records
  publish           copies a finished run's <workdir>/record.json to docs/results/<name>.json,
                    with the paper's figures and the table rows it fills:
      python -m experiments.results publish --run=runs/dpdfd/mnist_dkd_600steps_eps10 --name=dpdfd__mnist__dkd_600steps_eps10 \\
          --paper_row="DPDFD Table 1, MNIST, eps=10" --paper_accuracy=0.9751 --table=dpdfd_table1_short
    then `render`. A table's row template (in its begin marker) names the keys a row needs;
    give the ones the run's record lacks with --column KEY=VALUE or --text KEY=VALUE.
  combine           one record for a run repeated over seeds (mean accuracy, spread), from
                    published seed records, which are then marked `seed_of` it (the frontier
                    plots the mean, never a lucky seed):
      python -m experiments.results combine --records=dpsgd__mnist__a_s0,dpsgd__mnist__a_s1,\
          dpsgd__mnist__a_s2 --name=dpsgd__mnist__a --table=dpsgd_full_scale
  attach            adds curves a run logged (metrics.csv) to its published record, so a
                    figure the text cites is read from the run, never typed:
      python -m experiments.results attach --name=dpdfd__mnist__dkd_600steps_eps10 \
          --curve=train/released_agreement   # the record's own run (its `source`)
    publish takes the same --curve. A curve is the column "curve:<metric>": [[step, value]].
  report --run=DIR  (re)writes DIR/report.md (`dpkd_jax.train.report`; every run writes one
                    when it finishes): curves, ε spent, samples, the run among the records
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import configs
from dpkd_jax.errors import UserError
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import records as records_lib
from dpkd_jax.train import records_tables
from dpkd_jax.train import report as report_lib
from experiments import _cli

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# The Markdown files whose marked tables `render` generates (relative to the repository root).
DOCS = ("docs/RESULTS.md", "docs/SUPPORTING_RUNS.md", "README.md", "docs/privacy.md")


def _render(a: argparse.Namespace) -> int:
  docs = a.doc or [os.path.join(_ROOT, path) for path in DOCS]
  files = records_tables.render_files(a.results_dir, docs, a.notebook_data or None,
                                      configs.record_commands())
  stale = [path for path, (old, new) in files.items() if old != new]
  for path in stale:
    if not a.check:
      with open(path, "w", encoding="utf-8") as f:
        f.write(files[path][1])
  rel = ", ".join(os.path.relpath(p) for p in stale) or "none"
  if a.check:
    print(f"stale: {rel}" + (" (run: python -m experiments.results render)" if stale else ""))
    return 1 if stale else 0
  print(f"written: {rel}")
  return 0


def _key_value(text: str, flag: str) -> tuple[str, object]:
  key, sep, value = text.partition("=")
  if not sep or not key:
    raise UserError(f"{flag} wants KEY=VALUE, got {text!r}")
  try:
    return key, json.loads(value)  # numbers, lists, null; anything else stays a string
  except json.JSONDecodeError:
    return key, value


def _table_position(spec: str, results_dir: str, replacing: str) -> tuple[str, int]:
  name, _, pos = spec.partition(":")
  if pos:
    if not pos.isdigit():
      raise UserError(f"--table wants NAME or NAME:POSITION, got {spec!r}")
    return name, int(pos)
  last = 0
  for other, record in records_tables.load_records(results_dir).items():
    if other != replacing:
      last = max(last, record.get("tables", {}).get(name, 0))
  return name, last + 1  # the row after the table's last one


def _add_curve(record: dict, run: str) -> None:
  """The run's test-accuracy curve (metrics.csv) as `accuracy_per_eval` / `eval_steps`, unless
  --column gave them: a curve in a table is then read from the run, never typed."""
  if not os.path.exists(os.path.join(run, "metrics.csv")):
    return
  curve = metrics_lib.read_metrics(run).get("test/accuracy", [])
  columns = record.setdefault("columns", {})
  if curve and "accuracy_per_eval" not in columns:
    columns["accuracy_per_eval"] = [round(acc, 4) for _, acc in curve]
    columns["eval_steps"] = [step for step, _ in curve]


def _add_logged_curves(record: dict, run: str, names: list[str]) -> None:
  """Each metric of `names` that the run logged, as the column "curve:<name>" of `record`:
  [[step, value rounded to 4 digits], ...] in the order of metrics.csv."""
  if not names:
    return
  logged = metrics_lib.read_metrics(run) if os.path.exists(
      os.path.join(run, "metrics.csv")) else {}
  for name in names:
    if name not in logged:
      raise UserError(f"--curve={name}: {run}/metrics.csv logs no such metric (it has: "
                      f"{', '.join(sorted(logged)) or 'none'})")
    record.setdefault("columns", {})["curve:" + name] = [
        [step, round(value, 4)] for step, value in logged[name]]


def _attach(a: argparse.Namespace) -> int:
  dest = os.path.join(a.results_dir, a.name + ".json")
  if not _NAME.match(a.name) or not os.path.exists(dest):
    raise UserError(f"--name={a.name!r}: no record {dest}")
  record = records_lib.read_record(dest)
  source = record.get("source")
  if not isinstance(source, str) or not source.endswith("record.json"):
    raise UserError(f"{dest} names no single run as its source (a combined record?): attach "
                    "curves to its seed records")
  run = os.path.dirname(source)
  _add_logged_curves(record, run if os.path.isabs(run) else os.path.join(a.root, run), a.curve)
  records_lib.write_record(dest, record)
  print(f"wrote {os.path.relpath(dest)}; now run: python -m experiments.results render")
  return 0


def _destination(a: argparse.Namespace) -> str:
  """docs/results/<--name>.json, after checking the name and that --force allows replacing."""
  if not _NAME.match(a.name):
    raise UserError(f"--name={a.name!r}: use letters, digits, '_', '.', '-' (e.g. "
                    "dpdfd__mnist__dkd_600steps_eps10)")
  dest = os.path.join(a.results_dir, a.name + ".json")
  if os.path.exists(dest) and not a.force:
    raise UserError(f"{dest} exists; pass --force to replace it")
  return dest


def _add_rows_and_labels(record: dict, a: argparse.Namespace) -> None:
  """The --table positions and the --column / --text entries of `a`, into `record`."""
  record["tables"] = dict(record.get("tables", {}))
  for spec in a.table:
    name, pos = _table_position(spec, a.results_dir, a.name)
    record["tables"][name] = pos
  for flag, field in (("column", "columns"), ("text", "text")):
    for item in getattr(a, flag):
      key, value = _key_value(item, "--" + flag)
      record.setdefault(field, {})[key] = value if field == "columns" else str(value)


def _publish(a: argparse.Namespace) -> int:
  dest = _destination(a)
  source = os.path.join(a.run, "record.json")
  record = records_lib.read_record(source)
  for field in ("paper_row", "paper_accuracy", "selection"):
    if getattr(a, field) is not None:
      record[field] = getattr(a, field)
  if a.paper_epsilon is not None:
    try:
      record["paper_epsilon"] = "inf" if a.paper_epsilon == "inf" else float(a.paper_epsilon)
    except ValueError:
      raise UserError(f"--paper_epsilon wants a number or inf, got {a.paper_epsilon!r}") from None
  _add_rows_and_labels(record, a)
  _add_curve(record, a.run)
  _add_logged_curves(record, a.run, a.curve)
  record.update(single_seed=record.get("single_seed", True), regenerated=True, source=source)
  try:
    records_lib.validate_record(record)
  except ValueError as e:
    raise UserError(f"{source} with the given paper fields: {e}") from e
  records_lib.write_record(dest, record)
  print(f"wrote {os.path.relpath(dest)}; now run: python -m experiments.results render")
  return 0


def _combine(a: argparse.Namespace) -> int:
  dest = _destination(a)
  names = [n for n in a.records.split(",") if n]
  seeds = {n: records_lib.read_record(os.path.join(a.results_dir, n + ".json")) for n in names}
  record = records_lib.combine_seeds(seeds, name=a.name)
  _add_rows_and_labels(record, a)
  record.update(regenerated=True, source=[f"docs/results/{n}.json" for n in names])
  records_lib.write_record(dest, record)
  for n, seed in seeds.items():  # the seeds point at their mean: no frontier point of their own
    records_lib.write_record(os.path.join(a.results_dir, n + ".json"), {**seed, "seed_of": a.name})
  print(f"wrote {os.path.relpath(dest)} (mean {record['test_accuracy']:.4f} ± "
        f"{record['columns']['accuracy_std']:.4f} over {len(names)} seeds); now run: "
        "python -m experiments.results render")
  return 0


def _report(a: argparse.Namespace) -> int:
  if not os.path.isdir(a.run):
    raise UserError(f"--run: {a.run!r} is not a directory; give a finished run's workdir")
  path = report_lib.write_report(a.run, results_dir=a.results_dir)
  print(f"wrote {path}")
  return 0


def _parser() -> argparse.ArgumentParser:
  p = _cli.Parser(prog="python -m experiments.results", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--results_dir", default=os.path.join(_ROOT, "docs", "results"),
                 help="the committed records (default: docs/results)")
  sub = p.add_subparsers(dest="command", required=True)
  r = sub.add_parser("render", help="regenerate the tables from the records")
  r.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
  r.add_argument("--doc", action="append", default=[],
                 help="a Markdown file to render (repeatable; default: every file of DOCS)")
  r.add_argument("--notebook_data",
                 default=os.path.join(_ROOT, "dpkd_jax", "resources", "paper_results.json"),
                 help="the paper-tables notebook's data ('' to skip)")
  u = sub.add_parser("publish", help="copy a run's record.json into the results records")
  u.add_argument("--run", required=True, help="the run's workdir (holds record.json)")
  u.add_argument("--name", required=True, help="record name: <method>__<dataset>__<slug>")
  u.add_argument("--paper_row", default=None, help='e.g. "DPDFD Table 1, MNIST, eps=10"')
  u.add_argument("--paper_accuracy", type=float, default=None)
  u.add_argument("--paper_epsilon", default=None, help="the paper's own ε for this run")
  u.add_argument("--selection", default=None, choices=records_lib.SELECTIONS,
                 help="how the run's flags were chosen, if not by the run itself (e.g. test)")
  u.add_argument("--table", action="append", default=[],
                 help="NAME or NAME:POSITION of a table the run is a row of (repeatable)")
  u.add_argument("--column", action="append", default=[], help="KEY=VALUE (repeatable)")
  u.add_argument("--text", action="append", default=[], help="KEY=VALUE label (repeatable)")
  u.add_argument("--force", action="store_true", help="replace an existing record")
  u.add_argument("--curve", action="append", default=[],
                 help="a metric the run logged, kept as column curve:<metric> (repeatable)")
  t = sub.add_parser("attach", help="add a run's logged curves to its published record")
  t.add_argument("--name", required=True, help="the published record's name")
  t.add_argument("--curve", action="append", required=True,
                 help="a metric of the run's metrics.csv (repeatable)")
  t.add_argument("--root", default=_ROOT, help="the directory the record's source is under")
  c = sub.add_parser("combine", help="one record for a run over seeds (mean and spread)")
  c.add_argument("--records", required=True, help="comma-separated names of the seed records")
  c.add_argument("--name", required=True, help="the combined record's name")
  c.add_argument("--table", action="append", default=[], help="NAME or NAME:POSITION")
  c.add_argument("--column", action="append", default=[], help="KEY=VALUE (repeatable)")
  c.add_argument("--text", action="append", default=[], help="KEY=VALUE label (repeatable)")
  c.add_argument("--force", action="store_true", help="replace an existing combined record")
  o = sub.add_parser("report", help="write a run's report.md (curves, ε spent, records)")
  o.add_argument("--run", required=True, help="the run's workdir (holds results.json)")
  return p


def main(argv: list[str] | None = None) -> int:
  """The subcommand's exit status: 0, 1 (`render --check` found a stale file), or 2 for a
  user error, printed in one line by the CLIs' handler (`_cli.user_errors`: a bad record, an
  unreadable results.json, a destination that cannot be written)."""
  a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
  try:
    with _cli.user_errors():
      return {"render": _render, "publish": _publish, "combine": _combine, "attach": _attach,
              "report": _report}[a.command](a)
  except SystemExit as done:  # `_cli.fail`: the line is printed, the status returned
    return done.code


if __name__ == "__main__":
  sys.exit(main())
