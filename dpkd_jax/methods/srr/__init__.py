"""DP-DFD with selective randomized response (SRR): Liu et al., "Privacy-Preserving Student
Learning with Differentially Private Data-Free Distillation", arXiv:2409.12384.

1. Generator prior. `generator_prior="teacher"` (the paper): the generator is pretrained
   data-free against the frozen teacher (CE + alpha IE + beta BN-statistics). `"none"`: no
   pretraining; the generator starts from public random weights.
2. Stages t = 1..S: N synthetic queries, the student's prior, the teacher's argmax asked once
   per query, selective RR with threshold tau (default 1/K) and ε per query, E student epochs
   of KL on the noisy labels, generator fine-tuning on the same labels through the student.

Rooms:
  config.py       `SRRConfig`: the flags, validated once (it never resolves ε or stages);
                  config_migration.py reads every saved form of it (format versions);
                  options.py: `EngineOptions`, the options added after the paper
                  (`SRRConfig.engine`)
  privacy.py      `SRRPlan`, `make_plan` (the only place ε per query / stages are resolved,
                  calibration included), `report`; the privacy argument (paper label-DP per
                  query, RR composition of the labels, record level: inf with the teacher prior)
  generator.py    pretraining losses: the teacher's BatchNorm input statistics, CE / IE / BN
  step.py         `init_models`, `init_state(config, key, ...)`, the jitted student /
                  pretrain / fine-tune steps, `build_train_step(plan, ...)`: one stage with
                  the plan's ε (`make_train_step`: as the run calls it)
  stage.py        one stage: queries, prior, the one teacher call and SRR release, updates
  pretraining.py  the generator prior: resumable pretraining, reuse of a pretrained one
  run.py          `train_srr(config, workdir, *, resume=False)`, `pretrain`, `load_run`

Data flow: flags -> `SRRConfig` -> `make_plan(config)` -> `SRRPlan` (ε per query, stages,
labels ε, record-level ε) -> `build_train_step(plan, ...)` (the RR draws use plan's ε) ->
`randomized_response.selective_randomized_response` (privacy/) -> the ledger charges
`plan.event(samples_per_stage)` before each stage -> results.json / record.json
(`privacy.report`: both figures).
"""

from dpkd_jax.methods.srr.config import SRRConfig
from dpkd_jax.methods.srr.options import EngineOptions
from dpkd_jax.methods.srr.privacy import SRRPlan, make_plan, report
from dpkd_jax.methods.srr.run import load_run, pretrain, train_srr
from dpkd_jax.methods.srr.step import build_train_step, init_models, init_state
from dpkd_jax.methods.srr.step import make_train_step

__all__ = [
    "EngineOptions",
    "SRRConfig",
    "SRRPlan",
    "build_train_step",
    "init_models",
    "init_state",
    "load_run",
    "make_plan",
    "make_train_step",
    "pretrain",
    "report",
    "train_srr",
]
