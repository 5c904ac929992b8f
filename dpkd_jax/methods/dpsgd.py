"""DP-SGD (Abadi et al. 2016) on the private training split, as jax_privacy / Opacus do it.

Each step: a Poisson sample (every record in independently w.p. q); per-example gradients,
each clipped to L2 norm C over the whole parameter pytree; their sum plus N(0, z²C²) per
coordinate, divided by the expected batch size q N (data-independent, unlike the realised
size); an optax update. Privacy (add/remove-one record, docs/privacy.md): the clipped sum moves
by <= C, so T steps are `accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=T)`
(N public, as in Opacus/jax_privacy). Padding rows of the fixed-size batch weigh 0; an
oversized sample raises, never truncates; a non-finite per-example gradient becomes zero. The
noise derives from the run's root seed: without `seed` it is drawn from OS entropy and kept
only in the checkpoint (`privacy.seeds`), which is then as secret as the data; an explicit
`seed` makes the noise reproducible by anyone who knows it (research runs only). Only the parameters
are released; training metrics come from private batches (monitoring only).

The step itself (per-example gradients, clipping, the sharded clipped sum and the single noise
draw) is in `dpsgd_step.py`.

Workdir: checkpoints/ (Orbax state + PRNG key data; config, plan, ledger JSON as metadata),
privacy_ledger.json, results.json, metrics.csv and tb/.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, NamedTuple

import jax
import optax
import tqdm
from flax import nnx
from jax.sharding import Mesh

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.privacy import validation
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState
from dpkd_jax.methods.dpsgd_step import make_train_step

PyTree = Any
_OPTIMIZERS = ("sgd", "adam")
_DP_NORMS = ("group", "none")
_LOG_EVERY_STEPS = 50


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
    target_epsilon: instead of z: the budget; z is calibrated for the whole run.
    delta: δ of every reported ε.
    steps: T, or epochs: expected passes over the data (T = ceil(epochs / q)); give one.
    optimizer: "sgd" (with `momentum` in [0, 1)) or "adam", constant `learning_rate`.
    seed: root of model init, Poisson sampling and noise; None (default) draws a secret one
      from OS entropy (`privacy.seeds.resolve_seed`); an integer makes the noise public.
    data_dir, download: as for `data.load`.
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

  def __post_init__(self):
    for name, table in (("dataset", data.DATASETS), ("model", models.CLASSIFIERS),
                        ("optimizer", _OPTIMIZERS)):
      if getattr(self, name) not in table:
        raise ValueError(f"unknown {name} {getattr(self, name)!r}; known: {sorted(table)}")
    if self.norm not in _DP_NORMS:
      why = (": BatchNorm mixes the examples of a batch, so clipping would not bound one "
             "record's effect" if self.norm == "batch" else "")
      raise ValueError(f"norm must be one of {_DP_NORMS} for DP-SGD, got {self.norm!r}{why}")
    for first, second in (("noise_multiplier", "target_epsilon"), ("steps", "epochs")):
      if (getattr(self, first) is None) == (getattr(self, second) is None):
        raise ValueError(f"give exactly one of {first} and {second}, got {first}="
                         f"{getattr(self, first)!r}, {second}={getattr(self, second)!r}")
    validation.check_int("expected_batch_size", self.expected_batch_size, minimum=1)
    for name, minimum in (("max_batch_size", self.expected_batch_size), ("steps", 1)):
      if getattr(self, name) is not None:
        validation.check_int(name, getattr(self, name), minimum=minimum)
    for name, positive in (("l2_clip_norm", True), ("noise_multiplier", False),
                           ("target_epsilon", True), ("epochs", True), ("learning_rate", True)):
      if getattr(self, name) is not None:
        validation.check_float(name, getattr(self, name), positive=positive)
    validation.check_delta(self.delta)
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
    if self.seed is not None:
      validation.check_int("seed", self.seed, minimum=0)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]


class DPSGDPlan(NamedTuple):
  """A config resolved for N records on a mesh: q = B / N, T, steps_per_epoch = ceil(N / B)
  (the ledger / checkpoint / evaluation interval), padded batch M, z (given or calibrated),
  the run's planned ε at δ (PLD), and the ledger's budget (target_epsilon, else planned ε)."""

  num_examples: int
  sampling_rate: float
  steps: int
  steps_per_epoch: int
  max_batch_size: int
  noise_multiplier: float
  planned_epsilon: float
  target_epsilon: float


def make_plan(config: DPSGDConfig, *, num_examples: int, num_devices: int) -> DPSGDPlan:
  """Resolves q, T, M and z (calibrating z for `target_epsilon`), cheap checks first.

  Args:
    config: the validated configuration.
    num_examples: N, size of the private training split.
    num_devices: size of the mesh's 'data' axis.

  Returns:
    The plan. Raises ValueError for a batch larger than N, M not divisible by the devices,
    or z = 0 (no noise: ε = ∞, no budget can hold the run).
  """
  if config.expected_batch_size > num_examples:
    raise errors.UserError(f"expected_batch_size={config.expected_batch_size} exceeds the "
                           f"{num_examples} private training examples")
  q = config.expected_batch_size / num_examples
  steps = config.steps if config.steps is not None else math.ceil(config.epochs / q)
  # Default M: the overflow-safe size rounded up to a multiple of the device count.
  max_batch_size = config.max_batch_size or -(
      -data.suggested_max_batch_size(num_examples, q) // num_devices) * num_devices
  if max_batch_size % num_devices:
    raise ValueError(f"max_batch_size={max_batch_size} is not divisible by the {num_devices} "
                     f"devices of the 'data' mesh axis; use a multiple of {num_devices}")

  def event(z: float):
    return accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps)

  noise_multiplier = float(config.noise_multiplier) if config.target_epsilon is None else (
      calibration.calibrate_noise_multiplier(event, target_epsilon=config.target_epsilon,
                                             delta=config.delta))
  if noise_multiplier == 0:
    raise ValueError("noise_multiplier=0 adds no noise (ε = ∞): a DP-SGD run needs z > 0; "
                     "train non-privately with experiments.teacher instead")
  planned = accounting.epsilon(event(noise_multiplier), delta=config.delta)
  target = planned if config.target_epsilon is None else float(config.target_epsilon)
  return DPSGDPlan(num_examples=num_examples, sampling_rate=q, steps=steps,
                   steps_per_epoch=math.ceil(num_examples / config.expected_batch_size),
                   max_batch_size=max_batch_size, noise_multiplier=noise_multiplier,
                   planned_epsilon=planned, target_epsilon=target)


def make_optimizer(config: DPSGDConfig) -> optax.GradientTransformation:
  """Constant-rate SGD (optional momentum) or Adam: post-processing of the noisy gradient."""
  return _optimizer(config.optimizer, config.learning_rate, config.momentum)


@functools.cache
def _optimizer(name: str, learning_rate: float, momentum: float) -> optax.GradientTransformation:
  # One object per setting: TrainState's static `tx` is compared by identity under jit, so
  # repeated runs in one process (resume, sweeps, tests) then reuse the compiled step.
  if name == "adam":
    return optax.adam(learning_rate)
  return optax.sgd(learning_rate, momentum=momentum or None)


def init_model(config: DPSGDConfig, key: jax.Array) -> core.ModelParts:
  """The config's classifier, initialised from `key` and split."""
  return core.split(models.create_classifier(
      config.model, num_classes=config.info.num_classes, input_shape=config.info.image_shape,
      norm=config.norm, rngs=nnx.Rngs(key)))


def train_dpsgd(config: DPSGDConfig, workdir: str, *, resume: bool = False,
                stop_at_step: int | None = None, progress: bool = True,
                mesh: Mesh | None = None) -> dict[str, Any]:
  """Trains with DP-SGD, keeps the privacy ledger, evaluates on the test split.

  Each expected epoch (ceil(N/B) steps) the ledger checks its event against the budget before
  it runs (`BudgetExceededError`), records it after, then a checkpoint is written. A run cut
  mid-epoch resumes from the last checkpoint and replays the same keys: the replayed releases
  equal the lost ones and cost no extra privacy.

  Args:
    config: the validated configuration.
    workdir: output directory (created).
    resume: continue the checkpoint in `workdir` (same config required; none: start afresh).
      Without it a workdir holding a checkpoint is refused.
    stop_at_step: end this invocation (checkpointed) at this step, as if preempted.
    progress: show a tqdm progress bar (step, loss, ε).
    mesh: mesh with a 'data' axis (default: all devices).

  Returns:
    The results (also `<workdir>/results.json`).
  """
  if stop_at_step is not None:
    validation.check_int("stop_at_step", stop_at_step, minimum=1)
  mesh = sharding.data_mesh() if mesh is None else mesh
  train = data.load(config.dataset, "train", data_dir=config.data_dir, download=config.download)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  plan = make_plan(config, num_examples=len(train), num_devices=mesh.shape[sharding.DATA_AXIS])

  root_seed = seeds.resolve_seed(config.seed)  # a resumed run restores its key below
  root_key = jax.random.key(root_seed.value)
  state = TrainState.create(init_model(config, jax.random.split(root_key, 3)[0]),
                            make_optimizer(config))
  ledger = ledger_lib.PrivacyLedger(target_epsilon=plan.target_epsilon, delta=config.delta)
  config_json = dataclasses.asdict(config)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if checkpoint.latest_step(ckpt_dir) is not None:
    if not resume:
      raise errors.UserError(f"{workdir!r} already holds a DP-SGD checkpoint: pass resume=True "
                             "(--resume) to continue it, or use a fresh workdir")
    saved_config = checkpoint.restore_metadata(ckpt_dir).get("config")
    if saved_config != config_json:
      raise errors.UserError(f"{workdir!r} holds a run with another config {saved_config}; "
                             "use a fresh workdir")
    arrays, meta = checkpoint.restore(
        ckpt_dir, {"state": state.arrays(), "rng": jax.random.key_data(root_key)})
    state = state.with_arrays(arrays["state"])
    root_key = jax.random.wrap_key_data(arrays["rng"])
    ledger = ledger_lib.PrivacyLedger.from_json(meta["ledger"])
  # Named streams, each used with fold_in(step): a key is never reused.
  _, sample_key, noise_key = jax.random.split(root_key, 3)
  state = sharding.replicate(state, mesh)
  train_step = make_train_step(config, mesh, noise_multiplier=plan.noise_multiplier)
  writer = metrics_lib.MetricsWriter(workdir)

  step = int(state.step)
  stop = plan.steps if stop_at_step is None else min(stop_at_step, plan.steps)
  bar = tqdm.tqdm(total=plan.steps, initial=step, disable=not progress,
                  desc=f"dpsgd {config.model}/{config.dataset}")
  start_time, test_metrics, postfix = time.time(), None, {"eps": f"{ledger.spent_epsilon():.3f}"}
  while step < stop:
    chunk_steps = min(plan.steps_per_epoch - step % plan.steps_per_epoch, stop - step)
    event = accounting.dpsgd_event(noise_multiplier=plan.noise_multiplier,
                                   sampling_rate=plan.sampling_rate, steps=chunk_steps)
    ledger.check(event)  # Before the releases: raises BudgetExceededError if over budget.
    for _ in range(chunk_steps):
      indices, mask = data.poisson_batch(jax.random.fold_in(sample_key, step), len(train),
                                         plan.sampling_rate, max_batch_size=plan.max_batch_size)
      batch = sharding.shard_batch((train.images[indices], train.labels[indices], mask), mesh)
      step_noise_key = sharding.replicate(jax.random.fold_in(noise_key, step), mesh)
      state, step_metrics = train_step(state, *batch, step_noise_key)
      step += 1
      bar.update(1)
      if step % _LOG_EVERY_STEPS == 0 or step == stop:
        step_metrics = jax.device_get(step_metrics)
        writer.write(step, step_metrics, prefix="train/")
        postfix["loss"] = f"{step_metrics['loss']:.3f}"
        bar.set_postfix(postfix)
    spent = ledger.record(event, step=step, note="dpsgd")
    test_metrics = evaluate_lib.evaluate(state.parts, test)
    writer.write(step, {**test_metrics, "epsilon": spent}, prefix="test/")
    postfix.update(eps=f"{spent:.3f}", test_acc=f"{test_metrics['accuracy']:.4f}")
    bar.set_postfix(postfix)
    checkpoint.save(ckpt_dir, step, jax.device_get(
        {"state": state.arrays(), "rng": jax.random.key_data(root_key)}),
        {"config": config_json, "plan": plan._asdict(), "ledger": ledger.to_json()})
    if jax.process_index() == 0:
      ledger.save(os.path.join(workdir, "privacy_ledger.json"))
  bar.close()
  writer.close()

  if test_metrics is None:  # nothing ran in this invocation
    test_metrics = evaluate_lib.evaluate(state.parts, test)
  results = {
      "method": "dpsgd", "dataset": config.dataset, "model": config.model, "norm": config.norm,
      "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
      "epsilon": ledger.spent_epsilon(), "delta": config.delta, "accountant": ledger.accountant,
      "neighbouring_relation": "add_or_remove_one", **plan._asdict(),
      "steps": step, "planned_steps": plan.steps, "finished": step == plan.steps,
      "expected_batch_size": config.expected_batch_size, "l2_clip_norm": config.l2_clip_norm,
      "param_count": models.count_params(state.params),
      "seed": root_seed.public_description(),  # secret iff config.seed is None, resumed or not
      "train_seconds_this_run": round(time.time() - start_time, 1),
      "config": config_json, "ledger": json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
  }
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "results.json"), "w") as f:
      json.dump(results, f, indent=2)
  return results
