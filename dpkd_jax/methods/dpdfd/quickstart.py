"""The Quickstart's main job: get a teacher, convert it with DPDFD, say what came out.

`python -m experiments.dpdfd` and the quickstart notebook run it in two calls,
`prepare_teachers(config, teacher_config=...)` and `train_dpdfd(config, workdir)`, as the other
CLIs call their `train_<method>`:

  1. the teacher: the workdirs of `config.teacher_dirs`; with a `teacher_config`, the first
     of them is reused when its card.json shows a finished teacher of that dataset and model,
     else trained there (`ensure_teacher`; the CLI's default is runs/teacher/<dataset>_<model>,
     the workdir `experiments.teacher` writes); or the stacked ensemble of
     `config.teacher_ensemble_dir` (`experiments.teacher_ensemble`), checked before the run;
  2. `train_dpdfd` (its report.md, and the model card where helper code writes one, come from
     `train.outputs.finish_run`);
  3. `summary_lines(results, workdir)`: accuracy, the sound (ε, δ) with its relation, the
     files, where the private diagnostics are (the teacher's accuracy among them: its value
     stays in results.json's "private_diagnostics", never printed), and a line saying why
     when the student is at chance.

The recipes are files (configs/dpdfd/, `--config`); without one, `--dataset=<name>` runs
the file `configs.dpdfd.BY_DATASET` names. A recipe whose teacher is the CLI's default teacher
(runs/teacher/<dataset>_<teacher_model>, `default_teacher_dir`) has it trained or reused there
(`cli_teachers`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.train import summary

RESULTS = "docs/RESULTS.md#"
ENGINE_ANCHOR = RESULTS + "dpdfd-engine"
DISAGREEMENT_ANCHOR = ENGINE_ANCHOR
PAPER_TABLE_ANCHOR = RESULTS + "dpdfd-paper-table-1"
ENSEMBLE_ANCHOR = RESULTS + "dpdfd-many-teachers"
PRIVACY_ANCHOR = "docs/privacy.md#one-teacher-at-chance"
COVERAGE_ANCHOR = RESULTS + "dpdfd-class-conditional"
TEACHER_MODEL = "small_cnn"
TEACHER_EPOCHS = 5  # the teacher trained without a recipe's TEACHER_EPOCHS (--teacher_epochs)

Log = Callable[[str], None]


def cli_teachers(dataset: str, *, teacher_dirs: tuple[str, ...], default_teacher: bool,
                 teacher_ensemble_dir: str | None, teacher_model: str, teacher_epochs: int,
                 data_dir: str | None, validation_examples: int,
                 ) -> tuple[tuple[str, ...], teacher_lib.TeacherConfig | None]:
  """(teacher_dirs, the teacher `prepare_teachers` trains or reuses, or None) of the CLI's flags.

  `default_teacher`: the run names no teacher of its own (no --teacher_dirs, and the recipe's,
  if any, is the CLI's default teacher of its dataset). Then the teachers are the ensemble's
  with --teacher_ensemble_dir (none here), else `default_teacher_dir` of the run's dataset and
  model (its own with a hold-out), trained or reused. Otherwise `teacher_dirs`, trained by
  nobody. A bad teacher flag is a one-line `UserError`.
  """
  if not default_teacher:
    return teacher_dirs, None
  if teacher_ensemble_dir is not None:
    return (), None
  try:
    config = teacher_lib.TeacherConfig(dataset=dataset, model=teacher_model, epochs=teacher_epochs,
                                       data_dir=data_dir, validation_examples=validation_examples)
  except ValueError as error:
    raise errors.UserError(str(error)) from error
  held = f"_val{validation_examples}" if validation_examples else ""  # its own teacher
  return (default_teacher_dir(dataset, teacher_model) + held,), config


def default_teacher_of(recipe: config_lib.DPDFDConfig | None) -> bool:
  """Whether a run of `recipe` (None: no recipe) gets the CLI's default teacher: the recipe
  names no teacher, or the default teacher of its own dataset (`default_teacher_dir`)."""
  return recipe is None or recipe.teacher_dirs == (default_teacher_dir(recipe.dataset),)


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
    held = card.get("split", {}).get("validation_examples", 0)
    if held != config.validation_examples:  # it trained on the run's hold-out, or lacks one
      raise teacher_lib.TeacherMismatchError(
          f"the default teacher {workdir!r} left {held} records out, not the run's "
          f"--validation_examples={config.validation_examples}; give --teacher_dirs or remove it")
    log(f"teacher: reusing {workdir} ({card['model']} on {card['dataset']}, its card.json "
        f"matches; remove the directory to retrain)")
    return card
  epochs = f"{config.epochs} epoch" + "s" * (config.epochs != 1)
  log(f"teacher: training {config.model} on {config.dataset} for {epochs} in {workdir} (not "
      "private: it is the model to convert)")
  return teacher_lib.train_teacher(config, workdir, progress=progress)


def prepare_teachers(config: config_lib.DPDFDConfig, *,
                     teacher_config: teacher_lib.TeacherConfig | None = None,
                     progress: bool = True, log: Log = print) -> None:
  """(Trains or reuses the teacher,) checks every teacher's card before the run starts.

  Args:
    config: the run; `config.teacher_dirs[0]` is where `teacher_config`'s teacher lives.
    teacher_config: train (or reuse) the first teacher with this recipe; None: the teachers
      must exist already.
    progress: progress bars.
    log: where the one-line notes go.
  """
  if teacher_config is not None:
    ensure_teacher(teacher_config, config.teacher_dirs[0], progress=progress, log=log)
  for tdir in config.teacher_dirs:
    teacher_lib.read_card(tdir, flag="--teacher_dirs", dataset=config.dataset)
  if config.teacher_ensemble_dir is not None:  # cheap: the meta only, before the run starts
    teacher_ensemble.read_meta(config.teacher_ensemble_dir, flag="--teacher_ensemble_dir",
                               dataset=config.dataset)


NEGLIGIBLE_NOISE = 0.01  # noise std per coordinate of the released mean row, in units of C


def _engine_reason(steps: int, config: config_lib.DPDFDConfig, noise: str) -> str:
  """The noise is not what failed: the engine did not learn in `steps` steps."""
  if config.engine.generator_objective == "disagreement":
    return (f"why at chance: {noise}, so the engine itself did not learn in {steps} steps "
            f"(its outcome spreads from seed to seed and grows with steps: "
            f"{DISAGREEMENT_ANCHOR}); try more --steps or another --seed")
  return (f"why at chance: {noise}, so the engine itself did not learn in {steps} steps "
          f"(the generator sees only the student and can collapse: {ENGINE_ANCHOR}); try "
          "more --steps, or the disagreement generator: --generator_objective=disagreement "
          "--bound_method=clip --teacher_loss=logit --l2_clip_norm=1000")


def chance_reason(results: Mapping[str, Any]) -> str:
  """Why a DPDFD student is at chance, and what to try (one line).

  The cases: noise negligible beside the rows (σ = 0 included: the engine); the paper's
  formula chose the noise (its C); sound accounting with one teacher (the budget); sound with
  n teachers (too much noise per teacher, or teachers sharing records).

  Args:
    results: a DPDFD run's results (`train_dpdfd`), its "config" the run's `to_json`.
  """
  config = config_lib.DPDFDConfig.from_json(results["config"])
  sigma, steps = results.get("noise_multiplier") or 0.0, results.get("steps", 0)
  n, m = results.get("num_teachers", 1), results.get("teachers_per_record", 1)
  bound = config.l2_clip_norm
  std = sigma / n  # noise std per coordinate of the released mean row, in units of C
  if std < NEGLIGIBLE_NOISE:
    noise = "no noise" if sigma == 0 else f"noise std {std:.2g}*C is negligible beside the rows"
    return _engine_reason(steps, config, noise)
  eps = f"sound epsilon {results.get('epsilon', float('nan')):.4g}"
  if results.get("accounting_used_for_budget", config.accounting) == "paper":
    chose = ("the paper's formula chose the noise, and its epsilon grows with C^2/sigma^2"
             if config.target_epsilon is not None else
             "the paper's epsilon grows with C^2/sigma^2")
    return (f"why at chance: {chose}: at C = {bound:g} the noise std per coordinate "
            f"{std * bound:.3g} drowns rows of norm <= C ({eps} for this run); its Table 1 "
            "recipe keeps rows far below a tiny C: --l2_clip_norm=1e-10 "
            f"--teacher_loss_scale=1e-12 --gamma=1e12 ({PAPER_TABLE_ANCHOR})")
  batch = config.batch_size * (1 + config.probes_per_sample)  # rows of one release
  z = sigma / (2 * m * math.sqrt(batch))
  per_step = (f"{eps} leaves noise multiplier sigma/(2m*sqrt(B)) = {z:.3g} per step over "
              f"{steps} steps")
  if n == 1:
    return (f"why at chance: sound epsilon budget too small for one teacher: one record may "
            f"change its teacher arbitrarily, so {per_step} ({PRIVACY_ANCHOR}); try many "
            "teachers on disjoint shards (python -m experiments.teacher_ensemble, then "
            "--teacher_ensemble_dir), or python -m experiments.dfpate; --noise_multiplier=0 "
            "shows the pipeline learn (NOT private)")
  shared = (f"; one record reaches {m} of them: train them on disjoint shards "
            "(python -m experiments.teacher_ensemble)" if m > 1 else "")
  return (f"why at chance: too much noise for {n} teachers: {per_step}, noise std "
          f"{std:.3g}*C per coordinate of the mean row (rows of norm <= C){shared}; try more "
          f"teachers, a larger --target_epsilon ({ENSEMBLE_ANCHOR}), or python -m "
          "experiments.dfpate")


# A class named by fewer than this share of the released targets is flagged as rarely generated.
RARE_CLASS_SHARE = 0.01


def coverage_line(results: Mapping[str, Any]) -> str | None:
  """One line on the generator's class coverage as the release shows it (the share of released
  targets naming each class, `released_rows_per_class`), flagging the classes the generator
  rarely made: the student sees few targets of those and often misses them. None without counts.
  """
  counts = results.get("released_rows_per_class")
  if not counts or not sum(counts):
    return None
  total = sum(counts)
  shares = " ".join(f"{k}:{100 * c / total:.0f}%" for k, c in enumerate(counts))
  rare = [str(k) for k, c in enumerate(counts) if c < RARE_CLASS_SHARE * total]
  line = f"generator classes (released targets' argmax, {total:,} rows): {shares}"
  if rare:
    line += (f"; rarely generated (< {100 * RARE_CLASS_SHARE:g}%): class {', '.join(rare)}, "
             f"which the student likely misses ({COVERAGE_ANCHOR})")
  return line


def summary_lines(results: dict[str, Any], workdir: str) -> list[str]:
  """The Quickstart's closing summary of a DPDFD run (`summary.conversion_lines`) with the
  generator's class coverage before its last line (a chance reason stays last)."""
  info = data.DATASETS[results["config"]["dataset"]]
  lines = summary.conversion_lines(results, workdir=workdir, num_classes=info.num_classes,
                                   chance_reason=chance_reason(results))
  coverage = coverage_line(results)
  return lines if coverage is None else lines[:-1] + [coverage, lines[-1]]
