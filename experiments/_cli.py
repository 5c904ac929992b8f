"""What every `python -m experiments.<x>` shares: one-line user errors with exit status 2.

    @_cli.entry_point
    def main(argv=None): ...

turns an expected mistake of the person running the command (any `dpkd_jax.errors.UserError`,
a checkpoint that does not fit, a flag argparse or a config rejects, a target ε no noise meets,
a directory that cannot be written) into one line `error: <message>` on stderr and exit status
2, before anything is written when the mistake can be seen up front (`check_output_dir`,
`check_output_file`). A write the machine refuses later (full disk, file size limit, read-only;
an OSError, or TensorStore's ValueError carrying the OS error code) is one line naming the file
and the cause. Every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import os
import re
import sys
import tempfile
import warnings
from typing import Any, Callable, NoReturn, TypeVar

from dpkd_jax import errors, kernels
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint

EXIT_USER_ERROR = 2  # argparse's own status for bad flags
# OSErrors that say the machine refused a write the user asked for: not bugs.
_ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                       errno.EFBIG}
# TensorStore (Orbax's checkpoint writer) reports a failed write as a ValueError whose message
# names the file and carries the OS error code: `Failed writing: "<path>": ... [os_error_code='28']`.
_TENSORSTORE_WRITE = re.compile(r"Failed (?:writing|to write)[^\"]*\"(?P<path>[^\"]+)\"(?:.|\n)*?"
                                r"\[os_error_code='(?P<code>\d+)'\]")
_written: list[str] = []  # the file most recently opened for writing (`_note_writes`)
_hooked: list[bool] = []  # the audit hook is installed (once per process: it stays)
_running_commands: list[str] = []  # the `entry_point` commands running now (innermost last)
_T = TypeVar("_T")
# The library's own package directory: its warnings are notes to the person running a command.
_LIBRARY_DIR = os.path.join(os.path.dirname(os.path.abspath(errors.__file__)), "")


def one_line(message: str) -> str:
  """`message` with its lines joined by "; " (the contract: a user error is one line)."""
  return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def fail(message: str) -> NoReturn:
  """Prints `error: <message>` as one line on stderr and exits with status 2."""
  sys.stdout.flush()
  print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
  raise SystemExit(EXIT_USER_ERROR)


class Parser(argparse.ArgumentParser):
  """ArgumentParser whose errors are one line (no usage block), exit status 2.

  `cpu_kernels=True` (the commands that train or evaluate models) adds `--cpu_kernels`: the
  model zoo's opt-in CPU kernels and XLA CPU option (`dpkd_jax.kernels`), on by default when
  JAX's backend is the CPU, applied by `parse_args` before any step is traced.
  """

  def __init__(self, *args: Any, cpu_kernels: bool = False, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self._cpu_kernels = cpu_kernels
    if cpu_kernels:
      self.add_argument(
          "--cpu_kernels", nargs="?", const=True, type=parse_bool, default=True, metavar="BOOL",
          help="on the CPU backend, run the model zoo through this library's CPU kernels and "
               "XLA CPU option (dpkd_jax.kernels: faster on XLA CPU, equal values to float "
               "rounding, reverse-mode only); --nocpu_kernels: plain jax.lax/Flax ops, as on "
               "GPU and TPU (default: true; ignored on other backends)")
      self.add_argument("--nocpu_kernels", "--no-cpu_kernels", dest="cpu_kernels",
                        action="store_false", help=argparse.SUPPRESS)

  def error(self, message: str) -> NoReturn:
    fail(f"{message} (see {self.prog} --help)")

  def format_usage(self) -> str:
    return self._with_usage(super().format_usage)

  def format_help(self) -> str:
    return self._with_usage(super().format_help)

  def _with_usage(self, format_text: Callable[[], str]) -> str:
    """`format_text()` under a one-line usage: the command, its required flags, `[flags]` (the
    flags are listed once, below it, each with its help)."""
    if self.usage is not None:
      return format_text()
    required = [f"{a.option_strings[0]}={a.metavar or a.dest.upper()}" for a in self._actions
                if a.required and a.option_strings]
    self.usage = " ".join([self.prog, *required, "[flags]"])
    try:
      return format_text()
    finally:
      self.usage = None

  def parse_args(self, *args: Any, **kwargs: Any) -> argparse.Namespace:  # type: ignore[override]
    parsed = super().parse_args(*args, **kwargs)
    # Only a running command switches the kernels (for its own duration: `entry_point`); a
    # caller that parses flags in-process (a notebook, a test) keeps its own ops.
    if self._cpu_kernels and _running_commands:
      if parsed.cpu_kernels:
        kernels.use_cpu_kernels_on_cpu_backend()
      else:
        kernels.use(kernels.REFERENCE)
    return parsed


_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def parse_bool(text: str) -> bool:
  """`true/false/1/0/yes/no` (any case) -> bool; anything else is a flag error."""
  if text.lower() in _TRUE:
    return True
  if text.lower() in _FALSE:
    return False
  raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build(cls: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
  """`cls(*args, **kwargs)` (a config), or a one-line error for the value it rejects."""
  try:
    return cls(*args, **kwargs)
  except ValueError as error:  # configs validate in __post_init__ and name the field
    fail(str(error))


def check_output_dir(path: str, flag: str) -> None:
  """Fails (one line) unless `path` is, or can be created as, a writable directory.

  Writes nothing that stays: a directory that does not exist yet is tested by creating and
  removing an empty temporary directory in its nearest existing ancestor. Remote paths
  (`gs://...`) are left to the storage library.
  """
  if "://" in path:
    return
  path = os.path.abspath(path)
  if os.path.exists(path):
    if not os.path.isdir(path):
      raise errors.UserError(f"{flag}: {path!r} is a file, not a directory; give another path")
    if not os.access(path, os.W_OK | os.X_OK):
      raise errors.UserError(f"{flag}: directory {path!r} is not writable; give another path")
    return
  ancestor = os.path.dirname(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise errors.UserError(f"{flag}: cannot create {path!r}: {ancestor!r} is a file; give "
                           "another path")
  try:
    if not os.access(ancestor, os.W_OK | os.X_OK):
      raise PermissionError(errno.EACCES, "not writable")
    os.rmdir(tempfile.mkdtemp(prefix=".dpkd_probe_", dir=ancestor))
  except OSError as error:
    raise errors.UserError(f"{flag}: cannot create {path!r} in {ancestor!r} "
                           f"({error.strerror or error}); give a writable path") from error


def check_output_file(path: str, flag: str) -> None:
  """Fails (one line) unless `path` can be written: an existing, writable parent directory."""
  if "://" in path:
    return
  path = os.path.abspath(path)
  parent = os.path.dirname(path)
  if os.path.isdir(path):
    raise errors.UserError(f"{flag}: {path!r} is a directory; give a file name")
  if not os.path.isdir(parent):
    raise errors.UserError(f"{flag}: folder {parent!r} does not exist; create it first or give "
                           "another path")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise errors.UserError(f"{flag}: folder {parent!r} is not writable; give another path")


def _quiet_closed_loop(unraisable) -> None:
  """Drops Orbax's "Event loop is closed" noise after a failed restore; the rest as usual.

  TensorStore callbacks of a failed restore may still fire, from other threads, after the
  error line and until the interpreter exits: the filter stays installed for the process.
  """
  if (unraisable.exc_type is RuntimeError
      and str(unraisable.exc_value) == "Event loop is closed"):
    return
  sys.__unraisablehook__(unraisable)


def _note_writes(event: str, args: tuple[Any, ...]) -> None:
  """Audit hook: remembers the last file opened for writing, so that an OSError without a
  file name (a write() past a file size limit or a full disk) can still name it."""
  if event != "open" or len(args) < 3:
    return
  path, mode, flags = args[:3]
  writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
      isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
  if writing and isinstance(path, (str, bytes, os.PathLike)):
    _written[:] = [os.fsdecode(path)]


def _environment_error(path: str | None, code: int) -> str:
  """One line: the file and the cause (strerror of `code`), and what to do."""
  where = f"cannot write {os.path.abspath(path)!r}" if path else "cannot write"
  return f"{where}: {os.strerror(code)}; check its permissions, free space and file size limit"


def _write_error(error: Exception) -> str | None:
  """The one line of an environment write failure (`_ENVIRONMENT_ERRNOS`) in `error` or its
  causes, else None (a bug: the traceback stays)."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS:
      path = error.filename if error.filename is not None else (_written or [None])[-1]
      return _environment_error(path, error.errno)
    match = _TENSORSTORE_WRITE.search(str(error)) if isinstance(error, ValueError) else None
    if match and int(match["code"]) in _ENVIRONMENT_ERRNOS:
      return _environment_error(match["path"], int(match["code"]))
    error = error.__cause__ or error.__context__
  return None


def _reports_refused_write(record: logging.LogRecord) -> bool:
  """Whether a log record is an error report of a write the machine refused (`_write_error`),
  in its exception or in its message."""
  failure = record.exc_info[1] if record.exc_info else None
  return record.levelno >= logging.ERROR and (
      (failure is not None and _write_error(failure) is not None)
      or _write_error(ValueError(record.getMessage())) is not None)


class _HeldWriteFailures(logging.Filter):
  """Holds back the log records (with tracebacks) that Orbax's background threads emit about
  a write the machine refused (`_write_error`): the CLI says it in one line instead. Records
  are released to their handlers if the command then fails otherwise (a bug) or goes on."""

  def __init__(self):
    super().__init__()
    self.held: list[logging.LogRecord] = []

  def filter(self, record: logging.LogRecord) -> bool:
    if _reports_refused_write(record):
      self.held.append(record)
      return False
    return True

  def release(self, logger: logging.Logger) -> None:
    logger.removeFilter(self)
    for record in self.held:
      logger.handle(record)
    self.held.clear()


class _SaidWriteFailures(logging.Filter):
  """Drops the asyncio logger's "Task exception was never retrieved" records of a refused
  write once the CLI has said that failure in one line: Orbax's unawaited write tasks are
  collected late, often after the error line and as the interpreter exits, so the filter stays
  installed for the process. Every other record passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not _reports_refused_write(record)


def _say_write_failure(line: str) -> NoReturn:
  """`fail(line)` for a refused write, first silencing asyncio's late reports of it."""
  asyncio_logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _SaidWriteFailures) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_SaidWriteFailures())
  fail(line)


def _forget(held: dict[logging.Logger, _HeldWriteFailures]) -> None:
  """Drops the held records: the error line says them."""
  for records in held.values():
    records.held.clear()


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
  """`warnings.showwarning` that says the library's own notes (a `UserWarning` raised from
  dpkd_jax, e.g. a corrupt checkpoint moved aside) as one line, without Python's source
  excerpt; every other warning is shown by `show` as before."""

  def showwarning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, UserWarning) and _LIBRARY_DIR in os.path.abspath(filename):
      print(f"warning: {one_line(str(message))}", file=sys.stderr if file is None else file)
    else:
      show(message, category, filename, lineno, file, line)

  return showwarning


@contextlib.contextmanager
def user_errors():
  """Turns the user errors raised inside into `fail(...)` (one line, exit 2), and the
  library's warnings into one line each."""
  sys.unraisablehook = _quiet_closed_loop
  shown, warnings.showwarning = warnings.showwarning, _one_line_warnings(warnings.showwarning)
  if not _hooked:
    sys.addaudithook(_note_writes)
    _hooked.append(True)
  # Orbax's background threads log a refused write to absl; its unawaited tasks to asyncio.
  held = {logging.getLogger(name): _HeldWriteFailures() for name in ("absl", "asyncio")}
  for logger, records in held.items():
    logger.addFilter(records)
  try:
    yield
  except (errors.UserError, checkpoint.CheckpointMismatchError,
          calibration.CalibrationError) as error:
    _forget(held)  # said in the line below
    fail(str(error))
  except ledger_lib.BudgetExceededError as error:  # refused before the release: nothing spent
    _forget(held)
    fail(f"{str(error).split('; requested event')[0]}; nothing was released; the budget of "
         "this workdir is spent: start a new --workdir")
  except Exception as error:  # pylint: disable=broad-except  (a refused write, else re-raised)
    line = _write_error(error)
    if line is None:
      raise
    _forget(held)
    _say_write_failure(line)
  finally:
    for logger, records in held.items():
      records.release(logger)  # what was not said in one line above
    warnings.showwarning = shown


def entry_point(main: Callable[..., Any]) -> Callable[..., Any]:
  """Decorates a CLI `main(argv=None)`: user errors become one line and exit status 2."""

  @functools.wraps(main)
  def wrapped(argv: list[str] | None = None) -> Any:
    # The command's kernel choice (`--cpu_kernels`) lasts as long as the command: a caller that
    # runs it in-process (a notebook, a test) gets its own ops back.
    with user_errors(), kernels.using(kernels.active()):
      _running_commands.append(main.__module__)
      try:
        return main(sys.argv[1:] if argv is None else argv)
      finally:
        _running_commands.pop()

  return wrapped
