"""The small digits teacher shared by the DPDFD and SRR tests, and a small stacked ensemble
(`ensemble_dir`) shared by the teacher-ensemble, DF-PATE and DPDFD tests (registered in
conftest.py); `CountingTeacher`, the SRR tests' teacher label function that counts its calls.

Session-scoped: trained once per test process; every user only reads them (copies one when a
test needs a second directory)."""

import os
import shutil

import jax
import pytest

from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_ensemble
from dpkd_jax.train import checkpoint


class CountingTeacher:
  """Wraps a teacher label function and counts its calls and labelled rows."""

  def __init__(self, label_fn):
    self.label_fn, self.calls, self.rows = label_fn, 0, []

  def __call__(self, queries):
    self.calls += 1
    self.rows.append(int(queries.shape[0]))
    return self.label_fn(queries)


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("teacher"))
  cfg = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1, batch_size=64,
                                  learning_rate=3e-3)
  teacher_lib.train_teacher(cfg, workdir, progress=False)
  return workdir


ENSEMBLE_CONFIG = dict(dataset="digits", num_teachers=3, teacher_model="mlp", teacher_epochs=1,
                       teacher_batch_size=32)


@pytest.fixture(scope="session")
def ensemble_dir(tmp_path_factory):
  """Three mlp teachers stacked on disjoint equal shards of digits (`teacher_ensemble`)."""
  workdir = str(tmp_path_factory.mktemp("teacher_ensemble"))
  teacher_ensemble.train_and_save(teacher_ensemble.TeacherEnsembleConfig(**ENSEMBLE_CONFIG),
                                  workdir, log=lambda _: None)
  return workdir


def copy_without_partition(source: str, target: str) -> str:
  """`target`: a copy of the ensemble in `source` whose newest meta has no `partition` (as
  a data-free PATE `teachers_dir` saved before the record existed)."""
  ensemble, meta = teacher_ensemble.load(source, flag="source")
  shutil.copytree(source, target)
  teacher_ensemble.save(target, ensemble, {k: v for k, v in meta.items() if k != "partition"})
  return target


def copy_with_old_identity(source: str, target: str) -> str:
  """`target`: a copy of the ensemble in `source` whose newest meta names the learning rate
  `teacher_lr` (as stores were saved before the identity took the library's vocabulary)."""
  ensemble, meta = teacher_ensemble.load(source, flag="source")
  identity = {("teacher_lr" if k == "teacher_learning_rate" else k): v
              for k, v in meta["identity"].items()}
  shutil.copytree(source, target)
  teacher_ensemble.save(target, ensemble, {**meta, "identity": identity})
  return target


def retrain_in_place(directory: str) -> str:
  """`directory` (a teacher's copy) holding other weights under the same path, as if retrained
  there: its newest checkpoint saved again one step later with every parameter shifted."""
  ckpt_dir = os.path.join(directory, "checkpoints")
  verified = checkpoint.read_verified(ckpt_dir)
  shifted = jax.tree.map(lambda v: v + 0.01, verified.arrays["params"])
  arrays = {**verified.arrays, "params": shifted}
  checkpoint.save(ckpt_dir, verified.step + 1, arrays, verified.meta)
  return directory
