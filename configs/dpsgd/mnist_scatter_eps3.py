"""DP-SGD on MNIST: a linear model on ScatterNet features, sound ε = 3 (replace-one).

Record: docs/results/dpsgd__mnist__scatter_eps3.json
Command: python -m experiments.dpsgd --config=configs/dpsgd/mnist_scatter_eps3.py --seed=0
Hardware: CPU
Time: 9 min wall (all its seeds)
Selected on: validation hold-out

The private-data baseline of docs/CHOOSING.md (Tramèr & Boneh's ScatterNet + linear recipe):
ghost clipping at C = 0.1, expected batch 4,096, learning rate 8 with momentum 0.9, 20
epochs (docs/RESULTS.md#dpsgd-scatternet). The record is the mean of
several seeds; --seed=1, 2 give the others.
"""

from dpkd_jax.methods import dpsgd


def get_config() -> dpsgd.DPSGDConfig:
  return dpsgd.DPSGDConfig(
      dataset="mnist", model="scatter_linear", features="scatternet", target_epsilon=3.0,
      epochs=20.0, expected_batch_size=4096, l2_clip_norm=0.1, learning_rate=8.0,
      momentum=0.9, clipping="ghost")
