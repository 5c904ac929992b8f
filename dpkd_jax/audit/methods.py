"""Which methods an audit runs, what each releases, and where its canaries go.

`METHODS[name]` is an `AuditedMethod`: the method's train function, the threat models its
release is scored under (`scores.THREAT_MODELS`; the first is the record's `audit`), its hook
for the rows of the training split it keeps private (`private_rows(config, N)` in its data
path: RONA's sensitive part, the shards of DF-PATE's teachers, the private set of reverse
k-NN; all rows where None), and the config fields naming teachers trained elsewhere. Those
fields are replaced for the audited run (`run_config`): RONA's and DF-PATE's teachers train
inside the run on the canary data, or come from the `--teacher_audit` whose canaries the run
reuses (DPDFD, SRR and RONA; `prepare` refuses a reused design with a canary outside the
method's private rows).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable

import numpy as np

from dpkd_jax import errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditedMethod:
  """How `experiments.audit` runs one method.

  Attributes:
    cli: the method's CLI module (its `parse_config(argv)` gives the config).
    train: "module:function", `function(config, workdir, progress=..., [resume=...])`.
    kinds: threat models scored, the record's `audit` first.
    resumes: the train function takes `resume` (a run with checkpoints/ is resumed).
    rows: "module:function" (config, N) -> (R,) private rows, or None (all rows).
    teacher_flag: the CLI flag a `--teacher_audit`'s teacher is given to (DPDFD, SRR).
    teacher_fields: config fields naming pre-trained teachers, replaced for the audit.
  """

  cli: str
  train: str
  kinds: tuple[str, ...] = ("student",)
  resumes: bool = True
  rows: str | None = None
  teacher_flag: str | None = None
  teacher_fields: tuple[str, ...] = ()

  def __post_init__(self):
    for name in ("train", "rows"):
      value = getattr(self, name)
      if value is not None and ":" not in value:
        raise ValueError(f"{name} must be 'module:function', got {value!r}")

  @property
  def takes_teacher_audit(self) -> bool:
    return self.teacher_flag is not None or bool(self.teacher_fields)

  def private_rows(self, config: Any) -> Callable[[int], np.ndarray] | None:
    """rows(N) of `config`'s run, or None (all rows)."""
    if self.rows is None:
      return None
    fn = _function(self.rows)
    return lambda num_train: fn(config, num_train)


METHODS = {
    "dpsgd": AuditedMethod(cli="experiments.dpsgd", train="dpkd_jax.methods.dpsgd:train_dpsgd",
                           kinds=("student", "white_box")),
    "dpdfd": AuditedMethod(cli="experiments.dpdfd", train="dpkd_jax.methods.dpdfd:train_dpdfd",
                           kinds=("student", "generator"), resumes=False,
                           teacher_flag="--teacher_dirs"),
    "srr": AuditedMethod(cli="experiments.srr", train="dpkd_jax.methods.srr:train_srr",
                         teacher_flag="--teacher_dir"),
    "teacher": AuditedMethod(cli="experiments.teacher", train="dpkd_jax.teacher:train_teacher",
                             kinds=("teacher",), resumes=False),
    "rona": AuditedMethod(cli="experiments.rona", train="dpkd_jax.methods.rona:train_rona",
                          rows="dpkd_jax.methods.rona.teachers:private_rows",
                          teacher_fields=("teacher_dir", "aux_teacher_dir")),
    "dfpate": AuditedMethod(cli="experiments.dfpate",
                            train="dpkd_jax.methods.dfpate:train_dfpate",
                            rows="dpkd_jax.methods.dfpate.teachers:private_rows",
                            teacher_fields=("teachers_dir",)),
    "rknn": AuditedMethod(cli="experiments.rknn", train="dpkd_jax.methods.rknn:train_rknn",
                          rows="dpkd_jax.methods.rknn.run:private_rows"),
}
# Where a finished audit of another method keeps the teachers a RONA run may reuse.
_RONA_TEACHERS = {"teacher_dir": "teacher", "aux_teacher_dir": "aux_teacher"}


def _function(spec: str) -> Callable[..., Any]:
  module, _, name = spec.partition(":")
  return getattr(importlib.import_module(module), name)


def teacher_overrides(method: str, config: Any, run_dir: str,
                      teacher_audit: str | None) -> dict[str, Any]:
  """The config fields that make the audited run's teachers see the canaries: teachers trained
  inside `run_dir` on the canary data (a recipe's pre-trained ones never saw them), or those
  of the audit in `teacher_audit` (whose design the run reuses)."""
  if method == "dfpate":
    return {"teachers_dir": os.path.join(run_dir, "teachers")} if config.use_teachers else {}
  if method != "rona":
    return {}
  if teacher_audit is None:
    return {"teacher_dir": None, "aux_teacher_dir": None}
  found = {field: os.path.join(teacher_audit, "run", sub)
           for field, sub in _RONA_TEACHERS.items()}
  if not os.path.exists(os.path.join(found["teacher_dir"], "card.json")):
    raise errors.UserError(f"--teacher_audit: {teacher_audit!r} holds no RONA teacher "
                           "(run/teacher/card.json); give the workdir of a RONA audit")
  if config.bound_mode != "adaptive" or not os.path.exists(
      os.path.join(found["aux_teacher_dir"], "card.json")):
    found["aux_teacher_dir"] = None  # trained in the run on the public part (no canaries)
  return found


def trainer(method: str, config: Any, progress: bool, teacher_audit: str | None = None
            ) -> Callable[[str, str], None]:
  """train(canary_data_dir, run_workdir): the method's run on the canary data, its teachers
  as `teacher_overrides` makes them (a run found there is resumed where the method can)."""
  spec = METHODS[method]
  train_fn = _function(spec.train)

  def train(canary_dir: str, run_dir: str) -> None:
    kwargs = ({"resume": os.path.isdir(os.path.join(run_dir, "checkpoints"))}
              if spec.resumes else {})
    audited = dataclasses.replace(config, data_dir=canary_dir, **teacher_overrides(
        method, config, run_dir, teacher_audit))
    train_fn(audited, run_dir, progress=progress, **kwargs)
  return train
