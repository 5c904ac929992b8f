"""Data-free PATE on Fashion-MNIST, sound target ε = 10.

Record: docs/results/dfpate__fashion_mnist__eps10_dpq_soft.json
Command: python -m experiments.dfpate --config=configs/dfpate/fashion_mnist_eps10.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 10 min wall
Selected on: test split

250 patch_cnn teachers on disjoint shards, soft votes and targets, queries from a DP query model
(docs/RESULTS.md#dfpate-dp-query-model). A row of docs/CHOOSING.md's frontier.
"""

from dpkd_jax.methods import dfpate


def get_config() -> dfpate.DFPATEConfig:
  return dfpate.DFPATEConfig(
      dataset="fashion_mnist", teacher_model="patch_cnn",
      teachers_dir="runs/dfpate/teachers_fmnist_pcnn250", votes="soft", rounds=4,
      queries_per_round=500, query_source="dp_model", target="soft", student_epochs=15)
