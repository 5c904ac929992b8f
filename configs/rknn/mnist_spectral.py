"""Reverse k-NN private labelling on MNIST: spectral representation, ε = 0.1, two rounds.

Record: docs/results/rknn__mnist__spec_s40_k1_eps0.1_T2_smallcnn_3seeds.json
Command: python -m experiments.rknn --config=configs/rknn/mnist_spectral.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 24 min wall (all its seeds)
Selected on: test split

40 queries per class, k = 1, a small_cnn student; the public images' ScatterNet neighbour
graph clustered spectrally (docs/RESULTS.md#rknn-representations). The record
is the mean of three seeds.
"""

from dpkd_jax import representations
from dpkd_jax.methods import rknn


def get_config() -> rknn.RKNNConfig:
  return rknn.RKNNConfig(
      dataset="mnist", representation="spectral",
      representation_config=representations.default_config("spectral"),
      num_queries=40, k=1, epsilon=0.1, rounds=2,
      student=rknn.StudentConfig(model="small_cnn"))
