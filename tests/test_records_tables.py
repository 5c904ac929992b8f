"""Tables generated from results records (dpkd_jax/train/records_tables.py) and the CLI
`python -m experiments.results` (render, render --check, publish)."""

import decimal
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import configs
from dpkd_jax.errors import UserError
from dpkd_jax.train import records
from dpkd_jax.train import records_tables as rt
from experiments import results as results_cli

_REPO = pathlib.Path(__file__).resolve().parent.parent
_RESULTS = _REPO / "docs" / "results"
_DOCS = [_REPO / path for path in results_cli.DOCS]  # every generated Markdown file
_NOTEBOOK = _REPO / "dpkd_jax" / "resources" / "paper_results.json"
D = decimal.Decimal


def _record(name="run", tables=None, **extra):
  record = records.make_record(
      method="dpdfd", dataset="mnist", test_accuracy=0.5, sound_epsilon=9.999, delta=1e-5,
      neighbouring="replace-one", accounting="sound", cpu_seconds=100.0, wall_seconds=90.0,
      command=f"python -m experiments.dpdfd --workdir=runs/{name}", commit="abc")
  record.update(name=name, tables=tables or {}, **extra)
  return record


def _doc(template, name="t"):
  return (f"intro\n\n<!-- results-table:{name} begin {template} -->\n| a | b |\n| --- | --- |\n"
          f"| stale | row |\n<!-- results-table:{name} end -->\n\nafter\n")


def _rows(text):
  """The generated rows (the markers' templates, with their {placeholders}, left out)."""
  lines = [line for line in text.split("\n") if line.startswith("| ") and "{" not in line]
  return [line for line in lines if line not in ("| a | b |", "| --- | --- |", "| h | 1 | 2 |",
                                                 "| --- | --- | --- |")]


# ---------------------------------------------------------------- the committed files


def test_a_record_a_recipe_reproduces_shows_the_recipe_command(tmp_path):
  for name in ("a", "b"):
    (tmp_path / f"{name}.json").write_text(json.dumps(_record(name, tables={"t": 1 + (name == "b")})))
  recipe = "python -m experiments.dpdfd --config=configs/dpdfd/x.py --seed=0"
  recs = rt.load_records(str(tmp_path), {"a": recipe})
  assert rt.command(recs["a"]) == recipe  # the record file keeps its own command
  assert rt.command(recs["b"]) == "python -m experiments.dpdfd --workdir=runs/b"
  text, _ = rt.render_markdown(_doc("| {name} | {command:`} |"), recs)
  assert f"| a | `{recipe}` |" in text and "| b | `python -m experiments.dpdfd --workdir" in text
  assert json.loads((tmp_path / "a.json").read_text())["command"].endswith("runs/a")


def test_committed_docs_and_notebook_data_match_their_records():
  files = rt.render_files(str(_RESULTS), [str(d) for d in _DOCS], str(_NOTEBOOK),
                          configs.record_commands())
  for path, (current, generated) in files.items():
    assert current == generated, f"{path} is stale: run python -m experiments.results render"


def test_render_check_cli_passes_on_the_committed_files():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_REPO),
                                                                  os.environ.get("PYTHONPATH")])))
  done = subprocess.run([sys.executable, "-m", "experiments.results", "render", "--check"],
                        cwd=_REPO, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "stale: none" in done.stdout


def test_every_committed_record_is_a_row_of_a_table_or_referenced():
  recs = rt.load_records(str(_RESULTS))
  text = "".join(d.read_text(encoding="utf-8") for d in _DOCS)
  referenced = {v for r in recs.values() for v in r.get("columns", {}).values()
                if isinstance(v, str) and v in recs}
  referenced |= {seed for r in recs.values() for seed in r.get("combined_from", [])}
  for name, record in recs.items():
    assert record.get("tables") or f"@{name}." in text or name in referenced, name


# ---------------------------------------------------------------- formatting


def test_numbers_keep_their_digits_and_runs_floats_are_rounded():
  recs = {"r": _record(tables={"t": 1}, columns={"a": D("0.4670"), "b": 1462, "c": D("-6.23")})}
  recs["r"]["test_accuracy"] = 0.95289999246597  # a run's own float
  text, _ = rt.render_markdown(_doc("| {a} | {b:,} | {c} | {test_accuracy} | {sound_epsilon} |"),
                               recs)
  assert _rows(text) == ["| 0.4670 | 1,462 | −6.23 | 0.9529 | 9.999 |"]


def test_a_runs_full_precision_floats_read_back_from_file_are_rounded():
  # record.json of a run holds 0.10140845070422536; read back as Decimal it must not print
  # 17 digits (the renderer reads files with parse_float=Decimal).
  recs = {"r": _record(tables={"t": 1}, columns={"a": D("0.10140845070422536"),
                                                  "b": D("9.99938280228868"), "c": D("195.9")})}
  text, _ = rt.render_markdown(_doc("| {a} | {b} | {c} |"), recs)
  assert _rows(text) == ["| 0.1014 | 9.999 | 195.9 |"]


def test_flags_bold_lists_labels_and_missing():
  recs = {"r": _record(tables={"t": 1}, columns={"acc": [D("0.1"), D("0.2")], "none": None},
                       text={"label": "`x` (y)", "t/command": "same as above"},
                       bold=["t/test_accuracy"])}
  recs["r"]["sound_epsilon"] = "inf"
  text, _ = rt.render_markdown(_doc(
      "| {label} | {acc:/L} | {acc:;} | {test_accuracy:b} | {sound_epsilon:b} | {none} |"
      "{none:?_} {absent:?} | {command:`} | {dataset:D} |"), recs)
  assert _rows(text) == ["| `x` (y) | 0.1 / **0.2** | 0.1, 0.2 | **0.5** | ∞ | — | "
                         " | same as above | MNIST |"]


def test_a_test_accuracy_says_how_its_row_was_selected():
  recs = {name: _record(name, tables={"t": i}, selection=selection)
          for i, (name, selection) in enumerate(
              [("a", "test"), ("b", "validation"), ("c", "paper_recipe"), ("d", "none")], 1)}
  text, _ = rt.render_markdown(_doc("| {name} | {test_accuracy} |"), recs)
  assert _rows(text) == ["| a | 0.5ᵗ |", "| b | 0.5ᵛ |", "| c | 0.5ᵖ |", "| d | 0.5 |"]


def test_pivot_rows_reference_and_alternatives():
  recs = {"gen": _record("gen"), "a": _record("a", tables={"t": 1}, columns={"gen": "gen"}),
          "b": _record("b", columns={"curve": [1, 2]})}
  recs["a"]["paper_epsilon"] = None
  recs["a"]["columns"]["target"] = 10
  recs["gen"]["cpu_seconds"] = 7.0
  text, _ = rt.render_markdown(
      _doc("| {gen>cpu_seconds} + {cpu_seconds} | {paper_epsilon|target} |")
      + "<!-- results-table:p begin\n| curve | {@b.curve:p} |\n-->\n| h | 1 | 2 |\n| --- | --- "
        "| --- |\n<!-- results-table:p end -->\n", recs)
  assert _rows(text) == ["| 7 + 100 | 10 |", "| curve | 1 | 2 |"]


def test_a_field_of_a_block_the_run_wrote_is_looked_up_by_a_dotted_key():
  recs = {"r": _record(tables={"t": 1}, audit={"auroc": D("0.55"), "m": 1000})}
  text, _ = rt.render_markdown(_doc("| {audit.auroc} | {audit.m} | {audit.absent:?} |"), recs)
  assert _rows(text) == ["| 0.55 | 1000 |  |"]


def test_rows_follow_their_positions():
  recs = {"x": _record("x", tables={"t": 2}), "y": _record("y", tables={"t": 1})}
  text, names = rt.render_markdown(_doc("| {name} |"), recs)
  assert _rows(text) == ["| y |", "| x |"] and names == ["t"]
  assert text.startswith("intro\n\n<!-- results-table:t begin") and text.endswith("\n\nafter\n")


# ---------------------------------------------------------------- errors


def test_begin_marker_without_end_is_refused():
  text = _doc("| {name} |").replace("<!-- results-table:t end -->", "")
  with pytest.raises(UserError, match="without its"):
    rt.render_markdown(text, {"r": _record(tables={"t": 1})})


def test_missing_key_names_record_and_table():
  with pytest.raises(UserError, match=r"docs/results/r\.json: lacks `sigma`, needed by table t"):
    rt.render_markdown(_doc("| {sigma} |"), {"r": _record(tables={"t": 1})})


def test_same_position_twice_and_orphan_tables_are_refused(tmp_path):
  recs = {"x": _record("x", tables={"t": 1}), "y": _record("y", tables={"t": 1})}
  with pytest.raises(UserError, match="same row position"):
    rt.render_markdown(_doc("| {name} |"), recs)
  doc = tmp_path / "doc.md"
  doc.write_text(_doc("| {name} |"))
  records.write_record(str(tmp_path / "dpdfd__mnist__x.json"), _record("x", {"t": 1, "gone": 1}))
  with pytest.raises(UserError, match="gone"):
    rt.render_files(str(tmp_path), [str(doc)], None)


def test_malformed_record_is_one_line_naming_the_file(tmp_path):
  bad = tmp_path / "dpdfd__mnist__bad.json"
  bad.write_text(json.dumps(dict(_record(), neighbouring="both")))
  with pytest.raises(UserError, match="dpdfd__mnist__bad.json: neighbouring") as info:
    rt.load_records(str(tmp_path))
  assert "\n" not in str(info.value)
  done = subprocess.run(
      [sys.executable, "-m", "experiments.results", f"--results_dir={tmp_path}", "render",
       "--check", "--notebook_data="],
      cwd=_REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, PYTHONPATH=str(_REPO)))
  assert done.returncode == 2 and "Traceback" not in done.stderr
  assert done.stderr.count("\n") == 1 and str(bad) in done.stderr


# ---------------------------------------------------------------- CLI: check and publish


def _copy_repo_files(tmp_path):
  shutil.copytree(_RESULTS, tmp_path / "results")
  docs = []
  for doc in _DOCS:  # RESULTS.md keeps its name: the CLI prints the stale file's name
    shutil.copy(doc, tmp_path / doc.name)
    docs.append(f"--doc={tmp_path / doc.name}")
  shutil.copy(_NOTEBOOK, tmp_path / "paper_results.json")
  return [f"--results_dir={tmp_path / 'results'}", "render", *docs,
          f"--notebook_data={tmp_path / 'paper_results.json'}"]


def test_check_detects_a_changed_record_and_render_fixes_it(tmp_path, capsys):
  args = _copy_repo_files(tmp_path)
  path = tmp_path / "results" / "dpdfd__mnist__m_np.json"
  path.write_text(path.read_text().replace("0.4708", "0.4709"))  # final accuracy
  assert results_cli.main(args + ["--check"]) == 1
  assert "RESULTS.md" in capsys.readouterr().out
  assert results_cli.main(args) == 0
  assert "| 0.4115 / 0.4324 / 0.4670 / **0.4709** |" in (tmp_path / "RESULTS.md").read_text()
  assert results_cli.main(args + ["--check"]) == 0


def test_publish_round_trip(tmp_path, capsys):
  run = tmp_path / "runs" / "fake"
  records.write_record(str(run / "record.json"), _record())
  out = tmp_path / "results"
  out.mkdir()
  base = [f"--results_dir={out}", "publish", f"--run={run}", "--name=dpdfd__mnist__fake"]
  extra = ["--paper_row=DPDFD Table 1, MNIST, eps=10", "--paper_accuracy=0.9751",
           "--paper_epsilon=10", "--table=t", "--column=sigma=195.9", "--text=label=sound"]
  assert results_cli.main(base + extra) == 0
  published = records.read_record(str(out / "dpdfd__mnist__fake.json"))
  assert published == {**_record(), "paper_row": "DPDFD Table 1, MNIST, eps=10",
                       "paper_accuracy": 0.9751, "paper_epsilon": 10.0, "tables": {"t": 1},
                       "columns": {"sigma": 195.9}, "text": {"label": "sound"},
                       "single_seed": True, "regenerated": True,
                       "source": str(run / "record.json")}
  assert results_cli.main(base) == 2  # exists
  assert "--force" in capsys.readouterr().err
  records.write_record(str(out / "dpdfd__mnist__other.json"), _record("other", {"t": 1}))
  assert results_cli.main(base + extra[:-2] + ["--force", "--column=sigma=1"]) == 0
  assert records.read_record(str(out / "dpdfd__mnist__fake.json"))["tables"] == {"t": 2}
  (out / "dpdfd__mnist__other.json").unlink()
  rendered, _ = rt.render_markdown(_doc("| {label:?} | {sigma} | {test_accuracy} |"),
                                   rt.load_records(str(out)))
  assert _rows(rendered) == ["|  | 1 | 0.5 |"]


def test_publish_reads_the_accuracy_curve_from_metrics_csv(tmp_path):
  run = tmp_path / "run"
  records.write_record(str(run / "record.json"), _record())
  (run / "metrics.csv").write_text("step,name,value\n100,train/loss,2.0\n100,test/accuracy,0.41234\n"
                                   "200,test/accuracy,0.5\n")
  out = tmp_path / "results"
  out.mkdir()
  base = [f"--results_dir={out}", "publish", f"--run={run}"]
  assert results_cli.main(base + ["--name=dpdfd__mnist__curve"]) == 0
  columns = records.read_record(str(out / "dpdfd__mnist__curve.json"))["columns"]
  assert columns == {"accuracy_per_eval": [0.4123, 0.5], "eval_steps": [100, 200]}
  # A curve given with --column wins over the file.
  assert results_cli.main(base + ["--name=dpdfd__mnist__given",
                                  "--column=accuracy_per_eval=[0.1]"]) == 0
  given = records.read_record(str(out / "dpdfd__mnist__given.json"))["columns"]
  assert given == {"accuracy_per_eval": [0.1]}


def test_logged_curves_come_from_the_run_at_publish_and_attach(tmp_path, capsys):
  run = tmp_path / "runs" / "r"
  records.write_record(str(run / "record.json"), _record())
  (run / "metrics.csv").write_text("step,name,value\n100,train/agree,0.812345\n"
                                   "200,train/agree,0.9\n200,test/accuracy,0.5\n")
  out = tmp_path / "results"
  out.mkdir()
  assert results_cli.main([f"--results_dir={out}", "publish", f"--run={run}",
                           "--name=dpdfd__mnist__p", "--curve=train/agree"]) == 0
  published = records.read_record(str(out / "dpdfd__mnist__p.json"))
  assert published["columns"]["curve:train/agree"] == [[100, 0.8123], [200, 0.9]]
  # attach: the record's own source run, relative to --root as the repo's records are.
  records.write_record(str(out / "dpdfd__mnist__a.json"),
                       {**_record(), "source": "runs/r/record.json"})
  attach = [f"--results_dir={out}", "attach", "--name=dpdfd__mnist__a", f"--root={tmp_path}"]
  assert results_cli.main(attach + ["--curve=train/agree"]) == 0
  attached = records.read_record(str(out / "dpdfd__mnist__a.json"))
  assert attached["columns"] == {"curve:train/agree": [[100, 0.8123], [200, 0.9]]}
  capsys.readouterr()
  for bad, match in ((["--curve=train/nope"], "train/agree"),
                     (["--curve=train/agree", "--name=dpdfd__mnist__none"], "no record")):
    assert results_cli.main(attach + bad) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
  assert records.read_record(str(out / "dpdfd__mnist__a.json")) == attached


@pytest.mark.parametrize("args,match", [
    (["--name=../x"], "--name"), (["--name=ok", "--paper_accuracy=2"], "paper_accuracy"),
    (["--name=ok", "--paper_epsilon=big"], "--paper_epsilon"),
    (["--name=ok", "--column=novalue"], "--column"), (["--name=ok", "--table=t:x"], "--table")])
def test_publish_refuses_bad_input_in_one_line(tmp_path, capsys, args, match):
  run = tmp_path / "run"
  records.write_record(str(run / "record.json"), _record())
  code = results_cli.main([f"--results_dir={tmp_path}", "publish", f"--run={run}"] + args)
  err = capsys.readouterr().err
  assert code == 2 and match in err and err.count("\n") == 1
  assert not list(tmp_path.glob("ok.json"))


def test_publish_without_record_names_the_file(tmp_path, capsys):
  code = results_cli.main([f"--results_dir={tmp_path}", "publish", f"--run={tmp_path}",
                           "--name=x"])
  assert code == 2 and "record.json" in capsys.readouterr().err
