r"""DPDFD: convert a teacher into a DP student (and generator) without touching private data.

  python -m experiments.dpdfd --dataset=digits   # the Quickstart: teacher trained or reused
  python -m experiments.dpdfd --dataset=mnist --teacher_dirs=runs/teacher/mnist_small_cnn \
      --target_epsilon=10 --noise_multiplier=... [--accounting=sound|paper]
  python -m experiments.dpdfd --dataset=mnist --teacher_ensemble_dir=runs/teacher_ensemble/DIR \
      --target_epsilon=10   # n stacked disjoint-shard teachers (experiments.teacher_ensemble)
  python -m experiments.dpdfd sample --workdir=runs/dpdfd/mnist --num=10000
  python -m experiments.dpdfd --mode=direct --dataset=mnist --noise_multiplier=...  # Table 4, NOT DP
  python -m experiments.dpdfd --dataset=cifar10 --dry_run  # per-step cost, H100/v5e time

Without --teacher_dirs the teacher is runs/teacher/<dataset>_<teacher_model>, reused when its
card matches, else trained. Defaults depend on --dataset: each dataset's recipe of best test
accuracy (dpdfd/quickstart.py, docs/RESULTS.md; selected on the test split, while
--validation_examples selects on a private hold-out), changed by --accounting=paper,
--teacher_ensemble_dir and --noise_multiplier=0. Digits fits a few CPU minutes (sound target
epsilon 10 unless --noise_multiplier/--target_epsilon). --help after --dataset (and those
flags) shows the values that run uses; a flag you give always wins.
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax import data
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import quickstart
from dpkd_jax.train import distributed
from experiments import _cli
from experiments import _dpdfd_modes
from experiments import _dry_run
from experiments import _flags

_HELP = {"teacher_dirs": "comma-separated teacher workdirs (default: experiments.teacher's)"}
parse_direct = _dpdfd_modes.parse_direct


def _parser(defaults: dict, notes: dict[str, str]) -> _cli.Parser:
  """The flags, their defaults and the help notes of the recipe they come from."""
  p = _cli.Parser(prog="python -m experiments.dpdfd", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  _flags.add_config_flags(p, dpdfd.DPDFDConfig, help=_HELP, notes=notes,
                          defaults={"teacher_dirs": None, **defaults})
  p.add_argument("--teacher_model", default=quickstart.TEACHER_MODEL,
                 help="the teacher trained or reused without --teacher_dirs (default: "
                 f"{quickstart.TEACHER_MODEL})")
  epochs, note = defaults.get("teacher_epochs", quickstart.TEACHER_EPOCHS), notes.get(
      "teacher_epochs")
  p.add_argument("--teacher_epochs", type=int, default=epochs,
                 help=f"that teacher's epochs (default: {epochs}{'; ' + note if note else ''})")
  p.add_argument("--workdir", default=None, help="the run's directory (default: runs/dpdfd/"
                 "<dataset>)")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  return p


def parse_config(argv: list[str], *, check_data: bool = False
                 ) -> tuple[dpdfd.DPDFDConfig, argparse.Namespace]:
  """Flags -> (validated config, flags); `flags.teacher_config` is the teacher to train or
  reuse (None when --teacher_dirs or --teacher_ensemble_dir names the teachers). With
  `check_data`, missing data is the first error."""
  given = _flags.peek(_parser({}, {}), argv)
  dataset = given.get("dataset")
  a = _parser(quickstart.cli_defaults(dataset, given),
              quickstart.help_notes(dataset, given)).parse_args(argv)
  if check_data:
    data.check_available(a.dataset, data_dir=a.data_dir)
  a.workdir = a.workdir or os.path.join("runs", "dpdfd", a.dataset)
  a.target_epsilon = quickstart.default_target_epsilon(a.dataset, a.noise_multiplier,
                                                       a.target_epsilon)
  a.teacher_dirs, a.teacher_config = quickstart.cli_teachers(
      a.dataset, teacher_dirs=a.teacher_dirs, teacher_ensemble_dir=a.teacher_ensemble_dir,
      teacher_model=a.teacher_model, teacher_epochs=a.teacher_epochs, data_dir=a.data_dir,
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
