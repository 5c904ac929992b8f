"""Tests of `dfpate.run.train_dfpate` on the embedded digits, with tiny configs."""

import json
import math
import os

import numpy as np
import pytest

from dpkd_jax.methods import dfpate
from dpkd_jax.methods.dfpate import student as student_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from experiments import dfpate as dfpate_cli

_TINY = dict(dataset="digits", num_teachers=4, teacher_epochs=1, teacher_batch_size=32,
             rounds=2, queries_per_round=16, pool_factor=2, student_model="lenet5_half",
             student_epochs=1, student_batch_size=16, seed=0)
_TINY_DPQ = dict(_TINY, query_source="dp_model", query_model_components=6,
                 query_model_clusters=4)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("dfpate"))
  teachers_dir = os.path.join(workdir, "teachers")
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=5.0, teachers_dir=teachers_dir)
  results = dfpate.train_dfpate(config, os.path.join(workdir, "run"), progress=False)
  return config, workdir, results


def test_end_to_end_outputs_and_sound_epsilon(tiny_run):
  config, workdir, results = tiny_run
  run = os.path.join(workdir, "run")
  for name in ("results.json", "samples.png", "metrics.csv"):
    assert os.path.exists(os.path.join(run, name)), name
  with open(os.path.join(run, "results.json")) as f:
    assert json.load(f)["num_queries"] == 32
  expected = accounting.epsilon(accounting.pate_event(noise_std=results["noise_std"],
                                                      num_queries=32), delta=1e-5)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert 4.9 < results["epsilon"] <= 5.0  # calibrated to the target, never above
  assert len(results["accuracy_per_round"]) == 2
  assert 0.0 <= results["test_accuracy"] <= 1.0
  meta = checkpoint.restore_metadata(os.path.join(run, "checkpoints"))
  ledger = ledger_lib.PrivacyLedger.from_json(meta["ledger"])
  assert len(ledger.entries) == 2
  assert ledger.spent_epsilon() == pytest.approx(results["epsilon"], rel=1e-9)
  # Teacher accuracies / agreement are noiseless functions of the private teachers.
  with open(os.path.join(run, "results.json")) as f:
    saved = json.load(f)
  assert "teachers" not in saved and saved["warnings"] == []
  assert set(saved[outputs.PRIVATE_KEY]["teachers"]) == {"teacher_mean", "plurality", "agreement"}
  record = records.read_record(os.path.join(run, "record.json"))
  assert record["method"] == "dfpate" and record["test_accuracy"] == results["test_accuracy"]
  assert record["sound_epsilon"] == pytest.approx(results["epsilon"])


def test_refuses_existing_workdir_and_resumes(tiny_run):
  config, workdir, results = tiny_run
  run = os.path.join(workdir, "run")
  with pytest.raises(ValueError, match="resume"):
    dfpate.train_dfpate(config, run, progress=False)
  resumed = dfpate.train_dfpate(config, run, resume=True, progress=False)  # nothing left to do
  assert resumed["accuracy_per_round"] == results["accuracy_per_round"]
  assert resumed["epsilon"] == pytest.approx(results["epsilon"])


def test_saved_teachers_are_reused_only_for_the_same_training(tiny_run):
  config, workdir, _ = tiny_run
  other = dfpate.DFPATEConfig(**{**_TINY, "teacher_epochs": 2}, target_epsilon=5.0,
                              teachers_dir=config.teachers_dir)
  with pytest.raises(ValueError, match="another teachers_dir"):
    dfpate.train_dfpate(other, os.path.join(workdir, "other"), progress=False)


def test_baselines_epsilon_zero_and_inf(tiny_run, tmp_path, capsys):
  config, _, _ = tiny_run
  no_teacher = dfpate.DFPATEConfig(**{**_TINY, "rounds": 1}, use_teachers=False)
  r = dfpate.train_dfpate(no_teacher, str(tmp_path / "none"), progress=False)
  assert r["epsilon"] == 0.0 and r[outputs.PRIVATE_KEY]["teachers"] == {}
  # --noise_std=0 through the CLI: allowed, loudly not private (reuses the trained ensemble).
  flags = [f"--{k}={v}" for k, v in {**_TINY, "rounds": 1}.items()]
  dfpate_cli.main(flags + ["--target_epsilon=none", "--noise_std=0", "--no_progress",
                           f"--teachers_dir={config.teachers_dir}",
                           f"--workdir={tmp_path / 'exact'}"])
  assert "WARNING: epsilon = inf (NOT private)" in capsys.readouterr().out
  with open(tmp_path / "exact" / "results.json") as f:
    assert json.load(f)["epsilon"] == math.inf
  assert records.read_record(str(tmp_path / "exact" / "record.json"))["sound_epsilon"] == "inf"


def test_noise_std_above_target_is_refused(tmp_path):
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=1.0, noise_std=1.0)
  with pytest.raises(ValueError, match="target_epsilon"):
    dfpate.train_dfpate(config, str(tmp_path), progress=False)


@pytest.fixture(scope="module")
def self_training_run(tmp_path_factory):
  """Results of one run with both self-training options of the data-private query model on:
  the teachers relabel a pool of its samples, the student trains on its own confident labels
  of another (independent parts: the teachers before the queries, the student after them)."""
  config = dfpate.DFPATEConfig(**_TINY_DPQ, target_epsilon=8.0, teacher_self_training_pool=24,
                               teacher_self_training_epochs=1, teacher_pseudo_threshold=0.0,
                               student_pseudo_pool=32, student_pseudo_threshold=0.0)
  return dfpate.train_dfpate(config, str(tmp_path_factory.mktemp("dfpate_self") / "run"),
                             progress=False)


def test_teacher_self_training_runs_and_reports_both_ensembles(self_training_run):
  results = self_training_run
  private = results["private_diagnostics"]  # noiseless functions of the teachers
  assert "teachers" not in results and set(private["teachers"]) == set(
      private["teachers_before_self_training"])
  assert results["epsilon"] <= 8.0  # self-training is post-processing of the query model
  with pytest.raises(ValueError, match="dp_model"):
    dfpate.DFPATEConfig(**{**_TINY_DPQ, "query_source": "procedural"},
                        teacher_self_training_pool=10)


def test_student_self_training_uses_only_confident_own_labels(self_training_run):
  probs = np.array([[0.97, 0.03], [0.6, 0.4], [0.01, 0.99]])
  targets, weights = student_lib.pseudo_label_targets(probs, threshold=0.95)
  np.testing.assert_array_equal(targets, [[1, 0], [1, 0], [0, 1]])
  np.testing.assert_array_equal(weights, [1, 0, 1])
  results = self_training_run
  assert results["num_queries"] == 32 and results["epsilon"] <= 8.0  # pool is not queried


def test_a_validation_hold_out_keeps_the_test_split_for_the_end(tmp_path):
  # The teachers train without the hold-out, the rounds are evaluated on it (private
  # diagnostics only), the test split is read once at the end.
  workdir = str(tmp_path / "run")
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=5.0, validation_examples=100)
  results = dfpate.train_dfpate(config, workdir, progress=False)
  private = results[outputs.PRIVATE_KEY]
  assert "accuracy_per_round" not in results and len(private["validation_accuracy_per_round"]) == 2
  assert private["validation_examples"] == 100 and 0 <= results["test_accuracy"] <= 1
  assert not any(name.startswith("test/") for name in metrics_lib.read_metrics(workdir))
  assert "private_diagnostics/validation/accuracy" in outputs.read_private_diagnostics(workdir)
  assert records.read_record(os.path.join(workdir, "record.json"))["selection"] == "validation"
