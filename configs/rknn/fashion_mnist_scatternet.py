"""Reverse k-NN private labelling on Fashion-MNIST, ε = 0.1.

Record: docs/results/rknn__fashion_mnist__scat_s200_k1_eps0.1_val.json
Command: python -m experiments.rknn --config=configs/rknn/fashion_mnist_scatternet.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 6 min wall (all its seeds)
Selected on: validation hold-out

ScatterNet features of the public images, 200 queries per class, k = 1, chosen on a validation
hold-out (docs/RESULTS.md#rknn-representations). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax import representations
from dpkd_jax.methods import rknn


def get_config() -> rknn.RKNNConfig:
  return rknn.RKNNConfig(
      dataset="fashion_mnist", representation="scatternet",
      representation_config=representations.default_config("scatternet"), num_queries=200,
      student=rknn.StudentConfig(model="small_cnn"), validation_examples=5000)
