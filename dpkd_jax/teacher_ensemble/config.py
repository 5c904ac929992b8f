"""`TeacherEnsembleConfig`: what a stacked disjoint-shard ensemble is trained with (validated).

`identity()` is what a saved ensemble must have been trained with to be reused; it has the
same keys and values as `dfpate.DFPATEConfig.teacher_identity()`, so an ensemble saved by
`experiments.teacher_ensemble` is reused by a data-free PATE run with the same teacher flags.
`migrate_identity` renames the identity of a store saved under older names (read as today's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from dpkd_jax import config_checks as checks
from dpkd_jax import data
from dpkd_jax.teacher_ensemble import architectures

# The fields of `identity()` besides the dataset (a DF-PATE config has the same names).
IDENTITY_FIELDS = ("num_teachers", "teacher_model", "teacher_epochs", "teacher_batch_size",
                   "teacher_learning_rate", "shard_seed")

# Identity fields renamed to the library's vocabulary (docs/ARCHITECTURE.md#vocabulary):
# {old name: name now}. Stores saved before keep the old key; the CLI keeps the old flag.
IDENTITY_RENAMED: dict[str, str] = {"teacher_lr": "teacher_learning_rate"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherEnsembleConfig:
  """n teachers of one architecture on n disjoint equal shards of a training split.

  Attributes:
    dataset: the private dataset (its train split is sharded; its test split gives the report).
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
    num_teachers: n, also the number of shards (each teacher gets floor(N/n) records).
    teacher_model: a key of `teacher_ensemble.TEACHER_MODELS` (built with norm "none";
      mlp and patch_cnn are written for vmap on CPU).
    teacher_epochs: each teacher's passes over its shard.
    teacher_batch_size: each teacher's batch size (cut to the shard size).
    teacher_learning_rate: each teacher's Adam learning rate (cosine decay).
    shard_seed: public seed of the shard assignment (`data.shard_indices`).
    seed: seed of the teachers' initialisation, shuffles and augmentation (the teachers are
      not private, so a public seed costs nothing).
  """

  # Old flag names of renamed fields (hidden aliases printing one deprecation line).
  RENAMED: ClassVar[dict[str, str]] = IDENTITY_RENAMED

  dataset: str
  data_dir: str | None = None
  num_teachers: int = 250
  teacher_model: str = "mlp"
  teacher_epochs: int = 20
  teacher_batch_size: int = 32
  teacher_learning_rate: float = 3e-3
  shard_seed: int = 0
  seed: int = 0

  def __post_init__(self):
    checks.one_of("dataset", self.dataset, data.DATASETS)
    checks.one_of("teacher_model", self.teacher_model, architectures.TEACHER_MODELS)
    checks.integers(self, "num_teachers", "teacher_epochs", "teacher_batch_size")
    checks.integers(self, "shard_seed", minimum=0)
    checks.seed(self.seed)
    checks.positive(self, "teacher_learning_rate")

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  def identity(self) -> dict[str, Any]:
    """What a saved ensemble must have been trained with to be reused."""
    return {"dataset": self.dataset, **{name: getattr(self, name) for name in IDENTITY_FIELDS}}


def migrate_identity(identity: Any) -> Any:
  """A saved store's identity under today's names (`IDENTITY_RENAMED`: stores saved before
  the rename hold `teacher_lr`); anything but a dict is returned as it is (`store.read_meta`
  refuses it). The one place a saved identity is migrated: `store` applies it when read."""
  if not isinstance(identity, dict):
    return identity
  return {IDENTITY_RENAMED.get(name, name): value for name, value in identity.items()}
