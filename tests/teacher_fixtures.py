"""The small digits teacher shared by the DPDFD and SRR tests (registered in conftest.py).

Session-scoped: trained once per test process; every user only reads it (copies it when a test
needs a second directory)."""

import pytest

from dpkd_jax import teacher as teacher_lib


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("teacher"))
  cfg = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1, batch_size=64,
                                  learning_rate=3e-3)
  teacher_lib.train_teacher(cfg, workdir, progress=False)
  return workdir
