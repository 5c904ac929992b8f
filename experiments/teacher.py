"""Train a (non-private) teacher: `python -m experiments.teacher --dataset=mnist --model=small_cnn`.

Multi-teacher ensembles: `--num_shards=10 --shard=3` trains on one of 10 disjoint shards of the
private training split; `--num_shards=10 --all_shards` trains all of them one after another
(workdirs `<workdir>/shard_<i>`). Data: `<dataset>.npz` in --data_dir (else $DPKD_DATA_DIR, else
prepared tensorflow-datasets); `--download` lets tensorflow-datasets fetch it (needs internet).

Bring your own teacher (docs/TEACHERS.md): `python -m experiments.teacher import --from=torch
--arch=resnet18 --checkpoint=model.pt2 --dataset=cifar10 --input_norm=imagenet --workdir=DIR`
converts a PyTorch model (torch.export program, TorchScript, or a state_dict with the code
that builds it) or, --from=keras, a Keras 3 .keras file into a teacher workdir, checked
against the source model; `--arch=graph` imports any classifier whose operations are covered
(docs/TEACHERS.md#graph-importer).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from dpkd_jax import teacher
from dpkd_jax.train import distributed
from experiments import _cli
from experiments import _flags
from experiments import _teacher_import

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


@_cli.entry_point
def main(argv: list[str]) -> None:
  if argv[:1] == ["import"]:
    return _teacher_import.main(argv[1:])
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
