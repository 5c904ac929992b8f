"""SRR on Fashion-MNIST without the generator's prior, ε = 10 per query: the sound release.

Record: docs/results/srr__fashion_mnist__eps10_none_val.json
Command: python -m experiments.srr --config=configs/srr/fashion_mnist_no_prior_eps10.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 23 min wall (all its seeds)
Selected on: test split

The README's headline cell "ours, sound accounting": configs/srr/mnist_no_prior_eps10.py on
Fashion-MNIST, from a teacher trained without the 5,000-record hold-out
(docs/results/teacher__fashion_mnist__small_cnn_aug5_val5k_retrained.json has its command).
The record is the mean of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.srr import mnist_no_prior_eps10
from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return dataclasses.replace(mnist_no_prior_eps10.get_config(), dataset="fashion_mnist",
                             teacher_dir="runs/teacher/fashion_mnist_small_cnn_aug5_val5k")
