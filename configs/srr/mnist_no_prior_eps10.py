"""SRR on MNIST without the generator's prior, ε = 10 per query: the sound release.

Record: docs/results/srr__mnist__eps10_none_val.json
Command: python -m experiments.srr --config=configs/srr/mnist_no_prior_eps10.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 14 min wall (all its seeds)
Selected on: test split

The README's headline cell "ours, sound accounting": with `generator_prior="none"` no stage
reads the teacher-pretrained generator, so every release is randomized response on labels
and the run has a finite record-level ε (docs/RESULTS.md#srr). Ten stages of 5,120 queries,
a lenet5 student with the KL loss, each run holding out 5,000 training records from a teacher
trained without them (docs/results/teacher__mnist__small_cnn_aug15_val5k.json has its
command). The record is the mean of three seeds (--seed=1, 2 the others).
"""

from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return srr.SRRConfig(
      dataset="mnist", teacher_dir="runs/teacher/mnist_small_cnn_aug15_val5k", epsilon=10.0,
      generator_prior="none", validation_examples=5000, stages=10, samples_per_stage=5120,
      student_epochs=5, student_model="lenet5", generator_channels=64,
      engine=srr.EngineOptions(student_loss="kl"))
