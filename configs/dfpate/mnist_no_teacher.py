"""Data-free PATE on MNIST without teachers: the student learns from the generator alone, ε = 0.

Record: docs/results/dfpate__mnist__noteacher.json
Command: python -m experiments.dfpate --config=configs/dfpate/mnist_no_teacher.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 1 min wall
Selected on: test split

The student never sees a teacher's vote (`use_teachers=False`): ε = 0, the floor the private
recipes are measured against. A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import dfpate


def get_config() -> dfpate.DFPATEConfig:
  return dfpate.DFPATEConfig(
      dataset="mnist", use_teachers=False, teacher_model="patch_cnn", rounds=1,
      queries_per_round=2000, student_epochs=15)
