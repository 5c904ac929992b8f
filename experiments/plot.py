"""Privacy–utility plots.

  python -m experiments.plot --runs runs/dpdfd/* --out curve.png
      Reads each run's results.json (sound ε and test accuracy; see `dpkd_jax.plotting`) and
      writes a PNG of accuracy against ε. Runs without a guarantee (ε = ∞) are drawn as
      reference lines.

  python -m experiments.plot frontier [--out_dir=docs] [--doc=docs/CHOOSING.md] [--check]
      The sound frontier from the committed records (docs/results/*.json only;
      `dpkd_jax.train.frontier`): for each dataset, the best sound test accuracy at
      ε <= 0.1, 0.5, 1, 2, 5, 10, one line per setting, the published anchors as hollow
      markers, written to <out_dir>/frontier_<dataset>.png; and the generated tables of
      docs/CHOOSING.md (the text outside its markers is kept). --check writes nothing and
      exits 1 if CHOOSING.md differs from the records.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import configs
from dpkd_jax import plotting
from dpkd_jax.errors import UserError
from dpkd_jax.train import frontier as frontier_lib
from dpkd_jax.train import frontier_doc
from dpkd_jax.train import records_tables
from experiments import _cli

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _curves(argv: list[str]) -> None:
  p = _cli.Parser(prog="python -m experiments.plot", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", nargs="+", required=True, help="run workdirs (each with results.json)")
  p.add_argument("--out", required=True, help="output PNG")
  p.add_argument("--title", default=None)
  p.add_argument("--trajectories", action="store_true",
                 help="also draw each run's (ε spent, accuracy) at every evaluation (metrics.csv)")
  p.add_argument("--paper_epsilon", action="store_true",
                 help="also mark the papers' ε figures (hollow markers, NOT guarantees)")
  p.add_argument("--skip_unfinished", action="store_true",
                 help="ignore directories without results.json instead of failing")
  a = p.parse_args(argv)
  _cli.check_output_file(a.out, "--out")
  try:
    runs = plotting.load_runs(a.runs, skip_unfinished=a.skip_unfinished)
  except (FileNotFoundError, ValueError) as e:  # a missing or malformed results.json
    _cli.fail(f"--runs: {e}")
  plotting.plot_privacy_utility(runs, a.out, title=a.title, trajectories=a.trajectories,
                                paper_epsilon=a.paper_epsilon)
  for run in runs:
    eps = "inf (no guarantee)" if math.isinf(run.epsilon) else f"{run.epsilon:.4g}"
    print(f"{run.label}: {run.method}, eps {eps}, accuracy {run.accuracy:.4f}")
  print("wrote", a.out)


def _frontier_parser() -> _cli.Parser:
  p = _cli.Parser(prog="python -m experiments.plot frontier", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--results_dir", default=os.path.join(_ROOT, "docs", "results"),
                 help="the committed records (default: docs/results)")
  p.add_argument("--out_dir", default=os.path.join(_ROOT, "docs"),
                 help="folder of the frontier_<dataset>.png files (default: docs)")
  p.add_argument("--doc", default=os.path.join(_ROOT, "docs", "CHOOSING.md"),
                 help="the advice file whose generated block is rewritten ('' to skip)")
  p.add_argument("--check", action="store_true",
                 help="write nothing; exit 1 if --doc differs from the records")
  return p


def _read_doc(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    raise UserError(f"--doc: cannot read {path!r} ({e.strerror}); give the CHOOSING.md to "
                    "regenerate, or --doc='' to skip it") from e


def _draw(records: dict, out_dir: str) -> list[str]:
  """Writes <out_dir>/frontier_<dataset>.png for every dataset of the frontier."""
  paper = frontier_lib.paper_points(records)
  under = f"δ ≤ {frontier_doc.delta_text(frontier_lib.DELTA)}, {frontier_lib.NEIGHBOURING}"
  written = []
  for dataset, rows in frontier_lib.frontier(records).items():
    name = records_tables.DATASET_NAMES.get(dataset, dataset)
    written.append(plotting.plot_frontier(
        rows, os.path.join(out_dir, f"frontier_{dataset}.png"), grid=frontier_lib.EPSILON_GRID,
        anchors=frontier_lib.anchors_of(dataset),
        paper_points=[p for p in paper if p.dataset == dataset],
        title=f"{name}: best sound accuracy at ε ≤ x ({under})"))
  return written


def _frontier(argv: list[str]) -> int:
  a = _frontier_parser().parse_args(argv)
  records = records_tables.load_records(a.results_dir, configs.record_commands())
  if not records:
    raise UserError(f"--results_dir: no results records (*.json) in {a.results_dir!r}")
  old = new = None
  if a.doc:
    old = _read_doc(a.doc)
    image_dir = os.path.relpath(os.path.abspath(a.out_dir),
                                os.path.dirname(os.path.abspath(a.doc)))
    new = frontier_doc.render_doc(old, records, path=a.doc,
                                  image_dir="" if image_dir == "." else image_dir)
  if a.check:
    stale = new is not None and new != old
    print(f"stale: {os.path.relpath(a.doc)} (run: python -m experiments.plot frontier)"
          if stale else "stale: none")
    return 1 if stale else 0
  _cli.check_output_dir(a.out_dir, "--out_dir")  # before writing anything
  os.makedirs(a.out_dir, exist_ok=True)
  for path in _draw(records, a.out_dir):
    print("wrote", os.path.relpath(path))
  if new is not None:
    if new != old:
      with open(a.doc, "w", encoding="utf-8") as f:
        f.write(new)
    print(("written: " if new != old else "unchanged: ") + os.path.relpath(a.doc))
  return 0


@_cli.entry_point
def main(argv: list[str]) -> int | None:
  if argv[:1] == ["frontier"]:
    return _frontier(argv[1:])
  return _curves(argv)


if __name__ == "__main__":
  sys.exit(main())
