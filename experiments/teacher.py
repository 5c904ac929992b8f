"""Train a (non-private) teacher: `python -m experiments.teacher --dataset=mnist --model=small_cnn`.

Multi-teacher ensembles: `--num_shards=10 --shard=3` trains on one of 10 disjoint shards of the
private training split; `--num_shards=10 --all_shards` trains all of them one after another
(workdirs `<workdir>/shard_<i>`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpkd_jax import teacher
from dpkd_jax.train import distributed


def parse_config(argv: list[str]) -> tuple[teacher.TeacherConfig, argparse.Namespace]:
  defaults = {f.name: f.default for f in dataclasses.fields(teacher.TeacherConfig)
              if f.default is not dataclasses.MISSING}
  p = argparse.ArgumentParser(prog="python -m experiments.teacher", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", default="digits", help="digits (embedded), mnist, fashion_mnist, cifar10, ...")
  p.add_argument("--model", default="small_cnn", help="a name in dpkd_jax.models.CLASSIFIERS")
  p.add_argument("--norm", default=defaults["norm"], choices=["batch", "group", "none"])
  p.add_argument("--epochs", type=int, default=defaults["epochs"])
  p.add_argument("--batch_size", type=int, default=defaults["batch_size"])
  p.add_argument("--optimizer", default=defaults["optimizer"], choices=["adam", "sgd"])
  p.add_argument("--learning_rate", type=float, default=defaults["learning_rate"])
  p.add_argument("--weight_decay", type=float, default=defaults["weight_decay"])
  p.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                 help="random crop + flip (default: on for 32x32 colour datasets)")
  p.add_argument("--num_shards", type=int, default=1)
  p.add_argument("--shard", type=int, default=0)
  p.add_argument("--all_shards", action="store_true", help="train every shard in turn")
  p.add_argument("--shard_seed", type=int, default=0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--data_dir", default=None, help="directory of <dataset>.npz files (else $DPKD_DATA_DIR, else tfds)")
  p.add_argument("--download", action=argparse.BooleanOptionalAction, default=True,
                 help="let tensorflow-datasets download a dataset it lacks (needs internet)")
  p.add_argument("--workdir", default=None, help="output directory (default runs/teacher/<dataset>_<model>)")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  try:
    config = teacher.TeacherConfig(
        dataset=args.dataset, model=args.model, norm=args.norm, epochs=args.epochs,
        batch_size=args.batch_size, optimizer=args.optimizer, learning_rate=args.learning_rate,
        weight_decay=args.weight_decay, augment=args.augment, num_shards=args.num_shards,
        shard=args.shard, shard_seed=args.shard_seed, seed=args.seed, data_dir=args.data_dir,
        download=args.download)
  except ValueError as e:
    p.error(str(e))
  if args.workdir is None:
    args.workdir = os.path.join("runs", "teacher", f"{config.dataset}_{config.model}")
  return config, args


def main(argv: list[str] | None = None) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(sys.argv[1:] if argv is None else argv)
  shards = range(config.num_shards) if args.all_shards else [config.shard]
  for shard in shards:
    cfg = dataclasses.replace(config, shard=shard)
    workdir = args.workdir if config.num_shards == 1 else os.path.join(args.workdir, f"shard_{shard}")
    card = teacher.train_teacher(cfg, workdir, progress=not args.no_progress)
    print(f"teacher {cfg.model} on {cfg.dataset} shard {shard}/{cfg.num_shards}: "
          f"test accuracy {card['test_accuracy']:.4f}, {card['param_count']:,} params -> {workdir}")


if __name__ == "__main__":
  main()
