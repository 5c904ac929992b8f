"""The fault-injection harness: start a CLI run, kill it, watch its ledger file, compare two
finished workdirs, overwrite checkpoint bytes. `fault_injection.py` holds the scenarios."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import resource
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


def start(module: str, flags: list[str], workdir: str, *,
          file_size_limit: int | None = None) -> subprocess.Popen | Forked:
  """`python -m experiments.<module> <flags> --workdir=<workdir>`; `file_size_limit` (bytes):
  as `ulimit -f`, with SIGXFSZ ignored so that a write past it fails (EFBIG).

  Forked from the fork server once `run_all` has set the shared compilation cache (the CLIs
  imported once: `fault_forkserver.py`), else, and for a limited run, a process of its own."""
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  if _cache_dir and file_size_limit is None:  # a limited run must not fail on the cache
    env.update(CACHE_ENV, JAX_COMPILATION_CACHE_DIR=_cache_dir[0])
    server = _fork_server(env)
    if server is not None:
      return server.start(module, [*flags, f"--workdir={workdir}"])
  elif file_size_limit is not None:
    env = {k: v for k, v in env.items() if not k.startswith("JAX_COMPILATION_CACHE")}

  def limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

  return subprocess.Popen([sys.executable, "-m", f"experiments.{module}", *flags,
                           f"--workdir={workdir}"], cwd=str(REPO), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=None if file_size_limit is None else limit)


class Forked:
  """A run forked by the fork server, with the parts of `subprocess.Popen` the scenarios use."""

  def __init__(self, pid: int, files: dict[str, str]):
    self.pid, self._files, self.returncode = pid, files, None

  def poll(self) -> int | None:
    if self.returncode is None and os.path.exists(self._files["status"]):
      self.returncode = int(pathlib.Path(self._files["status"]).read_text())
    return self.returncode

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout: float | None = None) -> tuple[str, str]:
    deadline = None if timeout is None else time.time() + timeout
    while self.poll() is None:
      if deadline is not None and time.time() > deadline:
        raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
      time.sleep(0.01)
    return tuple(pathlib.Path(self._files[k]).read_text(errors="replace") for k in ("out", "err"))


class _ForkServer:
  """`fault_forkserver.py` in a process of its own; `start` is safe from several threads."""

  def __init__(self, env: dict[str, str], directory: str):
    self._lock, self._directory, self._count = threading.Lock(), directory, 0
    self.proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "fault_forkserver.py"), *FORKED_MODULES],
        cwd=str(REPO), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.ready = bool(self.proc.stdout.readline())

  def start(self, module: str, argv: list[str]) -> Forked:
    with self._lock:
      self._count += 1
      files = {k: os.path.join(self._directory, f"{self._count}.{k}")
               for k in ("out", "err", "status")}
      self.proc.stdin.write(json.dumps({"module": module, "argv": argv, "cwd": str(REPO),
                                        **files}) + "\n")
      self.proc.stdin.flush()
      return Forked(json.loads(self.proc.stdout.readline())["pid"], files)

  def stop(self) -> None:
    self.proc.stdin.close()
    self.proc.wait()


FORKED_MODULES = ("dpsgd", "dpdfd", "rona", "srr", "rknn", "teacher")
_servers: dict[str, _ForkServer | None] = {}  # by compilation cache directory


def _fork_server(env: dict[str, str]) -> _ForkServer | None:
  """The fork server of this cache directory (None: it could not start; spawn instead)."""
  cache = env["JAX_COMPILATION_CACHE_DIR"]
  with _servers_lock:
    if cache not in _servers:
      directory = tempfile.mkdtemp(prefix="forked_", dir=os.path.dirname(cache))
      server = _ForkServer(env, directory)
      _servers[cache] = server if server.ready else None
    return _servers[cache]


def stop_fork_servers() -> None:
  with _servers_lock:
    for server in _servers.values():
      if server is not None:
        server.stop()
    _servers.clear()


_servers_lock = threading.Lock()


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


def parallel(*functions) -> None:
  """Calls the functions in threads (their subprocesses overlap) and waits for all."""
  threads = [threading.Thread(target=f) for f in functions]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
