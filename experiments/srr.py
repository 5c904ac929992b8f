"""DP-DFD with selective randomized response (label-DP distillation from a data-free generator).

  python -m experiments.srr --dataset=mnist --teacher_dir=runs/teacher/mnist_small_cnn_aug15 \
      --data_dir=../shared/data --epsilon=1 [--generator_prior=teacher|none] [--target_epsilon=...]
  python -m experiments.srr pretrain --dataset=mnist --teacher_dir=... --workdir=runs/srr/gen
      (only the generator pretraining; runs reuse it with --pretrained_generator_dir=runs/srr/gen)

Two privacy figures are always printed together: the paper's ε-label-DP per query, and the
record-level ε w.r.t. the teacher's private data (the composition of every label query; inf
with --generator_prior=teacher, whose generator is a noiseless function of the teacher).
`--generator_terms=ce,ie,bn` picks the pretraining terms (ablation); `--resume` continues.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

from dpkd_jax.methods import srr
from dpkd_jax.train import distributed
from dpkd_jax.train import summary

_FIELDS = {f.name: f for f in dataclasses.fields(srr.SRRConfig)}
_OPTIONAL = {"epsilon": float, "target_epsilon": float, "threshold": float, "seed": int,
             "pretrained_generator_dir": str, "data_dir": str}
_HELP = {
    "epsilon": "ε per query (label DP); inf = no noise; omit to calibrate from --target_epsilon",
    "target_epsilon": "bound on the record-level ε of all label queries composed (PLD)",
    "threshold": "tau of the candidate set (default 1/K)",
    "generator_prior": "teacher (paper; record-level ε = inf) or none (sound)",
    "generator_terms": "comma-separated pretraining terms among ce,ie,bn (ablation)",
    "pretrained_generator_dir": "reuse <another run>/generator_pretrain",
    "seed": "reproducible run (noise then public); default: secret seed from OS entropy",
    "data_dir": "directory of <dataset>.npz (e.g. ../shared/data)",
}


def parse_config(argv: list[str], *, pretrain_only: bool = False,
                 ) -> tuple[srr.SRRConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit with the config's error message)."""
  prog = "python -m experiments.srr" + (" pretrain" if pretrain_only else "")
  suffix = "_generator" if pretrain_only else ""
  p = argparse.ArgumentParser(prog=prog, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  for name, field in _FIELDS.items():
    if name in _OPTIONAL:
      p.add_argument(f"--{name}", type=_OPTIONAL[name], default=None, help=_HELP.get(name))
    elif name == "generator_terms":
      p.add_argument("--generator_terms", default=",".join(field.default), help=_HELP[name])
    elif field.default is dataclasses.MISSING:
      p.add_argument(f"--{name}", required=True)
    else:
      p.add_argument(f"--{name}", type=type(field.default), default=field.default,
                     help=_HELP.get(name))
  p.add_argument("--workdir", default=None, help=f"default runs/srr/<dataset>{suffix}")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  kwargs = {name: getattr(args, name) for name in _FIELDS}
  kwargs["generator_terms"] = tuple(t for t in args.generator_terms.split(",") if t)
  if pretrain_only and kwargs["epsilon"] is None and kwargs["target_epsilon"] is None:
    kwargs["epsilon"] = math.inf  # pretraining asks no label query: no privacy flag needed
  try:
    config = srr.SRRConfig(**kwargs)
  except ValueError as e:
    p.error(str(e))
  if pretrain_only and config.generator_prior != "teacher":
    p.error("only generator_prior='teacher' pretrains a generator")
  if args.workdir is None:
    args.workdir = os.path.join("runs", "srr", config.dataset + suffix)
  return config, args


def main(argv: list[str] | None = None) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["pretrain"]:
    config, args = parse_config(argv[1:], pretrain_only=True)
    srr.pretrain(config, args.workdir, progress=not args.no_progress)
    print(f"pretrained generator -> {args.workdir} (reuse: --pretrained_generator_dir={args.workdir})")
    return
  config, args = parse_config(argv)
  r = srr.train_srr(config, args.workdir, resume=args.resume, progress=not args.no_progress)
  print("\n".join(summary.summary_lines(r, workdir=args.workdir)))


if __name__ == "__main__":
  main()
