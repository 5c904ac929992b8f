"""Which exact form computes each pass of a convolution on CPU: measured per machine and shape.

The fastest way to compute a convolution's forward pass, input gradient or kernel gradient on
XLA CPU depends on the machine and on the shape, not only on FLOP counts: on one 2-core AMD
EPYC XLA's own (YNNPACK) kernel gradient beat a GEMM form for 32 → 64 channels, on a 2-core
Intel Xeon the GEMM form is 1.6× faster for the same layer, and a banded-matrix product beats
XLA's direct kernels 3–4× for LeNet-5's 1 → 6 channel layer (docs/PERFORMANCE.md). A static
threshold is wrong on one machine or the other, so, like XLA's GPU autotuner, `fast_conv` asks
this module, which times every candidate form once per (machine, jax version, pass, shape) and
keeps the fastest:

* in memory for the process, and on disk in `$DPKD_CACHE_DIR/conv_routes.json` (default
  `~/.cache/dpkd_jax`), so a resumed or repeated run takes the same routes without measuring;
* `DPKD_CONV_ROUTES=static` skips measuring and takes the static rule `fast_conv` passes
  (the test suite does this: no timing in unit tests, the same programs on every machine);
  `DPKD_CONV_ROUTES=measure` (the default) measures on the CPU backend.

All candidate forms compute the same values up to float32 rounding (each is tested against
`lax.conv_general_dilated`), so a route changes speed, never results beyond rounding. Timing
happens while the caller is being traced, inside `jax.ensure_compile_time_eval`, on inputs of
the traced shapes (standard normal, fixed seed), minimum of a few calls after one warm-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import platform
import time
from collections.abc import Callable, Iterator, Mapping

import jax
import numpy as np

from dpkd_jax import errors

ENV_VAR = "DPKD_CONV_ROUTES"
CACHE_ENV_VAR = "DPKD_CACHE_DIR"
MODES = ("measure", "static")
TIMED_CALLS = 5

# (pass, shape key) → form name, for this process; filled from the disk cache and measurements.
_ROUTES: dict[str, str] = {}
_LOADED = [False]
_FORCED: list[str | None] = [None]  # set by `forced_mode`


def mode() -> str:
  value = _FORCED[0] or os.environ.get(ENV_VAR, "measure")
  if value not in MODES:
    raise errors.UserError(f"{ENV_VAR}={value!r}: expected one of {', '.join(MODES)}")
  return value


@contextlib.contextmanager
def forced_mode(value: str) -> Iterator[None]:
  """Convolutions traced inside take `value`'s routes whatever the environment says (e.g. a
  benchmark comparing measured routes with the static rule in one process)."""
  if value not in MODES:
    raise ValueError(f"mode {value!r}: expected one of {', '.join(MODES)}")
  previous, _FORCED[0] = _FORCED[0], value
  try:
    yield
  finally:
    _FORCED[0] = previous


def machine_id() -> str:
  """CPU model and core count (routes measured on one machine type do not transfer)."""
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), model)
  except OSError:
    pass
  return f"{model} x{os.cpu_count()}"


def cache_path() -> pathlib.Path:
  root = os.environ.get(CACHE_ENV_VAR) or pathlib.Path.home() / ".cache" / "dpkd_jax"
  return pathlib.Path(root) / "conv_routes.json"


def _scope() -> str:
  """Routes hold for one machine type, jax version and set of XLA options (an XLA flag can
  change which convolution kernel runs, e.g. dpkd_jax/xla_cpu.py's)."""
  flags = " ".join(sorted(os.environ.get("XLA_FLAGS", "").split()))
  return f"{machine_id()} | jax {jax.__version__}" + (f" | XLA_FLAGS {flags}" if flags else "")


def _load() -> None:
  """Reads this machine's routes from the disk cache once (a missing or bad file is empty)."""
  if _LOADED[0]:
    return
  _LOADED[0] = True
  try:
    table = json.loads(cache_path().read_text())
    _ROUTES.update({k: v for k, v in table.get(_scope(), {}).items() if isinstance(v, str)})
  except (OSError, ValueError, AttributeError):
    pass


def _store(key: str, form: str) -> None:
  """Adds one route to the disk cache (atomic replace; an unwritable cache is not an error)."""
  path = cache_path()
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
      table = json.loads(path.read_text())
      table = table if isinstance(table, dict) else {}
    except (OSError, ValueError):
      table = {}
    table.setdefault(_scope(), {})[key] = form
    scratch = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    scratch.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    os.replace(scratch, path)
  except OSError:
    pass


def _time(fn: Callable, args: tuple, clock: Callable[[], float]) -> float:
  jax.block_until_ready(fn(*args))  # compile and warm up
  best = float("inf")
  for _ in range(TIMED_CALLS):
    start = clock()
    jax.block_until_ready(fn(*args))
    best = min(best, clock() - start)
  return best


def choose(key: str, forms: Mapping[str, Callable], shapes: tuple[tuple[int, ...], ...],
           static: str, *, clock: Callable[[], float] | None = None) -> str:
  """The form to use for one pass of one convolution shape.

  Args:
    key: the pass and shape, e.g. "kernel_grad (256, 28, 28, 1) (5, 5, 1, 6) s(1, 1) p((2, 2),
      (2, 2)) float32"; routes are cached under it.
    forms: name → jittable function of arrays with `shapes` (the candidate computations).
    shapes: shapes of the candidates' float32 arguments.
    static: the form taken without measuring (`DPKD_CONV_ROUTES=static`, other backends, or a
      single candidate).
    clock: the timer (default `time.perf_counter`; tests pass a fake one).
  """
  if static not in forms:
    raise ValueError(f"static form {static!r} is not among {sorted(forms)}")
  if len(forms) == 1 or mode() == "static" or jax.default_backend() != "cpu":
    return static
  _load()
  cached = _ROUTES.get(key)
  if cached in forms:
    return cached
  rng = np.random.default_rng(0)
  with jax.ensure_compile_time_eval():
    args = tuple(jax.numpy.asarray(rng.standard_normal(s, dtype=np.float32)) for s in shapes)
    times = {name: _time(jax.jit(fn), args, clock or time.perf_counter)
             for name, fn in forms.items()}
  best = min(times, key=times.get)
  _ROUTES[key] = best
  _store(key, best)
  return best


def routes() -> dict[str, str]:
  """The routes this process has taken or loaded (key → form), e.g. for a run report."""
  return dict(_ROUTES)


def clear() -> None:
  """Forgets the in-memory routes (the disk cache is kept); tests use it."""
  _ROUTES.clear()
  _LOADED[0] = False
