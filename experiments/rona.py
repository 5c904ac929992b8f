"""RONA private model compression: `python -m experiments.rona --dataset=mnist --target_epsilon=8`.

Give `--noise_multiplier` (0: non-private compression run) or `--target_epsilon` (σ calibrated
for all T = (Th + R·Td)·ceil(|x_q|/S) queries). Teachers are trained in the workdir (teacher on
the whole training split, auxiliary teacher on the public split) unless `--teacher_dir` /
`--aux_teacher_dir` name trained ones. Privacy runs use `--public_fraction=0.4`, compression
runs `--public_fraction=0.8`. `--resume` continues an interrupted run in the same workdir.
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax import teacher
from dpkd_jax.methods import rona
from dpkd_jax.train import distributed
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _flags
from experiments import _recipes

def parse_config(argv: list[str]) -> tuple[rona.RONAConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit 2 with the config's one-line message)."""
  p = _cli.Parser(prog="python -m experiments.rona", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  recipe = _recipes.chosen(argv, rona.RONAConfig)
  _recipes.add_flag(p, recipe, "rona")
  _flags.add_config_flags(p, rona.RONAConfig, defaults={**recipe.values},
                          notes=recipe.notes)
  p.add_argument("--workdir", default=None, help="default runs/rona/<dataset>_<student_model>")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--stop_after_units", type=int, default=None,
                 help="end this invocation (checkpointed) after this many epochs of the schedule")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(argv)
  config = _flags.build_config(rona.RONAConfig, args)
  if args.workdir is None:
    args.workdir = os.path.join("runs", "rona", f"{config.dataset}_{config.student_model}")
  return config, args


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(argv)
  for flag, tdir in (("--teacher_dir", config.teacher_dir),
                     ("--aux_teacher_dir", config.aux_teacher_dir)):
    if tdir is not None:
      teacher.read_card(tdir, flag=flag, dataset=config.dataset)
  _cli.check_output_dir(args.workdir, "--workdir")
  results = rona.train_rona(config, args.workdir, resume=args.resume,
                            stop_after_units=args.stop_after_units,
                            progress=not args.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=args.workdir)))

if __name__ == "__main__":
  main()
