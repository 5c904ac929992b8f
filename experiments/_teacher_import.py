"""`python -m experiments.teacher import`: a PyTorch / Keras model -> a teacher workdir
(`importers.import_teacher`), checked against the source model; docs/TEACHERS.md."""

from __future__ import annotations

import argparse
import json

from dpkd_jax import importers
from dpkd_jax.importers import verify
from experiments import _cli

_DATASET_HELP = "digits (embedded), mnist, fashion_mnist, cifar10, ..."


def _floats(text: str) -> tuple[float, ...]:
  return tuple(float(v) for v in text.split(","))


def _kwargs(text: str) -> dict:
  try:
    value = json.loads(text)
  except ValueError as error:
    raise argparse.ArgumentTypeError(f"not JSON: {error}") from error
  if not isinstance(value, dict):
    raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"num_classes\": 10}'")
  return value


def main(argv: list[str]) -> None:
  """`import`: a PyTorch / Keras model -> a teacher workdir, checked against the source."""
  p = _cli.Parser(prog="python -m experiments.teacher import", description=__doc__)
  p.add_argument("--from", dest="framework", required=True, choices=sorted(importers.FRAMEWORKS),
                 help="the framework that wrote --checkpoint")
  p.add_argument("--arch", required=True, help="graph: any classifier whose operations are "
                 "covered (torch.export program or module, Keras model), run as its graph; or a "
                 "twin: resnet18, resnet34, vgg11_bn, vgg16_bn, mobilenet_v2 (torch), lenet5, "
                 "small_cnn (torch, keras)")
  p.add_argument("--checkpoint", required=True, help="torch: a torch.export .pt2 program, "
                 "TorchScript or a state_dict .pt file; keras: a .keras file")
  p.add_argument("--dataset", required=True, help=_DATASET_HELP)
  p.add_argument("--workdir", required=True, help="the new teacher directory")
  p.add_argument("--input_norm", required=True, choices=sorted(importers.INPUT_NORMS) + ["custom"],
                 help="what the teacher was trained on: (x/255 - mean) / std of the dataset's own "
                 "stats, ImageNet's, unit (x/255), half ((x/255 - 0.5) / 0.5), raw (0..255), custom")
  p.add_argument("--input_mean", type=_floats, help="custom: per-channel means, comma separated")
  p.add_argument("--input_std", type=_floats, help="custom: per-channel stds, comma separated")
  p.add_argument("--torch_module", default=None, help="for a state_dict: package.module:callable "
                 "building the module it loads into (e.g. torchvision.models:resnet18), so that "
                 "the import is checked against it")
  p.add_argument("--torch_module_kwargs", type=_kwargs, default=None,
                 help="JSON keyword arguments of --torch_module, e.g. '{\"num_classes\": 10}'")
  p.add_argument("--unverified_state_dict", action="store_true", help="import a bare state_dict "
                 "without checking it against the source model (the card records it)")
  p.add_argument("--tolerance", type=float, default=verify.TOLERANCE, help="largest relative "
                 f"logit difference to the source model accepted (default {verify.TOLERANCE:g})")
  p.add_argument("--data_dir", default=None, help="directory of <dataset>.npz files")
  p.add_argument("--download", action="store_true", help="let tensorflow-datasets download")
  args = p.parse_args(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  card = importers.import_teacher(
      framework=args.framework, arch=args.arch, checkpoint=args.checkpoint, dataset=args.dataset,
      workdir=args.workdir, input_norm=args.input_norm, input_mean=args.input_mean,
      input_std=args.input_std, data_dir=args.data_dir, download=args.download,
      torch_module=args.torch_module, torch_module_kwargs=args.torch_module_kwargs,
      unverified_state_dict=args.unverified_state_dict, tolerance=args.tolerance)
  check = card["import"]["check"]
  checked = (f"logits within {check['max_relative_logit_difference']:.2g} (relative) of the "
             f"{check['source']}" if check["verified"] else "UNVERIFIED (bare state_dict)")
  print(f"imported {args.framework} {args.arch} as {card['model']} for {card['dataset']}: test "
        f"accuracy {card['test_accuracy']:.4f}, {card['param_count']:,} params, {checked} -> "
        f"{args.workdir}")
