"""dpkd_jax.train.report: every run's report.md (curves, ε spent, samples, privacy–utility)."""

import json
import math
import os

import pytest

from dpkd_jax import errors
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import report
from experiments import results as results_cli

SECRET = 0.98765  # a private diagnostic's value: must appear only marked PRIVATE


def _ledger(path, charges=3):
  ledger = ledger_lib.PrivacyLedger(target_epsilon=20.0, delta=1e-5, relation="replace-one")
  for i in range(charges):
    ledger.record(accounting.dpdfd_event(noise_multiplier=50.0, batch_size=16, steps=10),
                  step=10 * i, note=f"steps {10 * i}..{10 * i + 9}")
  ledger.save(path)
  return ledger


def _run(workdir, *, method="dpdfd", epsilon_metric=True, samples=True, ledger=True,
         dataset="digits"):
  """A finished run's files, written by hand (no training): fast and exact."""
  os.makedirs(workdir, exist_ok=True)
  writer = metrics_lib.MetricsWriter(str(workdir), tensorboard=False)
  for step in (10, 20, 30):
    writer.write(step, {"student_loss": 1.0 / step, **({"epsilon": step / 5.0}
                                                        if epsilon_metric else {})},
                 prefix="train/")
    writer.write(step, {"accuracy": 0.1 + step / 100}, prefix="test/")
  private = outputs.PrivateDiagnosticsWriter(str(workdir), tensorboard=False)
  private.write(30, {"teacher_loss": 0.123})
  private.close()
  if ledger:
    _ledger(os.path.join(workdir, "privacy_ledger.json"))
  if samples:
    with open(os.path.join(workdir, "samples.png"), "wb") as f:
      f.write(b"\x89PNG\r\n\x1a\n")
  results = {"method": method, "test_accuracy": 0.4, "epsilon": 6.0, "delta": 1e-5,
             "paper_epsilon": 0.5, "config": {"dataset": dataset},
             "warnings": ["sound epsilon 6 exceeds target_epsilon=5 (accounting=paper)"],
             outputs.PRIVATE_KEY: outputs.private_section(
                 {"teacher_test_accuracy": [SECRET]}, workdir=str(workdir))}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f)
  records.write_record(os.path.join(workdir, "record.json"), records.make_record(
      method=method, dataset=dataset, test_accuracy=0.4, sound_epsilon=6.0, delta=1e-5,
      neighbouring="replace-one", accounting="paper", paper_epsilon=0.5, cpu_seconds=1.0,
      wall_seconds=2.0, command="python -m experiments.x --loss=ce|mse", commit="abc"))
  return str(workdir)


def _committed(results_dir):
  os.makedirs(results_dir)
  base = dict(delta=1e-5, neighbouring="replace-one", accounting="sound", cpu_seconds=1.0,
              wall_seconds=1.0, command="c", commit="x")
  for name, dataset, method, eps in (("a", "digits", "dpdfd", 10.0), ("b", "digits", "dpsgd", 1.0),
                                     ("c", "mnist", "dpdfd", 10.0),
                                     ("t", "digits", "teacher", "inf")):
    records.write_record(os.path.join(results_dir, f"{name}.json"), records.make_record(
        method=method, dataset=dataset, test_accuracy=0.5, sound_epsilon=eps, **base))
  with open(os.path.join(results_dir, "broken.json"), "w") as f:
    f.write("{")
  return str(results_dir)


def _sections(text):
  return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def test_report_has_every_section_and_its_images(tmp_path):
  workdir = _run(tmp_path / "run")
  path = report.write_report(workdir, results_dir=_committed(tmp_path / "results"))
  text = open(path, encoding="utf-8").read()
  assert _sections(text) == ["Summary", "Learning curves", "Privacy spent", "Synthetic samples",
                             "Privacy–utility", "Private diagnostics (NOT covered by ε)"]
  for image in (report.CURVES_PNG, report.PRIVACY_PNG, report.UTILITY_PNG, "samples.png"):
    assert f"]({image})" in text
    assert os.path.getsize(os.path.join(workdir, image)) > 0
  assert "| sound ε (dp_accounting) | 6 |" in text
  assert "| neighbouring relation | replace-one |" in text
  assert "| paper-formula ε (NOT a valid guarantee) | 0.5 |" in text
  assert "exceeds target_epsilon=5" in text
  assert "| command | `python -m experiments.x --loss=ce\\|mse` |" in text
  assert "`train/epsilon`" in text and "budget 20, 3 charges" in text
  # The digits student records beside the run: not mnist, not the teacher, not the broken file.
  assert "the 2 committed records of digits" in text
  assert "Unreadable records skipped: broken." in text


def test_private_values_appear_only_marked_in_their_section(tmp_path):
  text = open(report.write_report(_run(tmp_path / "run"), results_dir=None),
              encoding="utf-8").read()
  head, private = text.split("## Private diagnostics (NOT covered by ε)")
  assert str(SECRET) not in head and "teacher_loss" not in head
  assert "private_diagnostics.csv" not in head
  assert f"- PRIVATE `teacher_test_accuracy`: [{SECRET}]" in private
  assert "- PRIVATE file (not plotted): `private_diagnostics.csv`" in private
  assert "**PRIVATE, not covered by ε" in private
  for line in private.splitlines():
    assert str(SECRET) not in line or line.startswith("- PRIVATE")
  assert report.PRIVATE_KEY == outputs.PRIVATE_KEY


def test_privacy_curve_from_the_ledger_when_metrics_lack_epsilon(tmp_path):
  workdir = _run(tmp_path / "run", epsilon_metric=False, samples=False)
  text = open(report.write_report(workdir, results_dir=None), encoding="utf-8").read()
  assert "recomputed from the events of privacy_ledger.json" in text
  assert "Synthetic samples" not in text
  assert "no committed record of this dataset" in text
  ledger = json.load(open(os.path.join(workdir, "privacy_ledger.json")))
  points = report.ledger_series(ledger)
  assert [s for s, _ in points] == [0, 10, 20]
  assert all(a < b for (_, a), (_, b) in zip(points, points[1:]))
  whole = accounting.epsilon(accounting.dpdfd_event(noise_multiplier=50.0, batch_size=16,
                                                    steps=30), delta=1e-5)
  assert math.isclose(points[-1][1], whole, rel_tol=1e-6)


def test_ledger_series_recomputes_at_most_the_cap(tmp_path):
  ledger = _ledger(tmp_path / "l.json", charges=45)
  data = json.loads(ledger.to_json())
  points = report.ledger_series(data)
  assert len(points) <= report._MAX_LEDGER_POINTS + 1 and points[-1][0] == 440


def test_a_run_without_ledger_says_so(tmp_path):
  workdir = _run(tmp_path / "run", epsilon_metric=False, ledger=False)
  text = open(report.write_report(workdir, results_dir=None), encoding="utf-8").read()
  assert "no privacy ledger in this run" in text and report.PRIVACY_PNG not in text


def test_not_a_run_is_a_user_error(tmp_path):
  with pytest.raises(errors.UserError, match="no results.json"):
    report.write_report(str(tmp_path))


def test_finish_run_writes_the_report(tmp_path):
  workdir = str(tmp_path)
  results = {"method": "dpdfd", "test_accuracy": 0.3, "epsilon": math.inf, "delta": 1e-5,
             outputs.PRIVATE_KEY: outputs.private_section()}
  outputs.finish_run(workdir, results, run=None, clock=outputs.RunClock(), dataset="digits",
                     test_accuracy=0.3, sound_epsilon=math.inf, delta=1e-5)
  text = open(os.path.join(workdir, report.FILE_NAME), encoding="utf-8").read()
  assert "| sound ε (dp_accounting) | ∞ |" in text and "No metrics.csv in this run." in text
  assert "This run recorded no private diagnostic." in text


def test_results_cli_report(tmp_path, capsys):
  workdir = _run(tmp_path / "run")
  assert results_cli.main([f"--results_dir={tmp_path}/none", "report", f"--run={workdir}"]) == 0
  assert capsys.readouterr().out.strip() == f"wrote {workdir}/report.md"
  for argv, fragment in ((["report", f"--run={tmp_path}/missing"], "is not a directory"),
                         (["report", f"--run={tmp_path}"], "no results.json"),
                         (["report"], "required: --run")):
    with pytest.raises(SystemExit) as exit_info:
      code = results_cli.main(argv)
      raise SystemExit(code)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and err.startswith("error: ")
