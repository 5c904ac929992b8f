"""The tiny audit CI runs: `python -m experiments.audit` end to end on a small MNIST-format file.

The file is the embedded digits written as `mnist.npz` (1,442 training records), DP-SGD for a
few steps with 100 canaries. It checks the plumbing, not the bound: inclusion reproducible from
the recorded key, the run trained on the inserted labels, the scores recomputed from the
released run alone (the secret canaries/ folder removed) give the recorded audit, the auditor's
bounds are finite and >= 0, and the record, results and model card carry the block; the
white-box last-iterate block (final parameters against the public initialisation) is scored
from the same released copy and written as its own threat model's record.
"""

import json
import os
import shutil

import numpy as np
import pytest

from dpkd_jax import audit
from dpkd_jax import data
from dpkd_jax.audit import canaries
from dpkd_jax.audit import run as audit_run
from dpkd_jax.train import records
from experiments import audit as audit_cli

_DPSGD = ["--dataset=mnist", "--model=lenet5_half", "--expected_batch_size=16",
          "--noise_multiplier=1.0", "--steps=4", "--learning_rate=0.5", "--seed=0"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("data")
  train, test = data.load("digits", "train"), data.load("digits", "test")
  np.savez(directory / "mnist.npz", x_train=train.images, y_train=train.labels,
           x_test=test.images, y_test=test.labels)
  return str(directory)


@pytest.fixture(scope="module")
def audited(data_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("audit") / "w")
  audit_cli.main(["--method=dpsgd", "--canaries=100", "--audit_seed=3", f"--workdir={workdir}",
                  "--no_progress", "--", *_DPSGD, f"--data_dir={data_dir}"])
  return workdir


def test_inclusion_is_reproducible_from_the_recorded_key(audited, data_dir):
  design = canaries.load_design(os.path.join(audited, audit_run.CANARY_DIR))
  train = data.load("mnist", "train", data_dir=data_dir)
  again = audit.design_canaries(train.labels, 10, 100, seed=design.seed)
  np.testing.assert_array_equal(again.included, design.included)
  np.testing.assert_array_equal(again.indices, design.indices)
  with np.load(os.path.join(audited, audit_run.CANARY_DIR, "mnist.npz")) as trained_on:
    np.testing.assert_array_equal(trained_on["y_train"], audit.insert(train, design).labels)


def test_the_block_is_recomputed_from_the_released_run_alone(audited, data_dir, tmp_path):
  design = canaries.load_design(os.path.join(audited, audit_run.CANARY_DIR))
  released = tmp_path / "released"
  shutil.copytree(os.path.join(audited, audit_run.RUN_DIR), released)  # no canaries/ beside it
  images, labels = audit.public_view(data.load("mnist", "train", data_dir=data_dir), design)
  scores = audit.released_scores(str(released), "student", images, labels)
  result = audit.audit_scores(scores, design.included, delta=1e-5)
  block = records.read_record(os.path.join(audited, audit_run.RUN_DIR, "record.json"))["audit"]
  assert block["epsilon_lower_bound"] == pytest.approx(result.epsilon_lower_bound)
  assert block["auroc"] == pytest.approx(result.auroc)
  for name in ("epsilon_lower_bound", "epsilon_lower_bound_fdp", "epsilon_ceiling"):
    assert np.isfinite(block[name]) and block[name] >= 0
  assert block["m"] == 100 and block["confidence"] == 0.95 and block["delta"] == 1e-5
  assert block["exceeds_sound_claim"] is False
  with open(os.path.join(audited, audit_run.RUN_DIR, "results.json")) as f:
    assert json.load(f)["audit"] == block
  with open(os.path.join(audited, audit_run.RUN_DIR, "model_card.md")) as f:
    assert "## Audit" in f.read()
  white_box = audit.released_scores(str(released), "white_box", images, labels)
  blocks = records.read_record(os.path.join(audited, audit_run.RUN_DIR, "record.json"))[
      audit_run.THREATS_KEY]
  assert blocks["student"] == block and block["threat"] == "black-box final model"
  assert blocks["white_box"]["threat"] == "white-box last iterate"
  assert blocks["white_box"]["auroc"] == pytest.approx(
      audit.audit_scores(white_box, design.included, delta=1e-5).auroc)
  assert not np.allclose(white_box, scores)  # the initialisation is subtracted
  assert records.read_record(os.path.join(
      audited, audit_run.THREAT_DIR, "white_box", "record.json"))["audit"] == blocks["white_box"]


def test_user_errors_are_one_line_exit_2_before_anything_is_written(data_dir, tmp_path, capsys):
  for method, flags in (
      ("dpsgd", ["--canaries=1", "--", *_DPSGD, f"--data_dir={data_dir}"]),
      ("dpsgd", ["--", "--dataset=digits", "--noise_multiplier=1", "--steps=2"]),
      ("dpsgd", [f"--teacher_audit={tmp_path}", "--", *_DPSGD]),  # a DPDFD flag only
      ("dpsgd", ["--audit_seed=-1", "--", *_DPSGD, f"--data_dir={data_dir}"]),
      ("dpsgd", ["--confidence=1", "--", *_DPSGD, f"--data_dir={data_dir}"]),
      ("dpdfd", ["--", "--dataset=mnist", f"--data_dir={data_dir}"]),  # no --teacher_audit
      ("dpdfd", [f"--teacher_audit={tmp_path / 'none'}", "--", "--dataset=mnist",
                 f"--data_dir={data_dir}", "--target_epsilon=10"]),
      ("rknn", [f"--teacher_audit={tmp_path}", "--", "--dataset=mnist"]),  # no teachers
      ("rona", [f"--teacher_audit={tmp_path / 'none'}", "--", "--dataset=mnist",
                f"--data_dir={data_dir}", "--noise_multiplier=20"]),
      ("dfpate", ["--canaries=2000", "--", "--dataset=mnist", f"--data_dir={data_dir}",
                  "--target_epsilon=10", "--validation_examples=100"])):
    with pytest.raises(SystemExit) as exit_info:
      audit_cli.main([f"--method={method}", f"--workdir={tmp_path / 'w'}", *flags])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "w" / audit_run.CANARY_DIR / canaries.DESIGN_FILE).exists()


def test_committed_audits_keep_sound_claims_and_show_power():
  """No committed sound row's lower bound exceeds its claim; every teacher row (the power
  reference) has a clearly positive bound."""
  results = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "results")
  names = [n for n in os.listdir(results) if n.startswith("audit__") and n.endswith(".json")]
  for name in names:
    record = records.read_record(os.path.join(results, name))
    for block in [record["audit"], *record.get(audit_run.THREATS_KEY, {}).values()]:
      assert 0 <= block["epsilon_lower_bound"] <= block["epsilon_ceiling"], name
      if record["accounting"] == "sound" and record["sound_epsilon"] != "inf":
        assert block["epsilon_lower_bound"] <= record["sound_epsilon"], name
        assert not block["exceeds_sound_claim"], name
    if record["method"] == "teacher":
      assert record["audit"]["epsilon_lower_bound"] > 0.5, name
