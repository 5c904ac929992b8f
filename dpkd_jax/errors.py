"""Errors a user can cause and fix: the CLIs print them in one line and exit with status 2.

Raise `UserError` (or a subclass) for expected mistakes of the person running a command: a
missing or corrupt file they named, a workdir held by another run, teachers that do not come
from one partition, a flag value out of range. Anything else is a bug and keeps its traceback.
`UserError` subclasses `ValueError` so that existing callers catching `ValueError` still do.
The message must name the flag or file and say what to do; it must fit on one line.
"""

from __future__ import annotations


class UserError(ValueError):
  """An expected, user-fixable error; `experiments` CLIs print it as one line and exit 2."""
