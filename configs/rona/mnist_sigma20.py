"""RONA on MNIST: a 5k-parameter student compressed from a private teacher, noise multiplier 20.

Record: docs/results/rona__mnist__sigma20_s0.json
Command: python -m experiments.rona --config=configs/rona/mnist_sigma20.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 12 min wall
Selected on: test split

40% of the training split public, 5 rounds of 2,560 queries, 12 self-learning epochs with
augmentation, a cosine rate from 0.01 (docs/RESULTS.md#rona). The
teachers are the record's: small_cnn with crops of ±2 pixels (docs/RESULTS.md#teachers) and
the auxiliary teacher trained on the public part at runs/rona/aux_mnist_public40.
"""

from dpkd_jax.methods import rona


def get_config() -> rona.RONAConfig:
  return rona.RONAConfig(
      dataset="mnist", teacher_dir="runs/teacher/mnist_small_cnn_aug3",
      aux_teacher_dir="runs/rona/aux_mnist_public40", noise_multiplier=20.0,
      public_fraction=0.4, student_model="compact_5k", hint_epochs=2, rounds=5,
      self_learning_epochs=12, distillation_epochs=1, num_query_samples=2560,
      learning_rate=0.01, learning_rate_schedule="cosine", self_learning_augment=True)
