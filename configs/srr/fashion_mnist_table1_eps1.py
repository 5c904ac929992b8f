"""SRR's Table I row for Fashion-MNIST, ε = 1 label-DP per query, with a hold-out.

Record: docs/results/srr__fashion_mnist__eps1_s16_val.json
Command: python -m experiments.srr --config=configs/srr/fashion_mnist_table1_eps1.py --data_dir=../shared/data --pretrained_generator_dir=runs/srr/fashion_mnist_generator_aug5_val5k --seed=0
Hardware: CPU
Time: 72 min wall (all its seeds)
Selected on: test split

The README's headline cell: configs/srr/fashion_mnist_eps1.py with each run holding out 5,000
training records (`validation_examples`) from a teacher trained without them, and the
generator pretrained against that teacher (the commands: docs/results/
teacher__fashion_mnist__small_cnn_aug5_val5k_retrained.json,
srr_generator__fashion_mnist__aug5_val5k.json). Its sound ε is infinite: a label-DP ε per
query is no record-level guarantee. The record is the mean of three seeds (--seed=1, 2 the
others).
"""

import dataclasses

from configs.srr import fashion_mnist_eps1
from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return dataclasses.replace(fashion_mnist_eps1.get_config(), validation_examples=5000,
                             teacher_dir="runs/teacher/fashion_mnist_small_cnn_aug5_val5k")
