"""DPDFD's engine options: what the engine adds around the paper's Algorithm 1.

`DPDFDConfig` holds the paper's knobs (the mechanism A_{C,σ}, its accounting, the losses and
the models); `EngineOptions` (its `engine` field) holds the options added after the paper,
each off (or the paper's choice) at its default, so that `EngineOptions()` is Algorithm 1:

  generator   the disagreement generator (DFME-style probes of the released disagreement) and
              its terms: diversity, released class balance, a class code, an image prior
  student     a moving average of its weights; a replay memory of earlier released pairs
  restarts    a fresh generator when the released disagreement stalls

None of them changes what is released per row or how it is accounted, except that the
disagreement generator's probes are extra rows of the same release (`probes_per_sample`,
charged with the batch by `privacy.make_plan`). Checks that read the paper's knobs as well
(C's bound method, the latent size, the batch) are `DPDFDConfig.__post_init__`'s. What each
option was measured to do: docs/RESULTS.md#dpdfd-engine and the records it links.
"""

from __future__ import annotations

import dataclasses

from dpkd_jax import config_checks
from dpkd_jax.methods.dpdfd import replay
from dpkd_jax.methods.dpdfd import restarts

# How the generator learns: through the student (paper), or up the released disagreement.
GENERATOR_OBJECTIVES = ("paper", "disagreement")
# Terms of the disagreement generator only (the paper generator has its own L_G).
_DISAGREEMENT_TERMS = ("released_balance_weight", "class_conditional_weight",
                       "smoothness_weight")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
  """The engine's options around the paper's algorithm (module docstring); defaults: off.

  One entry per field, its first sentence the flag's `--help` line.

  Attributes:
    generator_objective: how the generator learns: "paper" or "disagreement". "paper": L_S +
      L_G through the updated student. "disagreement": it ascends ||s(x) - y_s(x)||_1, the
      disagreement the released rows show, by forward differences along `probe_directions`
      directions per sample (DFME); the probes' rows are released and charged with the batch
      (B·(1 + m) rows a step). Needs bound_method="clip".
    probe_directions: m, random probe directions per sample of the disagreement generator.
    probe_step: δ, the step of the disagreement probes x + δu.
    diversity_weight: weight of a class-balance entropy on the student's view of the batch.
      The disagreement generator's DAFL entropy of the student's predictions (0: off; the
      paper generator's is `entropy_weight`). Teacher-free: no row, no privacy cost.
    released_balance_weight: weight of a class-balance entropy on the released targets y_s.
      H(mean_b softmax(y_s)), ascended along the probes (`probes.released_balance_ascent`; 0:
      off). Released rows only: post-processing, same ε.
    class_conditional_weight: weight of a class code asked of the generator (0: off).
      Each sample asks for a uniform class through its first K latent coordinates; the
      released targets' cross-entropy to it is descended along the probes
      (`probes.released_class_descent`). Post-processing, same ε. Needs latent_dim > K.
    smoothness_weight: weight of a total-variation prior on the generated images (0: off).
      DeepInversion's `losses.total_variation`: no teacher, no row, no privacy cost.
    param_averaging_decay: d in [0, 1) of a moving average of the student's weights (0: off).
      The bias-corrected average (`train.averaging`) is evaluated and released instead of
      the last iterate (BatchNorm statistics: the running ones). Post-processing: same ε.
    generator_restart_ratio: restart the generator when its released disagreement stalls (0:
      never). It restarts when `generator_restart_patience` windows in a row exceed this
      ratio times the lowest since the last (re)start (`dpdfd.restarts`). Same ε.
    generator_restart_patience: evaluation windows in a row that trigger a generator restart.
    generator_max_restarts: the most generator restarts of a run.
    replay_size: rows of earlier released pairs (x, y_s) kept for the student (0: none).
      Each student update also draws `replay_batch` of them (`dpdfd.replay`). Same ε.
    replay_batch: replayed rows per student update; None: batch_size.
    replay_sampling: how replayed rows are drawn: "uniform" or "class_balanced".
      "class_balanced": every class (the stored target's argmax) alike.
    replay_memory: which released rows the replay memory keeps: "ring" or "per_class".
      "per_class": the newest replay_size // K of each class, so a class the generator left
      is not forgotten (needs replay_size >= K · batch_size).
  """

  generator_objective: str = "paper"
  probe_directions: int = 1
  probe_step: float = 1e-3
  diversity_weight: float = 0.0
  released_balance_weight: float = 0.0
  class_conditional_weight: float = 0.0
  smoothness_weight: float = 0.0
  param_averaging_decay: float = 0.0
  generator_restart_ratio: float = 0.0
  generator_restart_patience: int = 2
  generator_max_restarts: int = 2
  replay_size: int = 0
  replay_batch: int | None = None
  replay_sampling: str = "uniform"
  replay_memory: str = "ring"

  def __post_init__(self):
    config_checks.positive(self, "probe_step")
    config_checks.one_of("generator_objective", self.generator_objective,
                         GENERATOR_OBJECTIVES)
    config_checks.integers(self, "probe_directions")
    config_checks.fraction("param_averaging_decay", self.param_averaging_decay, open_low=False)
    config_checks.non_negative(self, "diversity_weight", *_DISAGREEMENT_TERMS)
    if self.diversity_weight and self.generator_objective != "disagreement":
      raise ValueError("diversity_weight adds the class-balance term to the disagreement "
                       "generator; the paper generator weighs it by entropy_weight")
    for name in _DISAGREEMENT_TERMS:
      if getattr(self, name) and self.generator_objective != "disagreement":
        raise ValueError(f"{name} is a term of the disagreement generator: it needs "
                         "generator_objective='disagreement'")
    _ = self.restart_rule  # validates the restart fields
    config_checks.integers(self, "replay_size", minimum=0)
    if self.replay_batch is not None:
      config_checks.integer("replay_batch", self.replay_batch, minimum=1)
      if not self.replay_size:
        raise ValueError("replay_batch needs replay_size > 0")
    config_checks.one_of("replay_sampling", self.replay_sampling, replay.SAMPLINGS)
    if self.replay_sampling != "uniform" and not self.replay_size:
      raise ValueError("replay_sampling needs replay_size > 0")
    config_checks.one_of("replay_memory", self.replay_memory, replay.MEMORIES)

  @property
  def probes_per_sample(self) -> int:
    """Extra released rows per synthetic sample: the disagreement probes, else 0."""
    return self.probe_directions if self.generator_objective == "disagreement" else 0

  @property
  def restart_rule(self) -> restarts.RestartRule | None:
    """The generator-restart rule, or None when the run never restarts its generator."""
    if isinstance(self.generator_restart_ratio, (int, float)) and not isinstance(
        self.generator_restart_ratio, bool) and self.generator_restart_ratio == 0:
      return None
    if self.generator_objective != "disagreement":
      raise ValueError("generator_restart_ratio reads the released disagreement: it needs "
                       "generator_objective='disagreement'")
    return restarts.RestartRule(ratio=self.generator_restart_ratio,
                                patience=self.generator_restart_patience,
                                max_restarts=self.generator_max_restarts)
