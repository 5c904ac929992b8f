r"""DP-DFD with selective randomized response (label-DP distillation from a data-free generator).

  python -m experiments.srr --dataset=mnist --teacher_dir=runs/teacher/mnist_small_cnn_aug15 \
      --data_dir=../shared/data --epsilon=1 [--generator_prior=teacher|none] [--target_epsilon=...]
  python -m experiments.srr pretrain --dataset=mnist --teacher_dir=... --workdir=runs/srr/gen
      (only the generator pretraining; runs reuse it with --pretrained_generator_dir=runs/srr/gen)

Two privacy figures are always printed together: the paper's ε-label-DP per query, and the
record-level ε w.r.t. the teacher's private data (the composition of every label query; inf
with --generator_prior=teacher, whose generator is a noiseless function of the teacher).
`--generator_terms=ce,ie,bn` picks the pretraining terms (ablation); `--student_replay` trains the
student on every stage's released labels so far (post-processing); `--resume` continues.
Recipes are files, `--config=configs/srr/<name>.py` (the record each reproduces, its command and
time); a flag given overrides it. Without --config the run starts from configs/srr/mnist_eps10.py
(the engine of best test accuracy at ε = 10, selected on the test split) for every --dataset;
where plain RR at --epsilon keeps under half of the labels, configs/srr/mnist_eps1.py's engine
learned better (the CLI says so).
"""

from __future__ import annotations

import argparse
import math
import os

from configs import srr as srr_recipes
from dpkd_jax import errors
from dpkd_jax import teacher
from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import config as srr_config
from dpkd_jax.methods.srr import summary as srr_summary
from dpkd_jax.train import distributed
from experiments import _cli
from experiments import _flags
from experiments import _recipes


def parse_config(argv: list[str], *, pretrain_only: bool = False,
                 ) -> tuple[srr.SRRConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit 2 with the config's one-line message)."""
  prog = "python -m experiments.srr" + (" pretrain" if pretrain_only else "")
  suffix = "_generator" if pretrain_only else ""
  p = _cli.Parser(prog=prog, description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  recipe = _recipes.chosen(argv, srr.SRRConfig, srr_recipes.DEFAULT)
  _recipes.add_flag(p, recipe, "srr")
  _flags.add_config_flags(p, srr.SRRConfig, defaults=recipe.values, notes=recipe.notes)
  p.add_argument("--workdir", default=None, help=f"default runs/srr/<dataset>{suffix}")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(argv)
  if pretrain_only and not {"epsilon", "target_epsilon"} & _recipes.given(argv, srr.SRRConfig):
    args.epsilon, args.target_epsilon = math.inf, None  # no label query: no privacy flag
  config = _flags.build_config(srr.SRRConfig, args)
  if (not pretrain_only and recipe.path != srr_recipes.NOISY_LABELS
      and srr_config.labels_mostly_noise(config.epsilon, config.info.num_classes)):
    print(f"note: plain RR at epsilon {config.epsilon:g} keeps under half of the labels; "
          f"{srr_recipes.NOISY_LABELS} is the engine measured there")
  if pretrain_only and config.generator_prior != "teacher":
    p.error("only generator_prior='teacher' pretrains a generator")
  if args.workdir is None:
    args.workdir = os.path.join("runs", "srr", config.dataset + suffix)
  return config, args


def _check_inputs(config: srr.SRRConfig, args: argparse.Namespace) -> None:
  """One-line errors for a wrong --teacher_dir, --pretrained_generator_dir or --workdir."""
  teacher.read_card(config.teacher_dir, flag="--teacher_dir", dataset=config.dataset)
  generator_dir = config.pretrained_generator_dir
  if generator_dir is not None and not os.path.isdir(os.path.join(generator_dir, "checkpoints")):
    raise errors.UserError(
        f"--pretrained_generator_dir: {generator_dir!r} holds no pretrained generator "
        "(no checkpoints/); give the --workdir of `python -m experiments.srr pretrain` or "
        "<another run>/generator_pretrain")
  _cli.check_output_dir(args.workdir, "--workdir")


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  if argv[:1] == ["pretrain"]:
    config, args = parse_config(argv[1:], pretrain_only=True)
    _check_inputs(config, args)
    srr.pretrain(config, args.workdir, progress=not args.no_progress)
    print(f"pretrained generator -> {args.workdir} (reuse: --pretrained_generator_dir={args.workdir})")
    return
  config, args = parse_config(argv)
  _check_inputs(config, args)
  r = srr.train_srr(config, args.workdir, resume=args.resume, progress=not args.no_progress)
  print("\n".join(srr_summary.summary_lines(r, workdir=args.workdir)))


if __name__ == "__main__":
  main()
