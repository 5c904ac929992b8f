"""The other modes of `python -m experiments.dpdfd`: `--mode=direct` and `sample`.

  python -m experiments.dpdfd --mode=direct --dataset=mnist --noise_multiplier=...  # NOT DP
  python -m experiments.dpdfd sample --workdir=runs/dpdfd/mnist --num=10000
"""

from __future__ import annotations

import os

from dpkd_jax.methods import dpdfd
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _flags
from experiments import _recipes


def parse_direct(argv: list[str]) -> tuple[dpdfd.DirectConfig, str]:
  """`--mode=direct` flags (without it) -> (validated config, workdir)."""
  p = _cli.Parser(prog="python -m experiments.dpdfd --mode=direct", cpu_kernels=True)
  recipe = _recipes.chosen(argv, dpdfd.DirectConfig)
  _recipes.add_flag(p, recipe, "dpdfd")
  _flags.add_config_flags(p, dpdfd.DirectConfig, defaults=recipe.values, notes=recipe.notes)
  p.add_argument("--workdir", default=None,
                 help="the run's directory (default: runs/dpdfd_direct/<dataset>)")
  a = p.parse_args(argv)
  config = _flags.build_config(dpdfd.DirectConfig, a)
  return config, a.workdir or os.path.join("runs", "dpdfd_direct", config.dataset)


def direct(argv: list[str]) -> None:
  """`--mode=direct`: the mechanism on the private data itself (paper Table 4): ε = inf."""
  config, workdir = parse_direct(argv)
  _cli.check_output_dir(workdir, "--workdir")
  results = dpdfd.train_direct(config, workdir)
  print("\n".join(summary.summary_lines(results, workdir=workdir)))


def sample(argv: list[str]) -> None:
  """`sample`: synthetic images from a finished run's generator."""
  p = _cli.Parser(prog="python -m experiments.dpdfd sample")
  p.add_argument("--workdir", required=True, help="a DPDFD run's workdir")
  p.add_argument("--num", type=int, default=10000,
                 help="number of synthetic images (default: %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of the latents (default: %(default)s)")
  p.add_argument("--out", default=None, help="output .npz (default: <workdir>/synthetic.npz)")
  a = p.parse_args(argv)
  if a.num < 1:
    p.error(f"--num must be >= 1, got {a.num}")
  dpdfd.check_run(a.workdir)
  _cli.check_output_file(a.out or os.path.join(a.workdir, "synthetic.npz"),
                         "--out" if a.out else "--workdir")
  print("wrote", dpdfd.sample(a.workdir, a.num, seed=a.seed, out_path=a.out))
