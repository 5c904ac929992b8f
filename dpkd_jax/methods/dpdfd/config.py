"""DPDFD configs: the data-free run (`DPDFDConfig`) and the direct mode (`DirectConfig`).

Both are frozen, keyword-only and validated at construction (one line naming the field, via
`config_checks`). Neither resolves σ: a config holds what the user asked for (σ, a target ε,
or both), and `privacy.make_plan` / `privacy.make_direct_plan` turn it into what runs.
Both modes share the output-gradient mechanism A_{C,σ} and the noisy target y_s = s - γ g~,
so the fields of those (C, e, the bound method, γ, L_S) are checked by one function.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.methods.dpdfd import replay
from dpkd_jax.methods.dpdfd import restarts
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import plan as plan_lib

STUDENT_LOSSES = ("ce", "mse", "l1")
# L_T, whose per-sample output gradient is the released row: "dkd" (the paper's decoupled KD,
# row = dDKD/ds) or "logit" (0.5||s - t||², row = s - t: the student-to-teacher logit gap).
TEACHER_LOSSES = ("dkd", "logit")
# How the generator learns: through the student (paper), or up the released disagreement.
GENERATOR_OBJECTIVES = ("paper", "disagreement")


def check_output_gradient_fields(config: Any) -> None:
  """C, e, the bound method, γ and L_S: the fields of A_{C,σ} and y_s both modes share."""
  config_checks.positive(config, "l2_norm_bound", "gamma")
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPDFDConfig:
  """A DPDFD run. Privacy fields first, then model/optimization, then bookkeeping.

  Attributes:
    noise_multiplier: σ (noise std σ·C per output coordinate), or None to calibrate.
    target_epsilon: stop/calibrate at this ε (None: report only).
    delta: δ.
    accounting: "sound" (default) or "paper" (Theorem 3 reconstruction; warned, sound ε beside).
    l2_norm_bound, stability, bound_method: C, e and "normalize"/"clip" of A_{C,σ}
      (rows bounded to C·g/(||g|| + e) or clipped to norm C).
    secure_noise, secure_grid_bits: grid C/2^bits (None: finest in int32) + discrete Gaussian.
    dataset: the private dataset (its test split evaluates the student).
    teacher_dirs: one workdir per teacher (`experiments.teacher`); n > 1 = an ensemble, whose
      accounting uses the most teachers one record can reach (`teacher_partition`).
    teacher_ensemble_dir: instead, one directory of n stacked teachers on disjoint equal shards
      (`experiments.teacher_ensemble` or DF-PATE `teachers_dir`): one teacher per record (m = 1).
    student_model, student_norm, generator_model, generator_channels, latent_dim: networks
      (`generator_channels` is DAFL's width, 128 in the paper; 64 quarters the CPU cost).
    steps, batch_size: DPDFD iterations (a bound with a target ε); B, rows released per step.
    gamma: step size of the noisy target y_s = s - γ g~.
    student_loss: "mse" (default: 0.5||s - y_s||², whose gradient w.r.t. s is exactly γ g~)
      or "ce" (the paper's: cross-entropy against softmax(y_s)). Measured on MNIST
      (docs/RESULTS.md): ce stalls at chance because once the generator makes the student
      confident, softmax barely moves under a shift of norm γC and its gradient vanishes.
      "l1": ||s - y_s||₁ (DFME's), whose gradient is sign(γ g~), the sign of each released
      coordinate: steps of one size whatever the row's scale.
    teacher_loss: L_T, whose per-sample gradient w.r.t. the student's output is the released
      row: "dkd" (the paper's decoupled KD with the teacher's argmax as the label) or "logit"
      (0.5||s - t||², row s - t: logit matching, as DFAD's L1 generator/student objective).
      Both rows leave through the same A_{C,σ}, so the privacy argument and ε are unchanged;
      which one learns faster is measured in docs/RESULTS.md ("DPDFD engine").
    teacher_loss_scale: κ, L_T's weight: the rows are κ·dL_T/ds. Rows and C scale together, so
      κ changes nothing under the sound accounting (ε depends on σ alone); κ·γ = 1 with κ far
      below C keeps rows unclipped at any C, which the paper's Theorem 3 (ε ∝ C²/σ², noise
      std σ·C) then prices as almost noiseless (docs/RESULTS.md, Table 1 rows).
    dkd_alpha, dkd_beta, temperature: decoupled-KD weights and temperature of L_T = "dkd".
    entropy_weight: α of L_G (information entropy of the batch-mean prediction); 5 by
      default: with the paper's α = β = 1 the generator collapsed to ~2 classes on digits.
    feature_weight: β of L_G (student penultimate-feature term), 0.1 by default.
    one_hot_weight: weight of L_G's cross-entropy to the student's own argmax (1 in the
      paper; 0 drops the term, for the paper's Table 6 ablation).
    student_lr, generator_lr: Adam learning rates (cosine-decayed over the steps).
    generator_objective: "paper" (L_S + L_G through the updated student, y_s constant) or
      "disagreement": the generator ascends D(x) = γ||g~(x)||_1 = ||s(x) - y_s(x)||_1, the
      student-teacher disagreement as the released rows show it, whose gradient w.r.t. x is
      estimated by forward differences along `probe_directions` random unit directions per
      sample (DFME, Truong et al. 2021). The probes x + δu are queries too: their rows leave
      through the same A_{C,σ} in the same release, so a step releases B·(1 +
      probe_directions) rows and the sound accounting charges them (the paper's Theorem 3
      counts steps, not rows: its figure is unchanged). Needs bound_method="clip" (normalised
      rows all have norm C). Measured in docs/RESULTS.md ("DPDFD engine").
    probe_directions, probe_step: m directions per sample and the step δ of the probes.
    diversity_weight: with generator_objective="disagreement", the weight of DAFL's
      information-entropy term on the updated student's predictions of the generated batch,
      added to the generator's loss so that its samples spread over the classes (the
      disagreement alone may keep to a few). Teacher-free: no row, no privacy cost. 0
      (default): the disagreement alone. The paper generator weighs the same term by
      `entropy_weight`.
    released_balance_weight: with generator_objective="disagreement", the weight of the same
      DAFL entropy on the released targets y_s of the generated batch (the teacher's view
      through the release, not the student's): H(mean_b softmax(y_s)), ascended by forward
      differences along the probes, as the disagreement (`probes.released_balance_ascent`).
      It reads released rows only: post-processing, same rows, same ε. 0 (default): off.
    class_conditional_weight: with generator_objective="disagreement", make the generator
      class-conditional (each sample asks for a uniformly drawn class through a code in its
      first K latent coordinates, `generators.class_coded_latents`) and add this weight times
      the cross-entropy of the released targets to the requested classes, descended by forward
      differences along the probes (`probes.released_class_descent`): every class is asked
      for equally often. Released rows only: post-processing, same rows, same ε. 0 (default):
      off. Needs latent_dim > K.
    smoothness_weight: with generator_objective="disagreement", the weight of a smoothness
      prior on the generated images (`losses.total_variation`, DeepInversion's), descended
      exactly: it reads no teacher and no row, so it costs no privacy. 0 (default): off.
    param_averaging_decay: d in [0, 1): evaluate, checkpoint and release an exponential moving
      average of the student's iterates (`train.averaging.param_averaging`, bias-corrected)
      instead of the last iterate; its BatchNorm statistics are the running ones. 0 (default):
      no averaging. Post-processing of the releases: same mechanism, noise and ε.
    generator_restart_ratio: with generator_objective="disagreement", restart the generator
      (fresh weights and Adam state; the student is kept) when the mean released
      disagreement of `generator_restart_patience` evaluation windows in a row exceeds this
      ratio times the lowest window mean since the last (re)start, at most
      `generator_max_restarts` times (`dpdfd.restarts`). It reads released rows only:
      post-processing, same releases, same ε. 0 (default): never restart.
    generator_restart_patience, generator_max_restarts: see generator_restart_ratio.
    replay_size: rows of earlier released pairs (x, y_s) the run keeps in a memory
      (`dpdfd.replay`; >= batch_size), from which each step's student update also draws
      `replay_batch` rows (default: batch_size). Post-processing of the releases: same rows,
      same ε. 0 (default): the student learns from the newest batch only.
    replay_batch: see replay_size.
    replay_sampling: how replayed rows are drawn: "uniform" (default) or "class_balanced"
      (every class, as the stored target's argmax names it, alike: `dpdfd.replay.sample`).
    replay_memory: which released rows the memory keeps: "ring" (default: the newest
      replay_size) or "per_class" (the newest replay_size // K of each class, as the stored
      target's argmax names it, so a class the generator left is not forgotten; needs
      replay_size >= K · batch_size).
    pretrained_generator_dir: None (default, the paper: a random generator that sees only the
      student), or the workdir of `python -m experiments.srr pretrain` (same dataset, teacher,
      generator): pretrained against the teacher WITHOUT noise. A labelled variant: the run's
      record-level ε is then inf; the release ε (conditional on that generator) is kept beside.
    validation_examples: private hold-out of the teachers' training split (`train.selection`)
      read during training (private diagnostics), test read once at the end; 0: test.
    seed: root seed of init, latents and noise; None (default): a secret one from OS entropy,
      kept only in the checkpoint (`privacy.seeds`); an integer: noise anyone can regenerate.
    eval_every, data_dir: bookkeeping.
  """

  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  accounting: str = "sound"
  l2_norm_bound: float = 1.0
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
  student_lr: float = 1e-3
  generator_lr: float = 1e-3
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
  pretrained_generator_dir: str | None = None
  validation_examples: int = 0
  seed: int | None = None
  eval_every: int = 200
  data_dir: str | None = None

  @property
  def probes_per_sample(self) -> int:
    """Extra released rows per synthetic sample: the disagreement probes, else 0."""
    return self.probe_directions if self.generator_objective == "disagreement" else 0

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
    config_checks.positive(self, "student_lr", "generator_lr", "temperature", "probe_step",
                           "teacher_loss_scale")
    config_checks.one_of("generator_objective", self.generator_objective,
                         GENERATOR_OBJECTIVES)
    config_checks.integers(self, "probe_directions")
    config_checks.fraction("param_averaging_decay", self.param_averaging_decay, open_low=False)
    if self.generator_objective == "disagreement" and self.bound_method != "clip":
      raise ValueError("generator_objective='disagreement' reads the disagreement from the size "
                       "of the released rows, which bound_method='normalize' sets to C for "
                       "every row: use bound_method='clip'")
    config_checks.non_negative(self, "entropy_weight", "feature_weight", "one_hot_weight",
                               "diversity_weight", "released_balance_weight",
                               "class_conditional_weight", "smoothness_weight")
    if self.diversity_weight and self.generator_objective != "disagreement":
      raise ValueError("diversity_weight adds the class-balance term to the disagreement "
                       "generator; the paper generator weighs it by entropy_weight")
    for name in ("released_balance_weight", "class_conditional_weight", "smoothness_weight"):
      if getattr(self, name) and self.generator_objective != "disagreement":
        raise ValueError(f"{name} is a term of the disagreement generator: it needs "
                         "generator_objective='disagreement'")
    if self.class_conditional_weight and self.latent_dim <= self.info.num_classes:
      raise ValueError(f"class_conditional_weight puts a class code in the first "
                       f"{self.info.num_classes} latent coordinates: latent_dim must exceed "
                       f"it, got {self.latent_dim}")
    _ = self.restart_rule  # validates the restart fields
    config_checks.integers(self, "replay_size", minimum=0)
    if self.replay_size and self.replay_size < self.batch_size:
      raise ValueError(f"replay_size must be 0 or >= batch_size={self.batch_size} (a step "
                       f"writes its whole batch), got {self.replay_size}")
    if self.replay_batch is not None:
      config_checks.integer("replay_batch", self.replay_batch, minimum=1)
      if not self.replay_size:
        raise ValueError("replay_batch needs replay_size > 0")
    config_checks.one_of("replay_sampling", self.replay_sampling, replay.SAMPLINGS)
    if self.replay_sampling != "uniform" and not self.replay_size:
      raise ValueError("replay_sampling needs replay_size > 0")
    config_checks.one_of("replay_memory", self.replay_memory, replay.MEMORIES)
    if self.replay_memory != "ring":
      classes = self.info.num_classes
      if self.replay_size < classes * self.batch_size:
        raise ValueError(f"replay_memory={self.replay_memory!r} keeps replay_size // "
                         f"{classes} rows per class, which must hold a step's batch: "
                         f"replay_size must be >= {classes * self.batch_size}, got "
                         f"{self.replay_size}")
    check_output_gradient_fields(self)
    check_privacy_request(self)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def class_codes(self) -> int:
    """K when the generator is class-conditional (`class_conditional_weight`), else 0."""
    return self.info.num_classes if self.class_conditional_weight else 0

  @property
  def replay_rows(self) -> int:
    """Replayed rows per step: 0 without replay, else replay_batch (default batch_size)."""
    if not self.replay_size:
      return 0
    return self.batch_size if self.replay_batch is None else self.replay_batch

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

  def to_json(self) -> dict[str, Any]:
    """The config as saved in checkpoints and results (a resumed run must match it)."""
    out = dataclasses.asdict(self)
    out["teacher_dirs"] = list(self.teacher_dirs)
    for name in ("param_averaging_decay", "diversity_weight", "released_balance_weight",
                 "class_conditional_weight", "smoothness_weight", "secure_noise",
                 "secure_grid_bits", "validation_examples"):
      if not out[name]:  # at its default: the dict saved before the field existed
        del out[name]
    if not self.generator_restart_ratio:  # restarts off: the dict saved before they existed
      for name in ("generator_restart_ratio", "generator_restart_patience",
                   "generator_max_restarts"):
        del out[name]
    if not self.replay_size:  # replay off: likewise
      del out["replay_size"], out["replay_batch"]
    if self.replay_sampling == "uniform":  # as saved before the field existed
      del out["replay_sampling"]
    if self.replay_memory == "ring":  # likewise
      del out["replay_memory"]
    if self.teacher_ensemble_dir is None:  # as saved before the field existed: runs resume
      del out["teacher_ensemble_dir"]
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class DirectConfig:
  """A direct-mode run (no generator, no teacher: the private labels play the teacher).

  Attributes:
    noise_multiplier: σ of A_{C,σ} (noise std σ·C per output coordinate).
    l2_norm_bound, stability, bound_method, gamma, student_loss: as in `DPDFDConfig`.
    delta: δ of the paper-formula figure.
    dataset, model, norm: private data and the model trained on it.
    expected_batch_size: q N of the Poisson sampling; max_batch_size: padded rows (None:
      the smallest size whose overflow probability is <= 1e-9 per step).
    steps, learning_rate: Adam steps and rate.
    seed: None (default) for a secret seed from OS entropy; an integer for a reproducible run.
    eval_every, data_dir: bookkeeping.
  """

  noise_multiplier: float
  l2_norm_bound: float = 1.0
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
