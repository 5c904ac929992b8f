"""Export a finished run's student: `python -m experiments.export --run=runs/dpsgd/digits_small_cnn
--format=onnx,stablehlo --out=release/`.

Writes `<out>/student.onnx` (jax2onnx; run by onnxruntime) and/or `<out>/student.stablehlo`
(`jax.export`, serialized; `jax.export.deserialize(...).call(images)`), both with a symbolic
batch dimension, each checked against JAX on the public test images (relative tolerance 1e-4),
and `<out>/model_card.{md,json}`: privacy guarantee and what it does not cover, input format,
files with sha256, CPU latency per image measured now (`--no_latency` skips it). Runs of dpsgd,
dpdfd, srr, rona, rknn and dfpate have a classifier student; other directories are refused,
as is a run whose newest checkpoint spent more epsilon than its results report (a run stopped
after that checkpoint: finish it with --resume first). The card's epsilon covers the exported
checkpoint: every release charged up to it.
ONNX needs `onnx`, `onnxruntime` and `jax2onnx` (setup.cfg extra `export`, then
`pip install --no-deps jax2onnx==0.17.1`).
"""

from __future__ import annotations

import argparse

from dpkd_jax.release import bundle
from experiments import _cli


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = _cli.Parser(prog="python -m experiments.export", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--run", required=True, help="workdir of a finished run")
  p.add_argument("--format", default="onnx,stablehlo",
                 help="onnx, stablehlo or both, comma-separated (default both)")
  p.add_argument("--out", required=True, help="directory for the files and the model card")
  p.add_argument("--no_latency", action="store_true", help="do not measure CPU latency")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per latency figure")
  args = p.parse_args(argv)
  if args.repeats < 1:
    p.error(f"--repeats must be >= 1, got {args.repeats}")
  return args


@_cli.entry_point
def main(argv: list[str]) -> None:
  args = parse_args(argv)
  formats = bundle.check_formats([f.strip() for f in args.format.split(",") if f.strip()])
  bundle.students.check_run(args.run)  # a wrong --run fails before --out is created
  bundle.students.check_covered(args.run)  # as does a checkpoint newer than the results
  _cli.check_output_dir(args.out, "--out")
  done = bundle.export_run(args.run, args.out, formats, measure_latency=not args.no_latency,
                           repeats=args.repeats)
  for entry in done["exports"]:
    check = entry["check"]
    print(f"{entry['format']}: {args.out}/{entry['file']} sha256 {entry['sha256']} "
          f"max abs diff {check['max_abs_diff']:.2e}, rel {check['max_rel_diff']:.2e}")
  print(f"model card: {done['card'][0]}")


if __name__ == "__main__":
  main()
