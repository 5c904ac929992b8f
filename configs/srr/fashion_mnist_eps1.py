"""DP-DFD with selective RR on Fashion-MNIST, ε = 1 per query, where most labels are noise.

Record: docs/results/srr__fashion_mnist__eps1_s16.json
Command: python -m experiments.srr --config=configs/srr/fashion_mnist_eps1.py --data_dir=../shared/data --pretrained_generator_dir=runs/srr/fashion_mnist_generator --seed=0
Hardware: CPU
Time: 77 min wall
Selected on: test split

configs/srr/mnist_eps1.py's engine (where plain RR keeps under half of the labels) on
Fashion-MNIST, with the record's teacher (small_cnn, crops of ±2 pixels and flips;
docs/RESULTS.md#teachers).
"""

from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return srr.SRRConfig(
      dataset="fashion_mnist", teacher_dir="runs/teacher/fashion_mnist_small_cnn_aug5",
      epsilon=1.0, stages=16, samples_per_stage=25600, student_epochs=5,
      student_learning_rate=3e-4, generator_epochs=0, student_model="small_cnn",
      generator_channels=64,
      engine=srr.EngineOptions(student_loss="rr_likelihood"))
