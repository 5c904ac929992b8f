"""RONA end to end on the embedded digits (tiny epochs, 8 fake devices): results, ledger,
record, resume, the auxiliary teacher's split, the schedule.

One full run trains both teachers (LeNet-5-Half, 1 epoch) and a LeNet-5-Half student (one
architecture keeps XLA's initialiser compilations to one set; compact students are covered by
test_rona_step.py) through one hint epoch, one self-learning epoch, one selection and one
distillation epoch, with query batches S = 32 of |x_q| = 64 samples: T = (1 + 1·1)·2 = 4
queries. Later runs reuse its teachers; one (cosine rates, shifted self-learning inputs, a
validation hold-out) runs whole and again interrupted after two units of the schedule and
resumed: it must end exactly where its uninterrupted twin ended. Tolerances: ε recomputed
from the same events is equal to 1e-9 (relative); the resumed run replays identical
computations (loss equal to 1e-7).
"""

import dataclasses
import functools
import json
import math
import os

import pytest

from dpkd_jax.methods import rona
from dpkd_jax.methods.rona import student
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from experiments import rona as rona_cli

SIGMA = 2.0


def _config(**kw):
  base = dict(noise_multiplier=SIGMA, dataset="digits", teacher_model="lenet5_half",
              student_model="lenet5_half",
              teacher_epochs=1, teacher_batch_size=64, hint_epochs=1, rounds=1,
              self_learning_epochs=1, distillation_epochs=1, num_query_samples=64,
              batch_size=32, self_learning_batch_size=64, seed=0)
  base.update(kw)
  return rona.RONAConfig(**base)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rona_full"))
  return workdir, rona.train_rona(_config(), workdir, progress=False, latency_seconds=0.0)


def test_results_ledger_and_query_count(full_run):
  workdir, results = full_run
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f) == json.loads(json.dumps(results, default=float))
  expected_queries = accounting.rona_num_queries(hint_epochs=1, distillation_epochs=1, rounds=1,
                                                 num_query_samples=64, batch_size=32)
  assert expected_queries == 4
  assert results["num_queries"] == results["num_queries_executed"] == expected_queries
  assert results["finished"] and results["units_done"] == results["units_planned"] == 4
  ledger = ledger_lib.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  assert [e.note for e in ledger.entries] == ["hint round 0 epoch 0", "distill round 0 epoch 0"]
  sound = accounting.epsilon(accounting.rona_event(noise_multiplier=SIGMA, num_queries=4),
                             delta=1e-5)
  assert results["epsilon"] == pytest.approx(sound, rel=1e-9)
  assert ledger.spent_epsilon() == pytest.approx(sound, rel=1e-9)
  assert results["paper_epsilon_per_query"] == pytest.approx(
      math.sqrt(2 * math.log(1.25e5)) / SIGMA)
  assert "ours is 2B" in results["paper_epsilon_warning"]
  assert results["seed"] == 0 and results["num_public"] + results["num_sensitive"] == 1442
  report = results["compression"]
  assert report["student"]["params"] == report["teacher"]["params"] == 15_749
  assert report["student"]["latency_ms_per_image_batch256"] > 0
  assert 0 <= results["test_accuracy"] <= 1
  with open(os.path.join(workdir, "aux_teacher", "card.json")) as f:
    assert json.load(f)["public_split"] == rona.public_split_card(_config(), 577)


def test_teacher_accuracy_is_a_private_diagnostic_and_the_record_validates(full_run):
  workdir, results = full_run
  assert "test_accuracy" not in results["compression"]["teacher"]
  assert results["compression"]["student"]["test_accuracy"] == results["test_accuracy"]
  private = results[outputs.PRIVATE_KEY]
  assert 0 <= private["teacher_test_accuracy"] <= 1 and private["files"] == ["teacher"]
  record = records.read_record(os.path.join(workdir, "record.json"))
  assert record["method"] == "rona" and record["sound_epsilon"] == results["epsilon"]
  assert record["paper_epsilon"] == results["paper_epsilon_composed"]
  assert record["paper_epsilon_per_query"] == results["paper_epsilon_per_query"]
  assert record["accounting"] == "sound" and "Theorem 2" in record["paper_epsilon_scope"]
  assert record["neighbouring"] == "replace-one" and record["warnings"] == []


def test_cli_noise_multiplier_zero_is_allowed_and_loudly_not_private(full_run, tmp_path,
                                                                     capsys, monkeypatch):
  workdir, _ = full_run
  monkeypatch.setattr(rona, "train_rona", functools.partial(rona.train_rona,
                                                            latency_seconds=0.0))
  run = str(tmp_path / "run")
  rona_cli.main(["--dataset=digits", "--noise_multiplier=0", "--bound_mode=none",
                 f"--teacher_dir={workdir}/teacher", "--student_model=lenet5_half",
                 "--hint_epochs=1", "--rounds=1", "--num_query_samples=64", "--batch_size=32",
                 "--self_learning_batch_size=64", "--seed=0", "--no-download",
                 f"--workdir={run}", "--no_progress"])
  out = capsys.readouterr().out
  assert "WARNING: epsilon = inf (NOT private)" in out
  assert "private diagnostics (not covered by epsilon) in" in out
  with open(os.path.join(run, "results.json")) as f:
    saved = json.load(f)
  assert saved["epsilon"] == math.inf and saved["warnings"] == [outputs.NOT_PRIVATE]
  assert records.read_record(os.path.join(run, "record.json"))["sound_epsilon"] == "inf"


@pytest.fixture(scope="module")
def variant_run(full_run, tmp_path_factory):
  """(config, workdir, results) of a run on the full run's teachers with cosine learning
  rates, shifted self-learning inputs over two epochs and a validation hold-out of 50 records.

  The teachers are the full run's: the teacher trains on every row and the auxiliary one on the
  public split, neither of which the hold-out changes. (The options touch independent parts:
  the optimizers, the self-learning inputs, the evaluation; each test below checks its own.)"""
  teachers, _ = full_run
  config = _config(teacher_dir=os.path.join(teachers, "teacher"),
                   aux_teacher_dir=os.path.join(teachers, "aux_teacher"),
                   learning_rate_schedule="cosine", self_learning_augment=True,
                   self_learning_epochs=2, validation_examples=50)
  workdir = str(tmp_path_factory.mktemp("rona_variant"))
  return config, workdir, rona.train_rona(config, workdir, progress=False, latency_seconds=0.0)


def test_interrupted_run_resumes_to_the_same_end(variant_run, tmp_path):
  # Each stage's Adam decays over its own steps in the run and the shifts come from their own
  # key stream, so a run interrupted inside self-learning and resumed must replay them exactly
  # (the plain schedule is the same loop without them).
  config, _, whole = variant_run
  resumed_dir = str(tmp_path / "resumed")
  partial = rona.train_rona(config, resumed_dir, stop_after_units=2, progress=False,
                            latency_seconds=0.0)
  assert not partial["finished"] and partial["units_done"] == 2
  assert partial["num_queries_executed"] == 2
  with pytest.raises(ValueError, match="already holds a RONA checkpoint"):
    rona.train_rona(config, resumed_dir, progress=False)
  with pytest.raises(ValueError, match="another config"):
    rona.train_rona(dataclasses.replace(config, noise_multiplier=3.0), resumed_dir,
                    resume=True, progress=False)
  final = rona.train_rona(config, resumed_dir, resume=True, progress=False, latency_seconds=0.0)
  assert final["finished"] and final["num_queries_executed"] == 4
  assert (final[outputs.PRIVATE_KEY]["validation_accuracy"]
          == whole[outputs.PRIVATE_KEY]["validation_accuracy"])
  assert final["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-7)
  assert final["epsilon"] == pytest.approx(whole["epsilon"], rel=1e-9)
  assert final["final_l2_bounds"] == pytest.approx(whole["final_l2_bounds"], rel=1e-6)
  assert config.phase_steps(577) == {"hint": 2, "self": 2 * (577 // 64), "distill": 2}
  optimizers = student.phase_optimizers(config.learning_rate, "cosine", config.phase_steps(577))
  assert optimizers["hint"] is not optimizers["self"]  # one cosine per stage length


def test_aux_teacher_of_another_split_is_refused(full_run, tmp_path):
  workdir, _ = full_run
  config = _config(split_seed=1, teacher_dir=os.path.join(workdir, "teacher"),
                   aux_teacher_dir=os.path.join(workdir, "aux_teacher"))
  with pytest.raises(ValueError, match="public_split"):
    rona.train_rona(config, str(tmp_path / "run"), progress=False)


def test_schedule_and_query_count():
  config = _config(hint_epochs=2, rounds=2, self_learning_epochs=1, distillation_epochs=2,
                   num_query_samples=100, batch_size=32)
  assert rona.schedule(config) == [
      ("hint", 0, 0), ("hint", 0, 1),
      ("self", 0, 0), ("select", 0, 0), ("distill", 0, 0), ("distill", 0, 1),
      ("self", 1, 0), ("select", 1, 0), ("distill", 1, 0), ("distill", 1, 1)]
  private_epochs = sum(phase in ("hint", "distill") for phase, _, _ in rona.schedule(config))
  assert config.num_queries() == private_epochs * 4 == accounting.rona_num_queries(
      hint_epochs=2, distillation_epochs=2, rounds=2, num_query_samples=100, batch_size=32)




def test_a_validation_hold_out_keeps_the_test_split_for_the_end(variant_run):
  # The hold-out comes from the sensitive part (the public split is unchanged); the units are
  # evaluated on it (private diagnostics only), the test split is read once at the end.
  _, workdir, results = variant_run
  private = results[outputs.PRIVATE_KEY]
  assert private["validation_examples"] == 50 and 0 <= private["validation_accuracy"] <= 1
  assert 0 <= results["test_accuracy"] <= 1
  assert not any(name.startswith("test/") for name in metrics_lib.read_metrics(workdir))
  assert "private_diagnostics/validation/accuracy" in outputs.read_private_diagnostics(workdir)
  assert records.read_record(os.path.join(workdir, "record.json"))["selection"] == "validation"
