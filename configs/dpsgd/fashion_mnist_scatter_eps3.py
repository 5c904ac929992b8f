"""DP-SGD on Fashion-MNIST, sound target ε = 3.

Record: docs/results/dpsgd__fashion_mnist__scatter_eps3.json
Command: python -m experiments.dpsgd --config=configs/dpsgd/fashion_mnist_scatter_eps3.py --seed=0
Hardware: CPU
Time: 12 min wall (all its seeds)
Selected on: validation hold-out

ScatterNet features and a linear model (Tramèr & Boneh), ghost clipping, momentum 0.9; the
batch, rate and epochs chosen on a validation hold-out for each target
(docs/RESULTS.md#dpsgd-scatternet). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import dpsgd


def get_config() -> dpsgd.DPSGDConfig:
  return dpsgd.DPSGDConfig(
      dataset="fashion_mnist", model="scatter_linear", expected_batch_size=8192,
      l2_clip_norm=0.1, target_epsilon=3.0, epochs=30.0, learning_rate=8.0, momentum=0.9,
      clipping="ghost", features="scatternet")
