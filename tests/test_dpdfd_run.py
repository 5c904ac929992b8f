"""dpkd_jax.methods.dpdfd.run: the DPDFD run end to end (outputs, resume, teachers)."""

import json
import math
import os
import shutil
import warnings

import jax
import numpy as np
import pytest
from dpdfd_fixtures import version1_json
from resume_fixtures import assert_same_dpdfd_state, interrupted_dpdfd, resume_dpdfd
from teacher_fixtures import copy_without_partition

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import checkpoint
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from experiments import dpdfd as dpdfd_cli


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=8)
  base.update(kw)
  return dpdfd.DPDFDConfig(**base)


def test_teacher_dataset_mismatch_fails_before_compute(teacher_dir, tmp_path):
  config = _config(teacher_dir, dataset="fashion_mnist")
  with pytest.raises(checkpoint.CheckpointMismatchError, match="dataset='digits'"):
    dpdfd.train_dpdfd(config, str(tmp_path), progress=False)
  with pytest.raises(ValueError, match="not divisible"):
    dpdfd.train_dpdfd(_config(teacher_dir, batch_size=12), str(tmp_path), progress=False)


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_run(teacher_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("dpdfd"))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    results = dpdfd.train_dpdfd(_config(teacher_dir), workdir, progress=False)
  return workdir, results


def _assert_per_class_accuracy(results):
  """The released student's accuracy per true test class, weighted by the class sizes, is
  its test accuracy."""
  per_class = results["test_accuracy_per_class"]
  sizes = np.bincount(data.load("digits", "test").labels, minlength=10)
  assert len(per_class) == 10 and all(0.0 <= v <= 1.0 for v in per_class)
  assert np.dot(per_class, sizes) / sizes.sum() == pytest.approx(results["test_accuracy"],
                                                                 abs=1e-9)


def test_results_report_sound_epsilon_of_executed_noise(finished_run):
  workdir, results = finished_run
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["test_accuracy"] == results["test_accuracy"]
  expected = accounting.epsilon(accounting.dpdfd_event(noise_multiplier=10.0, batch_size=16, steps=4),
                                delta=1e-5)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert results["paper_epsilon"] is not None and results["paper_epsilon"] < results["epsilon"]
  assert results["steps"] == 4
  # The generator's class coverage as released: every target of every step, counted by class.
  counts = results["released_rows_per_class"]
  assert len(counts) == 10 and sum(counts) == 4 * 16
  assert results["released_rows_counted_from_step"] == 0
  _assert_per_class_accuracy(results)
  assert os.path.getsize(os.path.join(workdir, "samples.png")) > 0
  # No seed given: a secret root seed, never printed, kept only in the checkpoint.
  assert results["seed"].startswith("os-entropy") and results["config"]["seed"] is None
  value, secret = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))["root_seed"]
  assert secret and str(value) not in json.dumps(results)


def test_results_keep_the_teacher_accuracy_apart_and_the_record_validates(finished_run):
  workdir, results = finished_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "teacher_test_accuracy" not in saved  # a noiseless function of the private data
  private = saved[outputs.PRIVATE_KEY]
  assert "NOT covered by epsilon" in private["_note"]
  assert len(private["teacher_test_accuracy"]) == 1 and saved["warnings"] == []
  names = {name for name in metrics_lib.read_metrics(workdir)}
  assert names and all(n.startswith(("train/", "test/")) for n in names)
  record = records.read_record(os.path.join(workdir, "record.json"))
  assert record["method"] == "dpdfd" and record["dataset"] == "digits"
  assert record["test_accuracy"] == results["test_accuracy"]
  assert record["sound_epsilon"] == pytest.approx(results["epsilon"])
  assert record["paper_epsilon"] == pytest.approx(results["paper_epsilon"])
  assert record["neighbouring"] == "replace-one" and record["accounting"] == "sound"
  assert record["delta"] == 1e-5 and record["cpu_seconds"] > 0 and record["wall_seconds"] > 0


def test_cli_noise_multiplier_zero_is_allowed_and_loudly_not_private(teacher_dir, tmp_path,
                                                                     capsys):
  workdir = str(tmp_path / "run")
  dpdfd_cli.main(["--dataset=digits", f"--teacher_dirs={teacher_dir}", "--noise_multiplier=0",
                  "--student_model=lenet5_half", "--steps=2", "--batch_size=16",
                  "--eval_every=2", "--latent_dim=8", f"--workdir={workdir}", "--no_progress"])
  out = capsys.readouterr().out
  assert "WARNING: epsilon = inf (NOT private)" in out
  assert "private diagnostics (not covered by epsilon) in" in out
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["epsilon"] == math.inf and saved["warnings"] == [outputs.NOT_PRIVATE]
  assert records.read_record(os.path.join(workdir, "record.json"))["sound_epsilon"] == "inf"


def test_resume_is_bit_identical(teacher_dir, finished_run, tmp_path):
  workdir, full = finished_run
  config = _config(teacher_dir)
  # Simulate an interruption after step 2: a fresh workdir holding only the step-2 checkpoint
  # (arrays + ledger + plan + secret root seed) of the finished 4-step run, then resume: equal
  # results show the resumed run continued the original's (never printed) key streams.
  resumed_dir = str(tmp_path / "resumed")
  arrays, meta = interrupted_dpdfd(config, workdir, 2, resumed_dir)
  resumed = resume_dpdfd(config, resumed_dir)
  assert resumed["test_accuracy"] == full["test_accuracy"]
  assert resumed["epsilon"] == pytest.approx(full["epsilon"], rel=1e-9)
  assert_same_dpdfd_state(resumed_dir, workdir)
  # The class counts continue across the resume (the checkpoint carries the first 2 steps').
  assert sum(meta["released_rows_per_class"]) == 2 * 16
  assert resumed["released_rows_per_class"] == full["released_rows_per_class"]
  assert resumed["released_rows_counted_from_step"] == 0
  # A checkpoint written in the first saved config format (flat, the later fields left out at
  # their default) and from before the class count (as such a run wrote it): compared after
  # `config_migration.migrate` it resumes as the new one, and the count is kept from its step.
  # (One resume checks both: the migration reads only `config`, the count only its own keys.)
  v1_dir = str(tmp_path / "format_1")
  old_meta = {k: v for k, v in meta.items() if not k.startswith("released_rows")}
  checkpoint.save(os.path.join(v1_dir, "checkpoints"), 2, arrays,
                  {**old_meta, "config": version1_json(config)})
  assert "version" not in version1_json(config) and "replay_size" not in version1_json(config)
  from_v1 = resume_dpdfd(config, v1_dir)
  assert from_v1["released_rows_counted_from_step"] == 2
  assert sum(from_v1["released_rows_per_class"]) == 2 * 16
  assert from_v1["test_accuracy"] == full["test_accuracy"]
  assert from_v1["config"] == config.to_json()  # saved in today's format from then on
  assert_same_dpdfd_state(v1_dir, workdir)
  assert dpdfd.load_run(v1_dir)[0] == config
  # The checkpoint names its teachers by their weights: a directory retrained since (the same
  # path, other weights) is refused before any step.
  assert len(meta["teachers_sha256"]) == 64
  other_dir = str(tmp_path / "other_teachers")
  checkpoint.save(os.path.join(other_dir, "checkpoints"), 2, arrays,
                  {**meta, "teachers_sha256": "0" * 64})
  with pytest.raises(errors.UserError, match="was run with other teachers"):
    dpdfd.train_dpdfd(config, other_dir, resume=True, progress=False)


def test_resume_with_spent_budget_raises(teacher_dir, tmp_path):
  config = _config(teacher_dir, target_epsilon=30.0, noise_multiplier=10.0, steps=50, eval_every=50)
  plan = dpdfd.make_plan(config)
  spent = ledger_lib.PrivacyLedger(target_epsilon=30.0, delta=1e-5)
  spent.record(accounting.dpdfd_event(noise_multiplier=10.0, batch_size=16, steps=plan.releases),
               step=0)
  state = dpdfd.init_state(config, jax.random.key(0))
  checkpoint.save(os.path.join(str(tmp_path), "checkpoints"), 0, state.arrays(),
                  {"config": config.to_json(), "step": 0, "ledger": spent.to_json()})
  with pytest.raises(ledger_lib.BudgetExceededError):
    dpdfd.train_dpdfd(config, str(tmp_path), resume=True, progress=False)


def test_the_same_teacher_twice_is_refused(teacher_dir, tmp_path):
  # `--teacher_dirs=T,T` used to run with the one-teacher epsilon (sensitivity 2x reported 1x).
  copied = str(tmp_path / "copy")
  shutil.copytree(teacher_dir, copied)
  for dirs in ((teacher_dir, teacher_dir), (teacher_dir, copied)):
    with pytest.raises(errors.UserError, match="twice|same teacher"):
      dpdfd.train_dpdfd(_config(teacher_dir, teacher_dirs=dirs), str(tmp_path / "run"),
                        progress=False)
  assert not os.path.exists(tmp_path / "run" / "results.json")


def test_overlapping_teachers_are_charged_per_record(teacher_dir, tmp_path, capsys):
  # Two whole-data teachers (another seed): one record reaches both, so each summed row
  # moves by 4C and epsilon is that of sigma / 2.
  other = str(tmp_path / "other")
  teacher_lib.train_teacher(teacher_lib.TeacherConfig(
      dataset="digits", model="lenet5", epochs=1, batch_size=64, learning_rate=3e-3, seed=1),
      other, progress=False)
  config = _config(teacher_dir, teacher_dirs=(teacher_dir, other), steps=2)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  expected = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=10.0, batch_size=16, steps=2, num_teachers=2, teachers_per_record=2),
      delta=1e-5)
  one_teacher = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=10.0, batch_size=16, steps=2), delta=1e-5)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9) and expected > one_teacher
  assert results["teachers_per_record"] == 2
  assert "may reach 2 teachers" in capsys.readouterr().out


# ------------------------------------------------------- a stacked disjoint-shard ensemble


def test_stacked_ensemble_end_to_end_counts_one_teacher_per_record(ensemble_dir, tmp_path,
                                                                  capsys):
  ensemble = str(tmp_path / "ensemble")
  shutil.copytree(ensemble_dir, ensemble)
  config = _config(None, teacher_dirs=(), teacher_ensemble_dir=ensemble, steps=2)
  results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  plan = dpdfd.make_plan(config, 1, num_teachers=3)
  expected = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=10.0, batch_size=16, steps=2, num_teachers=3, teachers_per_record=1),
      delta=1e-5)
  assert 0 < results["epsilon"] < math.inf
  assert results["epsilon"] == pytest.approx(plan.sound_epsilon, rel=1e-9)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9)
  with open(tmp_path / "run" / "results.json") as f:
    saved = json.load(f)
  assert (saved["num_teachers"], saved["teachers_per_record"]) == (3, 1)
  assert "3 stacked teachers on disjoint equal shards" in saved["teacher_partition"]
  assert set(saved[outputs.PRIVATE_KEY]["teacher_ensemble"]) == {
      "teacher_mean", "plurality", "agreement"}
  assert records.read_record(str(tmp_path / "run" / "record.json"))["sound_epsilon"] == (
      pytest.approx(results["epsilon"]))
  # Resuming checks the config, and that the directory still gives the same n and m.
  again = dpdfd.train_dpdfd(config, str(tmp_path / "run"), resume=True, progress=False)
  assert again["epsilon"] == pytest.approx(results["epsilon"], rel=1e-9)
  with pytest.raises(errors.UserError, match="holds a DPDFD run with another config"):
    dpdfd.train_dpdfd(_config(None, teacher_dirs=(), teacher_ensemble_dir=ensemble_dir,
                              steps=2), str(tmp_path / "run"), resume=True, progress=False)
  shutil.rmtree(ensemble)
  copy_without_partition(ensemble_dir, ensemble)  # retrained since: m = n now
  capsys.readouterr()
  with pytest.raises(errors.UserError, match="was run with teachers"):
    dpdfd.train_dpdfd(config, str(tmp_path / "run"), resume=True, progress=False)
  # The worst case is said in one line (m = n: the meta proves no partition).
  assert "DPDFD accounting: the stacked ensemble's meta does not prove" in (
      capsys.readouterr().out)


def test_stacked_ensemble_logits_and_a_missing_partition(ensemble_dir, tmp_path):
  config = _config(None, teacher_dirs=(), teacher_ensemble_dir=ensemble_dir)
  stacked, source = dpdfd.load_teachers(config)
  assert stacked.size == 3 and source.overlap.teachers_per_record == 1
  # teacher_logits (vmapped over the stack, empty batch_stats) = the ensemble's own logits.
  own, _ = teacher_ensemble.load(ensemble_dir, flag="--x")
  images, info = data.load("digits", "test").images[:20], data.DATASETS["digits"]
  np.testing.assert_allclose(
      step_lib.teacher_logits(stacked.graphdef, stacked.params, stacked.batch_stats,
                              data.normalize(images, info)),
      teacher_ensemble.ensemble_logits(own, images, info), atol=1e-5)
  # Saved without its partition record (an older DF-PATE teachers_dir): m = n, said once.
  old = copy_without_partition(ensemble_dir, str(tmp_path / "old"))
  config = _config(None, teacher_dirs=(), teacher_ensemble_dir=old, steps=2)
  _, source = dpdfd.load_teachers(config)
  assert source.overlap.teachers_per_record == 3
  assert "does not prove a partition into 3" in source.overlap.reason
  worst = dpdfd.make_plan(config, source.overlap.teachers_per_record, num_teachers=3)
  assert worst.sound_epsilon > 2 * dpdfd.make_plan(config, 1, num_teachers=3).sound_epsilon


def test_cifar10_runs_end_to_end_on_mock_data(tmp_path, mock_tfds):
  # The README's CIFAR-10 command needs tfds online; here tfds serves random mock images of
  # the real shapes (32x32x3, 10 classes), so the whole path (teacher, 3-channel generator,
  # student, accounting, sample grid) runs offline.
  with mock_tfds(num_examples=64):
    teacher_dir = str(tmp_path / "teacher")
    teacher_lib.train_teacher(teacher_lib.TeacherConfig(
        dataset="cifar10", model="lenet5", epochs=1, batch_size=32, learning_rate=3e-3),
        teacher_dir, progress=False)
    config = dpdfd.DPDFDConfig(dataset="cifar10", teacher_dirs=(teacher_dir,),
                               student_model="lenet5_half", generator_channels=8,
                               noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2,
                               latent_dim=8)
    results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  assert 0.0 <= results["test_accuracy"] <= 1.0
  assert 0 < results["epsilon"] < math.inf
  assert os.path.exists(tmp_path / "run" / "samples.png")
