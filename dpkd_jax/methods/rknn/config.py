"""Reverse k-NN configs: the run (`RKNNConfig`) and its student (`StudentConfig`).

Both are frozen keyword-only dataclasses validated at construction with `config_checks` (one
line naming the field). The config holds the user's choices only: the per-round ε and every
noise parameter of the vote release are resolved by `privacy.make_plan`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dpkd_jax import config_checks as checks
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax import representations
from dpkd_jax.models import classifiers
from dpkd_jax.privacy import discrete_laplace

MODES = ("central", "local")
# Private records per vote-counting step: memory O(chunk_size * s) (O(chunk_size * s * C) local).
DEFAULT_CHUNK_SIZE = 2048


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentConfig:
  """How the student is trained on the labelled public set.

  Attributes:
    model: the student architecture (a name in `models.CLASSIFIERS`).
    norm: the student's normalisation layers: "batch", "group" or "none".
    epochs: the student's passes over the labelled public set.
    batch_size: public images per student step.
    learning_rate: the student's peak AdamW learning rate (cosine decay to 0).
    weight_decay: the student's decoupled weight decay.
    label_smoothing: in [0, 1), label mass spread uniformly over the classes.
    augment: random rotations and shifts of the student's images (flips where invariant).
    rotation_degrees: the augmentation's rotations are uniform in [-this, this] degrees.
    translate_fraction: the augmentation's shifts are up to this fraction of the image size.
    self_training_rounds: rounds of self-training after the last labelling round (0: none).
      Each relabels every public image with the student's prediction and trains a fresh
      student on those labels.
      Post-processing of the released labels (public images only): no privacy cost.
  """

  model: str = "lenet5"
  norm: str = "batch"
  epochs: int = 20
  batch_size: int = 100
  learning_rate: float = 2e-3
  weight_decay: float = 1e-4
  label_smoothing: float = 0.1
  augment: bool = True
  rotation_degrees: float = 15.0
  translate_fraction: float = 0.1
  self_training_rounds: int = 0

  def __post_init__(self):
    checks.one_of("student model", self.model, models.CLASSIFIERS)
    classifiers.validate_norm(self.norm)
    checks.integers(self, "epochs", "batch_size")
    checks.integer("self_training_rounds", self.self_training_rounds, minimum=0)
    checks.positive(self, "learning_rate")
    checks.non_negative(self, "weight_decay", "rotation_degrees", "translate_fraction")
    checks.fraction("label_smoothing", self.label_smoothing, open_low=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RKNNConfig:
  """A reverse k-NN labelling run, validated at construction.

  Attributes:
    dataset: a name in `data.DATASETS` (train split = private, test split = public + eval).
    representation: a key of `representations.REPRESENTATIONS` ("pca", "simclr", "scatternet",
      "spectral").
    representation_config: that kind's config (None: its defaults).
    num_queries: s >= 2, k-means clusters (queries) per round.
    k: nearest queries each private record votes for, 1 <= k <= s.
    epsilon: total ε of the run (ε / rounds per round); per record in local mode.
    mode: "central" (discrete Laplace counts) or "local" (per-record bit flipping).
    rounds: T >= 1 labelling rounds.
    uncertain_fraction: rounds > 1: share of the public set relabelled each later round.
    kmeans_iterations: Lloyd iterations of each k-means run.
    kmeans_restarts: k-means++ restarts (the best clustering is kept).
    num_public: public images taken from the test split (the rest evaluates); None: half.
      Half of MNIST's test split is the paper's 5,000.
    split_seed: seed of the public/evaluation partition (public bookkeeping, not noise).
    student: `StudentConfig`.
    delta: δ at which the ledger also reports its PLD ε (the run itself is pure ε-DP).
    chunk_size: private records per vote-counting step (memory O(chunk_size · s)).
    validation_examples: private hold-out records for the evaluations during training (0: none).
      Held out (`train.selection`) and not labelled with: private diagnostics; the evaluation
      split is read once at the end.
    seed: root seed of representation, k-means, noise and student; None: secret OS entropy.
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
    download: let tensorflow-datasets download a dataset it lacks (needs internet).
  """

  dataset: str
  representation: str = "pca"
  representation_config: Any = None
  num_queries: int = 40
  k: int = 1
  epsilon: float = 0.1
  mode: str = "central"
  rounds: int = 1
  uncertain_fraction: float = 0.2
  kmeans_iterations: int = 50
  kmeans_restarts: int = 3
  num_public: int | None = None
  split_seed: int = 0
  student: StudentConfig = StudentConfig()
  delta: float = 1e-5
  chunk_size: int = DEFAULT_CHUNK_SIZE
  validation_examples: int = 0
  seed: int | None = None
  data_dir: str | None = None
  download: bool = False

  def __post_init__(self):
    checks.integer("validation_examples", self.validation_examples, minimum=0)
    checks.one_of("dataset", self.dataset, data.DATASETS)
    default_rep = representations.default_config(self.representation)  # unknown kind raises
    if self.representation_config is None:
      object.__setattr__(self, "representation_config", default_rep)
    elif not isinstance(self.representation_config, type(default_rep)):
      raise ValueError(f"representation {self.representation!r} needs a "
                       f"{type(default_rep).__name__}, got {self.representation_config!r}")
    checks.one_of("mode", self.mode, MODES)
    checks.integer("num_queries", self.num_queries, minimum=2)
    checks.integers(self, "k", "rounds", "kmeans_iterations", "kmeans_restarts", "chunk_size")
    if self.k > self.num_queries:
      raise ValueError(f"k={self.k} exceeds num_queries={self.num_queries}")
    checks.positive(self, "epsilon")
    if self.mode == "central":  # the exact integer sampler's scale 2k / ε_r must fit its range
      discrete_laplace.rational_scale(2 * self.k, self.epsilon / self.rounds)
    checks.fraction("uncertain_fraction", self.uncertain_fraction, open_high=False)
    if self.num_public is not None:
      checks.integer("num_public", self.num_public, minimum=self.num_queries)
      self.check_public_size(self.num_public)
    checks.integer("split_seed", self.split_seed, minimum=0)
    if not isinstance(self.student, StudentConfig):
      raise ValueError(f"student must be a StudentConfig, got {self.student!r}")
    checks.fraction("delta", self.delta)
    checks.seed(self.seed)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  def num_relabelled(self, num_public: int) -> int:
    """Public samples queried again in each round after the first."""
    return math.ceil(self.uncertain_fraction * num_public)

  def check_public_size(self, num_public: int) -> None:
    """Raises UserError if a public set of this size cannot hold the run's queries."""
    if num_public < self.num_queries:
      raise errors.UserError(f"{num_public} public images < num_queries={self.num_queries}")
    if self.rounds > 1 and self.num_relabelled(num_public) < self.num_queries:
      raise errors.UserError(f"uncertain_fraction={self.uncertain_fraction} of {num_public} "
                             f"public images gives {self.num_relabelled(num_public)} samples per "
                             f"later round, fewer than num_queries={self.num_queries}")
