"""DP-SGD's run configuration: `DPSGDConfig`, validated at construction.

The config holds the user's flags only: it never resolves σ (z) or the number of steps for a
privacy target; `privacy.make_plan` does, once. `to_json` is what a workdir saves and compares on
resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpkd_jax import config_checks
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.models import core
from dpkd_jax.models import ghost
from dpkd_jax.representations import scatternet

_OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "cosine")
_DP_NORMS = ("group", "none")
CLIPPINGS = ("vmap", "ghost")
# What the model reads: the normalized pixels, or fixed ScatterNet features of them (no
# parameters, no data: no privacy cost; `representations.scatternet`).
FEATURES = ("pixels", "scatternet")
# Default of `augmult_max_shift`: translations in [−2, 2]² pixels (De et al. 2022 crop
# 4-pixel-padded 32 x 32 CIFAR images, shifts up to ±4; MNIST digits sit in a ~4-pixel margin).
AUGMULT_MAX_SHIFT = 2
# Fields added after workdirs were first saved: left out of `to_json` at their default, so that
# a default run saves the same config as before and older workdirs keep resuming.
_OMITTED_AT_DEFAULT = ("clipping", "features", "validation_examples",
                       "standardize_noise_multiplier", "standardize_mean_clip",
                       "standardize_second_moment_clip", "lr_schedule",
                       "param_averaging_decay", "param_averaging_start_step", "augmult",
                       "augmult_max_shift", "secure_noise")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPSGDConfig:
  """A DP-SGD run, validated at construction so bad flags fail before any compute.

  Attributes:
    dataset: a name in `data.DATASETS`; its train split is the private data.
    model: a name in `models.CLASSIFIERS`.
    norm: "group" or "none"; "batch" is rejected (BatchNorm mixes the examples of a batch).
    expected_batch_size: q N, expected Poisson batch size and the update's normaliser.
    max_batch_size: padded batch M, a multiple of the device count; None: the smallest such
      multiple with overflow probability <= 1e-9 per step.
    l2_clip_norm: C, the norm each example's gradient is clipped to.
    noise_multiplier: z, the noise std in units of C; None: calibrate it for target_epsilon.
    secure_noise: refused: DP-SGD has no accountant for discrete Gaussian noise. It would need
      Poisson-subsampled zCDP under replace-one, which dp_accounting lacks (docs/privacy.md).
    target_epsilon: instead of z: the budget (replace-one ε); z is calibrated for the whole run.
    delta: δ of every reported ε.
    steps: T, the number of noisy steps (give steps or epochs).
    epochs: expected passes over the data, T = ceil(epochs / q) (give steps or epochs).
    optimizer: "sgd" (with `momentum`) or "adam", at `learning_rate`.
    learning_rate: the optimizer's (peak) learning rate.
    momentum: SGD's momentum in [0, 1).
    lr_schedule: "constant" or "cosine" (decayed to 0 over the planned steps).
    seed: root of model init, Poisson sampling and noise; None: a secret one from OS entropy.
      `privacy.seeds.resolve_seed` draws it; an integer makes the noise public.
    data_dir: the directory of `<dataset>.npz` (else $DPKD_DATA_DIR, else tensorflow-datasets).
    download: let tensorflow-datasets download a dataset it lacks (needs internet).
    log_private_diagnostics: also write the private batches' training metrics to a CSV.
      `private_diagnostics.csv`: noiseless, NOT covered by ε, never to publish.
    clipping: how the clipped sum is computed: "vmap" or "ghost". "vmap": per-example
      gradients by vmap(grad); "ghost": ghost clipping (`models.ghost`: the same sum and norms,
      to float rounding, without a per-example gradient of the whole model; models of Linear,
      Conv and GroupNorm layers only, others refused at construction). Same ε.
    features: what the model reads: "pixels" or "scatternet". "scatternet": the ScatterNet
      features of the images (J = 2, L = 8; Tramèr & Boneh 2021), computed once before
      training; use the `scatter_linear` or `scatter_cnn` heads. Same mechanism, noise and ε.
    validation_examples: training records held out for validation (0: none). A fixed split
      (seed 0); the model's accuracy on them is `validation_accuracy` (a private diagnostic of
      results.json and record.json, curve in private_diagnostics.csv), for tuning that never
      reads the test split. The held-out records are not trained on (N shrinks and
      ε is of the remaining records); the validation accuracy is a noiseless statistic of
      private records, NOT covered by ε (as for the tuning in the DP-SGD literature).
    standardize_noise_multiplier: z of a DP standardization of the features (None: none).
      Each feature channel is standardized by its mean and variance over the private records,
      released once before training by `privacy.feature_moments` (two Gaussian sums) and
      composed into ε (the DP-SGD z is calibrated for what is left of a target).
    standardize_mean_clip: C_m, the clip norm of each record's per-channel feature means.
    standardize_second_moment_clip: C_s, the clip norm of each record's per-channel mean squares.
    param_averaging_decay: d in [0, 1) of a moving average of the iterates (0: off).
      The bias-corrected average (De et al. 2022, `train.averaging.param_averaging`) is
      evaluated and released instead of the last iterate: post-processing, same ε.
    param_averaging_start_step: average the iterates after this many steps only (0: from the
      first). The average is the iterate until then. Needs a decay > 0.
    augmult: V >= 2 views of each record averaged before clipping (0 or 1: off).
      Augmentation multiplicity (De et al. 2022, `augmult`): each record's gradient is the
      mean of its loss gradients over V views of it (itself and V − 1 copies translated by
      shifts drawn from the seed, not from the data), averaged BEFORE clipping, so one record
      still contributes one clipped vector: same ε. Needs features='scatternet' and
      clipping='vmap'.
    augmult_max_shift: s >= 1, the views' translations are uniform in [−s, s]² pixels. Needs
      augmult >= 2.
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
  clipping: str = "vmap"
  features: str = "pixels"
  validation_examples: int = 0
  standardize_noise_multiplier: float | None = None
  standardize_mean_clip: float = 1.0
  standardize_second_moment_clip: float = 1.0
  lr_schedule: str = "constant"
  param_averaging_decay: float = 0.0
  param_averaging_start_step: int = 0
  augmult: int = 0
  augmult_max_shift: int = AUGMULT_MAX_SHIFT
  secure_noise: bool = False

  def __post_init__(self):
    if self.secure_noise:
      raise errors.UserError(
          "--secure_noise is not offered for DP-SGD: a Poisson-subsampled discrete Gaussian "
          "has no sound replace-one accountant in dp_accounting; it is offered for "
          "experiments.dpdfd")
    for name, table in (("dataset", data.DATASETS), ("model", models.CLASSIFIERS),
                        ("optimizer", _OPTIMIZERS), ("clipping", CLIPPINGS),
                        ("features", FEATURES), ("lr_schedule", LR_SCHEDULES)):
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
    config_checks.integer("validation_examples", self.validation_examples, minimum=0)
    for name, minimum in (("max_batch_size", self.expected_batch_size), ("steps", 1)):
      if getattr(self, name) is not None:
        config_checks.integer(name, getattr(self, name), minimum=minimum)
    config_checks.positive(self, "l2_clip_norm", "learning_rate", *self._given(
        "target_epsilon", "epochs"))
    config_checks.non_negative(self, *self._given("noise_multiplier"))
    config_checks.positive(self, "standardize_mean_clip", "standardize_second_moment_clip",
                           *self._given("standardize_noise_multiplier"))
    if self.standardize_noise_multiplier is not None and self.features == "pixels":
      raise ValueError("standardize_noise_multiplier standardizes features: give features="
                       "'scatternet' too (pixels are normalized with public statistics)")
    config_checks.delta(self.delta)
    config_checks.fraction("momentum", self.momentum, open_low=False)
    config_checks.fraction("param_averaging_decay", self.param_averaging_decay, open_low=False)
    config_checks.integer("param_averaging_start_step", self.param_averaging_start_step,
                          minimum=0)
    if self.param_averaging_start_step and not self.param_averaging_decay:
      raise ValueError(f"param_averaging_start_step={self.param_averaging_start_step} starts an "
                       "average that is off: give param_averaging_decay > 0 too")
    config_checks.seed(self.seed)
    if self.features == "scatternet":
      try:
        self.input_shape  # pylint: disable=pointless-statement
      except ValueError as err:
        raise errors.UserError(f"features='scatternet' cannot read {self.dataset}: {err}") from None
    self._check_augmult()
    if self.clipping == "ghost":
      check_ghost_clipping(self.model, norm=self.norm, info=self.info,
                           input_shape=self.input_shape)

  def _check_augmult(self) -> None:
    """Raises ValueError (one line) unless `augmult` and `augmult_max_shift` fit the run."""
    config_checks.integer("augmult", self.augmult, minimum=0)
    config_checks.integer("augmult_max_shift", self.augmult_max_shift, minimum=1)
    if not self.augmented:
      if self.augmult_max_shift != AUGMULT_MAX_SHIFT:
        raise ValueError(f"augmult_max_shift={self.augmult_max_shift} shifts views that are off:"
                         " give augmult >= 2 too")
      return
    if self.features != "scatternet":
      raise ValueError(f"augmult={self.augmult} augments the images before the ScatterNet "
                       f"transform: give features='scatternet' (got {self.features!r})")
    if self.clipping != "vmap":
      raise ValueError(f"augmult={self.augmult} averages each example's gradient over its views "
                       f"before clipping, which clipping={self.clipping!r} does not compute: "
                       "give clipping='vmap'")
    if self.augmult_max_shift >= min(self.info.image_shape[:2]):
      raise ValueError(f"augmult_max_shift={self.augmult_max_shift} would shift the "
                       f"{self.dataset} images out of their {self.info.image_shape[0]}x"
                       f"{self.info.image_shape[1]} frame")

  @property
  def augmented(self) -> bool:
    """True if each record is trained on `augmult` >= 2 views (augmentation multiplicity)."""
    return self.augmult >= 2

  def _given(self, *names: str) -> tuple[str, ...]:
    """The optional fields among `names` that are set (not None)."""
    return tuple(name for name in names if getattr(self, name) is not None)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def input_shape(self) -> tuple[int, int, int]:
    """(H, W, C) of one model input: the image's, or its ScatterNet features'."""
    if self.features == "scatternet":
      return scatternet.ScatterNetConfig().output_shape(self.info.image_shape)
    return self.info.image_shape

  def to_json(self) -> dict[str, Any]:
    """The fields as a JSON dict, without those of `_OMITTED_AT_DEFAULT` left at their default
    (a default run's dict is the one saved before they existed)."""
    out = dataclasses.asdict(self)
    for field in dataclasses.fields(self):
      if field.name in _OMITTED_AT_DEFAULT and out[field.name] == field.default:
        del out[field.name]
    return out


def check_ghost_clipping(model: str, *, norm: str, info: data.DatasetInfo,
                         input_shape: tuple[int, int, int] | None = None) -> None:
  """Raises UserError (one line) unless ghost clipping can train `model` with `norm` on `info`.

  Traces the clipped sum of a batch of two abstractly (shapes only: no computation, no JAX
  backend initialised), so the refusals of `models.ghost` (BatchNorm in training mode, an op
  that mixes examples, other parameter-owning layers, shared or unused layers) come before any
  data is loaded or workdir touched. Two examples, not one: a batch of one cannot mix examples,
  so `models.ghost` only looks for mixing ops from two on.
  """
  input_shape = info.image_shape if input_shape is None else input_shape
  parts = core.split(nnx.eval_shape(lambda: models.create_classifier(
      model, num_classes=info.num_classes, input_shape=input_shape, norm=norm,
      rngs=nnx.Rngs(0))))
  shape = jax.ShapeDtypeStruct

  def _cross_entropy(output: core.ClassifierOutput, label: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(output.logits, label)

  def clipped_sum(params, x, labels, mask):
    return ghost.ghost_clip_and_sum(parts.graphdef, params, parts.batch_stats, x, labels, mask,
                                    loss_fn=_cross_entropy, l2_clip_norm=1.0)

  try:
    jax.eval_shape(clipped_sum, parts.params, shape((2, *input_shape), jnp.float32),
                   shape((2,), jnp.int32), shape((2,), jnp.bool_))
  except errors.UserError as err:
    raise errors.UserError(f"clipping='ghost' cannot train model={model!r} with norm={norm!r} "
                           f"(use clipping='vmap'): {err}") from None
