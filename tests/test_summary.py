"""The printed end-of-run summary: headline, loud privacy warnings, where private values are."""

import math

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
