"""DP-SGD baseline: `python -m experiments.dpsgd --dataset=mnist --model=small_cnn --epochs=10
--target_epsilon=3`.

Give `--noise_multiplier` or `--target_epsilon` (z is then calibrated for the whole run), and
`--steps` or `--epochs`. `--resume` continues an interrupted run in the same workdir;
`--stop_at_step` ends an invocation early (checkpointed) to split a long run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpkd_jax.methods import dpsgd
from dpkd_jax.train import distributed
from dpkd_jax.train import summary


def parse_config(argv: list[str]) -> tuple[dpsgd.DPSGDConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit with the config's error message)."""
  defaults = {f.name: f.default for f in dataclasses.fields(dpsgd.DPSGDConfig)
              if f.default is not dataclasses.MISSING}
  p = argparse.ArgumentParser(prog="python -m experiments.dpsgd", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", default="digits", help="digits (embedded), mnist, cifar10, ...")
  p.add_argument("--model", default="small_cnn", help="a name in dpkd_jax.models.CLASSIFIERS")
  p.add_argument("--norm", default=defaults["norm"], help="group or none (batch is rejected)")
  p.add_argument("--expected_batch_size", type=int, default=defaults["expected_batch_size"])
  p.add_argument("--max_batch_size", type=int, default=None, help="padded batch (default: auto)")
  p.add_argument("--l2_clip_norm", type=float, default=defaults["l2_clip_norm"])
  p.add_argument("--noise_multiplier", type=float, default=None)
  p.add_argument("--target_epsilon", type=float, default=None)
  p.add_argument("--delta", type=float, default=defaults["delta"])
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--epochs", type=float, default=None)
  p.add_argument("--optimizer", default=defaults["optimizer"], help="sgd or adam")
  p.add_argument("--learning_rate", type=float, default=defaults["learning_rate"])
  p.add_argument("--momentum", type=float, default=defaults["momentum"])
  p.add_argument("--seed", type=int, default=None,
                 help="reproducible run (noise then public); default: secret seed from OS entropy")
  p.add_argument("--data_dir", default=None, help="directory of <dataset>.npz files")
  p.add_argument("--download", action=argparse.BooleanOptionalAction, default=True,
                 help="let tensorflow-datasets download a dataset it lacks (needs internet)")
  p.add_argument("--workdir", default=None, help="default runs/dpsgd/<dataset>_<model>")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--stop_at_step", type=int, default=None)
  p.add_argument("--log_private_diagnostics", action="store_true",
                 help="also write the training loss/accuracy/clipping of the private batches to "
                      "private_diagnostics.csv (noiseless: NOT covered by ε, never publish)")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  try:
    config = dpsgd.DPSGDConfig(
        dataset=args.dataset, model=args.model, norm=args.norm,
        expected_batch_size=args.expected_batch_size, max_batch_size=args.max_batch_size,
        l2_clip_norm=args.l2_clip_norm,
        noise_multiplier=args.noise_multiplier, target_epsilon=args.target_epsilon,
        delta=args.delta, steps=args.steps, epochs=args.epochs, optimizer=args.optimizer,
        learning_rate=args.learning_rate, momentum=args.momentum, seed=args.seed,
        data_dir=args.data_dir, download=args.download,
        log_private_diagnostics=args.log_private_diagnostics)
  except ValueError as e:
    p.error(str(e))
  if args.workdir is None:
    args.workdir = os.path.join("runs", "dpsgd", f"{config.dataset}_{config.model}")
  return config, args


def main(argv: list[str] | None = None) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(sys.argv[1:] if argv is None else argv)
  results = dpsgd.train_dpsgd(config, args.workdir, resume=args.resume,
                              stop_at_step=args.stop_at_step, progress=not args.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=args.workdir)))


if __name__ == "__main__":
  main()
