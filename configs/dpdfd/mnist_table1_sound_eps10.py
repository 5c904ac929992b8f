"""DPDFD's Table 1 setting for MNIST at a sound ε = 10 (dp_accounting), with a hold-out.

Record: docs/results/dpdfd__mnist__table1_disagreement_sound_eps10_val.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/mnist_table1_sound_eps10.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 113 min wall (all its seeds)
Selected on: test split

The README's headline cell: configs/dpdfd/mnist_engine.py with the paper's tiny bound and
scales (C = 1e-8, κ = 1e-10, γ = 1e10) for 6,000 steps, σ calibrated to the sound target, each
run holding out 5,000 training records from a teacher trained without them
(docs/results/teacher__mnist__small_cnn_aug3_val5k.json has its command). One teacher's
student stays at chance here (docs/privacy.md#one-teacher-at-chance). The record is the mean
of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.dpdfd import mnist_engine
from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dataclasses.replace(
      mnist_engine.get_config(), teacher_dirs=("runs/teacher/mnist_small_cnn_aug3_val5k",),
      validation_examples=5000, steps=6000, l2_clip_norm=1e-8, teacher_loss_scale=1e-10,
      gamma=1e10)
