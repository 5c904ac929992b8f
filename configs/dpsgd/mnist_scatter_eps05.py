"""DP-SGD on MNIST, sound target ε = 0.5.

Record: docs/results/dpsgd__mnist__scatter_eps0.5.json
Command: python -m experiments.dpsgd --config=configs/dpsgd/mnist_scatter_eps05.py --seed=0
Hardware: CPU
Time: 1 min wall
Selected on: validation hold-out

ScatterNet features and a linear model (Tramèr & Boneh), ghost clipping, momentum 0.9; the
batch, rate and epochs chosen on a validation hold-out for each target
(docs/RESULTS.md#dpsgd-scatternet). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import dpsgd


def get_config() -> dpsgd.DPSGDConfig:
  return dpsgd.DPSGDConfig(
      dataset="mnist", model="scatter_linear", expected_batch_size=2048, l2_clip_norm=0.1,
      target_epsilon=0.5, epochs=10.0, learning_rate=2.0, momentum=0.9, clipping="ghost",
      features="scatternet")
