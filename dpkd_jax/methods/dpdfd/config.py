"""DPDFD configs: the data-free run (`DPDFDConfig`) and the direct mode (`DirectConfig`).

Both are frozen, keyword-only and validated at construction (one line naming the field, via
`config_checks`). Neither resolves σ: a config holds what the user asked for (σ, a target ε,
or both), and `privacy.make_plan` / `privacy.make_direct_plan` turn it into what runs.
Both modes share the output-gradient mechanism A_{C,σ} and the noisy target y_s = s - γ g~,
so the fields of those (C, e, the bound method, γ, L_S) are checked by one function.
`DPDFDConfig` holds the paper's knobs; the options the engine adds are its nested `engine`
(`options.EngineOptions`). A saved config (`to_json`) carries a format version, and
`from_json` reads every older form through `config_migration.migrate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.methods.dpdfd import config_migration
from dpkd_jax.methods.dpdfd import options
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import plan as plan_lib

STUDENT_LOSSES = ("ce", "mse", "l1")
# L_T, whose per-sample output gradient is the released row: "dkd" (the paper's decoupled KD,
# row = dDKD/ds) or "logit" (0.5||s - t||², row = s - t: the student-to-teacher logit gap).
TEACHER_LOSSES = ("dkd", "logit")


def check_output_gradient_fields(config: Any) -> None:
  """C, e, the bound method, γ and L_S: the fields of A_{C,σ} and y_s both modes share."""
  config_checks.positive(config, "l2_clip_norm", "gamma")
  config_checks.non_negative(config, "stability")
  config_checks.one_of("bound_method", config.bound_method, mechanisms.ROW_BOUNDERS)
  config_checks.one_of("student_loss", config.student_loss, STUDENT_LOSSES)


def check_privacy_request(config: "DPDFDConfig") -> None:
  """The privacy flags are consistent: cheap (no calibration, which `make_plan` does)."""
  config_checks.one_of("accounting", config.accounting, plan_lib.ACCOUNTINGS)
  config_checks.integer("steps", config.steps, minimum=1)
  config_checks.fraction("delta", config.delta)
  if config.target_epsilon is None and config.noise_multiplier is None:
    raise ValueError("give noise_multiplier, target_epsilon, or both")
  if config.target_epsilon is not None:
    config_checks.positive(config, "target_epsilon")
  if config.noise_multiplier is not None:
    config_checks.non_negative(config, "noise_multiplier")
    if config.target_epsilon is not None and config.noise_multiplier == 0:
      raise ValueError(f"a target epsilon needs noise: noise_multiplier="
                       f"{config.noise_multiplier} must be > 0")
  bits = config.secure_grid_bits
  if (config.secure_noise and config.noise_multiplier == 0) or (bits is not None and not (
      config.secure_noise and config_checks.integer("secure_grid_bits", bits, minimum=1) <= 30)):
    raise ValueError("secure_noise needs noise_multiplier > 0; secure_grid_bits (1..30) needs "
                     "secure_noise")


def check_teacher_source(config: "DPDFDConfig") -> None:
  """Exactly one of teacher_dirs / teacher_ensemble_dir names the teachers."""
  if config.teacher_ensemble_dir is not None:
    if config.teacher_dirs:
      raise errors.UserError("give --teacher_dirs or --teacher_ensemble_dir, not both: the "
                             "ensemble directory already holds every teacher")
    if not config.teacher_ensemble_dir:
      raise errors.UserError("--teacher_ensemble_dir is empty: give the directory of "
                             "`python -m experiments.teacher_ensemble --workdir=...`")
  elif not config.teacher_dirs:
    raise ValueError("teacher_dirs must name at least one teacher workdir (or give "
                     "teacher_ensemble_dir)")
  if config.pretrained_generator_dir is not None and len(config.teacher_dirs) != 1:
    raise ValueError("pretrained_generator_dir needs exactly one teacher (the one it was "
                     "pretrained against, in teacher_dirs)")


def check_engine(config: "DPDFDConfig") -> None:
  """The engine options against the paper's knobs (each option alone: its own checks)."""
  engine, classes = config.engine, config.info.num_classes
  if engine.generator_objective == "disagreement" and config.bound_method != "clip":
    raise ValueError("generator_objective='disagreement' reads the disagreement from the size "
                     "of the released rows, which bound_method='normalize' sets to C for "
                     "every row: use bound_method='clip'")
  if engine.class_conditional_weight and config.latent_dim <= classes:
    raise ValueError(f"class_conditional_weight puts a class code in the first {classes} "
                     f"latent coordinates: latent_dim must exceed it, got {config.latent_dim}")
  if engine.replay_size and engine.replay_size < config.batch_size:
    raise ValueError(f"replay_size must be 0 or >= batch_size={config.batch_size} (a step "
                     f"writes its whole batch), got {engine.replay_size}")
  if engine.replay_memory != "ring" and engine.replay_size < classes * config.batch_size:
    raise ValueError(f"replay_memory={engine.replay_memory!r} keeps replay_size // {classes} "
                     f"rows per class, which must hold a step's batch: replay_size must be "
                     f">= {classes * config.batch_size}, got {engine.replay_size}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPDFDConfig:
  """A DPDFD run: Algorithm 1 of the paper, with the engine's options in `engine`.

  Each of `steps` iterations: the generator G maps B latents z to synthetic images x; the
  student s and the teacher(s) t score them; the per-sample output gradients of L_T, the rows
  g_b = κ·dL_T(s_b, t_b)/ds_b (B, K), are bounded to norm C and noised, g~ = A_{C,σ}(g) (the
  only release, charged to the ledger each step); the student descends L_S(s, y_s) to the noisy
  targets y_s = s - γ g~; the generator descends L_S + L_G (entropy, features, one-hot) through
  the updated student. Privacy fields first, then the models, losses and optimisation, then
  bookkeeping. What the engine adds around this (`EngineOptions`, off at its defaults): the
  disagreement generator and its terms, replay, averaging, restarts.

  One entry per field, its first sentence the flag's `--help` line.

  Attributes:
    noise_multiplier: σ, the noise std per output coordinate in units of C; None: calibrate.
    target_epsilon: the ε budget: σ is calibrated to it, or the run stops at it.
    delta: δ of every reported ε.
    accounting: "sound" (dp_accounting) or "paper" (Theorem 3 reconstruction; warned, and the
      sound ε is reported beside it).
    l2_clip_norm: C, the norm bound of each released output-gradient row.
    stability: e, the stabiliser of normalised rows C·g/(||g|| + e).
    bound_method: how rows are bounded: "normalize" (to norm C) or "clip" (to norm <= C).
    secure_noise: discrete Gaussian noise on an integer grid instead of float Gaussian noise.
    secure_grid_bits: the grid C/2^bits of secure noise; None: the finest in int32.
    dataset: the private dataset (its test split evaluates the student).
    teacher_dirs: one workdir per teacher (`experiments.teacher`). An ensemble (n > 1) is
      accounted by the most teachers one record can reach (`teacher_partition`).
    teacher_ensemble_dir: instead of teacher_dirs, n stacked teachers on disjoint shards.
      Written by `experiments.teacher_ensemble` (or DF-PATE's `teachers_dir`): one teacher per
      record (m = 1).
    student_model: the student architecture (a name in `models.CLASSIFIERS`).
    student_norm: the student's normalisation layers: "batch", "group" or "none".
    generator_model: the generator architecture (a name in `models.GENERATORS`).
    generator_channels: the generator's width (DAFL's, 128 in the paper; 64 quarters the cost).
    latent_dim: the size of the generator's latent input.
    steps: DPDFD iterations (an upper bound when a target ε stops the run).
    batch_size: B, synthetic samples (released rows) per step.
    gamma: γ, the step size of the noisy target y_s = s - γ g~.
    student_loss: L_S against y_s: "mse", "ce" or "l1". "mse" is 0.5||s - y_s||², whose
      gradient w.r.t. s is exactly γ g~; "ce" is the paper's cross-entropy against
      softmax(y_s), which stalls once the student is confident (docs/RESULTS.md, student loss);
      "l1" is ||s - y_s||₁ (DFME's): steps of one size whatever the row's scale.
    teacher_loss: L_T, whose per-sample output gradient is the released row: "dkd" or "logit".
      "dkd" is the paper's decoupled KD with the teacher's argmax as the label; "logit" is
      0.5||s - t||², row s - t (DFAD's logit matching). Both rows leave through the same
      A_{C,σ}: the privacy argument and ε are unchanged.
    teacher_loss_scale: κ, L_T's weight: the released rows are κ·dL_T/ds. Rows and C scale
      together, so κ changes nothing under the sound accounting; κ·γ = 1 with κ far below C
      keeps rows unclipped, which the paper's Theorem 3 then prices as almost noiseless
      (docs/RESULTS.md#dpdfd-paper-table-1).
    dkd_alpha: α of decoupled KD (the target-class term) when teacher_loss="dkd".
    dkd_beta: β of decoupled KD (the non-target-class term) when teacher_loss="dkd".
    temperature: the softmax temperature of decoupled KD.
    entropy_weight: α of L_G, the information entropy of the batch-mean prediction.
    feature_weight: β of L_G, the student penultimate-feature term.
    one_hot_weight: weight of L_G's cross-entropy to the student's own argmax (0: drop it).
    student_learning_rate: the student's Adam learning rate (cosine-decayed over the steps).
    generator_learning_rate: the generator's Adam learning rate (cosine-decayed over the steps).
    engine: the engine's options around the algorithm (`options.EngineOptions`; flat flags).
    pretrained_generator_dir: a generator of `experiments.srr pretrain` to start from (None:
      random). Pretrained against the teacher WITHOUT noise: the record-level ε is then inf;
      the release ε (conditional on that generator) is kept beside it.
    validation_examples: private hold-out records for the evaluations during training (0: test).
      Held out of the teachers' training split (`train.selection`): private diagnostics; the
      test split is read once at the end.
    seed: root seed of init, latents and noise; None: a secret one from OS entropy. The
      secret seed stays in the checkpoint (`privacy.seeds`); an integer makes the noise public.
    eval_every: steps between evaluations of the student.
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
  """

  # Old flag and saved names of renamed fields (the library's vocabulary, docs/ARCHITECTURE.md).
  RENAMED: ClassVar[dict[str, str]] = config_migration.V1_RENAMED

  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  accounting: str = "sound"
  l2_clip_norm: float = 1.0
  stability: float = 1e-6
  bound_method: str = "normalize"
  secure_noise: bool = False
  secure_grid_bits: int | None = None
  dataset: str
  teacher_dirs: tuple[str, ...] = ()
  teacher_ensemble_dir: str | None = None
  student_model: str = "datalens_cnn"
  student_norm: str = "batch"
  generator_model: str = "dafl"
  generator_channels: int = 128
  latent_dim: int = 100
  steps: int = 2000
  batch_size: int = 256
  gamma: float = 1.0
  student_loss: str = "mse"
  teacher_loss: str = "dkd"
  teacher_loss_scale: float = 1.0
  dkd_alpha: float = 1.0
  dkd_beta: float = 8.0
  temperature: float = 4.0
  entropy_weight: float = 5.0
  feature_weight: float = 0.1
  one_hot_weight: float = 1.0
  student_learning_rate: float = 1e-3
  generator_learning_rate: float = 1e-3
  engine: options.EngineOptions = dataclasses.field(default_factory=options.EngineOptions)
  pretrained_generator_dir: str | None = None
  validation_examples: int = 0
  seed: int | None = None
  eval_every: int = 200
  data_dir: str | None = None

  def __post_init__(self):
    config_checks.integer("validation_examples", self.validation_examples, minimum=0)
    object.__setattr__(self, "teacher_dirs", tuple(self.teacher_dirs))
    check_teacher_source(self)
    config_checks.one_of("dataset", self.dataset, data.DATASETS)
    config_checks.one_of("student_model", self.student_model, models.CLASSIFIERS)
    config_checks.one_of("generator_model", self.generator_model, models.GENERATORS)
    config_checks.one_of("teacher_loss", self.teacher_loss, TEACHER_LOSSES)
    config_checks.seed(self.seed)
    config_checks.integers(self, "eval_every", "generator_channels", "batch_size", "latent_dim")
    config_checks.positive(self, "student_learning_rate", "generator_learning_rate",
                           "temperature", "teacher_loss_scale")
    config_checks.non_negative(self, "entropy_weight", "feature_weight", "one_hot_weight")
    if not isinstance(self.engine, options.EngineOptions):
      raise ValueError(f"engine must be an EngineOptions, got {type(self.engine).__name__}")
    check_engine(self)
    check_output_gradient_fields(self)
    check_privacy_request(self)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def probes_per_sample(self) -> int:
    """Extra released rows per synthetic sample (`EngineOptions.probes_per_sample`)."""
    return self.engine.probes_per_sample

  @property
  def class_codes(self) -> int:
    """K when the generator is class-conditional (`class_conditional_weight`), else 0."""
    return self.info.num_classes if self.engine.class_conditional_weight else 0

  @property
  def replay_rows(self) -> int:
    """Replayed rows per step: 0 without replay, else replay_batch (default batch_size)."""
    if not self.engine.replay_size:
      return 0
    return self.batch_size if self.engine.replay_batch is None else self.engine.replay_batch

  def to_json(self) -> dict[str, Any]:
    """The config as saved in checkpoints and results: every field, the engine nested, and
    the format's `version` (`config_migration`; a resumed run must match it)."""
    out = dataclasses.asdict(self)
    out["teacher_dirs"] = list(self.teacher_dirs)
    return {"version": config_migration.VERSION, **out}

  @classmethod
  def from_json(cls, saved: dict[str, Any]) -> "DPDFDConfig":
    """The config of a saved dict of any format (`config_migration.migrate` first)."""
    values = config_migration.migrate(saved)
    del values["version"]
    config_checks.refuse_unknown_fields("DPDFD", (values, cls),
                                        (values["engine"], options.EngineOptions))
    return cls(**{**values, "teacher_dirs": tuple(values["teacher_dirs"]),
                  "engine": options.EngineOptions(**values["engine"])})


@dataclasses.dataclass(frozen=True, kw_only=True)
class DirectConfig:
  """A direct-mode run (no generator, no teacher: the private labels play the teacher).

  Attributes:
    noise_multiplier: σ of A_{C,σ}, the noise std per output coordinate in units of C.
    l2_clip_norm: C, the norm bound of each released output-gradient row.
    stability: e, the stabiliser of normalised rows C·g/(||g|| + e).
    bound_method: how rows are bounded: "normalize" (to norm C) or "clip" (to norm <= C).
    gamma: γ, the step size of the noisy target y_s = s - γ g~.
    student_loss: L_S against y_s: "mse", "ce" or "l1" (as in `DPDFDConfig`).
    delta: δ of the paper-formula figure.
    dataset: the private dataset, trained on directly.
    model: the model trained on it (a name in `models.CLASSIFIERS`).
    norm: the model's normalisation layers: "group" or "none".
    expected_batch_size: q N, the expected size of the Poisson-sampled batch.
    max_batch_size: padded rows per step; None: the smallest with overflow probability <= 1e-9.
    steps: Adam steps.
    learning_rate: Adam's learning rate.
    seed: root seed; None: a secret one from OS entropy (an integer: a reproducible run).
    eval_every: steps between evaluations of the model.
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
  """

  RENAMED: ClassVar[dict[str, str]] = {"l2_norm_bound": "l2_clip_norm"}  # old flag names

  noise_multiplier: float
  l2_clip_norm: float = 1.0
  stability: float = 1e-6
  bound_method: str = "normalize"
  gamma: float = 1.0
  student_loss: str = "mse"
  delta: float = 1e-5
  dataset: str
  model: str = "small_cnn"
  norm: str = "group"
  expected_batch_size: int = 256
  max_batch_size: int | None = None
  steps: int = 1000
  learning_rate: float = 1e-3
  seed: int | None = None
  eval_every: int = 200
  data_dir: str | None = None

  def __post_init__(self):
    config_checks.one_of("dataset", self.dataset, data.DATASETS)
    config_checks.one_of("model", self.model, models.CLASSIFIERS)
    if self.norm not in ("group", "none"):
      raise ValueError(f"norm must be 'group' or 'none' (BatchNorm would mix padded rows), "
                       f"got {self.norm!r}")
    config_checks.integers(self, "expected_batch_size", "steps", "eval_every")
    if self.max_batch_size is not None:
      config_checks.integer("max_batch_size", self.max_batch_size,
                            minimum=self.expected_batch_size)
    config_checks.positive(self, "learning_rate")
    config_checks.fraction("delta", self.delta)
    config_checks.seed(self.seed)
    config_checks.non_negative(self, "noise_multiplier")
    check_output_gradient_fields(self)
