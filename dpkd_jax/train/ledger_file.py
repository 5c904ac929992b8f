"""The privacy ledger of a run, kept in its own file so that it never goes down.

Every private release is charged before it happens (`charge`), and the ledger is then written
to `<workdir>/privacy_ledger.json` atomically (temporary file, fsync, `os.replace`, fsync of the
directory). The checkpoints also carry the ledger, but only as of their step: falling back to an
older checkpoint (the newest one corrupt), or resuming after a crash, must not forget the charges
made since. On resume the run therefore continues the ledger that has spent the most among the
file and every readable checkpoint, never a smaller one.

Replays. A resumed run repeats the releases after its checkpoint with the same keys. A charge
already in the file for such a release ("pending") is reused instead of charged twice when the
repeat provably releases nothing new:
  * the charge was never sealed: the run died before any output of that release was written
    (`seal` runs after the release is computed and before its outputs), so nothing was
    released under it and the repeat may use it;
  * it was sealed with the SHA-256 of the state the release produced (the checkpoint's
    checksum): the repeat's state must have the same digest. A different digest (a
    non-deterministic re-execution) is charged again at once, before its checkpoint, and warned.
Anything else (a charge known only from a checkpoint, a run that charges something different
from what the file lists) is charged again: over-counting is sound, under-counting is not.

A file that cannot be read as a ledger is refused with one line; it is never reset.

The digests cover the checkpoint's arrays, the run's secret key data among them where a method
checkpoints it. A digest gives no practical handle on that key (each guess of >= 62 bits costs a
hash of the whole state), but like the checkpoints this file is a working file of the run:
results.json carries the ledger for publication, without the digests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import warnings
from typing import Any

from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax.privacy import ledger as ledger_lib

FILE_NAME = "privacy_ledger.json"
_SEALS_KEY = "released_state_sha256"  # per entry: digest of the state it released, or null
# A charge whose release may have been written but whose digest is not known (a ledger read
# from a checkpoint, or a file written before seals existed): never reused.
UNKNOWN = "unknown"


class CorruptLedgerError(errors.UserError):
  """The ledger file of a run cannot be read; resetting it would under-count ε."""


def _entry_key(entry: ledger_lib.LedgerEntry) -> tuple[str, int, str]:
  return json.dumps(ledger_lib.event_to_dict(entry.event), sort_keys=True), entry.step, entry.note


def _spent_key(ledger: ledger_lib.PrivacyLedger) -> tuple[float, int]:
  return ledger.spent_epsilon(), len(ledger.entries)


def write_atomically(path: str, text: str) -> None:
  """Replaces `path` by `text` so that a crash leaves either the old or the new file, durably."""
  directory = os.path.dirname(os.path.abspath(path))
  with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp",
                                   encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(f.name, path)
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)  # the rename itself
  finally:
    os.close(fd)


def load(path: str) -> tuple[ledger_lib.PrivacyLedger, list[str | None]] | None:
  """(ledger, seals) stored at `path`, None if there is no file; refuses a damaged one."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    ledger = ledger_lib.PrivacyLedger.from_json(text)
    seals = json.loads(text).get(_SEALS_KEY, [UNKNOWN] * len(ledger.entries))
    if not isinstance(seals, list) or len(seals) != len(ledger.entries) or not all(
        s is None or isinstance(s, str) for s in seals):
      raise ValueError(f"{_SEALS_KEY} does not list one digest per entry")
  except (OSError, ValueError, UnicodeDecodeError) as err:
    raise CorruptLedgerError(
        f"privacy ledger {path!r} is unreadable or corrupt ({str(err).splitlines()[0]}); "
        "restore it from a backup: the run refuses to continue without it (a reset would "
        "under-count ε)") from err
  return ledger, seals


@dataclasses.dataclass
class _Pending:
  index: int  # position in the ledger
  key: tuple[str, int, str]
  seal: str | None
  reusable: bool


class LedgerFile:
  """The run's ledger object plus its file; see the module docstring."""

  def __init__(self, path: str, ledger: ledger_lib.PrivacyLedger, *,
               restored: ledger_lib.PrivacyLedger | None,
               candidates: list[ledger_lib.PrivacyLedger], write: bool):
    """Continues the most-spent of `ledger` (fresh), the file and `candidates`.

    Args:
      path: the ledger file.
      ledger: a fresh ledger (the run's budget) used when nothing was spent yet.
      restored: the ledger of the checkpoint the run restores (None: fresh start); entries of
        the chosen ledger beyond it are the pending charges of the releases to be repeated.
      candidates: ledgers of other readable checkpoints (never continue a smaller one).
      write: whether this process writes the file (the coordinator).
    """
    self.path, self._write = path, write
    stored = load(path)
    # On a tie the file wins (it alone knows the seals), then the restored checkpoint's.
    options = [*([stored[0]] if stored is not None else []),
               *([restored] if restored is not None else []), *candidates, ledger]
    seals: list[str | None] = []
    self.ledger = max(options, key=_spent_key)
    budget = lambda l: (l.target_epsilon, l.delta, l.accountant)  # noqa: E731
    if budget(self.ledger) != budget(ledger):
      raise errors.UserError(
          f"the privacy ledger in {os.path.dirname(os.path.abspath(path))!r} has budget "
          f"(ε, δ, accountant) = {budget(self.ledger)}, this run {budget(ledger)}: it belongs to "
          "another run; use a fresh workdir")
    if stored is not None and self.ledger is stored[0]:
      seals = list(stored[1])
    base = restored if restored is not None else ledger
    entries = self.ledger.entries
    self._seals = seals + [UNKNOWN] * (len(entries) - len(seals))
    self._pending: list[_Pending] = []
    if [_entry_key(e) for e in entries[:len(base.entries)]] == [_entry_key(e) for e in base.entries]:
      for i in range(len(base.entries), len(entries)):
        self._pending.append(_Pending(i, _entry_key(entries[i]), self._seals[i],
                                      self._seals[i] != UNKNOWN))
    self._chunk: list[int] = []  # entries charged or reused since the last seal
    if self.ledger.entries and (stored is None or self.ledger is not stored[0]):
      self.flush()  # the file must hold the most-spent ledger before anything else happens

  def charge(self, event: dp_event.DpEvent, *, step: int, note: str = "") -> float:
    """Charges a release about to happen (or reuses its pending charge); returns spent ε.

    Raises:
      BudgetExceededError: a new charge would exceed the budget (nothing is recorded).
    """
    key = _entry_key(ledger_lib.LedgerEntry(event=event, step=int(step), note=str(note)))
    if self._pending and self._pending[0].reusable and self._pending[0].key == key:
      self._chunk.append(self._pending.pop(0).index)
      return self.ledger.spent_epsilon()
    self._pending.clear()  # the run diverged from the file: what it lists stays charged
    self.ledger.check(event)
    return self._record(event, step=step, note=note)

  def _record(self, event: dp_event.DpEvent, *, step: int, note: str) -> float:
    last = self.ledger.entries[-1].step if self.ledger.entries else 0
    spent = self.ledger.record(event, step=max(int(step), last), note=note)
    self._seals.append(None)
    self._chunk.append(len(self.ledger.entries) - 1)
    self.flush()
    return spent

  def seal(self, digest: str) -> None:
    """Binds the charges since the last seal to the state `digest` their release produced.

    Call it after the release is computed and before any of its outputs is written.
    """
    chunk, self._chunk = self._chunk, []
    for index in chunk:
      expected = self._seals[index]
      if expected is None:
        self._seals[index] = digest
      elif expected != digest:
        entry = self.ledger.entries[index]
        warnings.warn(f"the repeat of release '{entry.note}' (step {entry.step}) differs from "
                      "the original (non-deterministic execution): it is charged again",
                      stacklevel=3)
        self._record(entry.event, step=entry.step, note=f"repeat of: {entry.note}")
        self._seals[-1] = digest
        self._chunk.clear()
    self.flush()

  def flush(self) -> None:
    """Writes the ledger and its seals to the file (coordinator only)."""
    if not self._write:
      return
    data = json.loads(self.ledger.to_json())
    data[_SEALS_KEY] = self._seals
    write_atomically(self.path, json.dumps(data, indent=1))


def ledger_of(meta: dict[str, Any]) -> ledger_lib.PrivacyLedger | None:
  """The ledger a checkpoint's metadata carries (None if it has none).

  Raises:
    CorruptLedgerError: the metadata's ledger does not read as one (edited or damaged): the
      charges it stood for are unknown, so the run is refused rather than continued.
  """
  text = meta.get("ledger")
  try:
    return None if text is None else ledger_lib.PrivacyLedger.from_json(text)
  except (ValueError, KeyError, TypeError, AttributeError) as error:
    raise CorruptLedgerError(
        f"the privacy ledger in the checkpoint's metadata is damaged ({type(error).__name__}: "
        f"{str(error)[:160]}); restore {FILE_NAME} or the checkpoint, or start a new "
        "--workdir") from error
