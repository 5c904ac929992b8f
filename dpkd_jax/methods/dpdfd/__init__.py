"""DPDFD: a non-private teacher converted into a DP student and generator without data.

Liu et al., IJCAI 2023, "Model Conversion via Differentially Private Data-Free Distillation".
A generator makes synthetic batches; the teacher's per-sample output gradients on them
(d L_T / d s, (B, K) per step) are bounded to norm C and noised (A_{C,σ}): that is the only
release, and the student and generator learn from it by post-processing. The direct mode
(`--mode=direct`, the paper's Table 4) applies A_{C,σ} to private inputs instead: NOT DP.

Rooms:
  config.py   `DPDFDConfig`, `DirectConfig`: frozen, validated user requests (σ and/or ε);
              `DPDFDConfig` holds the paper's knobs, its `engine` the engine's options
              (options.py, `EngineOptions`); config_migration.py upgrades saved configs.
  privacy.py  `DPDFDPlan` / `DirectPlan` and `make_plan` / `make_direct_plan`: the only place
              σ and the step count are resolved (calibration included), `event(n)`, budget.
  step.py     `init_state(config, key)`, the pure jittable step (`build_train_step(plan,
              config, teacher_graphdef)`; `make_train_step` jits it) and the stacked teachers.
  run.py      `train_dpdfd(config, workdir, *, resume=False)`: workdir -> teachers (cards, or
              one stacked ensemble) -> plan -> state -> train -> record.
  release.py  `load_run`, `sample`: the synthetic dataset of a finished run.
  direct.py   `train_direct`, `build_direct_step`: the direct mode.
  quickstart.py  `prepare_teachers` (the teacher trained or reused, every card checked before
              `train_dpdfd`), `summary_lines`:
              the README's Quickstart command and notebook; the digits flag defaults.
  dry_run.py  `dry_run`, `summary_lines`: a run sized from shapes alone (FLOPs, bytes, memory
              per step; H100 / TPU v5e time), for `--dry_run`: nothing read, charged or written.
  generator_prior.py  `load`: a generator pretrained against the teacher (`experiments.srr
              pretrain`) as the starting point: a labelled variant, record-level ε = inf.

Data flow: flags (`experiments/dpdfd.py`) -> `DPDFDConfig` -> `make_plan(config, m)` ->
`build_train_step(plan, ...)` takes σ, C, e and B from the plan -> `mechanisms` adds the
noise -> the ledger is charged `plan.event(n)` before each chunk of n steps, within
`plan.budget_epsilon` -> results.json / record.json report the ledger's sound ε beside
`plan.paper_epsilon`.
"""

from dpkd_jax.methods.dpdfd.config import DirectConfig
from dpkd_jax.methods.dpdfd.config import DPDFDConfig
from dpkd_jax.methods.dpdfd.options import EngineOptions
from dpkd_jax.methods.dpdfd.direct import build_direct_step
from dpkd_jax.methods.dpdfd.direct import train_direct
from dpkd_jax.methods.dpdfd.privacy import DirectPlan
from dpkd_jax.methods.dpdfd.privacy import DPDFDPlan
from dpkd_jax.methods.dpdfd.privacy import make_direct_plan
from dpkd_jax.methods.dpdfd.privacy import make_plan
from dpkd_jax.methods.dpdfd.release import check_run
from dpkd_jax.methods.dpdfd.release import load_run
from dpkd_jax.methods.dpdfd.release import sample
from dpkd_jax.methods.dpdfd.run import load_teachers
from dpkd_jax.methods.dpdfd.run import restart_generator
from dpkd_jax.methods.dpdfd.run import train_dpdfd
from dpkd_jax.methods.dpdfd.step import build_train_step
from dpkd_jax.methods.dpdfd.step import DPDFDState
from dpkd_jax.methods.dpdfd.step import init_state
from dpkd_jax.methods.dpdfd.step import make_train_step
from dpkd_jax.methods.dpdfd.step import TeacherEnsemble

__all__ = [
    "DPDFDConfig",
    "DPDFDPlan",
    "DPDFDState",
    "DirectConfig",
    "DirectPlan",
    "EngineOptions",
    "TeacherEnsemble",
    "build_direct_step",
    "build_train_step",
    "check_run",
    "init_state",
    "restart_generator",
    "load_run",
    "load_teachers",
    "make_direct_plan",
    "make_plan",
    "make_train_step",
    "sample",
    "train_direct",
    "train_dpdfd",
]
