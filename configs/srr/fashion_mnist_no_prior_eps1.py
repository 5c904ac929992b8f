"""SRR on Fashion-MNIST without the generator's prior, ε = 1 per query: the sound release.

Record: docs/results/srr__fashion_mnist__eps1_none_val.json
Command: python -m experiments.srr --config=configs/srr/fashion_mnist_no_prior_eps1.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 23 min wall (all its seeds)
Selected on: test split

The README's headline cell "ours, sound accounting": configs/srr/fashion_mnist_no_prior_eps10.py
at ε = 1 per query. The record is the mean of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.srr import fashion_mnist_no_prior_eps10
from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return dataclasses.replace(fashion_mnist_no_prior_eps10.get_config(), epsilon=1.0)
