"""Reverse k-NN private labelling: `python -m experiments.rknn --dataset=mnist
--data_dir=/work/shared/data --num_queries=40 --k=1 --epsilon=0.1 --seed=0`.

Private = the training split; public = `--num_public` test images (`--split_seed`), the
rest of the test split evaluates the student. `--mode=local` gives ε per record (local DP).
`--representation=simclr` trains a small SimCLR encoder on the public images first.
Without `--seed` the noise seed is secret (OS entropy).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpkd_jax import representations
from dpkd_jax.methods import rknn
from dpkd_jax.methods import rknn_student
from dpkd_jax.train import distributed
from dpkd_jax.train import summary


def parse_config(argv: list[str]) -> tuple[rknn.RKNNConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit with the config's error message)."""
  defaults = {f.name: f.default for f in dataclasses.fields(rknn.RKNNConfig)
              if f.default is not dataclasses.MISSING}
  student = rknn_student.StudentConfig()
  p = argparse.ArgumentParser(prog="python -m experiments.rknn", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", default="digits", help="digits (embedded), mnist, ...")
  p.add_argument("--representation", default=defaults["representation"],
                 help=f"one of {sorted(representations.REPRESENTATIONS)}")
  p.add_argument("--pca_components", type=int, default=None, help="PCA dimension")
  p.add_argument("--simclr_steps", type=int, default=None, help="SimCLR training steps")
  p.add_argument("--num_queries", type=int, default=defaults["num_queries"], help="s")
  p.add_argument("--k", type=int, default=defaults["k"])
  p.add_argument("--epsilon", type=float, default=defaults["epsilon"], help="total ε")
  p.add_argument("--mode", default=defaults["mode"], help="central or local")
  p.add_argument("--rounds", type=int, default=defaults["rounds"])
  p.add_argument("--uncertain_fraction", type=float, default=defaults["uncertain_fraction"])
  p.add_argument("--num_public", type=int, default=None, help="default: half the test split")
  p.add_argument("--split_seed", type=int, default=defaults["split_seed"])
  p.add_argument("--student_model", default=student.model)
  p.add_argument("--epochs", type=int, default=student.epochs)
  p.add_argument("--batch_size", type=int, default=student.batch_size)
  p.add_argument("--learning_rate", type=float, default=student.learning_rate)
  p.add_argument("--label_smoothing", type=float, default=student.label_smoothing)
  p.add_argument("--seed", type=int, default=None, help="default: secret (OS entropy)")
  p.add_argument("--data_dir", default=None, help="directory of <dataset>.npz files")
  p.add_argument("--download", action=argparse.BooleanOptionalAction, default=True,
                 help="let tensorflow-datasets download a dataset it lacks (needs internet)")
  p.add_argument("--workdir", default=None,
                 help="default runs/rknn/<dataset>_<rep>_<mode>_s<s>_k<k>_eps<ε>[_T<rounds>]")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  try:
    representation_config = representations.default_config(args.representation)
    overrides = {"num_components": args.pca_components, "steps": args.simclr_steps}
    overrides = {name: value for name, value in overrides.items() if value is not None
                 and name in {f.name for f in dataclasses.fields(representation_config)}}
    config = rknn.RKNNConfig(
        dataset=args.dataset, representation=args.representation,
        representation_config=dataclasses.replace(representation_config, **overrides),
        num_queries=args.num_queries, k=args.k, epsilon=args.epsilon, mode=args.mode,
        rounds=args.rounds, uncertain_fraction=args.uncertain_fraction,
        num_public=args.num_public, split_seed=args.split_seed,
        student=rknn_student.StudentConfig(
            model=args.student_model, epochs=args.epochs, batch_size=args.batch_size,
            learning_rate=args.learning_rate, label_smoothing=args.label_smoothing),
        seed=args.seed, data_dir=args.data_dir, download=args.download)
  except ValueError as e:
    p.error(str(e))
  if args.workdir is None:
    rounds = f"_T{config.rounds}" if config.rounds > 1 else ""
    args.workdir = os.path.join("runs", "rknn", f"{config.dataset}_{config.representation}_"
                                f"{config.mode}_s{config.num_queries}_k{config.k}_"
                                f"eps{config.epsilon:g}{rounds}")
  return config, args


def main(argv: list[str] | None = None) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(sys.argv[1:] if argv is None else argv)
  results = rknn.train_rknn(config, args.workdir, progress=not args.no_progress)
  print("\n".join(summary.summary_lines(results, workdir=args.workdir)))


if __name__ == "__main__":
  main()
