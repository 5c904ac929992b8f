"""Train a (non-private) teacher: `python -m experiments.teacher --dataset=mnist --model=small_cnn`.

Multi-teacher ensembles: `--num_shards=10 --shard=3` trains on one of 10 disjoint shards of the
private training split; `--num_shards=10 --all_shards` trains all of them one after another
(workdirs `<workdir>/shard_<i>`). Data: `<dataset>.npz` in --data_dir (else $DPKD_DATA_DIR, else
prepared tensorflow-datasets); `--download` lets tensorflow-datasets fetch it (needs internet).

Bring your own teacher (docs/TEACHERS.md): `python -m experiments.teacher import --from=torch
--arch=resnet18 --checkpoint=model.pt --dataset=cifar10 --input_norm=imagenet --workdir=DIR`
converts a PyTorch state_dict (or, --from=keras, a Keras 3 .keras file) into a teacher workdir.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from dpkd_jax import importers
from dpkd_jax import teacher
from dpkd_jax.train import distributed
from experiments import _cli
from experiments import _flags

_HELP = {
    "dataset": "digits (embedded), mnist, fashion_mnist, cifar10, ...",
    "model": "a name in dpkd_jax.models.CLASSIFIERS",
    "augment": "random crop + flip (default: on for 32x32 colour datasets)",
    "data_dir": "directory of <dataset>.npz files (else $DPKD_DATA_DIR, else tfds)",
    "download": "let tensorflow-datasets download a dataset it lacks (needs internet)",
}


def parse_config(argv: list[str]) -> tuple[teacher.TeacherConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit 2 with the config's one-line message)."""
  p = _cli.Parser(prog="python -m experiments.teacher", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  _flags.add_config_flags(p, teacher.TeacherConfig, help=_HELP,
                          defaults={"dataset": "digits", "model": "small_cnn"},
                          choices={"norm": ["batch", "group", "none"],
                                   "optimizer": ["adam", "sgd"]})
  p.add_argument("--all_shards", action="store_true", help="train every shard in turn")
  p.add_argument("--workdir", default=None, help="output directory (default runs/teacher/<dataset>_<model>)")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(argv)
  config = _flags.build_config(teacher.TeacherConfig, args)
  if args.workdir is None:
    args.workdir = os.path.join("runs", "teacher", f"{config.dataset}_{config.model}")
  return config, args


def _floats(text: str) -> tuple[float, ...]:
  return tuple(float(v) for v in text.split(","))


def import_main(argv: list[str]) -> None:
  """`import`: a PyTorch / Keras file -> a teacher workdir (`importers.import_teacher`)."""
  p = _cli.Parser(prog="python -m experiments.teacher import", description=import_main.__doc__)
  p.add_argument("--from", dest="framework", required=True, choices=sorted(importers.FRAMEWORKS),
                 help="the framework that wrote --checkpoint")
  p.add_argument("--arch", required=True, help="resnet18, resnet34, vgg11_bn, vgg16_bn, "
                 "mobilenet_v2 (torch), lenet5, small_cnn (torch, keras)")
  p.add_argument("--checkpoint", required=True, help="the .pt state_dict or .keras file")
  p.add_argument("--dataset", required=True, help=_HELP["dataset"])
  p.add_argument("--workdir", required=True, help="the new teacher directory")
  p.add_argument("--input_norm", required=True, choices=sorted(importers.INPUT_NORMS) + ["custom"],
                 help="what the teacher was trained on: (x/255 - mean) / std of the dataset's own "
                 "stats, ImageNet's, unit (x/255), half ((x/255 - 0.5) / 0.5), raw (0..255), custom")
  p.add_argument("--input_mean", type=_floats, help="custom: per-channel means, comma separated")
  p.add_argument("--input_std", type=_floats, help="custom: per-channel stds, comma separated")
  p.add_argument("--data_dir", default=None, help=_HELP["data_dir"])
  p.add_argument("--download", action="store_true", help=_HELP["download"])
  args = p.parse_args(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  card = importers.import_teacher(
      framework=args.framework, arch=args.arch, checkpoint=args.checkpoint, dataset=args.dataset,
      workdir=args.workdir, input_norm=args.input_norm, input_mean=args.input_mean,
      input_std=args.input_std, data_dir=args.data_dir, download=args.download)
  print(f"imported {args.framework} {args.arch} as {card['model']} for {card['dataset']}: test "
        f"accuracy {card['test_accuracy']:.4f}, {card['param_count']:,} params -> {args.workdir}")


@_cli.entry_point
def main(argv: list[str]) -> None:
  if argv[:1] == ["import"]:
    return import_main(argv[1:])
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  config, args = parse_config(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  shards = range(config.num_shards) if args.all_shards else [config.shard]
  for shard in shards:
    cfg = dataclasses.replace(config, shard=shard)
    workdir = args.workdir if config.num_shards == 1 else os.path.join(args.workdir, f"shard_{shard}")
    card = teacher.train_teacher(cfg, workdir, progress=not args.no_progress)
    print(f"teacher {cfg.model} on {cfg.dataset} shard {shard}/{cfg.num_shards}: "
          f"test accuracy {card['test_accuracy']:.4f}, {card['param_count']:,} params -> {workdir}")


if __name__ == "__main__":
  main()
