"""Where each method's canaries go and which teachers see them (`dpkd_jax.audit.methods`).

No method is trained here (the end-to-end plumbing is tests/test_audit_run.py's DP-SGD run):
each method's `private_rows` hook must name exactly the records its own data path keeps private
(RONA: the sensitive part less its hold-out, never the public part the student trains on;
DF-PATE: the teachers' shards; reverse k-NN: the labelling set), the audited run's teachers
must be trained on the canary data (a recipe's pre-trained ones replaced), and a reused design
with a canary outside a method's private rows is refused before anything is written.
"""

import os

import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.audit import canaries
from dpkd_jax.audit import methods
from dpkd_jax.audit import run as audit_run
from dpkd_jax.data import splits
from dpkd_jax.errors import UserError
from dpkd_jax.train import selection
from experiments import audit as audit_cli

TRAIN = data.load("digits", "train")
N = len(TRAIN)
_CONFIGS = {
    "rona": ["--dataset=mnist", "--noise_multiplier=20", "--validation_examples=100",
             "--teacher_dir=pretrained", "--aux_teacher_dir=pretrained_aux"],
    "dfpate": ["--dataset=mnist", "--target_epsilon=10", "--validation_examples=100",
               "--teachers_dir=pretrained"],
    "rknn": ["--dataset=mnist", "--validation_examples=100"],
}


def _config(method):
  _, config = audit_cli.parse([f"--method={method}", "--workdir=unused", "--",
                               *_CONFIGS[method]])
  return config


def _row_ids(dataset: data.ArrayDataset) -> set[int]:
  # digits' images are distinct, so an image identifies its row
  ids = {TRAIN.images[i].tobytes(): i for i in range(N)}
  return {ids[image.tobytes()] for image in dataset.images}


def test_rona_canaries_go_only_into_its_sensitive_part_less_the_hold_out():
  config = _config("rona")
  rows = methods.METHODS["rona"].private_rows(config)(N)
  sensitive, public = data.private_public_split(TRAIN, config.public_fraction,
                                                seed=config.split_seed)
  kept, held = selection.hold_out(sensitive, config.validation_examples)
  assert set(rows.tolist()) == _row_ids(kept)
  assert not set(rows.tolist()) & (_row_ids(public) | _row_ids(held))


@pytest.mark.parametrize("method", ["dfpate", "rknn"])
def test_shard_and_labelling_set_methods_take_all_rows_but_the_hold_out(method):
  config = _config(method)
  rows = methods.METHODS[method].private_rows(config)(N)
  kept, held = selection.hold_out(TRAIN, config.validation_examples)
  assert set(rows.tolist()) == _row_ids(kept) and len(rows) == N - len(held)


def test_the_audited_run_trains_its_teachers_on_the_canary_data(tmp_path):
  assert methods.teacher_overrides("rona", _config("rona"), "r", None) == {
      "teacher_dir": None, "aux_teacher_dir": None}
  assert methods.teacher_overrides("dfpate", _config("dfpate"), "r", None) == {
      "teachers_dir": os.path.join("r", "teachers")}
  assert methods.teacher_overrides("rknn", _config("rknn"), "r", None) == {}
  # A RONA audit reuses another RONA audit's teachers (not a bare teacher audit's).
  with pytest.raises(UserError, match="RONA teacher"):
    methods.teacher_overrides("rona", _config("rona"), "r", str(tmp_path))
  (tmp_path / "run" / "teacher").mkdir(parents=True)
  (tmp_path / "run" / "teacher" / "card.json").write_text("{}")
  assert methods.teacher_overrides("rona", _config("rona"), "r", str(tmp_path)) == {
      "teacher_dir": str(tmp_path / "run" / "teacher"), "aux_teacher_dir": None}


def test_a_design_with_canaries_outside_the_private_rows_is_refused(tmp_path):
  np.savez(tmp_path / "mnist.npz", x_train=TRAIN.images, y_train=TRAIN.labels,
           x_test=TRAIN.images[:10], y_test=TRAIN.labels[:10])
  config = _config("rona")
  rows = methods.METHODS["rona"].private_rows(config)
  design, _ = audit_run.prepare(str(tmp_path / "a"), "mnist", data_dir=str(tmp_path), m=50,
                                seed=1, rows=rows)
  assert np.isin(design.indices, rows(N)).all()
  public = np.setdiff1d(np.arange(N), rows(N))
  foreign = canaries.design_canaries(TRAIN.labels, 10, 50, seed=2, rows=public)
  canaries.save_design(str(tmp_path / "b" / audit_run.CANARY_DIR), foreign)
  with pytest.raises(UserError, match="outside this run's private"):
    audit_run.prepare(str(tmp_path / "c"), "mnist", data_dir=str(tmp_path), m=50, seed=None,
                      design_from=str(tmp_path / "b"), rows=rows)
  assert not (tmp_path / "c").exists()


def test_the_default_draw_is_unchanged_by_the_rows_option():
  everything = canaries.design_canaries(TRAIN.labels, 10, 40, seed=5)
  explicit = canaries.design_canaries(TRAIN.labels, 10, 40, seed=5, rows=np.arange(N))
  np.testing.assert_array_equal(everything.indices, explicit.indices)
  part = splits.partition(N, {"a": 0.5, "b": 0.5}, seed=0)["a"]
  inside = canaries.design_canaries(TRAIN.labels, 10, 40, seed=5, rows=part)
  assert np.isin(inside.indices, part).all()
