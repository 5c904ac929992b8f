"""Supervised (non-private) teacher training, checkpointing and loading.

A teacher is trained on the private data (or one disjoint shard of it, for multi-teacher
methods) and is the sensitive model that the DP methods convert. Its artefacts in `workdir`:
  checkpoints/<step>/   Orbax: params, batch_stats, optimizer state, step
  card.json             dataset, model, split (shard and the sharded split's size and
                        digest: `teacher_partition`), seed, test accuracy, params, config
  metrics.csv, tb/      training curves (CSV + TensorBoard)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, NamedTuple

import jax
import optax
from flax import nnx

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax import teacher_partition
from dpkd_jax.models import core
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import selection
from dpkd_jax.train import sharding
from dpkd_jax.train import supervised
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState
from dpkd_jax.train.progress import StepBar

_OPTIMIZERS = ("adam", "sgd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherConfig:
  """What to train. Validated at construction so bad flags fail before any compute.

  Attributes:
    dataset: a name in `data.DATASETS`.
    model: a name in `models.CLASSIFIERS`.
    norm: "batch" (default for teachers), "group" or "none".
    epochs: passes over the (shard of the) training split.
    batch_size: examples per step (must divide by the number of devices).
    optimizer: "adam" (AdamW) or "sgd" (Nesterov momentum 0.9); cosine-decayed learning rate.
    learning_rate: peak learning rate.
    weight_decay: decoupled weight decay.
    augment: random crop (pad 4 at 32×32 with reflection, pad 2 below with black borders)
      plus, for flip-invariant datasets, random horizontal flips (dm-pix); None = on for
      32×32 colour datasets only.
    num_shards: split the training data into this many disjoint shards (multi-teacher).
    shard: which shard to train on (0 <= shard < num_shards).
    shard_seed: seed of the shard partition (all teachers of an ensemble must share it).
    validation_examples: records held out before any shard, as the methods' hold-out (0: none).
    seed: model init / batch order / augmentation seed.
    data_dir: directory of `<dataset>.npz` files (else $DPKD_DATA_DIR, else tfds).
    download: let tensorflow-datasets download a dataset it has not prepared (needs internet).
  """

  dataset: str
  model: str
  norm: str = "batch"
  epochs: int = 5
  batch_size: int = 128
  optimizer: str = "adam"
  learning_rate: float = 1e-3
  weight_decay: float = 1e-4
  augment: bool | None = None
  num_shards: int = 1
  shard: int = 0
  shard_seed: int = 0
  validation_examples: int = 0
  seed: int = 0
  data_dir: str | None = None
  download: bool = False

  def __post_init__(self):
    if self.dataset not in data.DATASETS:
      raise ValueError(f"unknown dataset {self.dataset!r}; known: {sorted(data.DATASETS)}")
    if self.model not in models.CLASSIFIERS and self.model != models.GRAPH:  # GRAPH: imported
      raise ValueError(f"unknown model {self.model!r}; known: {sorted(models.CLASSIFIERS)}")
    if self.optimizer not in _OPTIMIZERS:
      raise ValueError(f"unknown optimizer {self.optimizer!r}; known: {_OPTIMIZERS}")
    for name, low in (("epochs", 1), ("batch_size", 1), ("num_shards", 1),
                      ("validation_examples", 0)):
      if getattr(self, name) < low:
        raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
    if not 0 <= self.shard < self.num_shards:
      raise ValueError(f"shard must be in [0, num_shards={self.num_shards}), got {self.shard}")
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.weight_decay < 0:
      raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def use_augment(self) -> bool:
    if self.augment is not None:
      return self.augment
    h, w, c = self.info.image_shape
    return c == 3 and h >= 32


class Teacher(NamedTuple):
  """A loaded teacher: the functional model and its JSON card."""

  parts: core.ModelParts
  card: dict[str, Any]


def weights_sha256(parts: core.ModelParts) -> str:
  """The teacher by content (`checkpoint.checksum` of its params and BatchNorm statistics): the
  same wherever its directory lies, another once retrained (`models.generator_identity`)."""
  return checkpoint.checksum({"params": parts.params, "batch_stats": parts.batch_stats})


def make_optimizer(config: TeacherConfig, total_steps: int) -> optax.GradientTransformation:
  schedule = optax.cosine_decay_schedule(config.learning_rate, max(total_steps, 1))
  if config.optimizer == "adam":
    return optax.adamw(schedule, weight_decay=config.weight_decay)
  return optax.chain(optax.add_decayed_weights(config.weight_decay),
                     optax.sgd(schedule, momentum=0.9, nesterov=True))


def make_train_step(config: TeacherConfig):
  """Returns `train_step(state, images_uint8, labels, key) -> (state, metrics)`, jitted, state donated."""
  info, augment = config.info, config.use_augment
  height = info.image_shape[0]
  pad, pad_mode = (4, "reflect") if height >= 32 else (2, "constant")

  def train_step(state: TrainState, images_uint8: jax.Array, labels: jax.Array, key: jax.Array):
    if augment:  # on uint8 pixels, so "constant" padding is black, not the mean
      images_uint8 = data.augment(key, images_uint8, pad=pad, flip=info.flip_invariant,
                                  pad_mode=pad_mode)
    x = data.normalize(images_uint8, info)  # (B, H, W, C) float32
    return supervised.cross_entropy_step(state, x, labels)

  return jax.jit(train_step, donate_argnums=0)


def init_model(config: TeacherConfig, key: jax.Array, *, input_adapter: bool = False,
               program: str | None = None) -> core.ModelParts:
  """The model of `config` (a graph teacher's: its `program`, `models.graph`); `input_adapter`:
  behind a `models.InputAdapter` (an imported teacher's input normalisation, `importers`)."""
  model = models.GraphClassifier(program, rngs=nnx.Rngs(key)) if program else (
      models.create_classifier(config.model, num_classes=config.info.num_classes,
          input_shape=config.info.image_shape, norm=config.norm, rngs=nnx.Rngs(key)))
  if input_adapter:
    model = models.InputAdapter(model, channels=config.info.image_shape[-1])
  return core.split(model)


def make_card(config: TeacherConfig, state: TrainState, test: data.ArrayDataset, *,
          split: dict[str, Any], seconds: tuple[float, float]) -> dict[str, Any]:
  """A teacher's card.json (also RONA's public-split teacher's): what it is, what it saw, its
  final test accuracy.

  Args:
    config: the recipe.
    state: the trained state (its model is evaluated on `test`).
    test: the test split.
    split: the card's `split` fields (`teacher_partition.split_fields`).
    seconds: (wall, CPU) seconds of this run's training, rounded.
  """
  final = evaluate_lib.evaluate(state.parts, test)
  return {
      "dataset": config.dataset,
      "model": config.model,
      "norm": config.norm,
      "num_classes": config.info.num_classes,
      "input_shape": list(config.info.image_shape),
      "split": split,
      "seed": config.seed,
      "test_accuracy": final["accuracy"],
      "test_loss": final["loss"],
      "param_count": models.count_params(state.params),
      "steps": int(state.step),
      "train_seconds_this_run": seconds[0],
      # CPU seconds of this process, all threads (XLA uses every core): the machine-load-
      # independent cost figure, beside the wall time above.
      "train_cpu_seconds_this_run": seconds[1],
      "config": dataclasses.asdict(config),
      "dpkd_jax_version": dpkd_jax.__version__,
  }


def write_card(workdir: str, card: dict[str, Any], *, run: workdir_lib.Run | None = None,
               clock: outputs.RunClock | None = None) -> None:
  """Writes `<workdir>/card.json` (process 0 only): the mark of a finished teacher; with the
  `run` that trained it and this process's `clock`, also its results record (record.json: no
  privacy, so sound ε "inf"; seconds summed over resumed processes, the starting commit)."""
  if jax.process_index() != 0:
    return
  with open(os.path.join(workdir, "card.json"), "w") as f:
    json.dump(card, f, indent=2)
  if run is not None and run.clock is not None and clock is not None:
    outputs.write_non_private_record(
        workdir, run=run, clock=clock, method="teacher", dataset=card["dataset"],
        test_accuracy=card["test_accuracy"],
        extra={"model": card["model"], "params": card["param_count"]})


@workdir_lib.run_scope
def train_teacher(config: TeacherConfig, workdir: str, *, progress: bool = True,
                  mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Trains a teacher, evaluates it on the test split, writes checkpoint + card.

  Resumes from the latest intact epoch checkpoint in `workdir` if one exists (same config
  required); the workdir is locked for the whole run.

  Args:
    config: the validated configuration.
    workdir: output directory (created).
    progress: show a tqdm progress bar.
    mesh: device mesh for data parallelism (default: all devices on a 'data' axis).

  Returns:
    The card (also written to `<workdir>/card.json`).
  """
  clock = outputs.RunClock()
  config_json = selection.config_json(config)  # a run without a hold-out saves as before
  run = workdir_lib.open_run(workdir, kind="teacher", config=config_json)
  mesh = sharding.data_mesh() if mesh is None else mesh
  sharding.check_divisible(config.batch_size, mesh)
  train, source = teacher_partition.training_split(config)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  if len(train) < config.batch_size:
    raise errors.UserError(f"teacher batch_size={config.batch_size} exceeds the {len(train)} "
                           "examples of its training split (shard); give a smaller --batch_size "
                           "(--teacher_batch_size in experiments.rona)")
  steps_per_epoch = len(train) // config.batch_size
  total_steps = steps_per_epoch * config.epochs

  # Named key streams, each used with fold_in(step or epoch): never reused.
  init_key, order_key, augment_key = jax.random.split(seeds.root_key(config.seed), 3)
  state = TrainState.create(init_model(config, init_key), make_optimizer(config, total_steps))
  start_epoch = 0
  if run.resuming:
    arrays, saved_meta = run.restore(state.arrays())
    state = state.with_arrays(arrays)
    start_epoch = saved_meta["epoch"]
  state = sharding.replicate(state, mesh)
  train_step = make_train_step(config)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=run.step)

  bar = StepBar(total=total_steps, initial=start_epoch * steps_per_epoch, disable=not progress,
                desc=f"teacher {config.model}/{config.dataset}")
  start_time, start_cpu = time.time(), time.process_time()
  for epoch in range(start_epoch, config.epochs):
    batches = data.epoch_batches(jax.random.fold_in(order_key, epoch), len(train), config.batch_size)
    for indices in batches:
      step_key = jax.random.fold_in(augment_key, int(state.step))
      images, labels = sharding.shard_batch((train.images[indices], train.labels[indices]), mesh)
      state, step_metrics = train_step(state, images, labels, step_key)
      bar.update(1)
      if int(state.step) % 50 == 0:
        step_metrics = jax.device_get(step_metrics)
        writer.write(int(state.step), step_metrics, prefix="train/")
        bar.set_postfix(loss=f"{step_metrics['loss']:.3f}", acc=f"{step_metrics['accuracy']:.3f}")
    test_metrics = evaluate_lib.evaluate(state.parts, test)
    writer.write(int(state.step), test_metrics, prefix="test/")
    bar.set_postfix(epoch=epoch + 1, test_acc=f"{test_metrics['accuracy']:.4f}")
    run.save(int(state.step), jax.device_get(state.arrays()),
             {"epoch": epoch + 1, "config": config_json})
  bar.close()
  writer.close()

  split = teacher_partition.split_fields(config, len(train), source)
  card = make_card(config, state, test, split=split,
                   seconds=(round(time.time() - start_time, 1),
                            round(time.process_time() - start_cpu, 1)))
  write_card(workdir, card, run=run, clock=clock)
  return card


class TeacherNotFoundError(errors.UserError, FileNotFoundError):
  """A teacher directory that is missing, empty or holds no card.json."""


class TeacherMismatchError(errors.UserError, checkpoint.CheckpointMismatchError):
  """A valid teacher that does not fit what the caller needs (dataset, classes, shape)."""


def _where(workdir: str, flag: str | None) -> str:
  return f"{flag}: {workdir!r}" if flag else f"teacher {workdir!r}"


def read_card(workdir: str, *, flag: str | None = None, dataset: str | None = None,
              num_classes: int | None = None,
              input_shape: tuple[int, ...] | None = None) -> dict[str, Any]:
  """Reads and checks a teacher's card.json without restoring any array (cheap).

  CLIs call it on every teacher flag before any compute, so a wrong directory fails at once.

  Args:
    workdir: the teacher's output directory (holds card.json and checkpoints/).
    flag: the CLI flag that named `workdir` (e.g. "--teacher_dirs"), for the messages.
    dataset / num_classes / input_shape: if given, must match the card.

  Returns:
    The card.

  Raises:
    TeacherNotFoundError / TeacherMismatchError / UserError: one-line messages naming `flag`
      and the file, saying what to do.
  """
  where = _where(workdir, flag)
  hint = f"train one with `python -m experiments.teacher --dataset=... --workdir={workdir}`"
  if not os.path.isdir(workdir):
    raise TeacherNotFoundError(f"{where} does not exist or is not a directory; {hint}")
  card_path = os.path.join(workdir, "card.json")
  if not os.path.isfile(card_path):
    unfinished = os.path.isdir(os.path.join(workdir, "checkpoints"))
    why = (" (its training did not finish: rerun the same command to resume it)"
           if unfinished else "")
    raise TeacherNotFoundError(f"{where} has no card.json, so no trained teacher{why}; {hint}")
  try:
    with open(card_path) as f:
      card = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
    raise errors.UserError(f"{where}: {card_path} is unreadable or not JSON ({error}); restore "
                           f"it or retrain the teacher") from error
  if (not isinstance(card, dict) or not isinstance(card.get("config"), dict)
      or not isinstance(card.get("steps"), int)):
    raise errors.UserError(f"{where}: {card_path} is not a teacher card (no config/steps); "
                           f"give a workdir of `python -m experiments.teacher`")
  expected = {"dataset": dataset, "num_classes": num_classes,
              "input_shape": None if input_shape is None else list(input_shape)}
  for key, want in expected.items():
    if want is not None and card.get(key) != want:
      raise TeacherMismatchError(
          f"{where} holds a teacher with {key}={card.get(key)!r} but {want!r} is needed; give "
          f"a teacher trained on {dataset or 'this dataset'}")
  try:
    TeacherConfig(**card["config"])
  except (TypeError, ValueError) as error:
    raise errors.UserError(f"{where}: {card_path} holds an invalid teacher config ({error}); "
                           "retrain the teacher") from error
  return card


def load_teacher(workdir: str, *, dataset: str | None = None, num_classes: int | None = None,
                 input_shape: tuple[int, ...] | None = None, flag: str | None = None) -> Teacher:
  """Loads a teacher written by `train_teacher`, checking it fits what the caller expects.

  Args:
    workdir: the teacher's output directory (holds card.json and checkpoints/).
    dataset / num_classes / input_shape: if given, must match the card, else
      `TeacherMismatchError` (a `checkpoint.CheckpointMismatchError`) explains the mismatch
      before anything is restored.
    flag: the CLI flag that named `workdir`, for the error messages.

  Returns:
    Teacher(parts, card) with eval-ready params and batch statistics.

  Raises:
    errors.UserError (one line): missing, empty, corrupt or mismatching teacher directory or
      checkpoint (see `read_card`).
  """
  card = read_card(workdir, flag=flag, dataset=dataset, num_classes=num_classes,
                   input_shape=input_shape)
  config = TeacherConfig(**card["config"])
  program = models.graph.read_program(workdir, card, _where(workdir, flag))  # None: zoo model
  parts = init_model(config, jax.random.key(0), input_adapter=bool(card.get("input_adapter")),
                     program=program)  # shapes only; the values come from the checkpoint
  # The checkpoint holds the whole train state; rebuild its template (same optimizer) and keep
  # only the model arrays: the optimizer state is irrelevant for a read-only teacher.
  template = TrainState.create(parts, make_optimizer(config, card["steps"])).arrays()
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if checkpoint.latest_step(ckpt_dir) is None:
    raise TeacherNotFoundError(f"{_where(workdir, flag)} has a card.json but no checkpoint in "
                               f"{ckpt_dir}; retrain the teacher")
  try:
    arrays, _ = checkpoint.restore(ckpt_dir, template)
  except checkpoint.CorruptCheckpointError as error:  # checksum mismatch: name the flag too
    raise checkpoint.CorruptCheckpointError(
        f"{_where(workdir, flag)}: checkpoints is damaged ({error}); retrain the teacher"
    ) from error
  except errors.UserError:
    raise
  except Exception as error:  # pylint: disable=broad-except
    # Orbax/TensorStore report damaged files as ValueError (DATA_LOSS, OUT_OF_RANGE), KeyError,
    # JSONDecodeError, ...: all mean "these files cannot give this teacher back".
    first = (str(error).strip().splitlines() or [""])[0][:200]
    raise errors.UserError(
        f"{_where(workdir, flag)}: checkpoint {ckpt_dir} is damaged or does not fit its "
        f"card ({type(error).__name__}: {first}); retrain the teacher") from error
  return Teacher(core.ModelParts(parts.graphdef, arrays["params"], arrays["batch_stats"]), card)
