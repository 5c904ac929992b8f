"""Data-free PATE on MNIST: 250 teachers, queries from a DP query model, sound ε = 10.

Record: docs/results/dfpate__mnist__eps10_dpq_soft_3seeds.json
Command: python -m experiments.dfpate --config=configs/dfpate/mnist_eps10.py --data_dir=../shared/data --seed=0
Hardware: CPU
Time: 68 min wall (all its seeds)
Selected on: test split

patch_cnn teachers on disjoint shards (kept at runs/dfpate/teachers_mnist_pcnn250), soft votes
and soft targets, 4 rounds of 500 queries, 15 student epochs
(docs/RESULTS.md#dfpate-dp-query-model). The record is the mean of three seeds.
"""

from dpkd_jax.methods import dfpate


def get_config() -> dfpate.DFPATEConfig:
  return dfpate.DFPATEConfig(
      dataset="mnist", teacher_model="patch_cnn", teachers_dir="runs/dfpate/teachers_mnist_pcnn250",
      target_epsilon=10.0, votes="soft", target="soft", query_source="dp_model", rounds=4,
      queries_per_round=500, student_epochs=15)
