"""DPDFD: convert a teacher into a DP student (and generator) without touching private data.

  python -m experiments.dpdfd --dataset=mnist --teacher_dirs=runs/teacher/mnist_small_cnn \
      --target_epsilon=10 --noise_multiplier=... [--accounting=sound|paper] [--train_teacher]
  python -m experiments.dpdfd sample --workdir=runs/dpdfd/mnist --num=10000
  python -m experiments.dpdfd --mode=direct --dataset=mnist --noise_multiplier=...  # Table 4, NOT DP
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpkd_jax import teacher
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import dpdfd_direct
from dpkd_jax.train import distributed
from dpkd_jax.train import summary

_FIELDS = {f.name: f for f in dataclasses.fields(dpdfd.DPDFDConfig)}
_OPTIONAL_FLOATS = ("noise_multiplier", "target_epsilon")
_SEED_HELP = "reproducible run (its noise is then public); default: a secret seed from OS entropy"


def _add_config_flags(p: argparse.ArgumentParser) -> None:
  for name, field in _FIELDS.items():
    if name == "teacher_dirs":
      p.add_argument("--teacher_dirs", default=None,
                     help="comma-separated teacher workdirs (default: train one, see --train_teacher)")
    elif name in _OPTIONAL_FLOATS:
      p.add_argument(f"--{name}", type=float, default=None)
    elif name == "seed":
      p.add_argument("--seed", type=int, default=None, help=_SEED_HELP)
    elif name == "data_dir":
      p.add_argument("--data_dir", default=None, help="directory of <dataset>.npz (else $DPKD_DATA_DIR/tfds)")
    elif field.default is dataclasses.MISSING:
      p.add_argument(f"--{name}", required=True)
    else:
      p.add_argument(f"--{name}", type=type(field.default), default=field.default)


def _direct(argv: list[str]) -> None:
  """`--mode=direct`: the mechanism on private data (paper Table 4); reports ε = inf."""
  p = argparse.ArgumentParser(prog="python -m experiments.dpdfd --mode=direct")
  for f in dataclasses.fields(dpdfd_direct.DirectConfig):
    default = None if f.default is dataclasses.MISSING else f.default
    kind = {"seed": int, "max_batch_size": int, "noise_multiplier": float}.get(
        f.name, str if default is None else type(default))
    p.add_argument(f"--{f.name}", required=f.default is dataclasses.MISSING, default=default,
                   type=kind)
  p.add_argument("--workdir", default=None)
  a = p.parse_args(argv)
  try:
    config = dpdfd_direct.DirectConfig(**{f.name: getattr(a, f.name)
                                          for f in dataclasses.fields(dpdfd_direct.DirectConfig)})
  except ValueError as e:
    p.error(str(e))
  workdir = a.workdir or os.path.join("runs", "dpdfd_direct", config.dataset)
  r = dpdfd_direct.train_direct(config, workdir)
  print("\n".join(summary.summary_lines(r, workdir=workdir)))


def main(argv: list[str] | None = None) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  argv = sys.argv[1:] if argv is None else argv
  if "--mode=direct" in argv:
    return _direct([x for x in argv if x != "--mode=direct"])
  if argv[:1] == ["sample"]:
    p = argparse.ArgumentParser(prog="python -m experiments.dpdfd sample")
    p.add_argument("--workdir", required=True)
    p.add_argument("--num", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv[1:])
    print("wrote", dpdfd.sample(a.workdir, a.num, seed=a.seed, out_path=a.out))
    return
  p = argparse.ArgumentParser(prog="python -m experiments.dpdfd", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  _add_config_flags(p)
  p.add_argument("--train_teacher", action="store_true",
                 help="first train a teacher with experiments.teacher defaults (--teacher_model)")
  p.add_argument("--teacher_model", default="small_cnn")
  p.add_argument("--teacher_epochs", type=int, default=5)
  p.add_argument("--workdir", default=None, help="default runs/dpdfd/<dataset>")
  p.add_argument("--no_progress", action="store_true")
  a = p.parse_args(argv)
  workdir = a.workdir or os.path.join("runs", "dpdfd", a.dataset)
  if a.teacher_dirs is None:
    if not a.train_teacher:
      p.error("give --teacher_dirs (from `python -m experiments.teacher`) or --train_teacher")
    tdir = os.path.join(workdir, "teacher")
    tcfg = teacher.TeacherConfig(dataset=a.dataset, model=a.teacher_model, epochs=a.teacher_epochs,
                                 data_dir=a.data_dir)
    if not os.path.exists(os.path.join(tdir, "card.json")):
      teacher.train_teacher(tcfg, tdir, progress=not a.no_progress)
    a.teacher_dirs = tdir
  kwargs = {k: getattr(a, k) for k in _FIELDS}
  kwargs["teacher_dirs"] = tuple(d for d in a.teacher_dirs.split(",") if d)
  try:
    config = dpdfd.DPDFDConfig(**kwargs)
  except ValueError as e:
    p.error(str(e))
  results = dpdfd.train_dpdfd(config, workdir, progress=not a.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=workdir)))


if __name__ == "__main__":
  main()
