"""Reverse k-NN private labelling: `python -m experiments.rknn --dataset=mnist
--data_dir=/work/shared/data --num_queries=40 --k=1 --epsilon=0.1 --seed=0`.

Private = the training split; public = `--num_public` test images (`--split_seed`), the
rest of the test split evaluates the student. `--mode=local` gives ε per record (local DP).
`--representation=simclr` trains a small SimCLR encoder on the public images first;
`--representation=spectral` clusters the public images' ScatterNet neighbour graph.
Without `--seed` the noise seed is secret (OS entropy). `--resume` continues a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from dpkd_jax import representations
from dpkd_jax.methods import rknn
from dpkd_jax.train import distributed
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _flags
from experiments import _recipes

# The student's flags: its fields, `model` and `norm` prefixed (the run has no model of its own).
_STUDENT_NAMES = {"model": "student_model", "norm": "student_norm"}

# Representation flags -> the config field each sets (one kind each).
_REPRESENTATION_FLAGS = {"pca_components": "num_components", "simclr_steps": "steps",
                         "spectral_components": "components",
                         "graph_neighbours": "graph_neighbours",
                         "extension_neighbours": "extension_neighbours"}


def _representation_overrides(args: argparse.Namespace, config) -> dict[str, int]:
  """The given representation flags as config fields; a flag of another kind exits 2."""
  fields = {f.name for f in dataclasses.fields(config)}
  given = {flag: field for flag, field in _REPRESENTATION_FLAGS.items()
           if getattr(args, flag) is not None}
  for flag in (flag for flag, field in given.items() if field not in fields):
    _cli.fail(f"--{flag} does not apply to --representation={args.representation}")
  return {field: getattr(args, flag) for flag, field in given.items()}


def parse_config(argv: list[str]) -> tuple[rknn.RKNNConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit 2 with the config's one-line message)."""
  p = _cli.Parser(prog="python -m experiments.rknn", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  recipe = _recipes.chosen(argv, rknn.RKNNConfig)
  _recipes.add_flag(p, recipe, "rknn")
  _flags.add_config_flags(p, rknn.RKNNConfig, defaults={"dataset": "digits", **recipe.values},
                          skip={"representation_config", "student"}, notes=recipe.notes)
  p.add_argument("--pca_components", type=int, default=None, help="PCA dimension")
  p.add_argument("--simclr_steps", type=int, default=None, help="SimCLR training steps")
  p.add_argument("--spectral_components", type=int, default=None, help="spectral: eigenvectors")
  p.add_argument("--graph_neighbours", type=int, default=None, help="spectral: graph degree")
  p.add_argument("--extension_neighbours", type=int, default=None,
                 help="spectral: public neighbours averaged to embed any image")
  _flags.add_config_flags(p, rknn.StudentConfig, names=_STUDENT_NAMES, defaults=(
      dataclasses.asdict(recipe.config.student) if recipe.config else None))
  p.add_argument("--workdir", default=None,
                 help="default runs/rknn/<dataset>_<rep>_<mode>_s<s>_k<k>_eps<ε>[_T<rounds>]")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--stop_after_rounds", type=int, default=None, help="end this invocation "
                 "(checkpointed) after this many more rounds, labelling or self-training")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(argv)
  if args.stop_after_rounds is not None and args.stop_after_rounds < 1:
    _cli.fail(f"--stop_after_rounds must be at least 1, got {args.stop_after_rounds}")
  try:  # the recipe's own, unless --representation names another kind
    representation_config = (recipe.config.representation_config if recipe.config and
                             args.representation == recipe.config.representation else
                             representations.default_config(args.representation))
  except ValueError as e:
    _cli.fail(f"--representation: {e}")
  representation_config = _cli.build(dataclasses.replace, representation_config,
                                     **_representation_overrides(args, representation_config))
  student = _flags.build_config(rknn.StudentConfig, args, names=_STUDENT_NAMES)
  config = _flags.build_config(rknn.RKNNConfig, args, student=student,
                               representation_config=representation_config)
  if args.workdir is None:
    args.workdir = os.path.join("runs", "rknn", f"{config.dataset}_{config.representation}_"
                                f"{config.mode}_s{config.num_queries}_k{config.k}_eps"
                                f"{config.epsilon:g}{f'_T{config.rounds}' * (config.rounds > 1)}")
  return config, args


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  results = rknn.train_rknn(config, args.workdir, resume=args.resume, progress=not
                            args.no_progress, stop_after_rounds=args.stop_after_rounds)
  print("\n".join(summary.summary_lines(results, workdir=args.workdir)) if results else
        f"stopped, checkpointed in {args.workdir}: continue with --resume")


if __name__ == "__main__":
  main()
