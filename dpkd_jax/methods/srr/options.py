"""SRR's engine options: what the engine adds around the paper's Algorithm 1.

`SRRConfig` holds the paper's knobs (selective RR: ε per query, the threshold tau and the
prior, the generator, the stages N and S, the student's and generator's training);
`EngineOptions` (its `engine` field) holds the options added after the paper, each the
paper's choice at its default but for the student's cosine schedule (the measured default),
so that `EngineOptions()` is Algorithm 1 with that schedule:

  student loss      the paper's KL to the released label, or the RR channel's likelihood
  student schedule  a cosine decay over every stage's student steps, or a constant rate
  student shift     the student sees its queries moved by a few pixels
  student replay    each stage's student epochs also draw from earlier stages' releases
  query pool        the N queries chosen from a larger pool balanced over the student's classes

None of them changes what is released or how it is accounted: each stage asks N labels
at ε per query (`privacy.make_plan`), whatever the options; they are post-processing of the
released labels and of public quantities. What each option was measured to do:
docs/RESULTS.md#srr-engine and the records it links.
"""

from __future__ import annotations

import dataclasses

from dpkd_jax import config_checks

STUDENT_LOSSES = ("kl", "rr_likelihood")
STUDENT_SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
  """The engine's options around the paper's algorithm (module docstring).

  One entry per field, its first sentence the flag's `--help` line.

  Attributes:
    student_loss: "kl" (paper: KL to the one-hot released label) or "rr_likelihood". The
      latter is -log of the released label's probability through the known SRR channel
      (`step`).
    student_schedule: "cosine" (decayed over all the student's steps, every stage's) or
      "constant" (later stages' labels are learnt at the same rate as the first's).
    student_shift: the student sees its queries moved by up to this many pixels (0: none).
    student_replay: each stage's student epochs also draw from earlier stages' releases.
      Stage t draws its N rows from the releases of stages 0..t (kept in the checkpoint):
      post-processing (same queries, ε and steps). False: the paper's.
    query_pool: ask the N of this many times N latents balanced over the student's classes.
      With the student's prior (`selection`; post-processing of public quantities: same
      queries per stage, same ε); 1: the N drawn, the paper's.
  """

  student_loss: str = "kl"
  student_schedule: str = "cosine"
  student_shift: int = 0
  student_replay: bool = False
  query_pool: int = 1

  def __post_init__(self):
    config_checks.one_of("student_loss", self.student_loss, STUDENT_LOSSES)
    config_checks.one_of("student_schedule", self.student_schedule, STUDENT_SCHEDULES)
    config_checks.integers(self, "student_shift", minimum=0)
    config_checks.integers(self, "query_pool")
    if not isinstance(self.student_replay, bool):
      raise ValueError(f"student_replay must be True or False, got {self.student_replay!r}")
