"""`python -m experiments.dpdfd --dry_run [--dry_run_out=FILE] [flags]`: the run the same flags
would start, sized from shapes alone (`dpkd_jax.methods.dpdfd.dry_run`): FLOPs, bytes and
memory per step, steps, and its estimated wall time on one H100 and one TPU v5e chip.

No data set, teacher weight or card is read, nothing is charged and nothing is written but
`--dry_run_out` (the record as JSON). The teacher is `--teacher_model` if given, else the
paper's ResNet-34. Without --noise_multiplier or --target_epsilon σ = 1 stands in: the cost of
a step does not depend on σ (the step count does, under a target ε).
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any, Callable

from dpkd_jax import models
from dpkd_jax.methods.dpdfd import dry_run
from dpkd_jax.train import records
from experiments import _cli

PLACEHOLDER_NOISE = "--noise_multiplier=1"


def _given(argv: list[str], flag: str) -> bool:
  return any(x == flag or x.startswith(flag + "=") for x in argv)


def requested(argv: list[str]) -> bool:
  return _given(argv, "--dry_run") or _given(argv, "--dry_run_out")


def _split(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """(the dry run's own flags: `dry_run`, `dry_run_out`; the run's flags)."""
  p = _cli.Parser(prog="python -m experiments.dpdfd --dry_run", add_help=False,
                  allow_abbrev=False)
  p.add_argument("--dry_run", action="store_true")
  p.add_argument("--dry_run_out", default=None)
  return p.parse_known_args(argv)


def main(argv: list[str],
         parse_config: Callable[[list[str]], tuple[Any, argparse.Namespace]]) -> None:
  """Prints the dry run of the flags `argv` (and writes `--dry_run_out`); `parse_config` is
  `experiments.dpdfd`'s, so every run flag and default is the run's own."""
  own, argv = _split(argv)
  placeholder = not (_given(argv, "--noise_multiplier") or _given(argv, "--target_epsilon"))
  config, flags = parse_config(argv + [PLACEHOLDER_NOISE] * placeholder)
  if config.teacher_ensemble_dir is not None:
    _cli.fail("--dry_run sizes the teachers of --teacher_model, one per --teacher_dirs entry; "
              "it does not read --teacher_ensemble_dir (give --teacher_dirs instead)")
  if own.dry_run_out:
    _cli.check_output_file(own.dry_run_out, "--dry_run_out")
  teacher = flags.teacher_model if _given(argv, "--teacher_model") else dry_run.PAPER_TEACHER
  if teacher not in models.CLASSIFIERS:  # --teacher_dirs given: no teacher config checked it
    _cli.fail(f"--teacher_model={teacher}: choose one of {', '.join(sorted(models.CLASSIFIERS))}")
  record = dry_run.dry_run(config, teacher, num_teachers=len(config.teacher_dirs))
  record.update(command=" ".join(["python -m experiments.dpdfd", *argv, "--dry_run"]),
                sigma_placeholder=placeholder, commit=records.current_commit(),
                date=datetime.date.today().isoformat())
  lines = dry_run.summary_lines(record)
  if placeholder:
    lines.insert(2, f"no --noise_multiplier or --target_epsilon: {PLACEHOLDER_NOISE} stands in "
                    "(a step's cost does not depend on sigma)")
  print("\n".join(lines))
  if own.dry_run_out:
    with open(own.dry_run_out, "w", encoding="utf-8") as f:
      json.dump(record, f, indent=2)
      f.write("\n")
    print("wrote", own.dry_run_out)
