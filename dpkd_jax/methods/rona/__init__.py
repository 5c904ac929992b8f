"""RONA private model compression (Wang et al., "Private Model Compression via Knowledge
Distillation", AAAI 2019).

Data: the training split is divided (seeded) into a labelled *public* part (40% for privacy
runs, 80% for compression runs) and a *sensitive* part. The cumbersome teacher is trained on
both (the whole training split, `dpkd_jax.teacher`); an auxiliary teacher of the same
architecture on the public part only. The compact student (with an adaptation layer on its
hint) then sees only public data and sanitized teacher knowledge:

  stage 1, Th hint epochs: each epoch |x_q| random public samples in query batches of S; the
    adapted student hint regresses the sanitized teacher hint;
  stage 2, R rounds of: Ts self-learning epochs (cross-entropy on the public labels, no
    teacher, no privacy cost); selection of |x_q| query samples (k-center over the student's
    outputs by default); Td distillation epochs on them in batches of S against the sanitized
    softened teacher probabilities (temperature τ).

One Adam learning rate serves all stages, but each stage keeps its own moment estimates.
After every private epoch the student's BatchNorm running statistics are re-estimated on
uniformly drawn public batches (selected queries are atypical by design).

Privacy (replace-one record of the *sensitive* split): the teacher is not private, so each
query bounds the whole (S, ...) knowledge batch to Frobenius norm B and adds N(0, σ²B²):
sensitivity 2B, noise multiplier σ/2 per query (`accounting.rona_event`), for any B
independent of sensitive data. The adaptive B comes from the auxiliary teacher, whose card
must name this very public split; the query choice reads only the student (post-processing);
self learning uses public labels. T = (Th + R·Td)·ceil(|x_q|/S) queries are composed with
dp_accounting (PLD) and checked against a ledger; the paper's per-query figure is reported
beside the sound ε, never instead of it. The teacher's accuracy and teacher/ are private
diagnostics (not covered by ε, `train.outputs`).

Rooms:
  config.py              `RONAConfig`: the flags, validated at construction (never a σ);
                         config_migration.py reads every saved form of it (format versions)
  privacy.py             `RONAPlan` (σ, B, T, ε, the paper's figure, budget; `event(n)`) and
                         `make_plan`, the only place σ is resolved (calibrated for a target).
  sanitize.py            the release of one knowledge batch: bound B, then
                         `privacy.mechanisms.sanitize` (`SanitizeConfig`, `BoundState`).
  student.py             the student with its hint adapter; `create_state`, `student_parts`.
  step.py                `init_state(config, key, ...)`; the private steps
                         `build_train_step(plan, kind, ...)` and `make_train_step` (jitted;
                         hint, distill); self learning, BatchNorm re-estimation.
  teachers.py            the teacher and the auxiliary (public-split) teacher, its split card.
  query_selection.py     k-center / random / margin selection of the distillation queries.
  compression_report.py  teacher vs student: parameters, FLOPs, CPU latency.
  run.py                 `train_rona`, the schedule and the results.

Data flow: flags -> `RONAConfig` -> `make_plan` -> `RONAPlan` -> `make_train_step(plan, ...)`
-> `sanitize.release_knowledge` -> `privacy.mechanisms.sanitize`; the ledger charges
`plan.event(queries_per_epoch)` before each private epoch -> results.json and record.json.

Workdir: teacher/ and aux_teacher/ (when trained here), checkpoints/ (Orbax, after every
epoch-sized unit of the schedule; config, plan, ledger and root seed as metadata),
privacy_ledger.json, results.json, record.json, metrics.csv and tb/.
"""

from dpkd_jax.methods.rona.config import RONAConfig
from dpkd_jax.methods.rona.privacy import RONAPlan
from dpkd_jax.methods.rona.privacy import make_plan
from dpkd_jax.methods.rona.run import schedule
from dpkd_jax.methods.rona.run import train_rona
from dpkd_jax.methods.rona.step import build_train_step
from dpkd_jax.methods.rona.step import init_state
from dpkd_jax.methods.rona.step import make_train_step
from dpkd_jax.methods.rona.student import STUDENTS
from dpkd_jax.methods.rona.teachers import public_split_card

__all__ = [
    "RONAConfig",
    "RONAPlan",
    "STUDENTS",
    "build_train_step",
    "init_state",
    "make_plan",
    "make_train_step",
    "public_split_card",
    "schedule",
    "train_rona",
]
