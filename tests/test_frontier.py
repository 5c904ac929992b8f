"""The sound frontier (dpkd_jax.train.frontier, frontier_doc) and
`python -m experiments.plot frontier`."""

from __future__ import annotations

import pathlib
import shutil

import pytest

import configs
from dpkd_jax.errors import UserError
from dpkd_jax.train import frontier as fr
from dpkd_jax.train import frontier_doc
from dpkd_jax.train import records as records_lib
from dpkd_jax.train import records_tables
from experiments import plot as plot_cli

_REPO = pathlib.Path(__file__).resolve().parent.parent
_RESULTS = _REPO / "docs" / "results"
_DOC = _REPO / "docs" / "CHOOSING.md"


def _rec(method="dpsgd", accuracy=0.9, epsilon=1.0, dataset="mnist", **fields):
  record = {"method": method, "dataset": dataset, "command": f"python -m experiments.{method}",
            "commit": None, "test_accuracy": accuracy, "sound_epsilon": epsilon,
            "delta": 1e-5, "neighbouring": "replace-one", "accounting": "sound",
            "paper_epsilon": None, "paper_row": None, "paper_accuracy": None,
            "cpu_seconds": 1.0, "wall_seconds": 1.0}
  record.update(fields)
  return records_lib.validate_record(record)


def _names(cells):
  return [None if p is None else p.name for p in cells]


def test_best_at_or_below_counts_a_run_at_every_larger_epsilon():
  points = fr.frontier_points({
      "a": _rec(accuracy=0.80, epsilon=0.1),
      "b": _rec(accuracy=0.90, epsilon=1.0),
      "c": _rec(accuracy=0.99, epsilon=1.0001),  # just above 1: not a run at ε <= 1
      "d": _rec(accuracy=0.85, epsilon=5.0),  # worse than c, which is below it
  })
  assert _names(fr.best_at_or_below(points)) == ["a", "a", "b", "c", "c", "c"]
  assert _names(fr.best_at_or_below(points, grid=(0.05, 1.0))) == [None, "b"]


def test_ties_go_to_less_epsilon_then_to_several_seeds():
  points = fr.frontier_points({
      "late": _rec(accuracy=0.9, epsilon=2.0),
      "early": _rec(accuracy=0.9, epsilon=1.0),
      "one_seed": _rec(accuracy=0.9, epsilon=1.0, single_seed=True),
      "three_seeds": _rec(accuracy=0.9, epsilon=1.0, single_seed=False),
  })
  assert _names(fr.best_at_or_below(points, grid=(2.0,))) == ["three_seeds"]
  seeds = {p.name: p.single_seed for p in points}
  assert seeds == {"late": True, "early": True, "one_seed": True, "three_seeds": False}


def test_no_guarantee_paper_direct_and_teacher_records_are_no_frontier_points():
  records = {
      "good": _rec(accuracy=0.5, epsilon=1.0),
      "inf": _rec(accuracy=0.99, epsilon="inf"),
      "paper": _rec(accuracy=0.99, epsilon=0.5, accounting="paper", paper_epsilon=1.0),
      "direct": _rec("dpdfd_direct", accuracy=0.99, epsilon=0.5, accounting="paper",
                     paper_epsilon=1.0),
      "teacher": _rec("teacher", accuracy=0.99, epsilon=0.5),
      "add_remove": _rec(accuracy=0.99, epsilon=0.5, neighbouring="add-remove"),
      "big_delta": _rec(accuracy=0.99, epsilon=0.5, delta=1e-3),
      "no_student": _rec(accuracy=None, epsilon=0.5),
      "lucky_seed": _rec(accuracy=0.99, epsilon=0.5, seed_of="three_seed_mean"),
      "tuning": _rec(accuracy=0.99, epsilon=0.5, validation_examples=5000),
      "audit": _rec(accuracy=0.99, epsilon=0.5, audit={"epsilon_lower_bound": 0.0}),
  }
  assert [p.name for p in fr.frontier_points(records)] == ["good"]
  row = fr.frontier(records)["mnist"]["private"]
  assert _names(row) == [None, None, "good", "good", "good", "good"]
  assert all(fr.exclusion(r) for n, r in records.items() if n != "good")
  assert "one seed of three_seed_mean" in fr.exclusion(records["lucky_seed"])
  assert "a tuning run" in fr.exclusion(records["tuning"])
  assert "an audit run" in fr.exclusion(records["audit"])  # trained on inserted canaries
  # A paper-accounting run is only a marker at its paper's ε; DPDFD direct is not even that.
  assert [(p.name, p.epsilon) for p in fr.paper_points(records)] == [("paper", 1.0)]


def test_the_setting_map_covers_every_method_with_records():
  records = records_tables.load_records(str(_RESULTS))
  methods = {r["method"] for r in records.values()}
  assert not set(fr.METHOD_SETTINGS) & set(fr.EXCLUDED_METHODS)
  assert methods <= set(fr.METHOD_SETTINGS) | set(fr.EXCLUDED_METHODS)
  keys = {s.key for s in fr.SETTINGS}
  assert set(fr.METHOD_SETTINGS.values()) <= keys
  assert set(fr.METHOD_LABELS) == set(fr.METHOD_SETTINGS)
  assert all(a.setting in keys and a.citation and 0 < a.accuracy <= 1 for a in fr.ANCHORS)
  assert fr.setting_of("dpdfd_direct") is None  # not DP: never a frontier point
  with pytest.raises(UserError, match="METHOD_SETTINGS"):
    fr.frontier_points({"x": _rec("new_method")})


def test_committed_choosing_md_is_generated_from_the_records_and_regenerates_to_itself():
  records = records_tables.load_records(str(_RESULTS), configs.record_commands())
  text = _DOC.read_text(encoding="utf-8")
  again = frontier_doc.render_doc(text, records)
  assert again == text, "docs/CHOOSING.md is stale: run python -m experiments.plot frontier"
  assert frontier_doc.render_doc(again, records) == again


def test_a_cell_names_method_accuracy_record_and_marks_single_seed():
  records = {"dpsgd__mnist__x": _rec(accuracy=0.95, epsilon=0.5),
             "dpsgd__mnist__y": _rec(accuracy=0.97, epsilon=2.0, single_seed=False)}
  block = frontier_doc.render_block(records)
  assert "| 0.5 | **0.95**¹ DP-SGD, ε 0.5: `dpsgd__mnist__x` |" in block
  assert "| 2 | **0.97** DP-SGD, ε 2: `dpsgd__mnist__y` |" in block
  assert "`python -m experiments.dpsgd`" in block  # the commands table


def _copy_doc(tmp_path):
  doc = tmp_path / "CHOOSING.md"
  shutil.copy(_DOC, doc)
  return doc


def test_cli_writes_the_pngs_and_rewrites_only_the_generated_block(tmp_path, capsys):
  doc = _copy_doc(tmp_path)
  intro, _, _ = doc.read_text(encoding="utf-8").partition("<!-- frontier:begin")
  doc.write_text(intro + frontier_doc.BEGIN + "\nstale\n" + frontier_doc.END + "\n",
                 encoding="utf-8")
  args = ["frontier", f"--out_dir={tmp_path / 'figs'}", f"--doc={doc}"]
  assert plot_cli.main(args + ["--check"]) == 1
  assert not (tmp_path / "figs").exists()  # --check writes nothing
  assert plot_cli.main(args) == 0
  for dataset in ("mnist", "fashion_mnist", "digits"):
    png = tmp_path / "figs" / f"frontier_{dataset}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  text = doc.read_text(encoding="utf-8")
  assert text.startswith(intro) and "(figs/frontier_mnist.png)" in text
  assert plot_cli.main(args + ["--check"]) == 0
  assert "unchanged" not in capsys.readouterr().out
  assert plot_cli.main(args) == 0
  assert doc.read_text(encoding="utf-8") == text  # idempotent
  assert "unchanged: " in capsys.readouterr().out


@pytest.mark.parametrize("case", ["out_dir_is_a_file", "doc_without_markers"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
  doc = _copy_doc(tmp_path)
  blocker = tmp_path / "a_file"
  blocker.write_text("x", encoding="utf-8")
  if case == "doc_without_markers":
    doc.write_text("# no markers\n", encoding="utf-8")
  before = doc.read_text(encoding="utf-8")
  out_dir = blocker if case == "out_dir_is_a_file" else tmp_path / "figs"
  with pytest.raises(SystemExit) as exit_info:
    plot_cli.main(["frontier", f"--out_dir={out_dir}", f"--doc={doc}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ")
  assert ("--out_dir" if case == "out_dir_is_a_file" else "frontier:begin") in err
  assert doc.read_text(encoding="utf-8") == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["CHOOSING.md", "a_file"]
