"""Reverse k-NN private labelling (Li et al., "Fine-grained private knowledge distillation",
arXiv:2207.13253), end to end.

Splits (MNIST as the paper): private = the training split (60k), public = `num_public`
images of the test split chosen by `split_seed`, evaluation = the rest of the test split.
One labelling round:

1. a representation is fitted on the public images only (`representations.fit`);
2. k-means++ (`votes.kmeans`) clusters the public embeddings into s clusters whose centres
   are the queries (public: computed from public data only);
3. every private record votes with its one-hot label for its k nearest queries; the (s, C)
   counts are released with exact discrete Laplace noise of scale >= 2k/ε_r (central, integer
   counts) or built from per-record
   bit-flipped reports (local) (`votes.release_counts`);
4. each query's noisy arg-max label goes to every public sample of its cluster (Acc_pl =
   label accuracy on the public set);
5. a student is trained on the labelled public set (`student`) and evaluated on the
   evaluation split (Acc_pc).

Rounds t > 1 (optional): the `uncertain_fraction` public samples on which the current student
is least confident are clustered again into s new queries, voted on, and relabelled.

Privacy (`privacy` module docstring): `epsilon` is the whole run's pure ε, ε / T per round,
under replace-one; in local mode it is also each record's local ε (simulated). The ledger
keeps the PLD ε of the rounds' dp_accounting events at `delta`. The noise derives from the
seed: a None seed is drawn from OS entropy and stored only in the checkpoint.

Rooms:
  config.py   `RKNNConfig`, `StudentConfig`: the user's choices, validated.
  privacy.py  `RKNNPlan`, `make_plan`: ε_r, k, the mode's noise parameters, `event(n)`.
  votes.py    k-means++ queries, exact vote counts, the central / local release.
  step.py     `build_train_step(plan, config, ...)`: one labelling round (k-means queries,
              the release, labels; `make_train_step` as the run calls it); the student's
              `init_state(config, key, ...)` and `build_student_step` (no noise).
  student.py  `train_student` and its confidence (which samples later rounds relabel).
  run.py      `train_rknn(config, workdir, *, resume=False, stop_after_rounds=None)`:
              workdir, data, plan and ledger, rounds (each checkpointed), results.

Data flow: flags (`experiments/rknn.py`) -> `RKNNConfig` -> `make_plan` -> per round
`run.charge(plan.event(1))` -> `build_train_step(plan, ...)`'s round ->
`votes.release_counts(plan, ...)` -> labels -> student ->
`Run.seal` / `Run.save` (plan and ledger in the checkpoint) -> results.json and record.json.
"""

from dpkd_jax.methods.rknn.config import MODES, RKNNConfig, StudentConfig
from dpkd_jax.methods.rknn.privacy import RKNNPlan, make_plan
from dpkd_jax.methods.rknn.run import public_evaluation_split, train_rknn
from dpkd_jax.methods.rknn.step import build_student_step, build_train_step, init_state
from dpkd_jax.methods.rknn.step import make_train_step
from dpkd_jax.methods.rknn.student import train_student
from dpkd_jax.methods.rknn.votes import release_counts

__all__ = [
    "MODES",
    "RKNNConfig",
    "RKNNPlan",
    "StudentConfig",
    "build_student_step",
    "build_train_step",
    "init_state",
    "make_plan",
    "make_train_step",
    "public_evaluation_split",
    "release_counts",
    "train_rknn",
    "train_student",
]
