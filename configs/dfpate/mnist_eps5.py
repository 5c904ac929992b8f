"""Data-free PATE on MNIST, sound target ε = 5.

Record: docs/results/dfpate__mnist__eps5_dpq_soft.json
Command: python -m experiments.dfpate --config=configs/dfpate/mnist_eps5.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 2 min wall
Selected on: test split

250 patch_cnn teachers on disjoint shards, soft votes and targets, queries from a DP query model
(docs/RESULTS.md#dfpate-dp-query-model). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import dfpate


def get_config() -> dfpate.DFPATEConfig:
  return dfpate.DFPATEConfig(
      dataset="mnist", target_epsilon=5.0, teacher_model="patch_cnn",
      teachers_dir="runs/dfpate/teachers_mnist_pcnn250", votes="soft", rounds=4,
      queries_per_round=500, query_source="dp_model", query_model_noise=2.0, target="soft",
      student_epochs=15)
