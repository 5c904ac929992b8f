"""DP-SGD's run configuration: `DPSGDConfig`, validated at construction.

The config holds the user's flags only: it never resolves σ (z) or the number of steps for a
privacy target; `privacy.make_plan` does, once.
"""

from __future__ import annotations

import dataclasses

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax import models

_OPTIMIZERS = ("sgd", "adam")
_DP_NORMS = ("group", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPSGDConfig:
  """A DP-SGD run, validated at construction so bad flags fail before any compute.

  Attributes:
    dataset, model: names in `data.DATASETS` (train split = private data), `models.CLASSIFIERS`.
    norm: "group" or "none"; "batch" is rejected (BatchNorm mixes the examples of a batch).
    expected_batch_size: q N, expected Poisson batch size and the update's normaliser.
    max_batch_size: padded batch M, a multiple of the device count; None: the smallest such
      multiple with overflow probability <= 1e-9 per step.
    l2_clip_norm: C. noise_multiplier: z (noise std z C).
    target_epsilon: instead of z: the budget (replace-one ε); z is calibrated for the whole run.
    delta: δ of every reported ε.
    steps: T, or epochs: expected passes over the data (T = ceil(epochs / q)); give one.
    optimizer: "sgd" (with `momentum` in [0, 1)) or "adam", constant `learning_rate`.
    seed: root of model init, Poisson sampling and noise; None (default) draws a secret one
      from OS entropy (`privacy.seeds.resolve_seed`); an integer makes the noise public.
    data_dir, download: as for `data.load`.
    log_private_diagnostics: also write the training metrics of the private batches to
      `private_diagnostics.csv` (noiseless, NOT covered by ε; off by default).
  """

  dataset: str
  model: str
  norm: str = "group"
  expected_batch_size: int = 256
  max_batch_size: int | None = None
  l2_clip_norm: float = 1.0
  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  steps: int | None = None
  epochs: float | None = None
  optimizer: str = "sgd"
  learning_rate: float = 0.5
  momentum: float = 0.0
  seed: int | None = None
  data_dir: str | None = None
  download: bool = False
  log_private_diagnostics: bool = False

  def __post_init__(self):
    for name, table in (("dataset", data.DATASETS), ("model", models.CLASSIFIERS),
                        ("optimizer", _OPTIMIZERS)):
      config_checks.one_of(name, getattr(self, name), table)
    if self.norm not in _DP_NORMS:
      why = (": BatchNorm mixes the examples of a batch, so clipping would not bound one "
             "record's effect" if self.norm == "batch" else "")
      raise ValueError(f"norm must be one of {_DP_NORMS} for DP-SGD, got {self.norm!r}{why}")
    for first, second in (("noise_multiplier", "target_epsilon"), ("steps", "epochs")):
      if (getattr(self, first) is None) == (getattr(self, second) is None):
        raise ValueError(f"give exactly one of {first} and {second}, got {first}="
                         f"{getattr(self, first)!r}, {second}={getattr(self, second)!r}")
    config_checks.integers(self, "expected_batch_size")
    for name, minimum in (("max_batch_size", self.expected_batch_size), ("steps", 1)):
      if getattr(self, name) is not None:
        config_checks.integer(name, getattr(self, name), minimum=minimum)
    config_checks.positive(self, "l2_clip_norm", "learning_rate", *self._given(
        "target_epsilon", "epochs"))
    config_checks.non_negative(self, *self._given("noise_multiplier"))
    config_checks.delta(self.delta)
    config_checks.fraction("momentum", self.momentum, open_low=False)
    config_checks.seed(self.seed)

  def _given(self, *names: str) -> tuple[str, ...]:
    """The optional fields among `names` that are set (not None)."""
    return tuple(name for name in names if getattr(self, name) is not None)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]
