r"""DPDFD: convert a teacher into a DP student (and generator) without touching private data.

  python -m experiments.dpdfd --config=configs/dpdfd/digits_quickstart.py  # the Quickstart
  python -m experiments.dpdfd --config=configs/dpdfd/mnist_paper_eps10.py  # paper accounting
  python -m experiments.dpdfd --config=configs/dpdfd/mnist_ensemble_eps10.py \
      --teacher_ensemble_dir=runs/teacher_ensemble/DIR   # sound, n disjoint-shard teachers
  python -m experiments.dpdfd sample --workdir=runs/dpdfd/mnist --num=10000
  python -m experiments.dpdfd --mode=direct --dataset=mnist --noise_multiplier=...  # Table 4, NOT DP
  python -m experiments.dpdfd --dataset=cifar10 --dry_run  # per-step cost, H100/v5e time

Recipes are files, `--config=configs/dpdfd/<name>.py` (its docstring: the record, command and
time); a flag given overrides it. Without --config, `--dataset=<name>` runs the file
configs/dpdfd/__init__.py names (digits: the Quickstart, sound target ε 10, a few CPU minutes);
--help after --dataset or --config shows the values the run uses. The default teacher is
runs/teacher/<dataset>_<teacher_model>, reused when its card matches, else trained.
"""

from __future__ import annotations

import argparse
import os

from configs import dpdfd as dpdfd_recipes
from dpkd_jax import data
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import quickstart
from dpkd_jax.train import distributed
from experiments import _cli
from experiments import _dpdfd_modes
from experiments import _dry_run
from experiments import _flags
from experiments import _recipes

parse_direct = _dpdfd_modes.parse_direct


def _default_recipe(argv: list[str]) -> str | None:
  return dpdfd_recipes.BY_DATASET.get(_recipes.peek(argv, "dataset"))


def _parser(recipe: _recipes.Recipe) -> _cli.Parser:
  """The flags, their defaults from `recipe` (the values the run uses)."""
  p = _cli.Parser(prog="python -m experiments.dpdfd", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  _recipes.add_flag(p, recipe, "dpdfd", "--dataset=" + ", ".join(
      f"{name}: {path}" for name, path in dpdfd_recipes.BY_DATASET.items()))
  teachers = ("experiments.teacher's" if quickstart.default_teacher_of(recipe.config) else
              ",".join(recipe.config.teacher_dirs) or "none")
  _flags.add_config_flags(p, dpdfd.DPDFDConfig, notes=recipe.notes, help={
      "teacher_dirs": f"comma-separated teacher workdirs (default: {teachers})"},
                          defaults={"teacher_dirs": None, **recipe.values})
  p.add_argument("--teacher_model", default=quickstart.TEACHER_MODEL, help="the teacher trained "
                 f"or reused without --teacher_dirs (default: {quickstart.TEACHER_MODEL})")
  epochs = getattr(recipe.module, "TEACHER_EPOCHS", quickstart.TEACHER_EPOCHS)
  p.add_argument("--teacher_epochs", type=int, default=epochs,
                 help=f"that teacher's epochs (default: {epochs})")
  p.add_argument("--workdir", default=None, help="run directory (default: runs/dpdfd/<dataset>)")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  return p


def parse_config(argv: list[str], *, check_data: bool = False
                 ) -> tuple[dpdfd.DPDFDConfig, argparse.Namespace]:
  """Flags -> (validated config, flags); `flags.teacher_config` is the teacher to train or
  reuse (None when the run names its teachers). With `check_data`, missing data is the first
  error."""
  recipe = _recipes.chosen(argv, dpdfd.DPDFDConfig, _default_recipe)
  a = _parser(recipe).parse_args(argv)
  if check_data:
    data.check_available(a.dataset, data_dir=a.data_dir)
  a.workdir = a.workdir or os.path.join("runs", "dpdfd", a.dataset)
  default = ("teacher_dirs" not in _recipes.given(argv, dpdfd.DPDFDConfig)
             and quickstart.default_teacher_of(recipe.config))
  a.teacher_dirs, a.teacher_config = quickstart.cli_teachers(
      a.dataset, teacher_dirs=a.teacher_dirs, default_teacher=default,
      teacher_ensemble_dir=a.teacher_ensemble_dir, teacher_model=a.teacher_model,
      teacher_epochs=a.teacher_epochs, data_dir=a.data_dir,
      validation_examples=a.validation_examples)
  return _flags.build_config(dpdfd.DPDFDConfig, a), a


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  if argv[:1] == ["sample"]:
    return _dpdfd_modes.sample(argv[1:])
  if "--mode=direct" in argv:
    return _dpdfd_modes.direct([x for x in argv if x != "--mode=direct"])
  if _dry_run.requested(argv):  # shapes only: reads no data, charges and writes nothing
    return _dry_run.main(argv, parse_config)
  config, a = parse_config(argv, check_data=True)
  _cli.check_output_dir(a.workdir, "--workdir")
  quickstart.prepare_teachers(config, teacher_config=a.teacher_config, progress=not a.no_progress)
  # A run of the same config in --workdir is continued (this CLI has no --resume flag).
  results = dpdfd.train_dpdfd(config, a.workdir, resume=True, progress=not a.no_progress)
  print("\n".join(quickstart.summary_lines(results, a.workdir)))


if __name__ == "__main__":
  main()
