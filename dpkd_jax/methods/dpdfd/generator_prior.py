"""A teacher-pretrained generator as DPDFD's starting point: a labelled variant, ε = inf.

The paper's DPDFD starts the generator from random weights and trains it only through the
student, so the teacher reaches it only through the released rows. Its samples then carry no
data prior (docs/RESULTS.md, "DPDFD engine"): they stay textures. `experiments.srr pretrain`
trains the same DAFL generator against the teacher itself (cross-entropy, entropy and the
teacher's BatchNorm statistics), i.e. a noiseless function of the teacher, hence of every
private record: a run that starts from it has no record-level guarantee (ε = inf). Its noisy
releases keep their own ε, which holds only conditional on that generator.

This module reads such a generator from the pretraining workdir's checkpoint (checking that it
was pretrained for this dataset, teacher and architecture: `models.generator_identity`, which
names the teacher by the hash of its weights, so a copy of the teacher elsewhere is accepted
and a teacher retrained in place is refused); it never trains one, so DPDFD does not depend on
the SRR package.
"""

from __future__ import annotations

import os
from typing import Any

from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.errors import UserError
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.models import core
from dpkd_jax.train import checkpoint
from dpkd_jax.train.state import TrainState

RECORD_EPSILON_NOTE = ("generator pretrained against the teacher without noise "
                       "(pretrained_generator_dir): record-level epsilon inf")


def identity(config: config_lib.DPDFDConfig, teacher: core.ModelParts) -> dict[str, Any]:
  """What the pretrained generator must have been trained for (as `SRRConfig` records it).

  Args:
    config: the run (its one teacher in `teacher_dirs`).
    teacher: that teacher as loaded (`TeacherEnsemble.member(0)`: no teacher axis, so the hash
      is the one SRR records for the same teacher).
  """
  return models.generator_identity(config, teacher_lib.weights_sha256(teacher))


def load(config: config_lib.DPDFDConfig, generator: TrainState,
         teacher: core.ModelParts) -> TrainState:
  """`generator` with the pretrained parameters and BatchNorm statistics (fresh optimizer).

  Args:
    config: the run, with `pretrained_generator_dir` and one teacher.
    generator: the freshly initialised generator state (the template).
    teacher: the run's teacher as loaded (see `identity`).

  Raises:
    UserError: no finished checkpoint in the directory, or one pretrained for something else
      (another teacher's weights, an identity saved before teachers were named by their
      weights, another architecture).
  """
  workdir = config.pretrained_generator_dir
  directory = os.path.join(workdir, "checkpoints")
  if checkpoint.latest_step(directory) is None:
    raise UserError(f"--pretrained_generator_dir={workdir!r} holds no checkpoint: run "
                    "`python -m experiments.srr pretrain --workdir=...` first")
  verified = checkpoint.read_verified(directory)
  meta = verified.meta
  models.check_generator_identity(meta.get("identity"), identity(config, teacher),
                                  where=f"--pretrained_generator_dir={workdir!r}",
                                  teacher_dir=config.teacher_dirs[0])
  if meta.get("step", 0) < meta.get("config", {}).get("steps", 0):
    raise UserError(f"--pretrained_generator_dir={workdir!r} is unfinished "
                    f"({meta.get('step')} of {meta['config']['steps']} steps)")
  params = checkpoint.into_target(verified.arrays["params"], generator.params, directory)
  stats = checkpoint.into_target(verified.arrays["batch_stats"], generator.batch_stats, directory)
  return TrainState.create(core.ModelParts(generator.graphdef, params, stats), generator.tx)
