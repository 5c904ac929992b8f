"""RONA on MNIST at a sound target ε = 7.68 (dp_accounting), with a hold-out.

Record: docs/results/rona__mnist__sound768_val.json
Command: python -m experiments.rona --config=configs/rona/mnist_eps7_68.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 14 min wall (all its seeds)
Selected on: test split

The README's headline cell "ours, sound accounting": configs/rona/fashion_mnist_eps7_68.py on
MNIST, each run holding out 5,000 training records from a teacher trained without them
(docs/results/teacher__mnist__small_cnn_aug3_val5k.json has its command; docs/RESULTS.md#rona).
The record is the mean of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.rona import fashion_mnist_eps7_68
from dpkd_jax.methods import rona


def get_config() -> rona.RONAConfig:
  return dataclasses.replace(fashion_mnist_eps7_68.get_config(), dataset="mnist",
                             teacher_dir="runs/teacher/mnist_small_cnn_aug3_val5k",
                             validation_examples=5000)
