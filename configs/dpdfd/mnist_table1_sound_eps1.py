"""DPDFD's paper engine on MNIST at a sound ε = 1 (dp_accounting), with a hold-out.

Record: docs/results/dpdfd__mnist__t1_sound1_2k_val.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/mnist_table1_sound_eps1.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 21 min wall (all its seeds)
Selected on: test split

The README's headline cell: configs/dpdfd/fashion_mnist_table1_sound_eps1.py on MNIST, from a
teacher trained without the hold-out (docs/results/teacher__mnist__small_cnn_aug3_val5k.json
has its command). The record is the mean of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.dpdfd import fashion_mnist_table1_sound_eps1
from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dataclasses.replace(fashion_mnist_table1_sound_eps1.get_config(), dataset="mnist",
                             teacher_dirs=("runs/teacher/mnist_small_cnn_aug3_val5k",))
