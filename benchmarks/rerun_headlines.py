"""Re-runs a headline record with selection on a validation hold-out, over three seeds.

  python -m benchmarks.rerun_headlines dpdfd__mnist__table1_disagreement_paper_eps10_c1e10_3seeds
  python -m benchmarks.rerun_headlines NAME [NAME ...] [--seeds=0,1,2]
      [--validation_examples=N] [--runs_dir=runs/rerun_validation] [--execute]
  python -m benchmarks.rerun_headlines NAME --candidates=OTHER,... --execute

For each named record of docs/results/ it prints (or, with --execute, runs one after another)
the record's own command with `--validation_examples=N` (default by dataset: 5,000 for MNIST,
Fashion-MNIST and CIFAR-10 as DP-SGD's tuning used, 200 for digits), each seed's `--seed` and a
fresh `--workdir`; then `experiments.results publish` of every seed as `<name>_val_s<seed>` and
`experiments.results combine` into `<name>_val` (mean ± std; `selection: "validation"`),
committed beside the old record. Only the hold-out is read during training; the test split is
read once at the end of each run (`dpkd_jax.train.selection`).

The record's flags were chosen by test accuracy; re-running them with fresh seeds and a
hold-out removes the test reads during training and the luck of a seed, not that choice, so
those re-runs are published `--selection=test`. With --candidates, the record and the other
named records (its competing recipes) are each run once (seed 0) with the hold-out, the one of
best validation accuracy (its private diagnostics) is re-run over the seeds and published
`--selection=validation`: the choice among them read only the hold-out (this needs --execute:
the winner is known only after the first runs).

It warns, before anything runs, of what would make the re-run no cleaner than the record: a
record from uncommitted code (`-dirty`), a teacher directory with no teacher record in
docs/results/, and (DPDFD, SRR) that a teacher not trained with the same --validation_examples
has seen the hold-out. --execute refuses a checkout with uncommitted changes (the records would
say -dirty).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESULTS = os.path.join(_ROOT, "docs", "results")
# Hold-out size by dataset when --validation_examples is not given.
DEFAULT_VALIDATION = {"mnist": 5000, "fashion_mnist": 5000, "cifar10": 5000, "digits": 200}
# Flags the re-run sets itself (dropped from the record's command).
_REPLACED = ("--seed", "--workdir", "--validation_examples", "--resume", "--no_progress")
_TEACHER_FLAGS = ("--teacher_dirs", "--teacher_dir", "--teacher_ensemble_dir", "--teachers_dir")


def _flag(arg: str) -> str:
  return arg.split("=", 1)[0]


def rerun_command(command: str, *, seed: int, workdir: str, validation_examples: int) -> str:
  """The record's `command` with the hold-out, `seed` and `workdir` (environment kept)."""
  words = shlex.split(command)
  kept = [w for w in words if _flag(w) not in _REPLACED]
  return " ".join(shlex.quote(w) for w in kept + [
      f"--validation_examples={validation_examples}", f"--seed={seed}",
      f"--workdir={workdir}", "--no_progress"])


def _teacher_dirs(command: str) -> list[str]:
  dirs = []
  for word in shlex.split(command):
    if _flag(word) in _TEACHER_FLAGS and "=" in word:
      dirs += [d for d in word.split("=", 1)[1].split(",") if d]
  return dirs


def warnings_for(record: dict, teacher_records: list[dict]) -> list[str]:
  """What keeps the re-run of `record` from being clean (see the module docstring)."""
  out = []
  if str(record.get("commit") or "").endswith("-dirty"):
    out.append(f"the record ran uncommitted code ({record['commit']}); its re-run will not")
  commands = " ".join(r.get("command", "") + " " + str(r.get("source", ""))
                      for r in teacher_records)
  for directory in _teacher_dirs(record["command"]):
    if os.path.basename(directory.rstrip("/")) not in commands:
      out.append(f"teacher {directory} has no record in docs/results/: train it with "
                 "`python -m experiments.teacher` and publish its record.json first")
    if record["method"] in ("dpdfd", "srr"):
      out.append(f"teacher {directory}: unless trained with the same --validation_examples "
                 "(experiments.teacher), it has seen the hold-out and the student's validation "
                 "accuracy is optimistic (not the test's)")
  return out


def _read(name: str) -> dict:
  with open(os.path.join(_RESULTS, f"{name}.json"), encoding="utf-8") as f:
    return json.load(f)


def plan(name: str, *, seeds: list[int], validation_examples: int | None, runs_dir: str,
         selection: str = "test", command: str | None = None) -> tuple[list[str], list[str]]:
  """(commands in order, warnings) of the seeded re-run of record `name` (or of `command`, a
  candidate chosen for it), published with `selection`."""
  record = _read(name)
  teachers = [_read(os.path.basename(p)[:-len(".json")])
              for p in glob.glob(os.path.join(_RESULTS, "teacher__*.json"))]
  held = validation_examples or DEFAULT_VALIDATION.get(record["dataset"], 5000)
  commands, seed_names = [], []
  for seed in seeds:
    workdir = os.path.join(runs_dir, f"{name}_val_s{seed}")
    seed_names.append(f"{name}_val_s{seed}")
    commands.append(rerun_command(command or record["command"], seed=seed, workdir=workdir,
                                  validation_examples=held))
    commands.append(f"python -m experiments.results publish --run={workdir} "
                    f"--name={seed_names[-1]} --selection={selection}")
  commands.append(f"python -m experiments.results combine --records={','.join(seed_names)} "
                  f"--name={name}_val")
  return commands, warnings_for(record, teachers)


def candidate_runs(name: str, candidates: list[str], *, validation_examples: int | None,
                   runs_dir: str) -> dict[str, tuple[str, str]]:
  """{candidate: (its hold-out run command at seed 0, its workdir)} for choosing `name`'s
  recipe on the hold-out."""
  held = validation_examples or DEFAULT_VALIDATION.get(_read(name)["dataset"], 5000)
  out = {}
  for candidate in [name, *candidates]:
    workdir = os.path.join(runs_dir, f"select_{name}", candidate)
    out[candidate] = (rerun_command(_read(candidate)["command"], seed=0, workdir=workdir,
                                    validation_examples=held), workdir)
  return out


def best_by_validation(workdirs: dict[str, str]) -> str:
  """The candidate whose run has the best validation accuracy (its private diagnostics)."""
  scores = {}
  for candidate, workdir in workdirs.items():
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
      scores[candidate] = json.load(f)["private_diagnostics"]["validation_accuracy"]
  return max(sorted(scores), key=scores.get)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.rerun_headlines", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("names", nargs="+", help="record names in docs/results/ (without .json)")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--validation_examples", type=int, default=None)
  p.add_argument("--runs_dir", default=os.path.join("runs", "rerun_validation"))
  p.add_argument("--candidates", default="", help="competing records to choose among on the "
                 "hold-out (one NAME only; needs --execute)")
  p.add_argument("--execute", action="store_true", help="run the commands (hours each)")
  a = p.parse_args(argv)
  candidates = [c for c in a.candidates.split(",") if c]
  try:
    seeds = [int(s) for s in a.seeds.split(",")]
    if len(seeds) < 2 or (a.validation_examples is not None and a.validation_examples < 1):
      raise ValueError("give at least two seeds and a positive --validation_examples")
    if candidates and (len(a.names) != 1 or not a.execute):
      raise ValueError("--candidates takes one NAME and --execute")
    kw = dict(validation_examples=a.validation_examples, runs_dir=a.runs_dir)
    runs = candidate_runs(a.names[0], candidates, **kw) if candidates else {}
    plans = [] if candidates else [plan(n, seeds=seeds, **kw) for n in a.names]
  except (OSError, ValueError, KeyError) as e:
    print(f"rerun_headlines: {e}", file=sys.stderr)
    return 2
  for commands, warnings in plans:
    print("\n".join([f"# WARNING: {w}" for w in warnings] + commands))
  if not a.execute:
    return 0
  dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_ROOT,
                         capture_output=True, text=True, check=False).stdout.strip()
  if dirty:
    print("rerun_headlines: the checkout has uncommitted changes; commit them first",
          file=sys.stderr)
    return 2
  for command, _ in runs.values():
    subprocess.run(command, shell=True, cwd=_ROOT, check=True)
  if runs:
    winner = best_by_validation({c: w for c, (_, w) in runs.items()})
    print(f"# chosen on the hold-out: {winner}")
    plans = [plan(a.names[0], seeds=seeds, selection="validation",
                  command=_read(winner)["command"], **kw)]
  for commands, _ in plans:
    for command in commands:
      subprocess.run(command, shell=True, cwd=_ROOT, check=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
