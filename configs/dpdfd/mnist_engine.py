"""DPDFD on MNIST: the disagreement engine, at the sound target ε = 10 unless σ is given.

Record: docs/results/dpdfd__mnist__engine_disagreement_np.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/mnist_engine.py --teacher_dirs=runs/teacher/mnist_small_cnn_aug3 --noise_multiplier=0 --seed=0
Hardware: CPU
Time: 34 min wall
Selected on: test split

`python -m experiments.dpdfd --dataset=mnist` runs it (`BY_DATASET`). The generator climbs
the released student-teacher disagreement: logit-gap rows clipped at C = 1000 (above the
gaps), one probe direction, a BatchNorm datalens_cnn student, 8,000 steps
(docs/RESULTS.md#dpdfd-engine). The record is this engine at σ = 0 (NOT private:
what the engine reaches without noise). At the sound ε = 10 of the recipe one teacher's
student stays at chance (docs/results/dpdfd__mnist__table1_disagreement_sound_eps10.json,
docs/privacy.md#one-teacher-at-chance); the private recipes are
configs/dpdfd/mnist_ensemble_eps10.py (sound, many teachers) and
configs/dpdfd/mnist_paper_eps10.py (the paper's accounting).
"""

from dpkd_jax.methods import dpdfd


def get_config() -> dpdfd.DPDFDConfig:
  return dpdfd.DPDFDConfig(
      dataset="mnist",
      teacher_dirs=("runs/teacher/mnist_small_cnn",),  # the CLI trains it, or reuses it
      target_epsilon=10.0,  # sound (dp_accounting), replace-one
      steps=8000, eval_every=1000, batch_size=64, generator_channels=64,
      student_model="datalens_cnn", student_norm="batch", teacher_loss="logit",
      bound_method="clip", l2_clip_norm=1000.0,
      engine=dpdfd.EngineOptions(generator_objective="disagreement", probe_directions=1))
