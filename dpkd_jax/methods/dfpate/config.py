"""The configuration of a data-free PATE run: flags -> `DFPATEConfig` (validated, frozen).

The config holds what the user asked for; it resolves no noise. σ of the vote histograms
(given, or calibrated to `target_epsilon`) and the query model's noise multipliers are
resolved once, by `privacy.make_plan`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from dpkd_jax import config_checks as checks
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax import teacher_ensemble
from dpkd_jax.data import procedural
from dpkd_jax.methods.dfpate import config_migration
from dpkd_jax.methods.dfpate import student
from dpkd_jax.privacy import aggregation
from dpkd_jax.privacy import seeds

QUERY_SOURCES = ("procedural", "dp_model")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFPATEConfig:
  """A data-free PATE run. Privacy fields first, then teachers, queries, student.

  Attributes:
    dataset: the private dataset (its train split is sharded among the teachers).
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
    target_epsilon: ε budget for all Q queries; σ is calibrated to it when `noise_std` is None.
    noise_std: σ per histogram bin; None = calibrate; 0 = no noise (ε = ∞, a baseline).
    secure_noise: exact discrete Gaussian noise on integer vote histograms. Accounted as zCDP
      (docs/privacy.md); procedural queries only (the query model's releases keep float noise).
    delta: δ of every reported ε.
    use_teachers: ask the teachers; False replaces every vote histogram by zeros (ε = 0).
      That baseline never touches the private data.
    num_teachers: n, the teachers, one per disjoint shard.
    teacher_model: a key of `teacher_ensemble.TEACHER_MODELS` (built with norm "none").
    teacher_epochs: each teacher's passes over its shard.
    teacher_batch_size: each teacher's batch size.
    teacher_learning_rate: each teacher's Adam learning rate.
    shard_seed: public seed of the shard assignment.
    teacher_self_training_pool: P query-model samples each teacher self-labels (0: off).
      Needs query_source="dp_model": after training, every teacher labels P samples of the
      released query model with its OWN confident predictions and trains on its shard plus
      those (`dfpate.teachers.self_train`; each teacher still depends on one shard only).
    teacher_self_training_epochs: the epochs of the teachers' self-training.
    teacher_pseudo_threshold: the confidence a teacher needs to label a pool image.
    teachers_dir: save the trained ensemble there, or reuse it if it holds one of the same
      dataset, shards and training fields (also one saved by `experiments.teacher_ensemble`).
    votes: "hard" (one-hot argmax per teacher) or "soft" (probabilities).
    rounds: query rounds; Q = rounds · queries_per_round.
    queries_per_round: noisy vote histograms released per round.
    pool_factor: rounds after the first pick queries from a pool this many times larger.
      The student picks them (1: no selection).
    query_source: "procedural" (public randomness, no privacy cost) or "dp_model". "dp_model":
      samples of a DP mixture of the private images (`dfpate.query_model`), charged.
    query_model_components: m, the DP-PCA components of the query model.
    query_model_clusters: k, the DP k-means clusters of the query model.
    query_model_noise: scale of the query model's noise multipliers (larger: cheaper, noisier).
      It multiplies the defaults of its three kinds of release (`dfpate.query_model`).
    query_temperature: scales the per-cluster standard deviation of the query samples.
    invert_probability: chance that a procedural image has inverted polarity.
    target: the student's targets from the votes: "hard" or "soft" (`dfpate.student`).
    margin_threshold: hard targets keep queries whose noisy top-2 margin is >= this·n.
    student_model: the student architecture (a name in `models.CLASSIFIERS`).
    student_epochs: student epochs per round, over every query answered so far.
    student_batch_size: the student's batch size.
    student_learning_rate: the student's Adam learning rate.
    student_pseudo_pool: fresh unanswered queries the student self-labels each round (0: off).
      From round 1 on, with confidence >= `student_pseudo_threshold` (post-processing).
    student_pseudo_threshold: the confidence the student needs to label a query itself.
    validation_examples: private hold-out records for the per-round evaluations (0: test).
      Held out before the teachers' shards (`train.selection`): private diagnostics; the test
      split is read once at the end.
    seed: root seed; None: a secret one from OS entropy.
  """

  # Old flag and saved names of renamed fields (the library's vocabulary, docs/ARCHITECTURE.md).
  RENAMED: ClassVar[dict[str, str]] = config_migration.V1_RENAMED

  dataset: str
  data_dir: str | None = None
  target_epsilon: float | None = 10.0
  noise_std: float | None = None
  delta: float = 1e-5
  use_teachers: bool = True
  num_teachers: int = 250
  teacher_model: str = "mlp"
  teacher_epochs: int = 20
  teacher_batch_size: int = 32
  teacher_learning_rate: float = 3e-3
  shard_seed: int = 0
  teachers_dir: str | None = None
  teacher_self_training_pool: int = 0
  teacher_self_training_epochs: int = 5
  teacher_pseudo_threshold: float = 0.9
  votes: str = "hard"
  rounds: int = 2
  queries_per_round: int = 1000
  pool_factor: int = 5
  query_source: str = "procedural"
  query_model_components: int = 20
  query_model_clusters: int = 40
  query_model_noise: float = 1.0
  query_temperature: float = 1.0
  invert_probability: float = 0.5
  target: str = "hard"
  margin_threshold: float = 0.0
  student_model: str = "lenet5"
  student_epochs: int = 20
  student_batch_size: int = 64
  student_learning_rate: float = 1e-3
  student_pseudo_pool: int = 0
  student_pseudo_threshold: float = 0.95
  validation_examples: int = 0
  seed: int | None = None
  secure_noise: bool = False

  def __post_init__(self):
    if self.secure_noise and self.query_source != "procedural":
      raise errors.UserError("--secure_noise covers the vote histograms only: the query model "
                             "(--query_source=dp_model) adds float noise; use procedural "
                             "queries")
    if self.secure_noise and self.noise_std == 0:
      raise ValueError("secure_noise needs noise: noise_std must be > 0")
    checks.integer("validation_examples", self.validation_examples, minimum=0)
    self.ensemble_config()  # the dataset and teacher fields, checked where the ensemble is
    checks.one_of("student_model", self.student_model, models.CLASSIFIERS)
    checks.one_of("votes", self.votes, aggregation.VOTE_KINDS)
    checks.one_of("query_source", self.query_source, QUERY_SOURCES)
    checks.one_of("target", self.target, student.TARGET_KINDS)
    checks.integers(self, "rounds", "queries_per_round", "pool_factor", "student_epochs",
                    "student_batch_size", "teacher_self_training_epochs",
                    "query_model_components", "query_model_clusters")
    checks.integers(self, "teacher_self_training_pool", "student_pseudo_pool", minimum=0)
    checks.positive(self, "student_learning_rate", "query_model_noise", "query_temperature")
    for name in ("margin_threshold", "teacher_pseudo_threshold", "student_pseudo_threshold",
                 "invert_probability"):
      checks.fraction(name, getattr(self, name), open_low=False, open_high=False)
    if self.teacher_self_training_pool and self.query_source != "dp_model":
      raise ValueError("teacher_self_training_pool needs query_source='dp_model' (the pool "
                       "is drawn from the released query model)")
    if self.noise_std is None and self.target_epsilon is None:
      raise ValueError("give target_epsilon (σ is calibrated) or noise_std")
    if self.target_epsilon is not None and not self.target_epsilon > 0:
      raise ValueError(f"target_epsilon must be > 0, got {self.target_epsilon!r}")
    if self.noise_std is not None:
      checks.non_negative(self, "noise_std")
    checks.fraction("delta", self.delta)
    seeds.resolve_seed(0 if self.seed is None else self.seed)  # validates an explicit seed

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def num_queries(self) -> int:
    """Q = rounds · queries_per_round, the noisy histograms the run releases."""
    return self.rounds * self.queries_per_round

  def procedural_config(self) -> procedural.ProceduralConfig:
    """The public generator of procedural queries (no privacy cost)."""
    return procedural.ProceduralConfig(image_shape=self.info.image_shape,
                                       invert_probability=self.invert_probability)

  def ensemble_config(self) -> teacher_ensemble.TeacherEnsembleConfig:
    """The run's teacher ensemble (trained with the run's own keys, not `seed` of it)."""
    fields = {name: getattr(self, name) for name in teacher_ensemble.IDENTITY_FIELDS}
    return teacher_ensemble.TeacherEnsembleConfig(dataset=self.dataset, data_dir=self.data_dir,
                                                  **fields)

  def to_json(self) -> dict[str, Any]:
    """The config as saved in checkpoints and results: every field and the format's
    `version` (`config_migration`; a resumed run must match it)."""
    return {"version": config_migration.VERSION, **dataclasses.asdict(self)}

  @classmethod
  def from_json(cls, saved: dict[str, Any]) -> "DFPATEConfig":
    """The config of a saved dict of any format (`config_migration.migrate` first)."""
    values = config_migration.migrate(saved)
    del values["version"]
    checks.refuse_unknown_fields("DF-PATE", (values, cls))
    return cls(**values)

  def teacher_identity(self) -> dict[str, Any]:
    """What a saved ensemble must have been trained with to be reused (with a validation
    hold-out: trained without it, so reused only by runs holding out the same records)."""
    identity = self.ensemble_config().identity()
    if self.validation_examples:
      identity["validation_examples"] = self.validation_examples
    return identity
