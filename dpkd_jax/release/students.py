"""Which runs release a classifier student, and where each method keeps it in its checkpoint.

Every method saves its state with `train.checkpoint` (Orbax arrays + JSON metadata holding the
run's config). The student is one sub-tree of those arrays, built from names in the config:

| method | student (model, norm) from the config | params / batch_stats in the checkpoint |
| --- | --- | --- |
| dpsgd | model, norm | state/params, state/batch_stats |
| dpdfd, srr, dfpate | student_model, student_norm | student/params, student/batch_stats |
| rknn | student.model, student.norm | student/params, student/batch_stats |
| rona | student_model, student_norm | state/params/student, state/batch_stats/student |

(RONA's adaptation layer, `state/params/adapter`, is not part of the deployed student; a DFPATE
student is always built with the registry's default norm "batch"; a DP-SGD or DPDFD run with
parameter averaging, `param_averaging_decay` > 0 in its config, releases the average its
optimizer state keeps, `state/opt_state/average` or `student/opt_state/average`, the
parameters it evaluated.) Other runs release no
classifier student: a teacher (trained without privacy), DPDFD's direct mode (no checkpoint).

`load_student(workdir)` rebuilds the architecture, checks the saved leaves' checksum, paths and
shapes against it (`checkpoint.read_verified`, `checkpoint.into_target`) and returns it.

The ε a release states must cover its weights. Every method charges a release to its ledger
before it happens and checkpoints the ledger with the state, so the ledger stored in the
exported checkpoint's metadata lists every release those weights depend on (and nothing is
removed from it: the run continues the most-spent ledger on resume). `covered_epsilon` states
the larger of that ledger's ε and the run's record; a checkpoint that spent more than the
record reports (a run stopped after it, before writing its results) is refused in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable

from flax import nnx

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.models import compact
from dpkd_jax.models import core
from dpkd_jax.representations import scatternet
from dpkd_jax.train import checkpoint
from dpkd_jax.train import ledger_file

# Every classifier a student can be: the registry plus RONA's compact students.
ARCHITECTURES = {**models.CLASSIFIERS, **compact.COMPACT_CLASSIFIERS}
_RUN_HINT = "give the workdir of a finished dpsgd, dpdfd, srr, rona, rknn or dfpate run"
_RELATIVE_SLACK = 1e-9  # the same events give the same ε up to float formatting


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a method keeps its student.

  Attributes:
    names: config (the JSON saved with the run) -> (model name, norm).
    params, batch_stats: key paths of the student's sub-trees in the checkpoint's arrays.
    averaged_params: where the averaged parameters are, released instead of `params` when the
      config averages (`param_averaging_decay` > 0, DP-SGD's `train.averaging.param_averaging`).
  """

  names: Callable[[dict[str, Any]], tuple[str, str]]
  params: tuple[str, ...]
  batch_stats: tuple[str, ...]
  averaged_params: tuple[str, ...] | None = None

  def params_path(self, config: dict[str, Any]) -> tuple[str, ...]:
    """The key path of the parameters to release for a run of `config`."""
    # DPDFD's saved config nests it in its engine options (a DPDFD config before: top level).
    decay = config.get("param_averaging_decay",
                       (config.get("engine") or {}).get("param_averaging_decay", 0.0))
    if self.averaged_params is not None and decay > 0:
      return self.averaged_params
    return self.params


_STUDENT = (("student", "params"), ("student", "batch_stats"))
LAYOUTS: dict[str, Layout] = {
    "dpsgd": Layout(lambda c: (c["model"], c["norm"]), ("state", "params"),
                    ("state", "batch_stats"), ("state", "opt_state", "average")),
    "dpdfd": Layout(lambda c: (c["student_model"], c["student_norm"]), *_STUDENT,
                    ("student", "opt_state", "average")),
    "srr": Layout(lambda c: (c["student_model"], c["student_norm"]), *_STUDENT),
    "dfpate": Layout(lambda c: (c["student_model"], c.get("student_norm", "batch")), *_STUDENT),
    "rknn": Layout(lambda c: (c["student"]["model"], c["student"]["norm"]), *_STUDENT),
    "rona": Layout(lambda c: (c["student_model"], c["student_norm"]),
                   ("state", "params", "student"), ("state", "batch_stats", "student")),
}


@dataclasses.dataclass(frozen=True)
class StudentSpec:
  """What a run's student is, without its weights (enough for a model card)."""

  method: str
  model: str
  norm: str
  info: data.DatasetInfo
  features: str = "pixels"  # or "scatternet": the student reads those features of the images


@dataclasses.dataclass(frozen=True)
class Student:
  """A trained student: its spec and its split model (`parts`, evaluation mode only)."""

  spec: StudentSpec
  parts: core.ModelParts
  step: int  # the checkpoint it was read from
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # that checkpoint's metadata


def spec_of(method: str, dataset: str, config: dict[str, Any] | None) -> StudentSpec | None:
  """The student of a `method` run on `dataset` with `config`; None if it has none we know."""
  layout = LAYOUTS.get(method)
  info = data.DATASETS.get(dataset)
  if layout is None or info is None or not isinstance(config, dict):
    return None
  try:
    model, norm = layout.names(config)
  except (KeyError, TypeError):
    return None
  if model not in ARCHITECTURES:
    return None
  return StudentSpec(method, model, norm, info, features=config.get("features", "pixels"))


@functools.cache
def reading_images(head_class: type[nnx.Module]) -> type[nnx.Module]:
  """`head_class` with the ScatterNet transform in front of it: a classifier of normalised
  images whose parameters are exactly the head's, so a DP-SGD run on ScatterNet features
  (`--features=scatternet`, which checkpoints only the head) is released as a model of images.
  """

  class ScatterNetOnImages(head_class):  # pylint: disable=missing-class-docstring
    def __init__(self, *, num_classes: int, input_shape, norm: str, rngs: nnx.Rngs):
      feature_shape = scatternet.ScatterNetConfig().output_shape(tuple(input_shape))
      super().__init__(num_classes=num_classes, input_shape=feature_shape, norm=norm, rngs=rngs)

    def __call__(self, x, *, train: bool = False):
      return super().__call__(scatternet.transform(x, scatternet.ScatterNetConfig()),
                              train=train)

  ScatterNetOnImages.__name__ = ScatterNetOnImages.__qualname__ = (
      f"ScatterNetOnImages{head_class.__name__}")
  return ScatterNetOnImages


def _read_json(path: str, what: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except OSError as error:
    raise errors.UserError(f"--run: cannot read {path!r} ({error.strerror}); {_RUN_HINT}") from error
  except ValueError as error:
    raise errors.UserError(f"--run: {what} {path!r} is not valid JSON ({error})") from error
  if not isinstance(value, dict):
    raise errors.UserError(f"--run: {what} {path!r} is not a JSON object")
  return value


def check_run(workdir: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """(record.json, results.json) of a finished run with a classifier student, or one line.

  Raises:
    UserError: no such directory, a teacher's workdir, an unfinished run, a method without a
      classifier student, or no checkpoint.
  """
  if not os.path.isdir(workdir):
    raise errors.UserError(f"--run: {workdir!r} does not exist; {_RUN_HINT}")
  if os.path.exists(os.path.join(workdir, "card.json")):
    raise errors.UserError(f"--run: {workdir!r} is a teacher's workdir (card.json): a teacher "
                           f"is trained without privacy and is not exported; {_RUN_HINT}")
  for name in ("record.json", "results.json"):
    if not os.path.exists(os.path.join(workdir, name)):
      raise errors.UserError(f"--run: {workdir!r} holds no {name}: not a finished run; "
                             f"{_RUN_HINT}")
  record = _read_json(os.path.join(workdir, "record.json"), "record")
  results = _read_json(os.path.join(workdir, "results.json"), "results")
  method = record.get("method")
  if method not in LAYOUTS:
    raise errors.UserError(f"--run: a {method!r} run releases no classifier student to export "
                           f"(exportable: {', '.join(sorted(LAYOUTS))})")
  if checkpoint.latest_step(os.path.join(workdir, "checkpoints")) is None:
    raise errors.UserError(f"--run: {workdir!r} holds no checkpoint of its student; {_RUN_HINT}")
  return record, results


def _subtree(arrays: Any, path: tuple[str, ...], where: str) -> Any:
  for key in path:
    if not isinstance(arrays, dict) or key not in arrays:
      raise checkpoint.CheckpointMismatchError(
          f"{where}: no {'/'.join(path)} in the checkpoint (a run of another version?)")
    arrays = arrays[key]
  return arrays


def load_student(workdir: str) -> Student:
  """The trained student of the finished run in `workdir` (newest checkpoint).

  Raises:
    UserError: see `check_run`; `checkpoint.CorruptCheckpointError` if the checkpoint does not
      match its checksum.
    checkpoint.CheckpointMismatchError: the saved student does not fit its config's model.
  """
  record, _ = check_run(workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  verified = checkpoint.read_verified(ckpt_dir)
  spec = spec_of(record["method"], record["dataset"], verified.meta.get("config"))
  if spec is None:
    raise errors.UserError(f"--run: the checkpoint in {ckpt_dir!r} names no known student model "
                           f"or dataset; {_RUN_HINT}")
  constructor = ARCHITECTURES[spec.model]
  if spec.features == "scatternet":  # DP-SGD on features: the checkpoint holds the head
    constructor = reading_images(constructor)
  elif spec.features != "pixels":
    raise errors.UserError(f"--run: the student reads {spec.features!r} features, which this "
                           f"release does not know how to compute from images")
  layout = LAYOUTS[spec.method]
  template = core.split(nnx.eval_shape(lambda: constructor(
      num_classes=spec.info.num_classes, input_shape=spec.info.image_shape, norm=spec.norm,
      rngs=nnx.Rngs(0))))  # shapes only (no initialisation): the saved arrays fill it
  saved = {"params": _subtree(verified.arrays, layout.params_path(verified.meta["config"]),
                             ckpt_dir),
           "batch_stats": _subtree(verified.arrays, layout.batch_stats, ckpt_dir)}
  restored = checkpoint.into_target(
      saved, {"params": template.params, "batch_stats": template.batch_stats}, ckpt_dir)
  parts = core.ModelParts(template.graphdef, restored["params"], restored["batch_stats"])
  return Student(spec, parts, verified.step, verified.meta)


def _epsilon_of(value: Any) -> float:
  """A record's `sound_epsilon` (a number or "inf") as a float."""
  return float("inf") if value == "inf" else float(value)


def covered_epsilon(workdir: str, meta: dict[str, Any], step: int) -> float:
  """The ε to state for the weights of checkpoint `step` (metadata `meta`) of `workdir`.

  Returns:
    max(ε of record.json, ε of the ledger the checkpoint carries); inf for a run without a
    guarantee.

  Raises:
    UserError: the checkpoint's ledger spent more than record.json reports: the results
      describe an earlier state than the weights (the run stopped after this checkpoint).
  """
  record, _ = check_run(workdir)
  recorded = _epsilon_of(record.get("sound_epsilon", "inf"))
  try:
    ledger = ledger_file.ledger_of(meta)
  except ValueError as error:
    raise errors.UserError(f"--run: the ledger in checkpoint step {step} of {workdir!r} is "
                           f"unreadable ({str(error).splitlines()[0]})") from error
  if ledger is None:  # a run without noise keeps no ledger: its record says inf
    return recorded
  spent = ledger.spent_epsilon()
  if spent > recorded * (1 + _RELATIVE_SLACK):
    raise errors.UserError(
        f"--run: checkpoint step {step} of {workdir!r} was charged epsilon {spent:.6g}, its "
        f"record.json reports {recorded:.6g}: the run stopped after that checkpoint without "
        "writing its results; finish it (the same command with --resume), then export")
  return max(spent, recorded)


def check_covered(workdir: str) -> float:
  """`covered_epsilon` of the newest checkpoint, from its metadata alone (cheap: before any
  output is written; `load_student` then verifies the same checkpoint's checksum)."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  step = checkpoint.latest_step(ckpt_dir)
  return covered_epsilon(workdir, checkpoint.restore_metadata(ckpt_dir, step=step), step)
