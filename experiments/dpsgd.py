"""DP-SGD baseline: `python -m experiments.dpsgd --dataset=mnist --model=small_cnn --epochs=10
--target_epsilon=3`.

Give `--noise_multiplier` or `--target_epsilon` (z is then calibrated for the whole run), and
`--steps` or `--epochs`. `--resume` continues an interrupted run in the same workdir;
`--stop_at_step` ends an invocation early (checkpointed) to split a long run. `--download` lets
tensorflow-datasets fetch a dataset that is neither in --data_dir nor prepared (needs internet).
`--param_averaging_decay=0.99` evaluates and releases a bias-corrected moving average of the
iterates (same ε), optionally from `--param_averaging_start_step`. `--augmult=4` (with
`--features=scatternet --clipping=vmap`) averages each record's gradient over 4 views of it
(itself and 3 copies shifted by up to `--augmult_max_shift` pixels) before clipping (same ε).
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax.methods import dpsgd
from dpkd_jax.train import distributed
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _flags
from experiments import _recipes


def parse_config(argv: list[str]) -> tuple[dpsgd.DPSGDConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit 2 with the config's one-line message)."""
  p = _cli.Parser(prog="python -m experiments.dpsgd", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  recipe = _recipes.chosen(argv, dpsgd.DPSGDConfig)
  _recipes.add_flag(p, recipe, "dpsgd")
  _flags.add_config_flags(p, dpsgd.DPSGDConfig, notes=recipe.notes, defaults={
      "dataset": "digits", "model": "small_cnn", **recipe.values})
  p.add_argument("--workdir", default=None, help="default runs/dpsgd/<dataset>_<model>")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--stop_at_step", type=int, default=None,
                 help="end this invocation (checkpointed) at this step; --resume continues")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(argv)
  config = _flags.build_config(dpsgd.DPSGDConfig, args)
  if args.workdir is None:
    args.workdir = os.path.join("runs", "dpsgd", f"{config.dataset}_{config.model}")
  return config, args


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  results = dpsgd.train_dpsgd(config, args.workdir, resume=args.resume,
                              stop_at_step=args.stop_at_step, progress=not args.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=args.workdir)))


if __name__ == "__main__":
  main()
