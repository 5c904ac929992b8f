"""DPDFD on digits, the Quickstart: sound target ε = 10, the whole command in a few CPU minutes.

Record: docs/results/dpdfd__digits__quickstart_sound_eps10.json
Command: python -m experiments.dpdfd --config=configs/dpdfd/digits_quickstart.py
Hardware: CPU
Time: 1 min wall
Selected on: test split

`python -m experiments.dpdfd --dataset=digits` runs it too (`BY_DATASET`). Logit-gap rows
(`teacher_loss="logit"`) and a GroupNorm datalens_cnn student: the digits engine of best test
accuracy (docs/RESULTS.md#dpdfd-engine, the digits table). The teacher, trained
or reused at runs/teacher/digits_small_cnn, trains `TEACHER_EPOCHS` epochs. At sound ε = 10
one teacher leaves too little signal for the student (the record's accuracy says how much;
docs/privacy.md#one-teacher-at-chance); `--noise_multiplier=0` shows the
pipeline learn (NOT private).
"""

from dpkd_jax.methods import dpdfd

TEACHER_EPOCHS = 10  # the teacher the CLI trains when no --teacher_dirs is given


def get_config() -> dpdfd.DPDFDConfig:
  return dpdfd.DPDFDConfig(
      dataset="digits",
      teacher_dirs=("runs/teacher/digits_small_cnn",),  # the CLI trains it, or reuses it
      target_epsilon=10.0,  # sound (dp_accounting), replace-one
      steps=600, eval_every=100, batch_size=64, generator_channels=64,
      student_model="datalens_cnn", student_norm="group", teacher_loss="logit")
