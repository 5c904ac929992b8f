"""Tests of release.students: where each method keeps its student, read back exactly.

The checkpoints here are written with `train.checkpoint.save` in each method's layout (the
student beside the sub-trees the export ignores), so every layout is exercised in seconds; the
config field names the layouts read are checked against the methods' real config classes.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from dp_accounting import dp_event
from flax import nnx

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.methods import dfpate, dpdfd, dpsgd, rknn, rona, srr
from dpkd_jax.models import core
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.release import students
from dpkd_jax.train import checkpoint
from dpkd_jax.train import records

# method -> (config as saved, model, norm)
CONFIGS = {
    "dpsgd": ({"dataset": "digits", "model": "lenet5_half", "norm": "group"}, "lenet5_half",
              "group"),
    "dpdfd": ({"student_model": "lenet5_half", "student_norm": "batch"}, "lenet5_half", "batch"),
    "srr": ({"student_model": "lenet5", "student_norm": "none"}, "lenet5", "none"),
    "dfpate": ({"student_model": "lenet5_half"}, "lenet5_half", "batch"),
    "rknn": ({"student": {"model": "small_cnn", "norm": "batch"}}, "small_cnn", "batch"),
    "rona": ({"student_model": "compact_5k", "student_norm": "batch"}, "compact_5k", "batch"),
}


def _nest(path, value, tree):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _fake_run(root, method, *, model=None, seed=3, ledger=None, recorded=1.0):
  """A finished run of `method` whose checkpoint holds a student in the method's layout (and
  `ledger`, as every method checkpoints it), its record stating ε `recorded`."""
  config, name, norm = CONFIGS[method]
  info = data.DATASETS["digits"]
  abstract = core.split(nnx.eval_shape(lambda: students.ARCHITECTURES[model or name](
      num_classes=10, input_shape=info.image_shape, norm=norm, rngs=nnx.Rngs(0))))
  # Distinct deterministic values per leaf (no initialisation to compile).
  leaves, tree = jax.tree_util.tree_flatten((abstract.params, abstract.batch_stats))
  filled = jax.tree_util.tree_unflatten(tree, [
      np.sin(np.arange(x.size, dtype=np.float32) + seed * i).reshape(x.shape).astype(x.dtype)
      for i, x in enumerate(leaves)])
  parts = core.ModelParts(abstract.graphdef, *filled)
  layout = students.LAYOUTS[method]
  arrays = {"rng": np.arange(2, dtype=np.uint32), "other": {"params": {"w": np.ones(3)}}}
  _nest(layout.params, parts.params, arrays)
  _nest(layout.batch_stats, parts.batch_stats, arrays)  # {} for norms "group" and "none"
  workdir = os.path.join(str(root), method)
  checkpoint.save(os.path.join(workdir, "checkpoints"), 7, jax.device_get(arrays),
                  {"config": config, **({} if ledger is None else {"ledger": ledger.to_json()})})
  records.write_record(os.path.join(workdir, "record.json"), records.make_record(
      method=method, dataset="digits", test_accuracy=0.5, sound_epsilon=recorded, delta=1e-5,
      neighbouring="replace-one", accounting="sound", cpu_seconds=1.0, wall_seconds=1.0))
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump({"method": method, "config": config}, f)
  return workdir, parts


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_load_student_reads_each_layout_exactly(method, tmp_path):
  workdir, parts = _fake_run(tmp_path, method)
  student = students.load_student(workdir)
  _, name, norm = CONFIGS[method]
  assert (student.spec.method, student.spec.model, student.spec.norm) == (method, name, norm)
  assert student.step == 7
  for got, saved in ((student.parts.params, parts.params),
                     (student.parts.batch_stats, parts.batch_stats)):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(saved)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, saved)
  assert student.parts.graphdef == parts.graphdef


def test_a_student_of_another_architecture_is_refused(tmp_path):
  workdir, _ = _fake_run(tmp_path, "dpdfd", model="lenet5")  # config says lenet5_half
  with pytest.raises(checkpoint.CheckpointMismatchError, match="shape"):
    students.load_student(workdir)


def test_layouts_read_fields_the_configs_have():
  def fields(cls):
    return {f.name for f in dataclasses.fields(cls)}
  assert {"model", "norm"} <= fields(dpsgd.DPSGDConfig)
  for cls in (dpdfd.DPDFDConfig, srr.SRRConfig, rona.RONAConfig):
    assert {"student_model", "student_norm"} <= fields(cls)
  # DFPATE builds its student with the registry's default norm; a new field must be read.
  assert "student_model" in fields(dfpate.DFPATEConfig)
  assert "student_norm" not in fields(dfpate.DFPATEConfig)
  assert {"model", "norm"} <= fields(rknn.StudentConfig) and "student" in fields(rknn.RKNNConfig)


def test_spec_of_unknown_runs_is_none():
  assert students.spec_of("dpdfd_direct", "digits", {"model": "lenet5"}) is None
  assert students.spec_of("dpsgd", "no_such_dataset", CONFIGS["dpsgd"][0]) is None
  assert students.spec_of("dpsgd", "digits", {"model": "lenet5"}) is None  # no norm saved
  assert students.spec_of("dpsgd", "digits", None) is None


def _ledger(charges: int) -> ledger_lib.PrivacyLedger:
  """A ledger of `charges` Gaussian releases (sigma 4), one per step."""
  ledger = ledger_lib.PrivacyLedger(target_epsilon=100.0, delta=1e-5)
  for step in range(charges):
    ledger.record(dp_event.GaussianDpEvent(4.0), step=step)
  return ledger


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_the_epsilon_stated_covers_the_checkpoint_of_every_method(method, tmp_path):
  # Before: the card took the record's epsilon whatever checkpoint was exported.
  two, three = _ledger(2), _ledger(3)
  assert two.spent_epsilon() < three.spent_epsilon()
  workdir, _ = _fake_run(tmp_path / "covered", method, ledger=two, recorded=two.spent_epsilon())
  student = students.load_student(workdir)
  assert students.covered_epsilon(workdir, student.meta, student.step) == pytest.approx(
      two.spent_epsilon(), rel=1e-12)
  assert students.check_covered(workdir) == pytest.approx(two.spent_epsilon(), rel=1e-12)
  # A record above the checkpoint's ledger (a charge after it): the larger figure.
  workdir, _ = _fake_run(tmp_path / "above", method, ledger=two, recorded=5.0)
  assert students.check_covered(workdir) == 5.0
  # Weights beyond the results (a run stopped after the checkpoint): refused in one line.
  workdir, _ = _fake_run(tmp_path / "beyond", method, ledger=three,
                         recorded=two.spent_epsilon())
  with pytest.raises(errors.UserError, match="checkpoint step 7 .* with --resume") as err:
    students.check_covered(workdir)
  assert "\n" not in str(err.value)
  # No ledger (no noise): the record says inf, and so does the release.
  workdir, _ = _fake_run(tmp_path / "none", method, recorded="inf")
  assert students.check_covered(workdir) == float("inf")
