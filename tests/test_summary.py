"""The printed end-of-run summary: headline, loud privacy warnings, where private values are."""

import math
import os

from dpkd_jax.train import outputs
from dpkd_jax.train import summary


def _dpdfd_results(**kw):
  base = {"method": "dpdfd", "test_accuracy": 0.75, "epsilon": 11.65, "paper_epsilon": 1.0,
          "delta": 1e-5, "steps": 100, "config": {"dataset": "mnist"},
          "warnings": outputs.privacy_warnings(sound_epsilon=11.65, target_epsilon=1.0,
                                               accounting="paper"),
          outputs.PRIVATE_KEY: outputs.private_section({"teacher_test_accuracy": [0.99]})}
  base.update(kw)
  return base


def test_paper_target_exceeded_is_a_warning_line_naming_the_sound_epsilon():
  lines = summary.summary_lines(_dpdfd_results(), workdir="runs/x")
  assert lines[0].startswith("DPDFD mnist: test accuracy 0.7500 after 100 steps; sound epsilon 11.65")
  assert "paper-formula epsilon 1 (NOT a valid guarantee)" in lines[0]
  warning = [line for line in lines if line.startswith("WARNING:")]
  assert len(warning) == 1 and "sound epsilon 11.65 exceeds target_epsilon=1" in warning[0]
  assert lines[-1].startswith("-> runs/x")


def test_private_diagnostics_are_located_never_printed():
  lines = summary.summary_lines(_dpdfd_results(), workdir="runs/x")
  private = [line for line in lines if line.startswith("private diagnostics")]
  assert private == ['private diagnostics (not covered by epsilon) in runs/x/results.json '
                     '["private_diagnostics"]']
  assert "0.99" not in "\n".join(lines)
  with_csv = _dpdfd_results(**{outputs.PRIVATE_KEY: {"_note": "n", "files": ["a.csv"]}})
  assert summary.private_diagnostics_line(with_csv, "w") == (
      "private diagnostics (not covered by epsilon) in w/a.csv")
  none = _dpdfd_results(**{outputs.PRIVATE_KEY: outputs.private_section()})
  assert summary.private_diagnostics_line(none) is None


def test_infinite_epsilon_is_loud():
  results = _dpdfd_results(epsilon=math.inf, paper_epsilon=None,
                           warnings=outputs.privacy_warnings(sound_epsilon=math.inf))
  lines = summary.summary_lines(results)
  assert "sound epsilon inf" in lines[0]
  assert "WARNING: epsilon = inf (NOT private)" in lines


def test_unknown_method_gets_a_generic_headline():
  assert summary.summary_lines({"method": "new", "test_accuracy": 0.5, "epsilon": 2.0}) == [
      "new: test accuracy 0.5, ε = 2"]


def test_dpsgd_summary_names_the_relation_with_add_remove_beside():
  results = {"method": "dpsgd", "model": "lenet5", "config": {"dataset": "mnist"},
             "test_accuracy": 0.95, "epsilon": 1.0, "epsilon_add_remove": 0.787, "delta": 1e-5,
             "noise_multiplier": 0.876, "sampling_rate": 0.00427, "steps": 500,
             "planned_steps": 500}
  line = summary.summary_lines(results, workdir="w")[0]
  assert "ε=1 (replace-one; add/remove ε=0.787)" in line


def test_conversion_lines_paper_accounting_files_and_chance(tmp_path):
  from dpkd_jax.train import records  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path)
  records.write_record(os.path.join(workdir, "record.json"), records.make_record(
      method="dpdfd", dataset="mnist", test_accuracy=0.11, sound_epsilon=516.1, delta=1e-5,
      neighbouring="replace-one", accounting="paper", paper_epsilon=10.0, cpu_seconds=1,
      wall_seconds=1, command="c", commit="x"))
  (tmp_path / "report.md").write_text("r")
  results = _dpdfd_results(test_accuracy=0.11, epsilon=516.1, paper_epsilon=10.0,
                           accounting_used_for_budget="paper")
  lines = summary.conversion_lines(results, workdir=workdir, num_classes=10,
                                   chance_reason="why at chance: test")
  assert lines[:3] == [
      "student test accuracy: 0.1100 (mnist test split)",
      "privacy: sound epsilon 516.1 at delta 1e-05, replace-one neighbouring (dp_accounting)",
      "paper-formula epsilon 10: chose the noise, NOT a valid guarantee"]
  # The teacher's accuracy (0.99) is a private diagnostic: named, never shown.
  assert not any("teacher" in line or "0.99" in line for line in lines)
  assert f"run report: {workdir}/report.md" in lines
  assert not any(line.startswith(("student checkpoint", "model card")) for line in lines)
  assert lines[-2:] == [f"private diagnostics (not covered by epsilon) in {workdir}/results.json"
                        ' ["private_diagnostics"]', "why at chance: test"]
  sound = summary.conversion_lines({**results, "test_accuracy": 0.5,
                                    "accounting_used_for_budget": "sound"},
                                   workdir=workdir, num_classes=10, chance_reason="x")
  assert "x" not in sound and not any("paper-formula" in line for line in sound)


def test_rona_summary_shows_the_paper_theorem_2_figure_beside_the_sound_one():
  results = {"method": "rona", "student_model": "compact_5k", "config": {"dataset": "mnist"},
             "test_accuracy": 0.9879, "epsilon": 15.22, "delta": 1e-5,
             "noise_multiplier": 5.989, "num_queries": 70, "num_queries_executed": 70,
             "paper_epsilon_composed": 7.68, "paper_epsilon_per_query": 0.809}
  lines = summary.summary_lines(results, workdir="w")
  assert "test accuracy 0.9879 at sound ε=15.22" in lines[0]
  assert lines[1] == "  paper (NOT a guarantee): Theorem 2 ε 7.68 over the queries, 0.809 per query"
  del results["paper_epsilon_composed"]  # results written before the composed figure existed
  assert "; paper per-query ε 0.809 (NOT a guarantee)" in summary.summary_lines(results)[0]
