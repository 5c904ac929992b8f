"""A benchmark protocol that load cannot fool: idle check, measured peak, tight intervals.

Contention hurts frameworks differently (eager PyTorch's threads suffer more from other jobs than
XLA's), so a speed ratio measured on a busy machine is not a property of the code. Every speed
table of `benchmarks/` therefore goes through this module:

* `require_idle`: refuse to start (exit 2, one line) while the 1-minute load average is above
  `IDLE_LOAD`, after waiting up to `--idle_wait` seconds for it to drop;
* `check_peak`: the measured float32 matmul peak must be within `PEAK_TOLERANCE` of the best
  peak recorded for this machine (`machine_peak.json`, keyed by CPU model and core count);
  a lower peak means something else is running and the run is marked invalid;
* `time_until_tight`: interleaved rounds are added until the 95% bootstrap interval of every
  ratio of medians is narrower than `rel_width` of the ratio (or `max_rounds` is reached,
  which the table then says);
* `Conditions.line()`: the load average before and after, the peak, the verdict: written with
  every table. A table whose conditions are invalid is printed but never written to the docs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence


IDLE_LOAD = 0.5
PEAK_TOLERANCE = 0.2
PEAK_FILE = pathlib.Path(__file__).resolve().parent / "machine_peak.json"


class MachineBusy(SystemExit):
  """The machine is not idle: the benchmark refuses to run (exit status 2)."""

  def __init__(self, message: str):
    print(f"error: {message}", file=sys.stderr)
    super().__init__(2)


def load1() -> float:
  return os.getloadavg()[0]


def require_idle(*, threshold: float = IDLE_LOAD, max_wait_s: float = 0.0,
                 poll_s: float = 5.0, load: Callable[[], float] = load1,
                 sleep: Callable[[float], None] = time.sleep) -> float:
  """Waits up to `max_wait_s` for the 1-minute load average to fall to `threshold`.

  Returns:
    The load average when the run may start.

  Raises:
    MachineBusy: still busy after waiting (prints one line, exit status 2).
  """
  waited = 0.0
  while True:
    now = load()
    if now <= threshold:
      return now
    if waited >= max_wait_s:
      raise MachineBusy(
          f"load average {now:.2f} > {threshold} (waited {waited:.0f} s): speed comparisons "
          "run only on an idle machine; stop other jobs, or wait with --idle_wait=<s> "
          "(DPKD_IDLE_WAIT=<s> for the smaller scripts)")
    sleep(poll_s)
    waited += poll_s


def machine_id() -> str:
  """CPU model and core count: peaks are only comparable within one machine type."""
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), model)
  except OSError:
    pass
  return f"{model} x{os.cpu_count()}"


def host_id() -> str:
  """This host: its CPU model and core count, and its name. A best peak is per host: VMs of one
  CPU model on different physical hosts (other tenants, other clocks) peak differently, so a
  table is judged against its own host's best and by the ratios it measured side by side."""
  return f"{machine_id()} @ {socket.gethostname()}"


def best_peak(path: pathlib.Path = PEAK_FILE) -> float | None:
  """The best peak (FLOP/s) recorded for this host, or None."""
  if not path.exists():
    return None
  return json.loads(path.read_text()).get(host_id())


def record_peak(peak: float, path: pathlib.Path = PEAK_FILE) -> None:
  """Keeps `peak` as this host's best if it beats the recorded one."""
  table = json.loads(path.read_text()) if path.exists() else {}
  key = host_id()
  if peak > table.get(key, 0.0):
    table[key] = peak
    path.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")


def check_peak(peak: float, best: float | None, tolerance: float = PEAK_TOLERANCE) -> str | None:
  """None if `peak` is within `tolerance` of `best` (or no best is known), else the reason."""
  if best is None or peak >= (1.0 - tolerance) * best:
    return None
  return (f"matmul peak {peak / 1e9:.0f} GFLOP/s is {1 - peak / best:.0%} below this machine's "
          f"best {best / 1e9:.0f} GFLOP/s on this host: something else is running")


def ratio_interval(a: Sequence[float], b: Sequence[float], *, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
  """median(b) / median(a) and its 95% bootstrap interval (paired by round)."""
  if len(a) != len(b) or not a:
    raise ValueError(f"need two equally long, non-empty series, got {len(a)} and {len(b)}")
  rng = random.Random(seed)
  n = len(a)
  ratios = []
  for _ in range(resamples):
    idx = [rng.randrange(n) for _ in range(n)]
    ratios.append(statistics.median(b[i] for i in idx) / statistics.median(a[i] for i in idx))
  ratios.sort()
  return (statistics.median(b) / statistics.median(a),
          ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1])


def time_until_tight(steps: Mapping[str, Callable[[int], None]],
                     pairs: Sequence[tuple[str, str]], *, warmup: int = 1, min_rounds: int = 5,
                     max_rounds: int = 30, rel_width: float = 0.05,
                     clock: Callable[[], float] = time.perf_counter) -> tuple[dict[str, list[float]], bool]:
  """Interleaved rounds until every (A, B) ratio's 95% interval is within `rel_width`.

  Each step gets its call index (for a fresh noise key per call) and must block until done.

  Returns:
    (name -> seconds per round, whether every interval got tight before `max_rounds`).
  """
  for step in steps.values():
    for i in range(warmup):
      step(i)
  times: dict[str, list[float]] = {name: [] for name in steps}
  for r in range(max_rounds):
    for name, step in steps.items():
      start = clock()
      step(warmup + r)
      times[name].append(clock() - start)
    if r + 1 >= min_rounds and all(_tight(times[a], times[b], rel_width) for a, b in pairs):
      return times, True
  return times, False


def _tight(a: Sequence[float], b: Sequence[float], rel_width: float) -> bool:
  ratio, low, high = ratio_interval(a, b, resamples=500)
  return (high - low) <= rel_width * ratio


@dataclasses.dataclass
class Conditions:
  """What a reader needs to trust a speed table: load, peak, and the verdict."""

  load_before: float
  peak: float
  best_peak: float | None
  load_after: float | None = None
  peak_after: float | None = None
  problems: list[str] = dataclasses.field(default_factory=list)
  peak_file: pathlib.Path = PEAK_FILE

  def finish(self, load_after: float, peak_after: float) -> None:
    """The load average after the run says little (the run itself keeps the cores busy), so a
    second peak measurement at the end tells whether another job started meanwhile."""
    self.load_after, self.peak_after = load_after, peak_after
    reason = check_peak(peak_after, max(self.peak, self.best_peak or 0.0))
    if reason:
      self.problems.append(f"at the end, {reason}")
    elif self.valid:
      record_peak(peak_after, self.peak_file)

  @property
  def valid(self) -> bool:
    return not self.problems

  def line(self) -> str:
    best = "none recorded" if self.best_peak is None else f"{self.best_peak / 1e9:.0f}"
    verdict = "valid" if self.valid else "INVALID: " + "; ".join(self.problems)
    after = "?" if self.load_after is None else f"{self.load_after:.2f}"
    peak_after = "?" if self.peak_after is None else f"{self.peak_after / 1e9:.0f}"
    return (f"load average {self.load_before:.2f} before (idle threshold {IDLE_LOAD}), {after} "
            f"after; matmul peak {self.peak / 1e9:.0f} GFLOP/s before, {peak_after} after "
            f"(this host's best {best} GFLOP/s); {verdict}")


def start_conditions(peak_fn: Callable[[], float], *, max_wait_s: float = 0.0,
                     allow_busy: bool = False) -> Conditions:
  """Idle check, then the peak (checked against the machine's best, which it may raise)."""
  if allow_busy:
    load_before, problems = load1(), []
    if load_before > IDLE_LOAD:
      problems.append(f"started busy (load average {load_before:.2f})")
  else:
    load_before, problems = require_idle(max_wait_s=max_wait_s), []
  peak = peak_fn()
  best = best_peak()
  reason = check_peak(peak, best)
  if reason:
    problems.append(reason)
  elif not problems:
    record_peak(peak)
  return Conditions(load_before=load_before, peak=peak, best_peak=best, problems=problems)


def guard_script() -> float:
  """The idle check for the smaller timing scripts (conv_grads, dpdfd_step, peers_dpsgd):
  `DPKD_IDLE_WAIT=<s>` waits for the machine to settle; `DPKD_ALLOW_BUSY=1` runs anyway, and
  the script's output then says it is not a valid speed comparison."""
  if os.environ.get("DPKD_ALLOW_BUSY") == "1":
    now = load1()
    if now > IDLE_LOAD:
      print(f"WARNING: load average {now:.2f} > {IDLE_LOAD}: these timings are NOT a valid "
            "speed comparison", flush=True)
    return now
  return require_idle(max_wait_s=float(os.environ.get("DPKD_IDLE_WAIT", "0")))
