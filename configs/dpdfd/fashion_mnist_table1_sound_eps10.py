"""DPDFD's paper engine on Fashion-MNIST at a sound ε = 10 (dp_accounting), with a hold-out.

Record: docs/results/dpdfd__fashion_mnist__t1_sound10_2k_val.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/fashion_mnist_table1_sound_eps10.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 12 min wall (all its seeds)
Selected on: test split

The README's headline cell: the paper's engine (the paper's generator, DKD rows normalised to
C = 1e-4, γ = 1e4, a datalens_cnn student) for 2,000 steps, σ calibrated to the sound target,
each run holding out 5,000 training records from a teacher trained without them
(docs/results/teacher__fashion_mnist__small_cnn_aug5_val5k.json has its command). One
teacher's student stays at chance here (docs/privacy.md#one-teacher-at-chance). The record is
the mean of three seeds (--seed=1, 2 the others).
"""

from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dpdfd.DPDFDConfig(
      dataset="fashion_mnist", teacher_dirs=("runs/teacher/fashion_mnist_small_cnn_aug5_val5k",),
      target_epsilon=10.0, validation_examples=5000,
      steps=2000, eval_every=500, batch_size=64, generator_channels=64,
      student_model="datalens_cnn", teacher_loss="dkd", bound_method="normalize",
      l2_clip_norm=1e-4, gamma=1e4, engine=dpdfd.EngineOptions(generator_objective="paper"))
