"""Released vs private (`train/released_fields.py`): no noiseless function of private data sits
in a released place. Checked over every committed record (top-level fields from the allow-list,
no private table column), the writers that route by the declared names, and the files of a real
DP-SGD run with a validation hold-out (metrics.csv, results.json, record.json, report.md and
the inputs of its curves, the model card, the printed summary)."""

import contextlib
import glob
import io
import json
import os

import pytest

from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import released_fields as rf
from dpkd_jax.train import report
from experiments import dpsgd as dpsgd_cli

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "results")


def test_the_declared_names():
  assert rf.is_private_field("validation_accuracy") and rf.is_private_field("validation_top5")
  assert rf.is_private_field("teacher_test_accuracy") and rf.is_private_field("teacher_mean")
  assert not rf.is_private_field("validation_examples")  # a setting: how many were held out
  assert not rf.is_private_field("test_accuracy")
  assert rf.is_private_metric("validation/accuracy") and rf.is_private_metric("validation_loss")
  assert not any(rf.is_private_metric(n) for n in ("test/accuracy", "train/released_agreement"))
  assert set(records.RECORD_FIELDS) <= rf.RELEASED_RECORD_FIELDS
  assert not any(rf.is_private_field(f) for f in rf.RELEASED_RECORD_FIELDS)
  assert outputs.PRIVATE_KEY == report.PRIVATE_KEY == rf.PRIVATE_KEY


def test_move_private_fields_keeps_the_note_and_the_files_last():
  results = {"test_accuracy": 0.9, "validation_accuracy": 0.8, "validation_examples": 10,
             rf.PRIVATE_KEY: {"_note": "n", "files": ["f.csv"]}}
  rf.move_private_fields(results)
  assert results == {"test_accuracy": 0.9, "validation_examples": 10,
                     rf.PRIVATE_KEY: {"_note": "n", "validation_accuracy": 0.8,
                                      "files": ["f.csv"]}}
  assert list(results[rf.PRIVATE_KEY]) == ["_note", "validation_accuracy", "files"]
  assert rf.move_private_fields({"a": 1}) == {"a": 1}  # nothing private: no block added


def _record(**extra):
  return records.make_record(method="dpsgd", dataset="digits", test_accuracy=0.5,
                             sound_epsilon=1.0, delta=1e-5, neighbouring="replace-one",
                             accounting="sound", cpu_seconds=1, wall_seconds=1, command="c",
                             commit="x", extra=extra)


def test_a_record_keeps_a_private_statistic_in_its_private_block_only():
  record = _record(validation_accuracy=0.75, validation_examples=100)
  assert "validation_accuracy" not in record and record["validation_examples"] == 100
  assert record[rf.PRIVATE_KEY] == {"_note": rf.PRIVATE_NOTE, "validation_accuracy": 0.75}
  with pytest.raises(ValueError, match="private statistics at the top level"):
    records.validate_record({**_record(), "validation_accuracy": 0.75})
  with pytest.raises(ValueError, match="must be an object"):
    records.validate_record({**_record(), rf.PRIVATE_KEY: 0.75})


def test_every_committed_record_releases_only_allowed_fields():
  paths = sorted(glob.glob(os.path.join(RESULTS, "*.json")))
  assert len(paths) > 100
  offenders = {}
  for path in paths:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    name = os.path.basename(path)
    unknown = set(record) - rf.RELEASED_RECORD_FIELDS - {rf.PRIVATE_KEY}
    columns = [k for k in record.get("columns", {})
               if rf.is_private_field(k) or rf.is_private_metric(k.removeprefix("curve:"))]
    private = record.get(rf.PRIVATE_KEY)
    if unknown or columns:
      offenders[name] = sorted(unknown) + columns
    elif private is not None and private.get("_note") != rf.PRIVATE_NOTE:
      offenders[name] = ["private block without its note"]
  assert offenders == {}


def test_a_released_metrics_writer_sends_private_names_apart(tmp_path):
  workdir = str(tmp_path)
  writer = metrics_lib.MetricsWriter(workdir, tensorboard=False)
  for step, value in ((1, 0.5), (2, 0.625)):
    writer.write(step, {"accuracy": value, "loss": 1.0}, prefix="test/")
    writer.write(step, {"accuracy": value}, prefix="validation/")
  writer.close()
  assert set(metrics_lib.read_metrics(workdir)) == {"test/accuracy", "test/loss"}
  private = outputs.read_private_diagnostics(workdir)
  assert private == {"private_diagnostics/validation/accuracy": [(1, 0.5), (2, 0.625)]}
  resumed = metrics_lib.MetricsWriter(workdir, tensorboard=False, resume_step=1)
  resumed.write(2, {"accuracy": 0.75}, prefix="validation/")  # the replayed step, once
  resumed.close()
  assert outputs.read_private_diagnostics(workdir) == {
      "private_diagnostics/validation/accuracy": [(1, 0.5), (2, 0.75)]}


def test_the_report_never_plots_a_private_metric_of_an_older_run():
  series = {"test/accuracy": [(1, 0.5)], "validation/accuracy": [(1, 0.4)], "empty": []}
  assert report.released_series(series) == {"test/accuracy": [(1, 0.5)]}


@pytest.fixture(scope="module")
def tuning_run(tmp_path_factory):
  """A DP-SGD tuning run through the CLI (validation hold-out, private batch metrics logged):
  (workdir, printed lines, the series handed to the released curves' plot)."""
  workdir = str(tmp_path_factory.mktemp("tuning") / "run")
  plotted = []

  def plot_curves(series, out_path):
    plotted.append(dict(series))
    return out_path

  out = io.StringIO()
  with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
    patch.setattr(report, "plot_curves", plot_curves)
    dpsgd_cli.main(["--dataset=digits", "--model=lenet5_half", "--expected_batch_size=32",
                    "--noise_multiplier=1", "--steps=4", "--learning_rate=0.5", "--seed=0",
                    "--validation_examples=200", "--log_private_diagnostics", "--no-download",
                    f"--workdir={workdir}", "--no_progress"])
  return workdir, out.getvalue().splitlines(), plotted


def _read(workdir, name):
  with open(os.path.join(workdir, name), encoding="utf-8") as f:
    return json.load(f) if name.endswith(".json") else f.read()


def _private_keys_with_values(tree, path=""):
  """Paths of keys that name a private statistic and hold a number, anywhere in `tree`."""
  found = []
  if isinstance(tree, dict):
    for key, value in tree.items():
      if rf.is_private_field(str(key)) and isinstance(value, (int, float, list, dict)):
        found.append(f"{path}/{key}")
      found += _private_keys_with_values(value, f"{path}/{key}")
  elif isinstance(tree, list):
    for i, value in enumerate(tree):
      found += _private_keys_with_values(value, f"{path}[{i}]")
  return found


def test_a_tuning_run_releases_no_private_statistic(tuning_run):
  workdir, printed, plotted = tuning_run
  results, record = _read(workdir, "results.json"), _read(workdir, "record.json")
  validation = results[rf.PRIVATE_KEY]["validation_accuracy"]
  assert 0.0 <= validation <= 1.0 and results["validation_examples"] == 200
  # results.json and record.json: released fields at top level, the statistic in the block.
  assert not [k for k in results if rf.is_private_field(k)]
  assert set(record) <= rf.RELEASED_RECORD_FIELDS | {rf.PRIVATE_KEY}
  assert record[rf.PRIVATE_KEY]["validation_accuracy"] == validation
  assert _private_keys_with_values({k: v for k, v in record.items() if k != rf.PRIVATE_KEY}) == []
  # metrics.csv: released names only; the validation curve and the batch metrics are private.
  released = metrics_lib.read_metrics(workdir)
  assert "test/accuracy" in released
  assert not [n for n in released if rf.is_private_metric(n) or n.startswith("train/")]
  private = outputs.read_private_diagnostics(workdir)
  assert private["private_diagnostics/validation/accuracy"][-1] == (4, validation)
  assert "private_diagnostics/train/loss" in private
  # The released curves' panels: exactly the names of metrics.csv.
  assert len(plotted) == 1 and set(plotted[0]) == set(released)
  # report.md: the value only in its last, PRIVATE section, which is not empty.
  text = _read(workdir, "report.md")
  public, _, private_part = text.partition("## Private diagnostics")
  assert "This run recorded no private diagnostic" not in text
  assert f"- PRIVATE `validation_accuracy`: {json.dumps(validation)}" in private_part
  assert json.dumps(validation) not in public and "validation_accuracy" not in public
  # The model card names the private diagnostics, never their values.
  card_md, card = _read(workdir, "model_card.md"), _read(workdir, "model_card.json")
  assert "validation_accuracy" in card_md and json.dumps(validation) not in card_md
  assert json.dumps(validation) not in json.dumps(card)
  assert _private_keys_with_values(card) == []
  # The printed summary says where the private diagnostics are, not what they are.
  assert any(line.startswith("private diagnostics (not covered by epsilon) in ")
             for line in printed)
  assert not any("validation" in line or json.dumps(validation) in line for line in printed)
