"""What every `python -m experiments.<x>` shares: one-line user errors with exit status 2.

    @_cli.entry_point
    def main(argv=None): ...

turns an expected mistake of the person running the command (any `dpkd_jax.errors.UserError`,
a checkpoint that does not fit, a flag argparse or a config rejects, a directory that cannot be
written) into one line `error: <message>` on stderr and exit status 2, before anything is
written when the mistake can be seen up front (`check_output_dir`, `check_output_file`). Every
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import os
import sys
import tempfile
from typing import Any, Callable, NoReturn, TypeVar

from dpkd_jax import errors
from dpkd_jax.models import conv_routes
from dpkd_jax.privacy import calibration
from dpkd_jax.train import checkpoint

EXIT_USER_ERROR = 2  # argparse's own status for bad flags
# OSErrors that say the machine refused a write the user asked for: not bugs.
_ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
_T = TypeVar("_T")


def one_line(message: str) -> str:
  """`message` with its lines joined by "; " (the contract: a user error is one line)."""
  return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def fail(message: str) -> NoReturn:
  """Prints `error: <message>` as one line on stderr and exits with status 2."""
  sys.stdout.flush()
  print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
  raise SystemExit(EXIT_USER_ERROR)


class Parser(argparse.ArgumentParser):
  """ArgumentParser whose errors are one line (no usage block), exit status 2."""

  def error(self, message: str) -> NoReturn:
    fail(f"{message} (see {self.prog} --help)")


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


@contextlib.contextmanager
def user_errors():
  """Turns the user errors raised inside into `fail(...)` (one line, exit 2)."""
  sys.unraisablehook = _quiet_closed_loop
  try:
    yield
  except (errors.UserError, checkpoint.CheckpointMismatchError,
          calibration.CalibrationError) as error:
    fail(str(error))
  except OSError as error:
    if error.errno not in _ENVIRONMENT_ERRNOS:
      raise
    where = f"{error.filename!r}: " if error.filename is not None else ""
    fail(f"cannot access {where}{error.strerror or error}; check its permissions and free space")


def entry_point(main: Callable[..., Any]) -> Callable[..., Any]:
  """Decorates a CLI `main(argv=None)`: user errors become one line and exit status 2."""

  @functools.wraps(main)
  def wrapped(argv: list[str] | None = None) -> Any:
    with user_errors():
      conv_routes.mode()  # a bad DPKD_CONV_ROUTES: one line before anything is written
      return main(sys.argv[1:] if argv is None else argv)

  return wrapped
