"""DPDFD on Fashion-MNIST, sound target ε = 1.

Record: docs/results/dpdfd__fashion_mnist__f_s1.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/fashion_mnist_paper_engine_sound_eps1.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: not recorded
Selected on: test split

The paper's engine (normalised DKD rows at C = 1, the paper's generator, a datalens_cnn student)
at a sound ε = 1 for 600 steps: one teacher's student stays at chance
(docs/privacy.md#one-teacher-at-chance). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dpdfd.DPDFDConfig(
      target_epsilon=1.0, dataset="fashion_mnist",
      teacher_dirs=("runs/teacher/fashion_mnist_small_cnn_aug5",), generator_channels=64,
      steps=600, batch_size=64, eval_every=150)
