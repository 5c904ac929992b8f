"""Fault injection on the CLIs: kill -9, overwritten checkpoint bytes, a concurrent start, and
missing data offline. Prints what it tried and whether anything was lost.

    PYTHONPATH=. python benchmarks/fault_injection.py [--seed=N] [--workdir=DIR]

Tiny runs on the embedded digits (`python -m experiments.<method>` subprocesses), each compared
with an uninterrupted run of the same flags and `--seed`:
  * kill -9 a DP-SGD and a DPDFD run (with a per-class replay memory) at a random release
    (after the k-th charge of the ledger file, plus a random delay), then `--resume`: the same
    final arrays (the replay buffer included), results, metrics.csv and ledger as the
    uninterrupted run; the ledger file, polled throughout, never goes down;
  * overwrite 8 bytes of the newest checkpoint's array file and `--resume`: the run falls back
    to the previous checkpoint and ends as the uninterrupted one; with every checkpoint
    overwritten it is refused in one line (exit 2) and the ledger file is untouched;
  * a second identical run while the first holds the workdir (the first is paused with SIGSTOP
    so that the overlap is certain): one line naming the first's pid, exit 2; the first ends
    as if alone (it is the reference of the kill -9 comparison);
  * a dataset missing offline (`--dataset=mnist --data_dir=<empty>`): one line, exit 2, fast.
`tests/test_fault_injection.py` runs these scenarios in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dpkd_jax.train import checkpoint  # noqa: E402  pylint: disable=g-import-not-at-top

TIMEOUT_S = 240
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


@dataclasses.dataclass
class Outcome:
  """One scenario: what was tried, what was seen, and the problems found (none: nothing lost)."""

  name: str
  tried: str
  seen: str = ""
  problems: list[str] = dataclasses.field(default_factory=list)

  def line(self) -> str:
    verdict = "ok" if not self.problems else "LOST: " + "; ".join(self.problems)
    return f"{self.name}: {self.tried} -> {self.seen} [{verdict}]"


CACHE_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
_cache_dir: list[str] = []  # set by `run_all`: runs after the first of a kind skip compiling


def start(module: str, flags: list[str], workdir: str) -> subprocess.Popen:
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  if _cache_dir:
    env.update(CACHE_ENV, JAX_COMPILATION_CACHE_DIR=_cache_dir[0])
  return subprocess.Popen([sys.executable, "-m", f"experiments.{module}", *flags,
                           f"--workdir={workdir}"], cwd=str(REPO), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> tuple[int, str, str]:
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate()
    return -999, out, err + f"\n(timed out after {timeout} s)"
  return proc.returncode, out, err


def run(module: str, flags: list[str], workdir: str) -> tuple[int, str, str]:
  return finish(start(module, flags, workdir))


def ledger_entries(workdir: str) -> list[dict[str, Any]] | None:
  try:
    with open(os.path.join(workdir, "privacy_ledger.json"), encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError):
    return None
  return data["entries"]


class LedgerWatch(threading.Thread):
  """Polls a workdir's ledger file and keeps every entry count it sees (it must never drop)."""

  def __init__(self, workdir: str):
    super().__init__(daemon=True)
    self.workdir, self.counts, self._done = workdir, [], threading.Event()

  def run(self) -> None:
    while not self._done.is_set():
      entries = ledger_entries(self.workdir)
      if entries is not None and (not self.counts or self.counts[-1] != len(entries)):
        self.counts.append(len(entries))
      time.sleep(0.01)

  def stop(self) -> list[int]:
    self._done.set()
    self.join()
    return self.counts


def wait_for(predicate, proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> bool:
  """Polls `predicate` every 10 ms while `proc` lives; False if it ended first."""
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if predicate():
      return True
    time.sleep(0.01)
  return False


TRACEBACK_NOT_LINE = "the UserError came as a traceback (exit 1), not one line (exit 2)"


def one_line_error(code: int, err: str, expect: str) -> list[str]:
  """Problems of an expected user error: exit 2, one stderr line containing `expect`."""
  lines = [line for line in err.splitlines() if line.strip()]
  if (code == 1 and lines and lines[-1].startswith("dpkd_jax.") and "Error: " in lines[-1]
      and expect in lines[-1]):
    return [TRACEBACK_NOT_LINE]  # the right error, not yet printed by the CLI as one line
  problems = [] if code == 2 else [f"exit {code}, not 2"]
  if len(lines) != 1:
    problems.append(f"{len(lines)} stderr lines, not 1 (last: {lines[-1:]})")
  if expect not in err:
    problems.append(f"stderr lacks {expect!r}")
  return problems


def compare(reference: str, other: str, keys: tuple[str, ...]) -> list[str]:
  """Differences of `other` from `reference`: results, final arrays, metrics.csv, ledger."""
  problems = []
  results = []
  for workdir in (reference, other):
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
      results.append(json.load(f))
  problems += [f"results[{k}] {results[1].get(k)!r} != {results[0].get(k)!r}"
               for k in keys if results[0].get(k) != results[1].get(k)]
  a, b = (checkpoint.read_verified(os.path.join(w, "checkpoints")) for w in (reference, other))
  leaves_a, leaves_b = (checkpoint._leaves_by_path(v.arrays) for v in (a, b))  # pylint: disable=protected-access
  if a.step != b.step or leaves_a.keys() != leaves_b.keys() or not all(
      np.array_equal(leaves_a[p], leaves_b[p]) for p in leaves_a):
    problems.append(f"final checkpoint arrays differ (steps {a.step}, {b.step})")
  metrics = [pathlib.Path(w, "metrics.csv").read_text() for w in (reference, other)]
  if metrics[0] != metrics[1]:
    problems.append("metrics.csv differs (duplicate or missing rows)")
  if ledger_entries(reference) != ledger_entries(other):
    problems.append(f"ledger entries differ: {len(ledger_entries(other) or [])} vs "
                    f"{len(ledger_entries(reference) or [])}")
  return problems


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


def kill_and_resume(module: str, flags: list[str], workdir: str, releases: int,
                    rng: random.Random) -> Outcome:
  """kill -9 after the k-th charge (+ a random delay), then resume to the end."""
  k, delay = rng.randint(1, releases), rng.uniform(0.0, 0.3)
  outcome = Outcome(f"kill -9 {module}", f"SIGKILL {delay:.2f} s after charge {k} of "
                    f"{releases}, then --resume")
  watch = LedgerWatch(workdir)
  watch.start()
  proc = start(module, flags, workdir)
  charged = wait_for(lambda: len(ledger_entries(workdir) or []) >= k, proc)
  time.sleep(delay if charged else 0.0)
  if proc.poll() is None:
    proc.send_signal(signal.SIGKILL)
  killed = finish(proc)[0] == -signal.SIGKILL
  at_kill = len(ledger_entries(workdir) or [])
  # DPDFD always resumes a workdir it finds; the other CLIs need --resume.
  code, _, err = run(module, [*flags, "--resume"] if module != "dpdfd" else flags, workdir)
  counts = watch.stop()
  outcome.seen = (f"killed with {at_kill} charge(s) in the file" if killed
                  else "the run ended before the kill") + f"; resume exit {code}"
  if code != 0:
    outcome.problems.append(f"resume failed: {err[-300:]}")
  if any(b < a for a, b in zip(counts, counts[1:])):
    outcome.problems.append(f"the ledger went down: entry counts {counts}")
  return outcome


def overwrite_array_bytes(ckpt_dir: str, step: int) -> str:
  """8 bytes of 0xFF in the middle of the step's largest array data file; returns the file."""
  root = os.path.join(ckpt_dir, str(step), "arrays")
  data = max((os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
              if os.path.basename(d) == "d"), key=os.path.getsize)
  with open(data, "r+b") as f:
    f.seek(os.path.getsize(data) // 2)
    f.write(b"\xff" * 8)
  return data


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


def parallel(*functions) -> None:
  """Calls the functions in threads (their subprocesses overlap) and waits for all."""
  threads = [threading.Thread(target=f) for f in functions]
  for t in threads:
    t.start()
  for t in threads:
    t.join()


def run_all(tmp: str, seed: int) -> dict[str, Outcome]:
  """Every scenario; returns their outcomes by key (concurrent, kill_dpsgd, corrupt,
  all_corrupt, dpdfd_ref, kill_dpdfd, offline).

  Two streams run in parallel (DP-SGD; teacher then DPDFD), each in sequence so that its first
  run fills a shared JAX compilation cache the others read (same programs, compiled once).
  """
  _cache_dir[:] = [os.path.join(tmp, "jax_cache")]
  rng = random.Random(seed)
  rngs = [random.Random(rng.getrandbits(64)) for _ in range(2)]
  d = {name: os.path.join(tmp, name) for name in (
      "dpsgd_ref", "dpsgd_killed", "dpsgd_corrupt", "dpsgd_all_corrupt", "teacher", "dpdfd_ref",
      "dpdfd_killed")}
  outcomes: dict[str, Outcome] = {}

  def dpsgd():
    outcomes["concurrent"], _ = concurrent_start("dpsgd", DPSGD_FLAGS, d["dpsgd_ref"])
    outcomes["kill_dpsgd"] = kill_and_resume("dpsgd", DPSGD_FLAGS, d["dpsgd_killed"],
                                             DPSGD_RELEASES, rngs[0])
    parallel(lambda: outcomes.__setitem__("corrupt", corrupt_and_resume(
        d["dpsgd_ref"], d["dpsgd_corrupt"], every=False)),
             lambda: outcomes.__setitem__("all_corrupt", corrupt_and_resume(
                 d["dpsgd_ref"], d["dpsgd_all_corrupt"], every=True)))

  def dpdfd():
    code, _, err = run("teacher", TEACHER_FLAGS, d["teacher"])
    if code != 0:
      outcomes["kill_dpdfd"] = Outcome("kill -9 dpdfd", "train a teacher",
                                       problems=[f"teacher failed: {err[-300:]}"])
      return
    flags = dpdfd_flags(d["teacher"])

    code, _, err = run("dpdfd", flags, d["dpdfd_ref"])
    outcomes["dpdfd_ref"] = Outcome("dpdfd reference", "an uninterrupted run", f"exit {code}",
                                    [] if code == 0 else [err[-300:]])
    outcomes["kill_dpdfd"] = kill_and_resume("dpdfd", flags, d["dpdfd_killed"],
                                             DPDFD_RELEASES, rngs[1])

  def offline():
    outcomes["offline"] = offline_missing_data(tmp)

  parallel(dpsgd, dpdfd, offline)
  for key, ref, killed, keys in (
      ("kill_dpsgd", "dpsgd_ref", "dpsgd_killed", ("test_accuracy", "test_loss", "epsilon")),
      ("kill_dpdfd", "dpdfd_ref", "dpdfd_killed",
       ("test_accuracy", "epsilon", "steps", "released_rows_per_class",
        "replay_rows_written_per_class", "replay_rows_held_per_class"))):
    if key in outcomes and not outcomes[key].problems and os.path.exists(
        os.path.join(d[ref], "results.json")):
      outcomes[key].problems += compare(d[ref], d[killed], keys)
  return outcomes


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seed", type=int, default=None, help="kill points (default: random)")
  p.add_argument("--workdir", default=None, help="keep the runs here (default: a temp dir)")
  a = p.parse_args()
  seed = random.SystemRandom().randrange(2**32) if a.seed is None else a.seed
  tmp = a.workdir or tempfile.mkdtemp(prefix="fault_injection_")
  started = time.time()
  outcomes = run_all(tmp, seed)
  print(f"fault injection (seed {seed}, {time.time() - started:.0f} s, runs in {tmp}):")
  for outcome in outcomes.values():
    print("  " + outcome.line())
  sys.exit(1 if any(o.problems for o in outcomes.values()) else 0)


if __name__ == "__main__":
  main()
