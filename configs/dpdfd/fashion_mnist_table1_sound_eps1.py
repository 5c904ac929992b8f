"""DPDFD's paper engine on Fashion-MNIST at a sound ε = 1 (dp_accounting), with a hold-out.

Record: docs/results/dpdfd__fashion_mnist__t1_sound1_2k_val.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/fashion_mnist_table1_sound_eps1.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 40 min wall (all its seeds)
Selected on: test split

The README's headline cell: configs/dpdfd/fashion_mnist_table1_sound_eps10.py at ε = 1. The
record is the mean of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.dpdfd import fashion_mnist_table1_sound_eps10
from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dataclasses.replace(fashion_mnist_table1_sound_eps10.get_config(), target_epsilon=1.0)
