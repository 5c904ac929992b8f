"""RONA's run configuration: `RONAConfig` and its schedule check, validated at construction.

The config holds the user's flags only: σ is given (`noise_multiplier`) or left to the plan
to calibrate for `target_epsilon` (`privacy.make_plan`, the only place σ is resolved).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from dpkd_jax import config_checks as checks
from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.methods.rona import config_migration
from dpkd_jax.methods.rona import query_selection
from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona import student
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import plan as plan_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class RONAConfig:
  """A RONA run; privacy fields first. Validated at construction, before any compute.

  Attributes:
    noise_multiplier: σ (noise std σB), or None to calibrate it for `target_epsilon`; 0 is a
      non-private compression run (ε = ∞).
    target_epsilon: the ε budget σ is calibrated for.
    delta: δ of every reported ε.
    accounting: what calibrates σ for `target_epsilon`: "sound" or "paper". "sound":
      dp_accounting; "paper": the paper's Theorem 2 reconstruction
      (`paper_accounting.paper_rona_composed_epsilon`; needs `target_epsilon`; the sound ε of
      the same run is reported and kept by the ledger).
    bound_mode: how the knowledge is bounded: "adaptive", "fixed" or "none". "adaptive": the
      auxiliary teacher's running mean norm; "fixed": `hint_l2_clip_norm` and `distill_l2_clip_norm`;
      "none": raw knowledge (σ = 0 only).
    hint_l2_clip_norm: with bound_mode="fixed", the norm bound of the released hints.
    distill_l2_clip_norm: with bound_mode="fixed", the norm bound of the released distillation
      knowledge.
    dataset: the dataset, split into public and sensitive parts.
    public_fraction: the share of the training split that is public.
    split_seed: the seed of the public/sensitive split.
    teacher_dir: a trained teacher to load; None: trained in the workdir.
    aux_teacher_dir: a trained auxiliary teacher (public split) to load; None: trained.
      Used by the adaptive bound only.
    teacher_model: the architecture of the teachers trained in the workdir.
    teacher_epochs: the epochs of the teachers trained in the workdir.
    teacher_batch_size: the batch size of the teachers trained in the workdir.
    teacher_seed: the seed of the teachers trained in the workdir.
    student_model: the student architecture (a name in `student.STUDENTS`).
    student_norm: the student's normalisation layers.
    hint_epochs: Th, epochs of hint learning.
    rounds: R, rounds of self learning and distillation.
    self_learning_epochs: Ts, self-learning epochs per round.
    distillation_epochs: Td, distillation epochs per round.
    num_query_samples: |x_q|, the queries selected from the public set.
    batch_size: S, the query batch.
    self_learning_batch_size: the batch of self learning on the public images.
    temperature: τ, the distillation temperature.
    query_selection: how queries are selected (a name in `query_selection.SELECTORS`).
    learning_rate: Adam's learning rate (each stage keeps its own moments).
    learning_rate_schedule: "constant" or "cosine". "cosine": each stage's rate decays to 0
      by a cosine over that stage's steps in the whole run (hint, self learning, distillation).
    self_learning_augment: random shifts of the public images in self learning. Pad 2 black
      pixels, then crop; public data only (no privacy cost), never the queries.
    validation_examples: private hold-out records for the per-unit evaluations (0: test).
      Held out before the public / private split (`train.selection`): private diagnostics;
      the test split is read once at the end.
    seed: root of student init, batch order, selection and noise; None: a secret one.
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
    download: let tensorflow-datasets download a dataset it lacks (needs internet).
  """

  # Old flag and saved names of renamed fields (the library's vocabulary, docs/ARCHITECTURE.md).
  RENAMED: ClassVar[dict[str, str]] = config_migration.V1_RENAMED

  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  accounting: str = "sound"
  bound_mode: str = "adaptive"
  hint_l2_clip_norm: float | None = None
  distill_l2_clip_norm: float | None = None
  dataset: str
  public_fraction: float = 0.4
  split_seed: int = 0
  teacher_dir: str | None = None
  aux_teacher_dir: str | None = None
  teacher_model: str = "small_cnn"
  teacher_epochs: int = 5
  teacher_batch_size: int = 128
  teacher_seed: int = 0
  student_model: str = "compact_5k"
  student_norm: str = "batch"
  hint_epochs: int = 2
  rounds: int = 3
  self_learning_epochs: int = 1
  distillation_epochs: int = 1
  num_query_samples: int = 2000
  batch_size: int = 256
  self_learning_batch_size: int = 128
  temperature: float = 4.0
  query_selection: str = "k_center"
  learning_rate: float = 1e-3
  learning_rate_schedule: str = "constant"
  self_learning_augment: bool = False
  validation_examples: int = 0
  seed: int | None = None
  data_dir: str | None = None
  download: bool = False

  def __post_init__(self):
    checks.integer("validation_examples", self.validation_examples, minimum=0)
    if (self.noise_multiplier is None) == (self.target_epsilon is None):
      raise ValueError(f"give exactly one of noise_multiplier and target_epsilon, got "
                       f"noise_multiplier={self.noise_multiplier!r}, "
                       f"target_epsilon={self.target_epsilon!r}")
    if self.target_epsilon is not None:
      checks.positive(self, "target_epsilon")
    if self.noise_multiplier is not None:
      checks.non_negative(self, "noise_multiplier")
    checks.fraction("delta", self.delta)
    checks.one_of("accounting", self.accounting, plan_lib.ACCOUNTINGS)
    if self.accounting == "paper" and self.target_epsilon is None:
      raise ValueError("accounting='paper' chooses sigma for target_epsilon: give "
                       "target_epsilon, not noise_multiplier")
    checks.one_of("learning_rate_schedule", self.learning_rate_schedule, student.SCHEDULES)
    if not isinstance(self.self_learning_augment, bool):
      raise ValueError(f"self_learning_augment must be a bool, got "
                       f"{self.self_learning_augment!r}")
    self._check_bounds()
    for name, known in (("dataset", data.DATASETS), ("teacher_model", models.CLASSIFIERS),
                        ("student_model", student.STUDENTS), ("student_norm", models.NORMS),
                        ("query_selection", query_selection.SELECTORS)):
      checks.one_of(name, getattr(self, name), known)
    checks.fraction("public_fraction", self.public_fraction)
    checks.integers(self, "split_seed", "teacher_seed", "hint_epochs", "rounds",
                    "self_learning_epochs", "distillation_epochs", minimum=0)
    checks.integers(self, "teacher_epochs", "teacher_batch_size", "num_query_samples",
                    "batch_size", "self_learning_batch_size", minimum=1)
    check_schedule(rounds=self.rounds, self_learning_epochs=self.self_learning_epochs,
                   distillation_epochs=self.distillation_epochs)
    checks.positive(self, "temperature", "learning_rate")
    checks.seed(self.seed)

  def _check_bounds(self) -> None:
    """The bound flags: B exactly in fixed mode, raw knowledge only without noise, the
    auxiliary teacher only where it is used (the adaptive bound)."""
    for name in ("hint_l2_clip_norm", "distill_l2_clip_norm"):
      sanitize.check_bound(self.bound_mode, getattr(self, name), name=name)
    if self.bound_mode == "none" and self.noise_multiplier != 0:
      raise ValueError(f"bound_mode='none' releases raw teacher knowledge: it needs "
                       f"noise_multiplier=0 (non-private), got noise_multiplier="
                       f"{self.noise_multiplier!r}, target_epsilon={self.target_epsilon!r}")
    if self.aux_teacher_dir is not None and self.bound_mode != "adaptive":
      raise ValueError(f"aux_teacher_dir is only used by the adaptive bound, got "
                       f"bound_mode={self.bound_mode!r}")

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  def to_json(self) -> dict[str, Any]:
    """The config as saved in checkpoints and results: every field and the format's
    `version` (`config_migration`; a resumed run must match it)."""
    return {"version": config_migration.VERSION, **dataclasses.asdict(self)}

  @classmethod
  def from_json(cls, saved: dict[str, Any]) -> "RONAConfig":
    """The config of a saved dict of any format (`config_migration.migrate` first)."""
    values = config_migration.migrate(saved)
    del values["version"]
    checks.refuse_unknown_fields("RONA", (values, cls))
    return cls(**values)

  def phase_steps(self, num_public: int) -> dict[str, int]:
    """Optimizer updates of each training stage over the whole run, with `num_public` public
    samples (self learning drops the last partial batch; a partial query batch counts)."""
    queries_per_epoch = self.queries_per_epoch()
    return {"hint": self.hint_epochs * queries_per_epoch,
            "self": self.rounds * self.self_learning_epochs * (
                num_public // self.self_learning_batch_size),
            "distill": self.rounds * self.distillation_epochs * queries_per_epoch}

  def queries_per_epoch(self) -> int:
    """ceil(|x_q|/S), the sanitized releases of one private epoch (a partial batch counts)."""
    return -(-self.num_query_samples // self.batch_size)

  def num_queries(self) -> int:
    """T = (Th + R·Td)·ceil(|x_q|/S), the planned number of sanitized releases."""
    return accounting.rona_num_queries(
        hint_epochs=self.hint_epochs, distillation_epochs=self.distillation_epochs,
        rounds=self.rounds, num_query_samples=self.num_query_samples,
        batch_size=self.batch_size)


def check_schedule(*, rounds: int, self_learning_epochs: int, distillation_epochs: int) -> None:
  """Refuses a schedule whose hint queries would spend ε on a classifier never trained."""
  if rounds == 0:
    raise ValueError("rounds must be >= 1: with rounds=0 the student's classifier is never "
                     "trained, yet its hint epochs spend privacy budget")
  if self_learning_epochs + distillation_epochs == 0:
    raise ValueError("self_learning_epochs and distillation_epochs are both 0: the student's "
                     "classifier would never be trained; give at least one epoch of either")
