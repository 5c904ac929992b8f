r"""Train n teachers at once on n disjoint equal shards and save them as one stacked ensemble.

  python -m experiments.teacher_ensemble --dataset=mnist --data_dir=../shared/data \
      --num_teachers=250 --teacher_model=patch_cnn --teacher_epochs=20 --shard_seed=0 \
      --workdir=runs/teacher_ensemble/mnist_pcnn250

No student, no privacy cost: the teachers are not private (the directory is as secret as the
data). Its meta records the partition (dataset, the sharded split's size and SHA-256,
num_teachers shards, shard_seed, shard size), so `python -m experiments.dpdfd
--teacher_ensemble_dir=DIR` counts one teacher per record; `python -m experiments.dfpate
--teachers_dir=DIR` reuses it with the same teacher flags. A directory that already holds
this ensemble is kept.
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax import teacher_ensemble
from experiments import _cli
from experiments import _flags



def parse_config(argv: list[str]
                 ) -> tuple[teacher_ensemble.TeacherEnsembleConfig, argparse.Namespace]:
  """Flags -> (validated config, flags); bad values exit 2 with one line."""
  p = _cli.Parser(prog="python -m experiments.teacher_ensemble", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  _flags.add_config_flags(p, teacher_ensemble.TeacherEnsembleConfig)
  p.add_argument("--workdir", default=None,
                 help="the teachers directory (default runs/teacher_ensemble/"
                      "<dataset>_<teacher_model><num_teachers>)")
  args = p.parse_args(argv)
  config = _flags.build_config(teacher_ensemble.TeacherEnsembleConfig, args)
  if args.workdir is None:
    args.workdir = os.path.join("runs", "teacher_ensemble", f"{config.dataset}_"
                                f"{config.teacher_model}{config.num_teachers}")
  return config, args


@_cli.entry_point
def main(argv: list[str]) -> None:
  config, args = parse_config(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  meta = teacher_ensemble.train_and_save(config, args.workdir)
  report, partition = meta["report"], meta["partition"]
  print(f"{config.num_teachers} {config.teacher_model} teachers on {config.dataset}, "
        f"{partition['shard_size']} records each (shard_seed {partition['shard_seed']}), "
        f"trained in {meta['train_seconds']:.0f} s -> {args.workdir}")
  print(f"teacher test accuracy: mean {report['teacher_mean']:.4f}, plurality vote "
        f"{report['plurality']:.4f} [PRIVATE diagnostic: non-private teachers, do not "
        "publish]")


if __name__ == "__main__":
  main()
