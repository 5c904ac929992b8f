"""The configuration of a DP-DFD + selective RR run: one frozen dataclass, validated once.

The config holds the user's flags only. It never resolves the executed ε per query or the
number of stages (with a `target_epsilon` either may change): `privacy.make_plan(config)` does,
and the stage step takes them from the plan.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods.srr import config_migration
from dpkd_jax.methods.srr import generator
from dpkd_jax.methods.srr import options as options_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import randomized_response

FIRST_PRIORS = ("uniform", "student")
GENERATOR_PRIORS = ("teacher", "none")
STUDENT_LOSSES = options_lib.STUDENT_LOSSES
STUDENT_SCHEDULES = options_lib.STUDENT_SCHEDULES
MOSTLY_NOISE = 0.5  # stage 1 keeps fewer teacher labels than this: the labels are mostly noise


def labels_mostly_noise(epsilon: float | None, num_classes: int) -> bool:
  """Whether plain K-ary RR at `epsilon` keeps the true label with probability < 1/2.

  p = e^ε / (e^ε + K − 1): below 1/2 (ε < ln(K − 1), ln 9 ≈ 2.2 for 10 classes) most of the
  first stage's labels (uniform prior: plain K-ary RR) are noise. False for ε = inf and for
  ε None (calibrated from a target later: the per-query ε is not known here).
  """
  if epsilon is None:
    return False
  return float(randomized_response.keep_probability(epsilon, num_classes)) < MOSTLY_NOISE


@dataclasses.dataclass(frozen=True, kw_only=True)
class SRRConfig:
  """A DP-DFD + selective RR run. Privacy fields first, then models, pretraining, stages;
  the options the engine adds after the paper in `engine` (`options.EngineOptions`).

  Attributes:
    epsilon: ε per query (label DP); None to calibrate from `target_epsilon`; inf: no noise.
    target_epsilon: bound on the record-level ε of all label queries composed (PLD).
    delta: δ of the record-level figures.
    threshold: tau of the candidate set; None = 1/K.
    first_prior: prior of the first stage: "uniform" or "student". The untrained student's
      output is an arbitrary function of its random weights; with tau <= 1/K the uniform
      prior makes every class a candidate.
    generator_prior: "teacher" (paper; record-level ε = inf) or "none" (sound).
    dataset: the private dataset.
    teacher_dir: the workdir of the teacher trained on it (`experiments.teacher`).
    student_model: the student architecture (a name in `models.CLASSIFIERS`).
    student_norm: the student's normalisation layers: "batch", "group" or "none".
    generator_model: the generator architecture (a name in `models.GENERATORS`).
    generator_channels: the generator's width (an even number; 128 in the paper).
    latent_dim: the size of the generator's latent input.
    pretrain_steps: steps of the generator's pretraining against the teacher.
    pretrain_batch_size: samples per generator pretraining step.
    pretrain_learning_rate: Adam learning rate of the generator's pretraining.
    generator_terms: the pretraining loss terms among ce, ie, bn (ablation).
    entropy_weight: alpha, the weight of the information-entropy (ie) pretraining term.
    bn_weight: beta, the weight of the BatchNorm-statistics (bn) pretraining term.
    pretrained_generator_dir: reuse a pretrained generator instead of pretraining again.
      Pretrained for the same dataset, teacher (its weights, wherever they lie:
      `models.generator_identity`), architecture and pretraining fields (`<other
      run>/generator_pretrain`, or a `pretrain(...)` workdir).
    stages: S, the number of labelling stages.
    samples_per_stage: N, label queries per stage.
    batch_size: B, samples per training step.
    student_epochs: the student's passes over each stage's labels.
    generator_epochs: the generator's fine-tuning passes over each stage's labels (0: none).
    student_learning_rate: the student's Adam learning rate (on `engine.student_schedule`).
    generator_learning_rate: the generator's Adam learning rate.
    engine: the options added after the paper (`options.EngineOptions`; flat flags).
    validation_examples: private hold-out records for the per-stage evaluations (0: test).
      Held out of the teacher's training split (`train.selection`): private diagnostics; the
      test split is read once at the end.
    seed: root seed; None: a secret one from OS entropy (`privacy.seeds`).
    data_dir: directory of `<dataset>.npz`.
  """

  # Old flag and saved names of renamed fields (the library's vocabulary, docs/ARCHITECTURE.md).
  RENAMED: ClassVar[dict[str, str]] = config_migration.V1_RENAMED

  epsilon: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  threshold: float | None = None
  first_prior: str = "uniform"
  generator_prior: str = "teacher"
  dataset: str
  teacher_dir: str
  student_model: str = "lenet5"
  student_norm: str = "batch"
  generator_model: str = "dafl"
  generator_channels: int = 128
  latent_dim: int = 100
  pretrain_steps: int = 1000
  pretrain_batch_size: int = 128
  pretrain_learning_rate: float = 1e-3
  generator_terms: tuple[str, ...] = generator.GENERATOR_TERMS
  entropy_weight: float = 5.0
  bn_weight: float = 10.0
  pretrained_generator_dir: str | None = None
  stages: int = 10
  samples_per_stage: int = 2560
  batch_size: int = 128
  student_epochs: int = 10
  generator_epochs: int = 1
  student_learning_rate: float = 1e-3
  generator_learning_rate: float = 1e-4
  engine: options_lib.EngineOptions = dataclasses.field(
      default_factory=options_lib.EngineOptions)
  validation_examples: int = 0
  seed: int | None = None
  data_dir: str | None = None

  def __post_init__(self):
    config_checks.integer("validation_examples", self.validation_examples, minimum=0)
    object.__setattr__(self, "generator_terms", tuple(self.generator_terms))
    config_checks.one_of("dataset", self.dataset, data.DATASETS)
    config_checks.one_of("student_model", self.student_model, models.CLASSIFIERS)
    config_checks.one_of("generator_model", self.generator_model, models.GENERATORS)
    config_checks.one_of("first_prior", self.first_prior, FIRST_PRIORS)
    config_checks.one_of("generator_prior", self.generator_prior, GENERATOR_PRIORS)
    if not isinstance(self.engine, options_lib.EngineOptions):
      raise ValueError(f"engine must be an srr.EngineOptions, got {type(self.engine).__name__}")
    if self.threshold is not None:
      config_checks.fraction("threshold (tau)", self.threshold, open_low=False, open_high=False)
    if config_checks.integer("generator_channels", self.generator_channels, minimum=2) % 2:
      raise ValueError(
          f"generator_channels must be an even integer >= 2, got {self.generator_channels}")
    config_checks.integers(self, "stages", "samples_per_stage", "batch_size", "student_epochs")
    config_checks.integers(self, "generator_epochs", minimum=0)
    if self.samples_per_stage % self.batch_size:
      raise ValueError(f"samples_per_stage={self.samples_per_stage} must be a multiple of"
                       f" batch_size={self.batch_size}")
    config_checks.positive(self, "student_learning_rate", "generator_learning_rate")
    if self.generator_prior == "none" and self.pretrained_generator_dir is not None:
      raise ValueError("generator_prior='none' never uses a teacher-pretrained generator;"
                       f" drop pretrained_generator_dir={self.pretrained_generator_dir!r}")
    self._check_privacy()
    self.pretrain_config()  # validates the generator terms, weights and pretraining sizes
    config_checks.seed(self.seed)

  def _check_privacy(self) -> None:
    """Inconsistent privacy flags (cheap: no accounting; `make_plan` calibrates)."""
    config_checks.fraction("delta", self.delta)
    if self.epsilon is None and self.target_epsilon is None:
      raise ValueError("give epsilon (per query), target_epsilon (record level), or both")
    if self.epsilon is not None and not (self.epsilon > 0 and not math.isnan(self.epsilon)):
      raise ValueError(f"epsilon (per query) must be > 0 (inf: no noise), got {self.epsilon}")
    if self.target_epsilon is not None and not 0 < self.target_epsilon < math.inf:
      raise ValueError(f"target_epsilon must be finite and > 0, got {self.target_epsilon}")
    if self.target_epsilon is not None and self.epsilon is not None and math.isinf(self.epsilon):
      raise ValueError("a target_epsilon needs noisy labels: epsilon=inf has no finite ε")

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def tau(self) -> float:
    return 1.0 / self.info.num_classes if self.threshold is None else self.threshold

  def pretrain_config(self) -> generator.PretrainConfig:
    return generator.PretrainConfig(
        terms=self.generator_terms, entropy_weight=self.entropy_weight, bn_weight=self.bn_weight,
        steps=self.pretrain_steps, batch_size=self.pretrain_batch_size,
        latent_dim=self.latent_dim, learning_rate=self.pretrain_learning_rate)

  def generator_identity(self, teacher: core.ModelParts) -> dict[str, Any]:
    """What a pretrained generator must have been trained for to be reused by this run, with
    `teacher` the loaded teacher of `teacher_dir` (named by its weights, not its path)."""
    return models.generator_identity(self, teacher_lib.weights_sha256(teacher))

  def to_json(self) -> dict[str, Any]:
    """The config as saved in checkpoints and results: every field (the engine's options
    nested under "engine") and the format's `version` (`config_migration`; a resumed run must
    match it)."""
    out = dataclasses.asdict(self)
    out["generator_terms"] = list(self.generator_terms)
    return {"version": config_migration.VERSION, **out}

  @classmethod
  def from_json(cls, saved: dict[str, Any]) -> "SRRConfig":
    """The config of a saved dict of any format (`config_migration.migrate` first)."""
    values = config_migration.migrate(saved)
    del values["version"]
    config_checks.refuse_unknown_fields("SRR", (values, cls),
                                        (values["engine"], options_lib.EngineOptions))
    return cls(**{**values, "generator_terms": tuple(values["generator_terms"]),
                  "engine": options_lib.EngineOptions(**values["engine"])})
