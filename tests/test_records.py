"""The results-record schema (dpkd_jax/train/records.py) and every committed record under
docs/results/: each is valid, named after its method and dataset, and states where it came from."""

import decimal
import glob
import json
import os
import pathlib
import sys
import types

import pytest

from dpkd_jax.data import sources
from dpkd_jax.errors import UserError
from dpkd_jax.train import records

_REPO = pathlib.Path(__file__).resolve().parent.parent
_COMMITTED = sorted(glob.glob(str(_REPO / "docs" / "results" / "*.json")))


def _record(**overrides):
  fields = dict(method="dpdfd", dataset="digits", test_accuracy=0.5, sound_epsilon=9.5,
                delta=1e-5, neighbouring="replace-one", accounting="sound", cpu_seconds=12.0,
                wall_seconds=10.0, command="python -m experiments.dpdfd", commit="abc")
  fields.update(overrides)
  return records.make_record(**fields)


def test_the_command_names_the_data_directory_it_read(monkeypatch):
  # A run that read $DPKD_DATA_DIR does not rerun without it: the record's command says it.
  monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
  monkeypatch.setattr(sys, "argv", ["dpdfd.py", "--dataset=mnist"])
  monkeypatch.delenv("DPKD_DATA_DIR", raising=False)
  assert records.current_command() == "python dpdfd.py --dataset=mnist"
  monkeypatch.setenv("DPKD_DATA_DIR", "../shared data")
  assert records.current_command() == "DPKD_DATA_DIR='../shared data' python dpdfd.py --dataset=mnist"
  # records.py names the variable without importing the data package (which imports jax).
  assert sources.DATA_DIR_ENV_VAR in records._COMMAND_ENV_VARS  # pylint: disable=protected-access


def test_make_record_has_every_field_and_validates():
  record = _record(sound_epsilon=float("inf"), extra={"sigma": 1.5})
  assert tuple(record)[:len(records.RECORD_FIELDS)] == records.RECORD_FIELDS
  assert record["sound_epsilon"] == "inf" and record["sigma"] == 1.5


def test_write_then_read_round_trip(tmp_path):
  path = str(tmp_path / "run" / "record.json")
  records.write_record(path, _record())
  assert records.read_record(path) == _record()


@pytest.mark.parametrize("field,value", [
    ("neighbouring", "both"), ("accounting", "mixed"), ("sound_epsilon", -1.0),
    ("sound_epsilon", "infinite"), ("test_accuracy", 1.5), ("paper_accuracy", "0.9"),
    ("delta", 1.0), ("paper_epsilon", -2.0), ("method", ""), ("commit", 5),
    ("cpu_seconds", None), ("wall_seconds", -1.0)])
def test_validate_rejects_a_bad_field_and_names_it(field, value):
  record = _record()
  record[field] = value
  with pytest.raises(ValueError, match=field):
    records.validate_record(record)


def test_null_seconds_only_in_a_legacy_record():
  record = _record()
  record["cpu_seconds"] = record["wall_seconds"] = None
  with pytest.raises(ValueError, match="cpu_seconds"):
    records.validate_record(record)
  record["regenerated"] = True
  with pytest.raises(ValueError, match="cpu_seconds"):
    records.validate_record(record)
  record["regenerated"] = False  # converted from the docs' text, which did not state them
  assert records.validate_record(record) is record


@pytest.mark.parametrize("text,match", [
    ("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), ('{"method": "x"}', "lacks")])
def test_read_record_error_is_one_line_naming_the_file(tmp_path, text, match):
  path = tmp_path / "bad.json"
  path.write_text(text)
  with pytest.raises(UserError, match=match) as info:
    records.read_record(str(path))
  message = str(info.value)
  assert message.startswith(str(path)) and "\n" not in message


def test_read_record_missing_file_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match="cannot read"):
    records.read_record(str(tmp_path / "absent.json"))


def test_read_record_keeps_digits_with_decimal(tmp_path):
  path = tmp_path / "r.json"
  record = _record()
  path.write_text(json.dumps(record).replace('"test_accuracy": 0.5', '"test_accuracy": 0.5000'))
  kept = records.read_record(str(path), parse_float=decimal.Decimal)
  assert str(kept["test_accuracy"]) == "0.5000"


def test_there_are_committed_records():
  assert len(_COMMITTED) >= 100


@pytest.mark.parametrize("path", _COMMITTED, ids=os.path.basename)
def test_committed_record(path):
  record = records.read_record(path)  # schema
  method, dataset, slug = os.path.basename(path)[:-len(".json")].split("__")
  if method == "audit":  # an audited run (dpkd_jax/audit) of any method: named by what it is
    assert isinstance(record.get("audit"), dict)
    method = record["method"]
  assert (method, dataset) == (record["method"], record["dataset"]) and slug
  assert isinstance(record.get("tables", {}), dict)
  assert isinstance(record["single_seed"], bool) and isinstance(record["regenerated"], bool)
  assert record["source"]
  if not record["regenerated"]:
    assert record["source"].startswith("docs/RESULTS.md as of ")
  if record["paper_accuracy"] is not None:
    assert record["paper_row"], "a paper figure names its paper row"
  # One relation across the tables: replace-one (DP-SGD's add/remove figure only beside it).
  assert record["neighbouring"] == "replace-one"
  if record["method"] == "dpsgd" and record["sound_epsilon"] != "inf":
    assert record["epsilon_add_remove"] <= record["sound_epsilon"]


def test_combine_seeds_gives_the_mean_and_its_spread():
  seeds = {f"dpdfd__digits__a_s{i}": _record(test_accuracy=acc, sound_epsilon=eps,
                                             extra={"sigma": 1.5, "seed": i})
           for i, (acc, eps) in enumerate(((0.9, 2.0), (0.8, 2.5), (0.7, 2.0)))}
  combined = records.combine_seeds(seeds, name="dpdfd__digits__a")
  assert combined["sigma"] == 1.5 and "seed" not in combined  # shared settings only
  assert combined["test_accuracy"] == pytest.approx(0.8)
  assert combined["columns"]["accuracy_std"] == pytest.approx(0.1)
  assert combined["columns"]["accuracy_seeds"] == [0.9, 0.8, 0.7]
  assert combined["sound_epsilon"] == 2.5 and combined["cpu_seconds"] == 36.0
  assert combined["single_seed"] is False and len(combined["combined_from"]) == 3
  with pytest.raises(UserError, match="at least two"):
    records.combine_seeds(dict(list(seeds.items())[:1]), name="x")
  with pytest.raises(UserError, match="differ in dataset"):
    records.combine_seeds({**seeds, "dpdfd__mnist__b": _record(dataset="mnist")}, name="x")


def test_combine_seeds_does_not_copy_the_resume_fields_of_one_run():
  # `segments` / `commits` describe one seed's run; an unknown account in any seed is kept.
  resumed = {"segments": 2, "commits": ["aaaa", "bbbb"]}
  seeds = {"a_s0": _record(extra=resumed), "a_s1": _record(extra=resumed)}
  combined = records.combine_seeds(seeds, name="a")
  assert "segments" not in combined and "commits" not in combined
  assert "clock_incomplete" not in combined
  seeds["a_s1"] = _record(extra={**resumed, "clock_incomplete": True})
  assert records.combine_seeds(seeds, name="a")["clock_incomplete"] is True


def test_combine_cli_writes_the_mean_and_marks_the_seeds(tmp_path, capsys):
  from experiments import results as results_cli
  for i, acc in enumerate((0.9, 0.8)):
    records.write_record(str(tmp_path / f"dpdfd__digits__a_s{i}.json"),
                         {**_record(test_accuracy=acc), "single_seed": True,
                          "regenerated": True, "source": "runs/x"})
  code = results_cli.main(["--results_dir", str(tmp_path), "combine", "--records",
                           "dpdfd__digits__a_s0,dpdfd__digits__a_s1", "--name",
                           "dpdfd__digits__a", "--text", "label=two seeds"])
  assert code == 0 and "mean 0.8500" in capsys.readouterr().out
  combined = records.read_record(str(tmp_path / "dpdfd__digits__a.json"))
  assert combined["test_accuracy"] == pytest.approx(0.85) and combined["text"]["label"]
  for i in range(2):
    assert records.read_record(str(tmp_path / f"dpdfd__digits__a_s{i}.json"))[
        "seed_of"] == "dpdfd__digits__a"
  assert results_cli.main(["--results_dir", str(tmp_path), "combine", "--records",
                           "dpdfd__digits__a_s0,dpdfd__digits__a_s1", "--name",
                           "dpdfd__digits__a"]) == 2  # exists: needs --force


def test_committed_combined_records_point_at_their_seeds():
  names = {os.path.basename(p)[:-len(".json")]: records.read_record(p) for p in _COMMITTED}
  for name, record in names.items():
    for seed in record.get("combined_from", []):
      assert names[seed]["seed_of"] == name
    if record.get("seed_of"):
      assert name in names[record["seed_of"]]["combined_from"]


def test_selection_is_written_and_checked():
  assert _record()["selection"] == "none"
  assert _record(selection="validation")["selection"] == "validation"
  with pytest.raises(ValueError, match="selection"):
    _record(selection="best")


@pytest.mark.parametrize("path", _COMMITTED, ids=os.path.basename)
def test_every_committed_record_says_how_it_was_selected(path):
  # The methods whose defaults and rows were chosen on the test split say so until their
  # validation-selected re-runs (which say "validation") replace them.
  record = records.read_record(path)
  assert record.get("selection") in records.SELECTIONS
  if record["method"] in ("dpdfd", "dpdfd_direct", "srr", "rknn", "rona", "dfpate"):
    assert record["selection"] in ("test", "validation")
