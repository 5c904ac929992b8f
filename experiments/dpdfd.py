"""DPDFD: convert a teacher into a DP student (and generator) without touching private data.

  python -m experiments.dpdfd --dataset=mnist --teacher_dirs=runs/teacher/mnist_small_cnn \
      --target_epsilon=10 --noise_multiplier=... [--accounting=sound|paper] [--train_teacher]
  python -m experiments.dpdfd sample --workdir=runs/dpdfd/mnist --num=10000
  python -m experiments.dpdfd --mode=direct --dataset=mnist --noise_multiplier=...  # Table 4, NOT DP
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax import teacher
from dpkd_jax.methods import dpdfd
from dpkd_jax.train import distributed
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _flags

_HELP = {
    "teacher_dirs": "comma-separated teacher workdirs (default: train one, see --train_teacher)",
    "seed": "reproducible run (its noise is then public); default: a secret seed from OS entropy",
    "data_dir": "directory of <dataset>.npz (else $DPKD_DATA_DIR/tfds)",
}


def parse_direct(argv: list[str]) -> tuple[dpdfd.DirectConfig, str]:
  """`--mode=direct` flags (without it) -> (validated config, workdir)."""
  p = _cli.Parser(prog="python -m experiments.dpdfd --mode=direct")
  _flags.add_config_flags(p, dpdfd.DirectConfig, help={"seed": _HELP["seed"]})
  p.add_argument("--workdir", default=None, help="default runs/dpdfd_direct/<dataset>")
  a = p.parse_args(argv)
  config = _flags.build_config(dpdfd.DirectConfig, a)
  return config, a.workdir or os.path.join("runs", "dpdfd_direct", config.dataset)


def _sample(argv: list[str]) -> None:
  p = _cli.Parser(prog="python -m experiments.dpdfd sample")
  p.add_argument("--workdir", required=True, help="a DPDFD run's workdir")
  p.add_argument("--num", type=int, default=10000, help="number of synthetic images")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="output .npz (default <workdir>/synthetic.npz)")
  a = p.parse_args(argv)
  if a.num < 1:
    p.error(f"--num must be >= 1, got {a.num}")
  dpdfd.check_run(a.workdir)
  _cli.check_output_file(a.out or os.path.join(a.workdir, "synthetic.npz"),
                         "--out" if a.out else "--workdir")
  print("wrote", dpdfd.sample(a.workdir, a.num, seed=a.seed, out_path=a.out))


def parse_config(argv: list[str]) -> tuple[dpdfd.DPDFDConfig, argparse.Namespace]:
  """Flags -> (validated config, flags); the teacher of --train_teacher is not trained yet."""
  p = _cli.Parser(prog="python -m experiments.dpdfd", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  _flags.add_config_flags(p, dpdfd.DPDFDConfig, help=_HELP, defaults={"teacher_dirs": None})
  p.add_argument("--train_teacher", action="store_true",
                 help="first train a teacher with experiments.teacher defaults (--teacher_model)")
  p.add_argument("--teacher_model", default="small_cnn")
  p.add_argument("--teacher_epochs", type=int, default=5)
  p.add_argument("--workdir", default=None, help="default runs/dpdfd/<dataset>")
  p.add_argument("--no_progress", action="store_true")
  a = p.parse_args(argv)
  a.workdir = a.workdir or os.path.join("runs", "dpdfd", a.dataset)
  a.teacher_to_train = None  # --train_teacher is ignored when --teacher_dirs names teachers
  if a.teacher_dirs is None:
    if not a.train_teacher:
      p.error("give --teacher_dirs (from `python -m experiments.teacher`) or --train_teacher")
    a.teacher_to_train = os.path.join(a.workdir, "teacher")
    a.teacher_dirs = (a.teacher_to_train,)
  return _flags.build_config(dpdfd.DPDFDConfig, a), a


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  if "--mode=direct" in argv:  # the mechanism on private data (paper Table 4): ε = inf
    config, workdir = parse_direct([x for x in argv if x != "--mode=direct"])
    _cli.check_output_dir(workdir, "--workdir")
    results = dpdfd.train_direct(config, workdir)
  elif argv[:1] == ["sample"]:
    return _sample(argv[1:])
  else:
    config, a = parse_config(argv)
    workdir = a.workdir
    _cli.check_output_dir(workdir, "--workdir")
    if a.teacher_to_train and not os.path.exists(os.path.join(a.teacher_to_train, "card.json")):
      tcfg = _cli.build(teacher.TeacherConfig, dataset=config.dataset, model=a.teacher_model,
                        epochs=a.teacher_epochs, data_dir=config.data_dir)
      teacher.train_teacher(tcfg, a.teacher_to_train, progress=not a.no_progress)
    for tdir in config.teacher_dirs:
      teacher.read_card(tdir, flag="--teacher_dirs", dataset=config.dataset)
    results = dpdfd.train_dpdfd(config, workdir, progress=not a.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=workdir)))


if __name__ == "__main__":
  main()
