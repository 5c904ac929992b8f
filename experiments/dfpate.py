r"""Data-free PATE: disjoint-shard teacher ensemble, procedural queries, noisy vote histograms.

  python -m experiments.dfpate --dataset=mnist --data_dir=../shared/data --target_epsilon=10 \
      --teachers_dir=runs/dfpate/teachers_mnist --workdir=runs/dfpate/mnist_eps10

`--query_source=dp_model` draws the queries from a DP mixture model of the private images
(DP-PCA + DP k-means, released once, charged to the same budget) instead of procedural images.
The printed ε is the sound record-level ε of everything released (query model and all Q noisy
histograms; PLD, δ=--delta).
`--noise_std=0` is the non-private baseline (ε = inf); `--use_teachers=false` never touches the
private data (ε = 0). `--resume` continues the run in --workdir.
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax.methods import dfpate
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _flags
from experiments import _recipes


def parse_config(argv: list[str]) -> tuple[dfpate.DFPATEConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit 2 with the config's one-line message)."""
  p = _cli.Parser(prog="python -m experiments.dfpate", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  recipe = _recipes.chosen(argv, dfpate.DFPATEConfig)
  _recipes.add_flag(p, recipe, "dfpate")
  _flags.add_config_flags(p, dfpate.DFPATEConfig, defaults={**recipe.values},
                          notes=recipe.notes)
  p.add_argument("--workdir", default=None, help="default runs/dfpate/<dataset>")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(argv)
  config = _flags.build_config(dfpate.DFPATEConfig, args)
  if args.workdir is None:
    args.workdir = os.path.join("runs", "dfpate", config.dataset)
  return config, args


@_cli.entry_point
def main(argv: list[str]) -> None:
  config, args = parse_config(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  if config.teachers_dir is not None:
    _cli.check_output_dir(config.teachers_dir, "--teachers_dir")
  r = dfpate.train_dfpate(config, args.workdir, resume=args.resume,
                          progress=not args.no_progress)
  print("\n".join(summary.summary_lines(r, workdir=args.workdir)))

if __name__ == "__main__":
  main()
