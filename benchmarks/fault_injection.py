"""Fault injection on the CLIs: kill -9, overwritten checkpoint bytes, a concurrent start, and
missing data offline. Prints what it tried and whether anything was lost.

    PYTHONPATH=. python benchmarks/fault_injection.py [--seed=N] [--workdir=DIR]

Tiny runs on the embedded digits, each a process of its own running `python -m
experiments.<method>`, compared with an uninterrupted run of the same flags and `--seed`. The
runs are forked from one interpreter that has imported the CLIs (`fault_forkserver.py`: the
same code from `main` on, without paying Python's and JAX's start-up in every run; the
file-size-limited run is spawned):
  * kill -9 a DP-SGD, a DPDFD (with a per-class replay memory), a RONA (cosine rates, shifted
    self learning), an SRR (with replay of earlier stages) and a reverse k-NN run (with
    self-training) at a random release (after the k-th charge of the ledger file, plus a
    random delay), then resume: the same final
    arrays (replay buffers and optimizers included), results, metrics.csv and ledger as the
    uninterrupted run; the ledger file, polled throughout, never goes down;
  * overwrite 8 bytes of the newest checkpoint's array file and `--resume`: the run falls back
    to the previous checkpoint and ends as the uninterrupted one; with every checkpoint
    overwritten it is refused in one line (exit 2) and the ledger file is untouched;
  * a second identical run while the first holds the workdir (the first is paused with SIGSTOP
    so that the overlap is certain): one line naming the first's pid, exit 2; the first ends
    as if alone (it is the reference of the kill -9 comparison);
  * a dataset missing offline (`--dataset=mnist --data_dir=<empty>`): one line, exit 2, fast;
  * bad input and a refusing machine, each one line, exit 2 and no ledger charged: a float
    flag beyond representable magnitudes (`--noise_multiplier=1e300`), an npz whose test split
    is empty, a DPDFD batch that cannot fit in memory (`--batch_size=1000000000`), and a file
    size limit (`ulimit -f 40`) the first checkpoint exceeds (the line names the file; the
    ledger then holds only what was released).
`tests/test_fault_injection.py` runs these scenarios in CI, with one of DPDFD, RONA, SRR and
reverse k-NN (drawn by the seed) killed beside DP-SGD; `--methods` picks them here (default:
all four).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# pylint: disable=g-import-not-at-top,wrong-import-position
from fault_harness import (  # noqa: E402  (re-exported: tests use overwrite_array_bytes)
    Outcome, checkpoint, compare, finish, kill_and_resume, ledger_entries, one_line_error,
    overwrite_array_bytes, parallel, run, start, stop_fork_servers, wait_for, _cache_dir)

DPSGD_FLAGS = ["--dataset=digits", "--model=lenet5_half", "--expected_batch_size=64",
               "--noise_multiplier=1", "--steps=60", "--seed=0", "--no-download", "--no_progress"]
DPSGD_RELEASES = 3  # chunks of ceil(1437 / 64) = 23 steps: 23, 23, 14
DPDFD_RELEASES = 3
TEACHER_FLAGS = ["--dataset=digits", "--model=lenet5", "--epochs=1", "--batch_size=64",
                 "--learning_rate=0.003", "--no-download", "--no_progress"]


def dpdfd_flags(teacher_dir: str) -> list[str]:
  return ["--dataset=digits", f"--teacher_dirs={teacher_dir}", "--student_model=lenet5_half",
          "--noise_multiplier=10", "--steps=12", "--batch_size=16", "--eval_every=4",
          "--latent_dim=8", "--generator_channels=16", "--seed=0", "--no_progress",
          # A per-class replay memory, so that kill -9 also covers the buffer's checkpoint.
          "--replay_size=160", "--replay_memory=per_class", "--replay_sampling=class_balanced"]


RONA_RELEASES = 3  # one charge per query epoch: hint, then distillation in each of 2 rounds
SRR_RELEASES = 3  # one charge per stage
RKNN_RELEASES = 3  # one charge per labelling round


def rona_flags(teacher_dir: str) -> list[str]:
  # The auxiliary teacher is trained in the workdir (before the first charge).
  return ["--dataset=digits", f"--teacher_dir={teacher_dir}", "--teacher_model=lenet5_half",
          "--student_model=lenet5_half", "--teacher_epochs=1", "--hint_epochs=1", "--rounds=2",
          "--self_learning_epochs=1", "--distillation_epochs=1", "--num_query_samples=64",
          "--batch_size=32", "--self_learning_batch_size=64", "--noise_multiplier=2",
          "--self_learning_augment", "--learning_rate_schedule=cosine", "--seed=0",
          "--no_progress"]


def srr_flags(teacher_dir: str) -> list[str]:
  # The generator is pretrained in the workdir (before the first charge).
  return ["--dataset=digits", f"--teacher_dir={teacher_dir}", "--epsilon=1",
          "--student_model=lenet5_half", "--generator_channels=8", "--latent_dim=8",
          "--pretrain_steps=2", "--pretrain_batch_size=16", "--stages=3",
          "--samples_per_stage=32", "--batch_size=16", "--student_epochs=2",
          "--student_replay", "--seed=0", "--no_progress"]


def rknn_flags(teacher_dir: str) -> list[str]:
  del teacher_dir  # the private records vote: reverse k-NN has no teacher
  return ["--dataset=digits", "--num_queries=10", "--k=1", "--epsilon=3", "--rounds=3",
          "--uncertain_fraction=0.5", "--kmeans_restarts=1", "--kmeans_iterations=10",
          "--student_model=lenet5_half", "--epochs=1", "--batch_size=32",
          "--self_training_rounds=1", "--seed=0", "--no_progress"]


def concurrent_start(module: str, flags: list[str], workdir: str) -> tuple[Outcome, int]:
  """Run A in `workdir`, paused while B starts there; returns (outcome, A's exit code)."""
  outcome = Outcome(f"concurrent {module}", "a second identical run while the first holds "
                    "the workdir (first paused by SIGSTOP)")
  first = start(module, flags, workdir)
  lock = os.path.join(workdir, ".lock")

  def first_holds_lock() -> bool:
    try:
      with open(lock, encoding="utf-8") as f:
        return json.loads(f.read() or "{}").get("pid") == first.pid
    except (OSError, ValueError):
      return False

  if not wait_for(first_holds_lock, first):
    outcome.problems.append(f"the first run never held {lock} (exit {first.poll()})")
    return outcome, finish(first)[0]
  first.send_signal(signal.SIGSTOP)
  try:
    code, _, err = run(module, flags, workdir)
  finally:
    first.send_signal(signal.SIGCONT)
  outcome.seen = f"second: exit {code}, {err.strip().splitlines()[-1:]}"
  outcome.problems += one_line_error(code, err, f"pid {first.pid}")
  first_code, _, first_err = finish(first)
  if first_code != 0:
    outcome.problems.append(f"the first run failed (exit {first_code}): {first_err[-300:]}")
  return outcome, first_code


def corrupt_and_resume(reference: str, workdir: str, *, every: bool) -> Outcome:
  """A copy of the finished `reference` with its newest (or every) checkpoint overwritten."""
  shutil.copytree(reference, workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  steps = checkpoint.all_steps(ckpt_dir)
  hit = steps if every else steps[-1:]
  for step in hit:
    overwrite_array_bytes(ckpt_dir, step)
  outcome = Outcome("corrupt dpsgd", f"8 bytes of 0xFF in checkpoint(s) {hit} of {steps}, "
                    "then --resume")
  before = ledger_entries(workdir)
  code, _, err = run("dpsgd", [*DPSGD_FLAGS, "--resume"], workdir)
  outcome.seen = f"exit {code}, {err.strip().splitlines()[-1:]}"
  if every:
    outcome.problems += one_line_error(code, err, "no intact checkpoint")
  elif code != 0:
    outcome.problems.append(f"the fallback run failed: {err[-300:]}")
  else:
    outcome.problems += compare(reference, workdir, ("test_accuracy", "test_loss", "epsilon"))
  after = ledger_entries(workdir)
  if after is None or before is None or len(after) < len(before):
    outcome.problems.append(f"ledger went from {len(before or [])} to {len(after or [])} entries")
  return outcome


def offline_missing_data(tmp: str, timeout: float = 90.0) -> Outcome:
  """mnist with an empty --data_dir: must fail at once, in one line, without the network.

  The timeout leaves room for starting Python and JAX on a loaded machine (over 20 s at load
  average 5); a run that tried the network would hang far longer."""
  empty = os.path.join(tmp, "empty_data")
  os.makedirs(empty, exist_ok=True)
  outcome = Outcome("offline dpsgd", "--dataset=mnist --data_dir=<empty dir>")
  started = time.time()
  code, _, err = finish(start("dpsgd", ["--dataset=mnist", f"--data_dir={empty}",
                                        "--noise_multiplier=1", "--steps=1", "--no_progress"],
                              os.path.join(tmp, "offline_run")), timeout=timeout)
  outcome.seen = f"exit {code} after {time.time() - started:.1f} s"
  outcome.problems += one_line_error(code, err, "mnist")
  return outcome


def refused(name: str, module: str, flags: list[str], workdir: str, expect: str, *,
            charged_ok: bool = False, file_size_limit: int | None = None) -> Outcome:
  """One bad-input or refused-write run: one line containing `expect`, exit 2, and no ledger
  charged (`charged_ok`: a run refused mid-way may hold the charges of its releases)."""
  outcome = Outcome(name, f"{module} {' '.join(flags[-2:])}")
  code, _, err = finish(start(module, flags, workdir, file_size_limit=file_size_limit))
  outcome.seen = f"exit {code}, {err.strip().splitlines()[-1:]}"
  outcome.problems += one_line_error(code, err, expect)
  if not charged_ok and ledger_entries(workdir) is not None:
    outcome.problems.append("the ledger was charged")
  return outcome


def bad_input(tmp: str) -> dict[str, Outcome]:
  """The bad-input and refused-write scenarios that need no teacher (sequential, small)."""
  data_dir = os.path.join(tmp, "empty_test_data")
  os.makedirs(data_dir, exist_ok=True)
  np.savez(os.path.join(data_dir, "mnist.npz"), x_train=np.zeros((16, 28, 28, 1), np.uint8),
           y_train=np.arange(16) % 10, x_test=np.zeros((0, 28, 28, 1), np.uint8),
           y_test=np.zeros((0,), np.int64))
  return {
      "overflow_flag": refused("overflow flag", "dpsgd", [
          "--steps=1", "--no_progress", "--noise_multiplier=1e300"],
          os.path.join(tmp, "overflow_run"), "out of range"),
      "empty_test": refused("empty test split", "dpsgd", [
          "--steps=1", "--no_progress", "--expected_batch_size=8", "--noise_multiplier=1",
          "--dataset=mnist", f"--data_dir={data_dir}"],
          os.path.join(tmp, "empty_test_run"), "holds no examples"),
      "file_size_limit": refused(
          "ulimit -f 40", "dpsgd", [*DPSGD_FLAGS[:4], "--steps=12", "--no_progress"],
          os.path.join(tmp, "fsize_run"), "File too large", charged_ok=True,
          file_size_limit=40 * 1024),
  }


KILLED_METHODS = {  # method -> (flags given the teacher's dir, charges in a run, result keys)
    "dpdfd": (dpdfd_flags, DPDFD_RELEASES,
              ("test_accuracy", "epsilon", "steps", "released_rows_per_class",
               "replay_rows_written_per_class", "replay_rows_held_per_class")),
    "rona": (rona_flags, RONA_RELEASES,
             ("test_accuracy", "test_loss", "epsilon", "num_queries_executed", "units_done")),
    "srr": (srr_flags, SRR_RELEASES,
            ("test_accuracy", "labels_epsilon", "num_queries", "record_level_epsilon")),
    "rknn": (rknn_flags, RKNN_RELEASES,
             ("student_accuracy", "label_accuracy", "ledger_epsilon", "per_round")),
}


def run_all(tmp: str, seed: int, methods: tuple[str, ...] = tuple(KILLED_METHODS)
            ) -> dict[str, Outcome]:
  """Every scenario; returns their outcomes by key (concurrent, kill_dpsgd, corrupt,
  all_corrupt, offline, overflow_flag, empty_test, file_size_limit, dpdfd_batch, and
  <method>_ref, kill_<method> for each of `methods`, a subset of dpdfd, rona, srr).

  Streams run in parallel (DP-SGD; a teacher, then one stream per method that reads it), each
  in sequence so that its first run fills a shared JAX compilation cache the others read (same
  programs, compiled once).
  """
  _cache_dir[:] = [os.path.join(tmp, "jax_cache")]
  rng = random.Random(seed)
  rngs = {name: random.Random(rng.getrandbits(64)) for name in ("dpsgd", *KILLED_METHODS)}
  d = {name: os.path.join(tmp, name) for name in (
      "dpsgd_ref", "dpsgd_killed", "dpsgd_corrupt", "dpsgd_all_corrupt", "teacher",
      *(f"{m}_{kind}" for m in methods for kind in ("ref", "killed")))}
  outcomes: dict[str, Outcome] = {}

  def dpsgd():
    outcomes["concurrent"], _ = concurrent_start("dpsgd", DPSGD_FLAGS, d["dpsgd_ref"])
    outcomes["kill_dpsgd"] = kill_and_resume("dpsgd", DPSGD_FLAGS, d["dpsgd_killed"],
                                             DPSGD_RELEASES, rngs["dpsgd"])
    parallel(lambda: outcomes.__setitem__("corrupt", corrupt_and_resume(
        d["dpsgd_ref"], d["dpsgd_corrupt"], every=False)),
             lambda: outcomes.__setitem__("all_corrupt", corrupt_and_resume(
                 d["dpsgd_ref"], d["dpsgd_all_corrupt"], every=True)))

  def reference_then_kill(method: str) -> None:
    flags_of, releases, _ = KILLED_METHODS[method]
    flags = flags_of(d["teacher"])
    code, _, err = run(method, flags, d[f"{method}_ref"])
    outcomes[f"{method}_ref"] = Outcome(f"{method} reference", "an uninterrupted run",
                                        f"exit {code}", [] if code == 0 else [err[-300:]])
    outcomes[f"kill_{method}"] = kill_and_resume(method, flags, d[f"{method}_killed"],
                                                 releases, rngs[method])

  def with_teacher():
    code, _, err = run("teacher", TEACHER_FLAGS, d["teacher"])
    if code != 0:
      for method in methods:
        outcomes[f"kill_{method}"] = Outcome(f"kill -9 {method}", "train a teacher",
                                             problems=[f"teacher failed: {err[-300:]}"])
      return
    def dpdfd_batch():  # a short refusal, beside the method streams rather than after them
      outcomes["dpdfd_batch"] = refused(
          "dpdfd batch beyond memory", "dpdfd",
          [*dpdfd_flags(d["teacher"])[:-3], "--batch_size=1000000000"],  # no replay flags
          os.path.join(tmp, "dpdfd_batch_run"), "--batch_size=1000000000")

    parallel(dpdfd_batch, *(lambda m=m: reference_then_kill(m) for m in methods))

  def offline():
    outcomes["offline"] = offline_missing_data(tmp)
    outcomes.update(bad_input(tmp))

  try:
    parallel(dpsgd, with_teacher, offline)
  finally:
    stop_fork_servers()
  kills = {"dpsgd": ("test_accuracy", "test_loss", "epsilon"),
           **{m: KILLED_METHODS[m][2] for m in methods}}
  for method, keys in kills.items():
    key, ref = f"kill_{method}", d[f"{method}_ref"]
    if key in outcomes and not outcomes[key].problems and os.path.exists(
        os.path.join(ref, "results.json")):
      outcomes[key].problems += compare(ref, d[f"{method}_killed"], keys)
  return outcomes


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seed", type=int, default=None, help="kill points (default: random)")
  p.add_argument("--workdir", default=None, help="keep the runs here (default: a temp dir)")
  p.add_argument("--methods", default=",".join(KILLED_METHODS),
                 help="the methods killed beside DP-SGD (default: all)")
  a = p.parse_args()
  methods = tuple(m for m in a.methods.split(",") if m)
  if set(methods) - set(KILLED_METHODS):
    p.error(f"--methods: choose among {', '.join(KILLED_METHODS)}")
  seed = random.SystemRandom().randrange(2**32) if a.seed is None else a.seed
  tmp = a.workdir or tempfile.mkdtemp(prefix="fault_injection_")
  started = time.time()
  outcomes = run_all(tmp, seed, methods)
  print(f"fault injection (seed {seed}, {time.time() - started:.0f} s, runs in {tmp}):")
  for outcome in outcomes.values():
    print("  " + outcome.line())
  sys.exit(1 if any(o.problems for o in outcomes.values()) else 0)


if __name__ == "__main__":
  main()
