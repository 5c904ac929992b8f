"""RONA private model compression: `python -m experiments.rona --dataset=mnist --target_epsilon=8`.

Give `--noise_multiplier` (0: non-private compression run) or `--target_epsilon` (σ calibrated
for all T = (Th + R·Td)·ceil(|x_q|/S) queries). Teachers are trained in the workdir (teacher on
the whole training split, auxiliary teacher on the public split) unless `--teacher_dir` /
`--aux_teacher_dir` name trained ones. Privacy runs use `--public_fraction=0.4`, compression
runs `--public_fraction=0.8`. `--resume` continues an interrupted run in the same workdir.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpkd_jax.methods import rona
from dpkd_jax.train import distributed
from dpkd_jax.train import summary

_FIELDS = {f.name: f for f in dataclasses.fields(rona.RONAConfig)}
# Fields whose default is None: their flag type cannot be read off the default.
_OPTIONAL_TYPES = {"noise_multiplier": float, "target_epsilon": float, "hint_l2_bound": float,
                   "distill_l2_bound": float, "teacher_dir": str, "aux_teacher_dir": str,
                   "seed": int, "data_dir": str}


def parse_config(argv: list[str]) -> tuple[rona.RONAConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit with the config's error message)."""
  p = argparse.ArgumentParser(prog="python -m experiments.rona", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  for name, field in _FIELDS.items():
    if name == "download":
      p.add_argument("--download", action=argparse.BooleanOptionalAction, default=True,
                     help="let tensorflow-datasets download a dataset it lacks (needs internet)")
    elif name in _OPTIONAL_TYPES:
      p.add_argument(f"--{name}", type=_OPTIONAL_TYPES[name], default=None)
    elif field.default is dataclasses.MISSING:
      p.add_argument(f"--{name}", required=True)
    else:
      p.add_argument(f"--{name}", type=type(field.default), default=field.default)
  p.add_argument("--workdir", default=None, help="default runs/rona/<dataset>_<student_model>")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--stop_after_units", type=int, default=None,
                 help="end this invocation (checkpointed) after this many epochs of the schedule")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  try:
    config = rona.RONAConfig(**{name: getattr(args, name) for name in _FIELDS})
  except ValueError as e:
    p.error(str(e))
  if args.workdir is None:
    args.workdir = os.path.join("runs", "rona", f"{config.dataset}_{config.student_model}")
  return config, args


def main(argv: list[str] | None = None) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(sys.argv[1:] if argv is None else argv)
  results = rona.train_rona(config, args.workdir, resume=args.resume,
                            stop_after_units=args.stop_after_units,
                            progress=not args.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=args.workdir)))

if __name__ == "__main__":
  main()
