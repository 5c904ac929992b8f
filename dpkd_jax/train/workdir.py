"""The prologue of every `train_*`: lock the workdir, resume or refuse, restore what is intact.

`open_run(workdir, kind=..., config=..., resume=...)` is the first thing a training function
does, before it writes anything:

1. Lock: an exclusive `fcntl.flock` on `<workdir>/.lock` for the whole run (pid, host and start
   time written inside for the message; the file is removed when the run ends). A second run in
   the same workdir stops at once with a one-line `WorkdirInUseError` naming the holder. The OS
   drops a flock when its process dies, so the lock of a killed run is stale by construction
   and never blocks. Multi-host: only the
   coordinator (process 0) locks. (On network file systems flock may be local to a host.)
2. Resume or refuse: a workdir holding checkpoints or a privacy ledger is continued when
   `resume` is True (or None: methods that always resume), refused otherwise (`resume=False`,
   or a method that cannot resume) so that its ledger is never overwritten.
3. Restore: the newest checkpoint that reads back and matches its checksum (arrays and
   metadata, the root seed among them); newer corrupt ones are moved to `<checkpoints>.corrupt/`
   with a warning; if none is intact the run is refused with one line. The saved config must
   equal the run's, and every checkpoint must store the same root seed: a seed changed in one
   of them (its key data would no longer be the run's) is refused, not fallen back from.
4. Ledger: `Run.ledger(fresh)` continues the most-spent ledger of the file and the checkpoints
   (`ledger_file`); `Run.charge` before each release, `Run.seal` after it is computed and
   before its outputs, `Run.save` for the checkpoint.
5. Cost: each process that opens the run is a segment of its account (`clock_file`,
   `<workdir>/run_clock.json`, process 0; `Run.clock`): `Run.save` records the segment's
   seconds, and `outputs.finish_run(..., run=run)` records the sum over the segments.

Decorate the training function with `@run_scope` so that the lock is released however it ends,
or use the `Run` as a context manager.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import os
import socket
import threading
import time
import warnings
from typing import Any, Callable, TypeVar

import jax
from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import clock_file
from dpkd_jax.train import ledger_file

LOCK_NAME = ".lock"
_F = TypeVar("_F", bound=Callable[..., Any])
_scopes = threading.local()


class WorkdirInUseError(errors.UserError):
  """Another live run holds the workdir's lock."""


def _holder(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      info = json.loads(f.read() or "{}")
    return f"pid {info['pid']} on {info['host']}, started {info['started']}"
  except (OSError, ValueError, KeyError, TypeError):
    return "pid unknown"


class _Lock:
  """An exclusive flock on `<workdir>/.lock`; creates the workdir if needed."""

  def __init__(self, workdir: str):
    self.workdir = os.path.abspath(workdir)
    # The directories this run creates (the workdir and missing parents), deepest first.
    self.created: list[str] = []
    path = self.workdir
    while not os.path.exists(path) and path != os.path.dirname(path):
      self.created.append(path)
      path = os.path.dirname(path)
    self.path = os.path.join(self.workdir, LOCK_NAME)
    try:
      os.makedirs(self.workdir, exist_ok=True)
      for _ in range(10):  # retry if the file was removed or replaced between open and flock
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          os.close(fd)
          raise WorkdirInUseError(
              f"workdir {self.workdir!r} is in use by another run ({_holder(self.path)}): wait "
              "for it to end or pass another --workdir") from None
        try:
          if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
            break
        except FileNotFoundError:
          pass
        os.close(fd)
      else:
        raise WorkdirInUseError(f"could not lock {self.path!r}: it keeps being replaced")
      info = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError as err:  # a file in the way, read-only, no space, ...
      raise errors.UserError(f"cannot use workdir {self.workdir!r}: {err.strerror or err}; "
                             "pass a writable directory as --workdir") from err
    self._fd: int | None = fd

  def release(self) -> None:
    """Removes the lock file, then drops the flock (a waiter then retries on a new file)."""
    if self._fd is None:
      return
    try:
      os.unlink(self.path)
      for directory in self.created:  # a run that wrote nothing leaves no trace
        if os.listdir(directory):
          break
        os.rmdir(directory)
    except OSError:
      pass  # best effort: a leftover lock file is harmless (the flock is what counts)
    os.close(self._fd)
    self._fd = None


def run_scope(fn: _F) -> _F:
  """Decorator: every `Run` opened during the call is closed (lock released) when it returns
  or raises."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    stack = getattr(_scopes, "stack", None)
    if stack is None:
      stack = _scopes.stack = []
    stack.append([])
    try:
      return fn(*args, **kwargs)
    finally:
      for run in reversed(stack.pop()):
        run.close()

  return wrapper  # type: ignore[return-value]


def open_run(workdir: str, *, kind: str, config: dict[str, Any], resume: bool | None = None,
             resumable: bool = True,
             migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> "Run":
  """Locks `workdir` and decides between a fresh run and a resumed one.

  Args:
    workdir: the run directory (created).
    kind: the method's name for messages ("DP-SGD", "RONA", ...).
    config: the run's JSON config; a resumed checkpoint must hold an equal one.
    resume: True: continue an existing run; False: refuse one; None: continue it if present.
      Every `train_<method>(config, workdir, *, resume=False)` passes its `resume` here: the
      one place a run is resumed, started or refused.
    resumable: False for methods that cannot resume: an existing run is always refused, and
      so is `resume=True`.
    migrate: the method's upgrade of a saved config to its current format (e.g. DPDFD's
      `config_migration.migrate`): the saved config is compared with `config` after it.

  Returns:
    The `Run`, holding the lock until `close` (or the end of the enclosing `run_scope`).

  Raises:
    WorkdirInUseError: another live run holds the lock.
    UserError: an existing run that may not be continued, another config, or no intact
      checkpoint left (`checkpoint.CorruptCheckpointError`).
  """
  if resume and not resumable:  # refused before the lock: nothing is written
    raise errors.UserError(f"a {kind} run cannot be resumed: use a fresh workdir without "
                           "resume")
  lock = _Lock(workdir) if jax.process_index() == 0 else None
  try:
    run = Run(workdir, kind=kind, config=config, resume=resume, resumable=resumable, lock=lock,
              migrate=migrate)
  except BaseException:
    if lock is not None:
      lock.release()
    raise
  stack = getattr(_scopes, "stack", None)
  if stack:
    stack[-1].append(run)
  return run


def _saved_config(saved: dict[str, Any], migrate: Callable[[dict], dict] | None) -> Any:
  """The checkpoint's config in the current format (as saved without `migrate`); a config
  `migrate` cannot read is refused in one line."""
  config = saved.get("config")
  if migrate is None or config is None:
    return config
  try:
    return migrate(config)
  except ValueError as error:
    raise errors.UserError(f"the checkpoint's config cannot be read: {error}") from error


class Run:
  """A locked workdir: fresh or resumed (`resuming`, `step`, `saved`), its ledger, checkpoints."""

  def __init__(self, workdir: str, *, kind: str, config: dict[str, Any], resume: bool | None,
               resumable: bool, lock: _Lock | None,
               migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
    self.workdir, self.kind, self._lock = workdir, kind, lock
    self.ckpt_dir = os.path.join(workdir, "checkpoints")
    self.ledger_path = os.path.join(workdir, ledger_file.FILE_NAME)
    steps = checkpoint.all_steps(self.ckpt_dir)
    if (steps or os.path.exists(self.ledger_path)) and (resume is False or not resumable):
      held = (f"a {kind} checkpoint" if steps else
              f"the privacy ledger of a {kind} run ({ledger_file.FILE_NAME})")
      how = ("pass resume=True (--resume) to continue it, or use a fresh workdir" if resumable
             else f"a {kind} run cannot be resumed: use a fresh workdir")
      raise errors.UserError(f"{workdir!r} already holds {held}: {how}")
    self._verified = self._newest_intact(steps)
    self.resuming = self._verified is not None
    self.step = self._verified.step if self.resuming else 0
    self.saved: dict[str, Any] = self._verified.meta if self.resuming else {}
    if self.resuming and _saved_config(self.saved, migrate) != config:
      raise errors.UserError(f"{workdir!r} holds a {kind} run with another config; use a "
                             "fresh workdir (or the same flags to continue it)")
    self._check_seeds(steps)
    for step in steps:
      if step > self.step:
        moved = checkpoint.quarantine(self.ckpt_dir, step)
        warnings.warn(f"checkpoint step {step} of {workdir!r} is corrupt: moved to {moved!r}; "
                      f"resuming from step {self.step}", stacklevel=3)
    self._ledger: ledger_file.LedgerFile | None = None
    self._ledger_opened = False
    self._sealed: str | None = None
    # This process's segment of the run's cost (`clock_file`), once every check has passed:
    # None on other processes and once the run is closed (its lock released), so that a
    # closed run's account is never written again (`outputs.finish_run` reads it here).
    self.clock: clock_file.ClockFile | None = (
        clock_file.ClockFile(workdir, resuming=self.resuming, step=self.step)
        if jax.process_index() == 0 else None)

  def _newest_intact(self, steps: list[int]) -> checkpoint.Verified | None:
    problems = []
    for step in reversed(steps):
      try:
        return checkpoint.read_verified(self.ckpt_dir, step)
      except checkpoint.CorruptCheckpointError as err:
        problems.append(str(err))
    if problems:
      raise checkpoint.CorruptCheckpointError(
          f"no intact checkpoint left in {self.ckpt_dir!r} ({len(problems)} corrupt, newest: "
          f"{problems[0]}): start again in a fresh workdir")
    return None

  def _check_seeds(self, steps: list[int]) -> None:
    """Refuses a run whose checkpoints store different root seeds (before anything is moved,
    charged or written): one of them was changed, and falling back would hide it."""
    if not self.resuming or "root_seed" not in self.saved:
      return
    for step in steps:
      if step == self.step:
        continue
      try:
        other = checkpoint.restore_metadata(self.ckpt_dir, step=step).get("root_seed")
      except checkpoint.CorruptCheckpointError:
        continue  # unreadable metadata holds no seed to compare
      if other is not None and other != self.saved["root_seed"]:
        path = os.path.join(os.path.abspath(self.ckpt_dir), str(step), checkpoint.META_FILE)
        raise errors.UserError(
            f"{path!r} stores another root seed than checkpoint step {self.step} of the same "
            "run: a seed was changed; restore the original file or start again in a fresh "
            "workdir")

  def root_seed(self, seed: int | None) -> seeds.ResolvedSeed:
    """The resumed run's own root seed, else `seed` (None: a secret one from OS entropy)."""
    if "root_seed" in self.saved:
      return seeds.ResolvedSeed(*self.saved["root_seed"])
    return seeds.resolve_seed(seed)

  def restore(self, target: Any) -> tuple[Any, dict[str, Any]]:
    """(arrays in the structure of `target`, metadata) of the checkpoint being resumed."""
    if self._verified is None or self._verified.arrays is None:
      raise RuntimeError("nothing to restore: the run is not resuming, or restored already")
    arrays = checkpoint.into_target(self._verified.arrays, target, self.ckpt_dir)
    self._verified = self._verified._replace(arrays=None)  # free the host copy
    return arrays, dict(self.saved)

  def ledger(self, fresh: ledger_lib.PrivacyLedger | None) -> ledger_lib.PrivacyLedger | None:
    """The ledger to continue: `fresh` for a new run, else the most spent one on disk.

    Args:
      fresh: an empty ledger with the run's budget, or None for a run without one.
    """
    self._ledger_opened = True
    if fresh is None:
      return None
    restored = ledger_file.ledger_of(self.saved) if self.resuming else None
    self._ledger = ledger_file.LedgerFile(
        self.ledger_path, fresh, restored=restored, candidates=self._checkpoint_ledgers(),
        write=jax.process_index() == 0)
    return self._ledger.ledger

  def _checkpoint_ledgers(self) -> list[ledger_lib.PrivacyLedger]:
    """Ledgers of every checkpoint whose metadata still reads (corrupt arrays included)."""
    found = []
    directories = [(self.ckpt_dir, s) for s in checkpoint.all_steps(self.ckpt_dir)]
    corrupt_dir = os.path.abspath(self.ckpt_dir) + ".corrupt"
    for sub in sorted(os.listdir(corrupt_dir)) if os.path.isdir(corrupt_dir) else []:
      directories.append((os.path.join(corrupt_dir, sub), None))
    for directory, step in directories:
      try:
        meta = (checkpoint.restore_metadata(directory, step=step) if step is not None
                else checkpoint.read_moved_metadata(directory))
        ledger = ledger_file.ledger_of(meta)
      except (ValueError, OSError, KeyError, TypeError):
        continue  # unreadable: the file and the other checkpoints still count
      if ledger is not None:
        found.append(ledger)
    return found

  def charge(self, event: dp_event.DpEvent, *, step: int, note: str = "") -> float:
    """Charges the release about to happen (file written first); returns the spent ε.

    A run opened with `ledger(None)` (no noise: nothing to account) gets inf.
    """
    if not self._ledger_opened:
      raise RuntimeError("call Run.ledger() before charging")
    if self._ledger is None:
      return math.inf
    return self._ledger.charge(event, step=step, note=note)

  def seal(self, arrays: Any) -> Any:
    """Binds the charges since the last seal to the host `arrays` (the state to checkpoint).

    Call it after a release is computed and before any of its outputs is written; returns
    the host arrays, to be passed to `save`.
    """
    arrays = jax.device_get(arrays)
    self._sealed = checkpoint.checksum(arrays)
    if self._ledger is not None:
      self._ledger.seal(self._sealed)
    return arrays

  def save(self, step: int, arrays: Any, meta: dict[str, Any]) -> None:
    """Checkpoints `arrays` (sealing them first if `seal` was not called since the release)."""
    if self._sealed is None:
      arrays = self.seal(arrays)
    digest = checkpoint.save(self.ckpt_dir, step, arrays, meta)
    if digest != self._sealed:
      raise RuntimeError(f"the state saved at step {step} differs from the one sealed after "
                         "its release: seal() must come after the last change of the state")
    self._sealed = None
    if self.clock is not None:
      self.clock.saved(step)

  def close(self) -> None:
    """Releases the lock and drops the cost account (idempotent)."""
    self.clock = None
    if self._lock is not None:
      self._lock.release()
      self._lock = None

  def __enter__(self) -> "Run":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
