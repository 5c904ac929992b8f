"""Data-free PATE: disjoint-shard teacher ensemble, procedural queries, noisy vote histograms.

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
import dataclasses
import os
import sys

from dpkd_jax.methods import dfpate
from dpkd_jax.train import summary

_FIELDS = {f.name: f for f in dataclasses.fields(dfpate.DFPATEConfig)}
_OPTIONAL = {"data_dir": str, "target_epsilon": float, "noise_std": float, "seed": int,
             "teachers_dir": str}
_HELP = {
    "target_epsilon": "ε budget of all queries (σ calibrated); 'none' with --noise_std",
    "noise_std": "σ per histogram bin (0 = non-private baseline); default: calibrate",
    "teachers_dir": "save / reuse the trained ensemble here (secret, like the data)",
    "seed": "reproducible run (noise then public); default: secret seed from OS entropy",
}


def _bool(text: str) -> bool:
  if text.lower() not in ("true", "false", "1", "0"):
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
  return text.lower() in ("true", "1")


def _optional(kind):
  return lambda text: None if text.lower() == "none" else kind(text)


def parse_config(argv: list[str]) -> tuple[dfpate.DFPATEConfig, argparse.Namespace]:
  """Flags -> validated config (bad values exit with the config's error message)."""
  p = argparse.ArgumentParser(prog="python -m experiments.dfpate", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  for name, field in _FIELDS.items():
    if name in _OPTIONAL:
      p.add_argument(f"--{name}", type=_optional(_OPTIONAL[name]), default=field.default,
                     help=_HELP.get(name))
    elif field.default is dataclasses.MISSING:
      p.add_argument(f"--{name}", required=True)
    else:
      kind = _bool if isinstance(field.default, bool) else type(field.default)
      p.add_argument(f"--{name}", type=kind, default=field.default, help=_HELP.get(name))
  p.add_argument("--workdir", default=None, help="default runs/dfpate/<dataset>")
  p.add_argument("--resume", action="store_true", help="continue the run in --workdir")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  try:
    config = dfpate.DFPATEConfig(**{name: getattr(args, name) for name in _FIELDS})
  except ValueError as e:
    p.error(str(e))
  if args.workdir is None:
    args.workdir = os.path.join("runs", "dfpate", config.dataset)
  return config, args


def main(argv: list[str] | None = None) -> None:
  config, args = parse_config(sys.argv[1:] if argv is None else argv)
  r = dfpate.train_dfpate(config, args.workdir, resume=args.resume,
                          progress=not args.no_progress)
  print("\n".join(summary.summary_lines(r, workdir=args.workdir)))

if __name__ == "__main__":
  main()
