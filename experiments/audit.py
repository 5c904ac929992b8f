"""One-run canary audit of a whole training run: `python -m experiments.audit --method=dpsgd
--canaries=1000 --workdir=runs/audit/dpsgd_eps8 -- --dataset=mnist --target_epsilon=8 ...`.

Flags after `--` are the method's own (`python -m experiments.<method> --help`). The audit
draws the canary design (mislabelled training records, each included with probability 1/2 from
the audit key: secret unless --audit_seed), writes the canary training split to
<workdir>/canaries/ (secret), runs the method end to end in <workdir>/run/, scores every canary
from the released classifier only and writes the audit (ε lower bounds at 95% confidence,
AUROC, TPR at 1% FPR) into the run's record.json, results.json and model card
(dpkd_jax/audit, docs/privacy.md "Claimed and measured"). --method=teacher audits a
non-private teacher: the power reference. --method=dpdfd or srr converts the teacher of a
finished teacher audit (--teacher_audit=<its workdir>) and audits the student with the same
canaries.
Rerunning the same command resumes the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os

from dpkd_jax import audit
from experiments import _cli

# method -> (its CLI module, its train function "module:name", what it releases)
METHODS = {"dpsgd": ("experiments.dpsgd", "dpkd_jax.methods.dpsgd:train_dpsgd", "student"),
           "dpdfd": ("experiments.dpdfd", "dpkd_jax.methods.dpdfd:train_dpdfd", "student"),
           "srr": ("experiments.srr", "dpkd_jax.methods.srr:train_srr", "student"),
           "teacher": ("experiments.teacher", "dpkd_jax.teacher:train_teacher", "teacher")}
# The methods that convert a teacher, and the flag of their CLI that names it.
TEACHER_FLAGS = {"dpdfd": "--teacher_dirs", "srr": "--teacher_dir"}


def _trainer(method: str, config, progress: bool):
  """train(canary_data_dir, run_workdir): the method's run on the canary data (a DP-SGD run
  found there is resumed; the teacher and DPDFD resume on their own)."""
  module, _, name = METHODS[method][1].partition(":")
  train_fn = getattr(importlib.import_module(module), name)

  def train(canary_dir: str, run_dir: str) -> None:
    kwargs = ({"resume": os.path.isdir(os.path.join(run_dir, "checkpoints"))}
              if method in ("dpsgd", "srr") else {})
    train_fn(dataclasses.replace(config, data_dir=canary_dir), run_dir, progress=progress,
             **kwargs)
  return train


def parse(argv: list[str]) -> tuple[argparse.Namespace, object]:
  """(the audit's flags, the method's validated config); bad flags exit 2 in one line."""
  cut = argv.index("--") if "--" in argv else len(argv)
  own, method_argv = argv[:cut], argv[cut + 1:]
  p = _cli.Parser(prog="python -m experiments.audit", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--method", required=True, choices=sorted(METHODS),
                 help="the method whose run is audited")
  p.add_argument("--canaries", type=int, default=1000,
                 help="m, the number of canaries (default: 1000)")
  p.add_argument("--audit_seed", type=int, default=None,
                 help="seed of the audit key (default: secret, from OS entropy)")
  p.add_argument("--confidence", type=float, default=0.95,
                 help="confidence of the epsilon lower bounds (default: 0.95)")
  p.add_argument("--teacher_audit", default=None,
                 help="dpdfd, srr: the workdir of a teacher audit, whose teacher and canaries "
                      "the run uses")
  p.add_argument("--workdir", required=True, help="the audit's directory (canaries/, run/)")
  p.add_argument("--no_progress", action="store_true", help="no progress bars")
  args = p.parse_args(own)
  if not 0 < args.confidence < 1:
    _cli.fail(f"--confidence must be in (0, 1), got {args.confidence}")
  if args.audit_seed is not None and not 0 <= args.audit_seed < 2**64:
    _cli.fail(f"--audit_seed must be in [0, 2**64), got {args.audit_seed}")
  if (args.method in TEACHER_FLAGS) != (args.teacher_audit is not None):
    _cli.fail("--teacher_audit is given with --method=dpdfd or srr, and only then")
  if args.teacher_audit is not None:
    method_argv += [f"{TEACHER_FLAGS[args.method]}={os.path.join(args.teacher_audit, 'run')}"]
  config, _ = importlib.import_module(METHODS[args.method][0]).parse_config(method_argv)
  return args, config


@_cli.entry_point
def main(argv: list[str]) -> None:
  args, config = parse(argv)
  _cli.check_output_dir(args.workdir, "--workdir")
  block = audit.run_audit(_trainer(args.method, config, not args.no_progress),
                          workdir=args.workdir, dataset=config.dataset, data_dir=config.data_dir,
                          kind=METHODS[args.method][2], m=args.canaries, seed=args.audit_seed,
                          confidence=args.confidence, design_from=args.teacher_audit)
  print(f"audit of {args.method} on {config.dataset}, {block['m']} canaries: epsilon >= "
        f"{block['epsilon_lower_bound']:.3f} (f-DP {block['epsilon_lower_bound_fdp']:.3f}; "
        f"at most {block['epsilon_ceiling']:.2f} measurable) at {block['confidence']:.0%} "
        f"confidence, AUROC {block['auroc']:.3f}, TPR@1%FPR {block['tpr_at_1pct_fpr']:.3f} "
        f"-> {os.path.join(args.workdir, 'run', 'record.json')}")


if __name__ == "__main__":
  main()
