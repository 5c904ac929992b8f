"""One-run canary audit of a whole training run: `python -m experiments.audit --method=dpsgd
--canaries=1000 --workdir=runs/audit/dpsgd_eps8 -- --dataset=mnist --target_epsilon=8 ...`.

Flags after `--` are the method's own (`python -m experiments.<method> --help`). The audit
draws the canary design (mislabelled private training records, each included with probability
1/2 from the audit key: secret unless --audit_seed), writes the canary training split to
<workdir>/canaries/ (secret), runs the method end to end in <workdir>/run/ (RONA's and
DF-PATE's teachers trained there on the canary data, a recipe's teacher directories replaced;
RONA's canaries only in its sensitive part), scores every canary from the released artefacts
only and writes the audit (ε lower bounds at 95% confidence, AUROC, TPR at 1% FPR) into the
run's record.json, results.json and model card (dpkd_jax/audit, docs/privacy.md "Claimed and
measured"). Threat models: the black-box final model for every method, and also the white-box
last iterate for dpsgd and the generator samples for dpdfd (<workdir>/threat_models/<kind>/
record.json). --method=teacher audits a non-private teacher: the power reference.
--method=dpdfd or srr converts the teacher of a finished teacher audit (--teacher_audit=<its
workdir>) with the same canaries; --method=rona --teacher_audit=<a RONA audit> reuses that
audit's teachers and canaries. Rerunning the same command resumes the run.
"""

from __future__ import annotations

import argparse
import importlib
import os

from dpkd_jax import audit
from dpkd_jax.audit import methods
from experiments import _cli


def parse(argv: list[str]) -> tuple[argparse.Namespace, object]:
  """(the audit's flags, the method's validated config); bad flags exit 2 in one line."""
  cut = argv.index("--") if "--" in argv else len(argv)
  own, method_argv = argv[:cut], argv[cut + 1:]
  p = _cli.Parser(prog="python -m experiments.audit", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--method", required=True, choices=sorted(methods.METHODS),
                 help="the method whose run is audited")
  p.add_argument("--canaries", type=int, default=1000,
                 help="m, the number of canaries (default: 1000)")
  p.add_argument("--audit_seed", type=int, default=None,
                 help="seed of the audit key (default: secret, from OS entropy)")
  p.add_argument("--confidence", type=float, default=0.95,
                 help="confidence of the epsilon lower bounds (default: 0.95)")
  p.add_argument("--teacher_audit", default=None,
                 help="dpdfd, srr: the workdir of a teacher audit; rona: of a RONA audit; "
                      "the run uses its teacher(s) and canaries")
  p.add_argument("--workdir", required=True, help="the audit's directory (canaries/, run/)")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(own)
  if not 0 < args.confidence < 1:
    _cli.fail(f"--confidence must be in (0, 1), got {args.confidence}")
  if args.audit_seed is not None and not 0 <= args.audit_seed < 2**64:
    _cli.fail(f"--audit_seed must be in [0, 2**64), got {args.audit_seed}")
  spec = methods.METHODS[args.method]
  if spec.teacher_flag is not None and args.teacher_audit is None:
    _cli.fail(f"--method={args.method} needs --teacher_audit (its teacher holds the canaries)")
  if args.teacher_audit is not None and args.method not in ("dpdfd", "srr", "rona"):
    _cli.fail("--teacher_audit is given with --method=dpdfd, srr or rona only")
  if spec.teacher_flag is not None:
    method_argv += [f"{spec.teacher_flag}={os.path.join(args.teacher_audit, 'run')}"]
  config, _ = importlib.import_module(spec.cli).parse_config(method_argv)
  return args, config


@_cli.entry_point
def main(argv: list[str]) -> None:
  args, config = parse(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  spec = methods.METHODS[args.method]
  block = audit.run_audit(
      methods.trainer(args.method, config, not args.no_progress, args.teacher_audit),
      workdir=args.workdir, dataset=config.dataset, data_dir=config.data_dir, kinds=spec.kinds,
      m=args.canaries, seed=args.audit_seed, confidence=args.confidence,
      design_from=args.teacher_audit, rows=spec.private_rows(config))
  print(f"audit of {args.method} on {config.dataset}, {block['m']} canaries: epsilon >= "
        f"{block['epsilon_lower_bound']:.3f} (f-DP {block['epsilon_lower_bound_fdp']:.3f}; "
        f"at most {block['epsilon_ceiling']:.2f} measurable) at {block['confidence']:.0%} "
        f"confidence, AUROC {block['auroc']:.3f}, TPR@1%FPR {block['tpr_at_1pct_fpr']:.3f} "
        f"({block['threat']}) -> {os.path.join(args.workdir, 'run', 'record.json')}")


if __name__ == "__main__":
  main()
