"""Data-free PATE: a teacher ensemble on disjoint private shards, public queries, noisy votes.

PATE (Papernot et al., ICLR 2017 / 2018) without public data: the queries are procedural
images or samples of a DP model of the private images. Pipeline of `train_dfpate`:

1. Teachers. n teachers of one small architecture, trained at once (vmapped) on disjoint
   equal shards of the private training set (`dpkd_jax.teacher_ensemble`, shared with DPDFD;
   reuse and self-training in `teachers`).
   They can be saved to and reused from `teachers_dir` (as secret as the data).
2. Queries (`queries`). Round r draws procedural images (`data.procedural`) from public
   randomness, or (`query_source="dp_model"`) samples of a DP mixture model of the private
   images released once at the start (`query_model`: DP-PCA + DP k-means, Gaussian releases
   of unlabelled statistics, mechanisms of `privacy.query_model_releases`). Round 0 asks
   `queries_per_round` random ones; later rounds draw `pool_factor` times as many and let the
   DP student pick a class-balanced set of confident ones (post-processing).
3. Private answers (`step.release_votes`). Each query's vote histogram is released once with
   Gaussian noise σ (`privacy.aggregation.noisy_histogram`); argmax and margin are free.
4. Student (`student`). Trained on (query, noisy answer) pairs, hard GNMax labels filtered by
   the noisy margin or soft noisy mean votes, continuing across rounds.

Rooms: `config` (DFPATEConfig, validated flags; `config_migration` reads every saved form of
it), `privacy` (DFPATEPlan, make_plan: the only place σ is resolved), `step` (init_state,
build_train_step: one round; make_train_step: the round as the run calls it), `run` (train_dfpate(config, workdir, *, resume=False)), `streams`
(the run's key streams), `queries`, `query_model`, `student`, `teachers`,
`dpkd_jax.teacher_ensemble` (the ensemble and its architectures).

Data flow: flags -> `DFPATEConfig` -> `make_plan` (σ given or calibrated by PLD for the whole
run: query model + Q = rounds · queries_per_round histograms) -> `build_train_step(plan, ...)`
(σ from the plan) -> `aggregation.noisy_histogram` (the mechanism) -> the ledger, charged
`plan.query_model_event()` once and `plan.event(1)` before every round -> results.json and
record.json (`train.outputs.finish_run`).

Privacy (docs/privacy.md, "Data-free PATE"). Unit: one record of the private training set,
replace-one. The record is in one shard, so it changes one teacher and each released
histogram by at most √2 in L2 (hard or soft votes). Queries, selection, student and sample
grid only see public randomness and released values, so the run is the query model's
releases followed by Q adaptively composed Gaussian mechanisms with noise multiplier σ/√2
(`DFPATEPlan.run_event`). The teacher accuracies are noiseless functions of the private
models: results.json keeps them under "private_diagnostics" (not covered by ε). Noise keys
derive from a secret OS-entropy seed unless `seed` is given (`privacy.seeds`).
"""

from dpkd_jax.methods.dfpate.config import QUERY_SOURCES
from dpkd_jax.methods.dfpate.config import DFPATEConfig
from dpkd_jax.methods.dfpate.privacy import DFPATEPlan
from dpkd_jax.methods.dfpate.privacy import make_plan
from dpkd_jax.methods.dfpate.query_model import QueryModel
from dpkd_jax.methods.dfpate.query_model import QueryModelConfig
from dpkd_jax.methods.dfpate.run import train_dfpate
from dpkd_jax.methods.dfpate.step import RoundState
from dpkd_jax.methods.dfpate.step import build_train_step
from dpkd_jax.methods.dfpate.step import init_state
from dpkd_jax.methods.dfpate.step import make_train_step
from dpkd_jax.teacher_ensemble import TEACHER_MODELS

__all__ = [
    "DFPATEConfig",
    "DFPATEPlan",
    "QUERY_SOURCES",
    "QueryModel",
    "QueryModelConfig",
    "RoundState",
    "TEACHER_MODELS",
    "build_train_step",
    "init_state",
    "make_plan",
    "make_train_step",
    "train_dfpate",
]
