"""dpkd_jax.importers.run: the teacher workdir of an import (checkpoint, card, input adapter),
read back by `teacher.load_teacher` and used by DPDFD. A stand-in converter serves a Flax
LeNet-5's own arrays, so no PyTorch or Keras is needed here (they are in
tests/test_importers_{torch,keras}.py)."""

import dataclasses
import json
import os
import types
import warnings

import numpy as np
import pytest
from flax import traverse_util

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.importers import common
from dpkd_jax.importers import run
from dpkd_jax.importers import verify
from dpkd_jax.methods import dpdfd
from dpkd_jax.models import core
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate

DIGITS = data.DATASETS["digits"]


@pytest.fixture(scope="module")
def source_model():
  """A LeNet-5 with non-trivial BatchNorm statistics, as the 'file' to import."""
  parts = models.split(models.create_classifier("lenet5", num_classes=10,
                                                input_shape=(28, 28, 1), seed=5))
  rng = np.random.default_rng(0)
  stats = {path: (rng.uniform(-0.5, 0.5, v.shape) if path[-1] == "mean" else
                  rng.uniform(0.5, 2.0, v.shape)).astype(np.float32)
           for path, v in traverse_util.flatten_dict(parts.batch_stats).items()}
  return parts._replace(batch_stats=traverse_util.unflatten_dict(stats))


@pytest.fixture
def fake_converter(monkeypatch, source_model):
  def convert(path, arch, info):
    def logits(x):  # the source model on inputs in its own normalisation
      return np.asarray(core.apply(source_model.graphdef, source_model.params,
                                   source_model.batch_stats, x, train=False)[0].logits)
    sources = {}
    for kind in ("params", "batch_stats"):
      for key, value in traverse_util.flatten_dict(getattr(source_model, kind)).items():
        sources[(kind, *key)] = common.source(value, "/".join(map(str, key)))
    return common.Converted("lenet5", "batch", sources, notes=("stand-in",),
                            reference=verify.Reference(logits, "stand-in model"))
  module = types.SimpleNamespace(convert=convert, framework_version=lambda: "0.0-test")
  monkeypatch.setattr(run, "_converter", lambda framework: module)


def _import(tmp_path, name="teacher", **kw):
  checkpoint = tmp_path / "model.pt"
  if not checkpoint.exists():
    checkpoint.write_bytes(b"stand-in weights")
  args = dict(framework="torch", arch="lenet5", checkpoint=str(checkpoint), dataset="digits",
              workdir=str(tmp_path / name), input_norm="unit")
  args.update(kw)
  return run.import_teacher(**args)


def _source_logits(source_model, pixels):
  """The source model on what it was trained with: pixels / 255 ("unit")."""
  out, _ = core.apply(source_model.graphdef, source_model.params, source_model.batch_stats,
                      (pixels / 255.0).astype(np.float32), train=False)
  return np.asarray(out.logits)


def test_import_writes_a_teacher_load_teacher_reads(tmp_path, fake_converter, source_model):
  card = _import(tmp_path)
  with open(tmp_path / "teacher" / "card.json") as f:
    assert json.load(f) == card
  assert card["import"]["source_sha256"] == checkpoint.sha256_file(str(tmp_path / "model.pt"))
  assert card["import"]["framework_version"] == "0.0-test"
  assert card["import"]["input_normalization"]["teacher_std"] == [1.0]
  assert card["input_adapter"] and card["model"] == "lenet5" and card["steps"] == 0
  loaded = teacher_lib.load_teacher(str(tmp_path / "teacher"), dataset="digits",
                                    num_classes=10, input_shape=(28, 28, 1))
  test = data.load("digits", "test")
  pixels = test.images[:16]
  # Fed our normalisation, the imported teacher computes what the source did on pixels / 255.
  ours = evaluate.predict_logits(loaded.parts, pixels, DIGITS, batch_size=16)
  want = _source_logits(source_model, pixels)
  assert np.abs(ours - want).max() <= 1e-4 * np.abs(want).max()
  assert card["test_accuracy"] == pytest.approx(evaluate.evaluate(loaded.parts, test)["accuracy"])


def test_dataset_normalisation_needs_no_adapter(tmp_path, fake_converter, source_model):
  card = _import(tmp_path, input_norm="dataset")
  assert card["input_adapter"] is False
  loaded = teacher_lib.load_teacher(str(tmp_path / "teacher"))
  assert set(loaded.parts.params) == set(source_model.params)  # a plain zoo LeNet-5


def test_refuses_a_workdir_holding_a_teacher_and_missing_files(tmp_path, fake_converter):
  _import(tmp_path)
  with pytest.raises(errors.UserError, match="already holds a teacher"):
    _import(tmp_path)
  os.remove(tmp_path / "teacher" / "card.json")  # as after an import killed before its card
  with pytest.raises(errors.UserError, match="cannot be resumed: use a fresh workdir"):
    _import(tmp_path)
  with pytest.raises(errors.UserError, match="does not exist"):
    _import(tmp_path, name="other", checkpoint=str(tmp_path / "missing.pt"))
  with pytest.raises(errors.UserError, match="unknown 'nope'"):
    _import(tmp_path, name="other", dataset="nope")
  assert not os.path.exists(tmp_path / "other")


def test_unknown_framework_is_a_user_error():
  with pytest.raises(errors.UserError, match="--from: unknown 'onnx'"):
    run._converter("onnx")


def test_dpdfd_runs_with_an_imported_teacher(tmp_path, fake_converter):
  _import(tmp_path, name="a")
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=(str(tmp_path / "a"),),
                             student_model="lenet5_half", noise_multiplier=10.0, steps=2,
                             batch_size=8, eval_every=2, latent_dim=8)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  assert results["steps"] == 2 and np.isfinite(results["epsilon"])
  assert results["teachers_per_record"] == 1


def test_dpdfd_refuses_to_mix_adapted_and_plain_teachers(tmp_path, fake_converter):
  _import(tmp_path, name="a")
  _import(tmp_path, name="b", input_norm="dataset")
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=(str(tmp_path / "a"),
                                                             str(tmp_path / "b")),
                             noise_multiplier=10.0, steps=2, batch_size=8)
  with pytest.raises(ValueError, match="share one architecture"):
    dpdfd.load_teachers(config)


def test_card_records_the_check(tmp_path, fake_converter):
  check = _import(tmp_path)["import"]["check"]
  assert check["verified"] and check["source"] == "stand-in model"
  assert check["max_relative_logit_difference"] < 1e-5 and check["argmax_agreement"] == 1.0
  assert check["num_inputs"] == verify.NUM_DATASET_INPUTS + verify.NUM_RANDOM_INPUTS


def test_logits_beyond_tolerance_are_refused_before_anything_is_written(
    tmp_path, fake_converter, monkeypatch):
  convert = run._converter("torch").convert

  def wrong(path, arch, info):  # the source computes something else: logits shifted per class
    converted = convert(path, arch, info)
    shifted = lambda x: converted.reference.logits(x) + np.arange(10)  # noqa: E731
    return dataclasses.replace(converted, reference=verify.Reference(shifted, "stand-in model",
                                                                      ("SiLU",)))
  monkeypatch.setattr(run, "_converter", lambda framework: types.SimpleNamespace(
      convert=wrong, framework_version=lambda: "0.0-test"))
  with pytest.raises(errors.UserError, match=r"largest relative logit difference .* \(tolerance "
                     r"0.0001\) on 48 inputs .* no counterpart for: SiLU") as caught:
    _import(tmp_path)
  assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "teacher")
  with pytest.raises(errors.UserError, match="--tolerance must be positive"):
    _import(tmp_path, tolerance=0.0)


def test_a_bare_state_dict_needs_consent_which_the_card_records(
    tmp_path, fake_converter, monkeypatch):
  convert = run._converter("torch").convert
  monkeypatch.setattr(run, "_converter", lambda framework: types.SimpleNamespace(
      convert=lambda *a: dataclasses.replace(convert(*a), reference=None),
      framework_version=lambda: "0.0-test"))
  with pytest.raises(errors.UserError, match="bare state_dict.*--unverified_state_dict"):
    _import(tmp_path)
  assert not os.path.exists(tmp_path / "teacher")
  check = _import(tmp_path, unverified_state_dict=True)["import"]["check"]
  assert check == {"verified": False, "reason": run.UNVERIFIED_STATE_DICT}
