"""The Quickstart's main job: get a teacher, convert it with DPDFD, say what came out.

`python -m experiments.dpdfd --dataset=digits` and the quickstart notebook both call
`convert(config, workdir, teacher_config=...)`:

  1. the teacher: the workdirs of `config.teacher_dirs`; with a `teacher_config`, the first
     of them is reused when its card.json shows a finished teacher of that dataset and model,
     else trained there (`ensure_teacher`; the CLI's default is runs/teacher/<dataset>_<model>,
     the workdir `experiments.teacher` writes); or the stacked ensemble of
     `config.teacher_ensemble_dir` (`experiments.teacher_ensemble`), checked before the run;
  2. `train_dpdfd` (its report.md, and the model card where helper code writes one, come from
     `train.outputs.finish_run`);
  3. `summary_lines(results, workdir)`: accuracy, the teacher's accuracy marked as a private
     diagnostic, the sound (ε, δ) with its relation, the files, and a line saying why when
     the student is at chance.

Per-dataset flag defaults (`DATASET_DEFAULTS`, digits only) keep the whole command within a few
CPU minutes; a run that gives neither σ nor a target ε gets the sound target
`DEFAULT_TARGET_EPSILON` (digits only: the other datasets keep asking for one).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from dpkd_jax import data
from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import run as run_lib
from dpkd_jax.train import summary

DEFAULT_TARGET_EPSILON = 10.0  # sound (dp_accounting), never the paper's formula
# Flags of `experiments.dpdfd` whose default depends on the dataset: the embedded digits are
# the Quickstart, which must run in a few minutes on a 2-core CPU (teacher included).
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    # The best measured digits recipe (docs/RESULTS.md, "DPDFD engine"): logit-gap rows and a
    # GroupNorm datalens_cnn student (no BatchNorm statistics of generated images at test time).
    "digits": {"steps": 600, "batch_size": 64, "generator_channels": 64,
               "student_model": "datalens_cnn", "student_norm": "group",
               "teacher_loss": "logit", "eval_every": 100, "teacher_epochs": 10},
}
TEACHER_MODEL = "small_cnn"
TEACHER_EPOCHS = 5  # other datasets (the CLI's --teacher_epochs default)
PRIVACY_ANCHOR = "docs/privacy.md#why-a-one-teacher-student-stays-at-chance"
ENGINE_ANCHOR = "docs/RESULTS.md#dpdfd-engine-what-makes-data-free-distillation-learn-issue-22"

Log = Callable[[str], None]


def flag_defaults(dataset: str) -> dict[str, Any]:
  """The CLI defaults of `dataset` that differ from the config's (empty for most datasets)."""
  return dict(DATASET_DEFAULTS.get(dataset, {}))


def default_target_epsilon(dataset: str, noise_multiplier: float | None,
                           target_epsilon: float | None) -> float | None:
  """The target ε a run uses: the given one, or `DEFAULT_TARGET_EPSILON` (sound) for a
  Quickstart dataset run that names neither σ nor a target."""
  if target_epsilon is None and noise_multiplier is None and dataset in DATASET_DEFAULTS:
    return DEFAULT_TARGET_EPSILON
  return target_epsilon


def default_teacher_dir(dataset: str, model: str = TEACHER_MODEL, root: str = "runs") -> str:
  """Where `python -m experiments.teacher --dataset=<dataset> --model=<model>` writes."""
  return os.path.join(root, "teacher", f"{dataset}_{model}")


def ensure_teacher(config: teacher_lib.TeacherConfig, workdir: str, *, progress: bool = True,
                   log: Log = print) -> dict[str, Any]:
  """The card of the teacher in `workdir`: reused if its card shows `config`'s dataset and
  model, else trained there (an unfinished training of the same config resumes).

  Raises:
    teacher.TeacherMismatchError: `workdir` holds a finished teacher of another model or
      dataset (one line: give --teacher_dirs, another --teacher_model, or remove it).
  """
  if os.path.isfile(os.path.join(workdir, "card.json")):
    card = teacher_lib.read_card(workdir, flag="the default teacher", dataset=config.dataset)
    if card["model"] != config.model:
      raise teacher_lib.TeacherMismatchError(
          f"the default teacher {workdir!r} is a {card['model']} teacher, not {config.model}; "
          f"give --teacher_model={card['model']}, --teacher_dirs, or remove {workdir}")
    log(f"teacher: reusing {workdir} ({card['model']} on {card['dataset']}, its card.json "
        f"matches; remove the directory to retrain)")
    return card
  epochs = f"{config.epochs} epoch" + "s" * (config.epochs != 1)
  log(f"teacher: training {config.model} on {config.dataset} for {epochs} in {workdir} (not "
      "private: it is the model to convert)")
  return teacher_lib.train_teacher(config, workdir, progress=progress)


def convert(config: config_lib.DPDFDConfig, workdir: str, *,
            teacher_config: teacher_lib.TeacherConfig | None = None, progress: bool = True,
            log: Log = print) -> dict[str, Any]:
  """The main job: (train or reuse the teacher,) check every teacher, run DPDFD.

  Args:
    config: the run; `config.teacher_dirs[0]` is where `teacher_config`'s teacher lives.
    workdir: the run's workdir.
    teacher_config: train (or reuse) the first teacher with this recipe; None: the teachers
      must exist already.
    progress: progress bars.
    log: where the one-line notes go.

  Returns:
    The run's results (results.json).
  """
  if teacher_config is not None:
    ensure_teacher(teacher_config, config.teacher_dirs[0], progress=progress, log=log)
  for tdir in config.teacher_dirs:
    teacher_lib.read_card(tdir, flag="--teacher_dirs", dataset=config.dataset)
  if config.teacher_ensemble_dir is not None:  # cheap: the meta only, before the run starts
    teacher_ensemble.read_meta(config.teacher_ensemble_dir, flag="--teacher_ensemble_dir",
                               dataset=config.dataset)
  return run_lib.train_dpdfd(config, workdir, progress=progress)


def chance_reason(results: dict[str, Any]) -> str:
  """Why a DPDFD student is at chance, and what to try (one line)."""
  sigma, steps = results.get("noise_multiplier") or 0.0, results.get("steps", 0)
  if sigma == 0:
    return (f"why at chance: no noise, so the engine itself did not learn in {steps} steps "
            f"(the generator sees only the student and can collapse: {ENGINE_ANCHOR}); try "
            "more --steps, or the disagreement generator: --generator_objective=disagreement "
            "--bound_method=clip --teacher_loss=logit --l2_norm_bound=1000")
  config = results.get("config", {})
  probes = (config.get("probe_directions", 1)
            if config.get("generator_objective") == "disagreement" else 0)
  batch = config.get("batch_size", 1) * (1 + probes)  # rows of one release
  n, m = results.get("num_teachers", 1), results.get("teachers_per_record", 1)
  z = sigma / (2 * m * math.sqrt(batch))
  teachers = "one teacher" if n == 1 else f"{n} teachers"
  shards = "teachers on disjoint shards, " if n == 1 else ""
  return (f"why at chance: one record may change its teacher arbitrarily, so sound epsilon "
          f"{results['epsilon']:.4g} leaves noise multiplier sigma/(2m*sqrt(B)) = {z:.3g} per "
          f"step over {steps} steps, too little signal from {teachers} ({PRIVACY_ANCHOR}); "
          f"try: {shards}experiments.dfpate, or --noise_multiplier=0 to see the pipeline learn "
          "(NOT private)")


def summary_lines(results: dict[str, Any], workdir: str) -> list[str]:
  """The Quickstart's closing summary of a DPDFD run (`summary.conversion_lines`)."""
  info = data.DATASETS[results["config"]["dataset"]]
  return summary.conversion_lines(results, workdir=workdir, num_classes=info.num_classes,
                                  chance_reason=chance_reason(results))
