"""Append-only privacy ledger: every private release, its ε, and a budget.

Use: `ledger.check(event)` before a release (raises `BudgetExceededError` if it
would overshoot), release, then `ledger.record(event, step=...)`. `record`
never refuses: once released, a release must be counted. ε is always
recomputed from the recorded events with `accounting.epsilon`.

One neighbouring relation per ledger: the first event that fixes one (or the constructor's
`relation`) sets it, and `check` / `record` refuse an event under another relation (a
replace-one ε plus an add/remove ε is neither). ε goes through `accounting.epsilon`, so
through the same closed forms and bounded PLD grids as every other figure.

JSON stores the events (explicit `event_to_dict` registry, no dynamic imports),
δ, target, accountant, relation and the spent ε. Loading recomputes ε and refuses a file
whose events give less than the stored figure (e.g. entries cut off); `save`
refuses to overwrite a ledger file that holds more entries. This catches
accidents, not an adversary who rewrites the stored figure too.
"""

import dataclasses
import json
import os
import tempfile
from typing import Any

from dp_accounting import dp_event

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import validation

_FORMAT = "dpkd_jax.privacy_ledger"
_VERSION = 2  # 2: tagged events and the ledger's relation. Version 1 files still load.
_READABLE_VERSIONS = (1, 2)
# Recomputation is deterministic; the slack only absorbs float formatting.
_RELATIVE_SLACK = 1e-9

# Leaf events: JSON name -> (class, scalar fields).
_LEAF_EVENTS = {
    "gaussian": (dp_event.GaussianDpEvent, ("noise_multiplier",)),
    "laplace": (dp_event.LaplaceDpEvent, ("noise_multiplier",)),
    "discrete_laplace": (dp_event.DiscreteLaplaceDpEvent, ("noise_parameter", "sensitivity")),
    "randomized_response": (dp_event.RandomizedResponseDpEvent,
                            ("noise_parameter", "num_buckets")),
    "no_op": (dp_event.NoOpDpEvent, ()),
    "non_private": (dp_event.NonPrivateDpEvent, ()),
    "zcdp": (dp_event.ZCDpEvent, ("rho", "xi")),  # secure-noise releases (secure_gaussian)
}


class BudgetExceededError(RuntimeError):
  """A release would take the ledger past its target ε."""


def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
  """JSON-ready dict of the event types this library builds.

  Args:
    event: Gaussian, Laplace, DiscreteLaplace, RandomizedResponse, NoOp, NonPrivate, or a
      PoissonSampled / SelfComposed / Tagged / Composed tree of them.

  Returns:
    A nested dict with a "type" key.
  """
  if isinstance(event, neighbouring.TaggedDpEvent):
    return {"type": "tagged", "relation": event.relation, "count": int(event.count),
            "event": event_to_dict(event.event)}
  if isinstance(event, dp_event.SelfComposedDpEvent):
    return {"type": "self_composed", "count": int(event.count),
            "event": event_to_dict(event.event)}
  if isinstance(event, dp_event.ComposedDpEvent):
    return {"type": "composed",
            "events": [event_to_dict(e) for e in event.events]}
  if isinstance(event, dp_event.PoissonSampledDpEvent):
    return {"type": "poisson_sampled",
            "sampling_probability": float(event.sampling_probability),
            "event": event_to_dict(event.event)}
  for name, (cls, fields) in _LEAF_EVENTS.items():
    if type(event) is cls:  # pylint: disable=unidiomatic-typecheck
      return {"type": name, **{f: getattr(event, f) for f in fields}}
  raise ValueError(f"cannot serialize {type(event).__name__}: supported are "
                   f"{sorted(_LEAF_EVENTS)} and composed/self_composed/tagged/"
                   "poisson_sampled trees of them")


def event_from_dict(data: dict[str, Any]) -> dp_event.DpEvent:
  """Inverse of `event_to_dict`.

  Args:
    data: a dict produced by `event_to_dict`.

  Returns:
    The DpEvent.
  """
  kind = data.get("type") if isinstance(data, dict) else None
  if kind == "tagged":
    return neighbouring.TaggedDpEvent(event_from_dict(data["event"]), int(data["count"]),
                                      str(data["relation"]))
  if kind == "self_composed":
    return dp_event.SelfComposedDpEvent(event_from_dict(data["event"]),
                                        int(data["count"]))
  if kind == "composed":
    return dp_event.ComposedDpEvent([event_from_dict(e)
                                     for e in data["events"]])
  if kind == "poisson_sampled":
    return dp_event.PoissonSampledDpEvent(float(data["sampling_probability"]),
                                          event_from_dict(data["event"]))
  if kind in _LEAF_EVENTS:
    cls, fields = _LEAF_EVENTS[kind]
    return cls(**{f: data[f] for f in fields})
  raise ValueError(f"unknown serialized event: {data!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LedgerEntry:
  """One private release.

  Attributes:
    event: the release's DpEvent.
    step: training step at which it happened (non-decreasing along the ledger).
    note: free text, e.g. the mechanism's name.
  """
  event: dp_event.DpEvent
  step: int
  note: str = ""


class PrivacyLedger:
  """Append-only record of private releases against an ε budget at fixed δ."""

  def __init__(self, *, target_epsilon: float, delta: float,
               accountant: accounting.AccountantName = "pld",
               relation: str | None = None):
    """Creates an empty ledger.

    Args:
      target_epsilon: budget ε (> 0, finite).
      delta: δ in (0, 1) at which ε is reported.
      accountant: "pld" or "rdp".
      relation: "replace-one" or "add-remove"; None: set by the first event that fixes one.
    """
    target_epsilon = validation.check_float("target_epsilon", target_epsilon, positive=True)
    delta = validation.check_delta(delta)
    accounting.check_accountant(accountant, None)
    self._target_epsilon = target_epsilon
    self._delta = delta
    self._accountant = accountant
    self._relation = None if relation is None else neighbouring.check_relation(relation)
    self._entries: list[LedgerEntry] = []
    self._spent = 0.0

  @property
  def target_epsilon(self) -> float:
    return self._target_epsilon

  @property
  def delta(self) -> float:
    return self._delta

  @property
  def accountant(self) -> str:
    return self._accountant

  @property
  def relation(self) -> str | None:
    """The neighbouring relation of every recorded event (None until one fixes it)."""
    return self._relation

  @property
  def entries(self) -> tuple[LedgerEntry, ...]:
    return tuple(self._entries)

  def composed_event(self) -> dp_event.DpEvent:
    """All recorded releases as one `ComposedDpEvent`."""
    return dp_event.ComposedDpEvent([e.event for e in self._entries])

  def _relation_with(self, event: dp_event.DpEvent) -> str | None:
    """The ledger's relation once `event` is added; raises if `event` is under another."""
    event_to_dict(event)  # Fail now, not at save time, on unsupported types.
    relation = neighbouring.relation_of(event)
    if relation is not None and self._relation is not None and relation != self._relation:
      raise ValueError(
          f"this ledger accounts under the {self._relation} relation; the event {event} is "
          f"{relation}: its ε would not compose (use one relation per ledger)")
    return self._relation if relation is None else relation

  def _epsilon_with(self, extra: list[dp_event.DpEvent]) -> float:
    events = [e.event for e in self._entries] + extra
    return accounting.epsilon(dp_event.ComposedDpEvent(events),
                              delta=self._delta, accountant=self._accountant)

  def spent_epsilon(self) -> float:
    """ε of all recorded releases at `delta` (inf if one is noiseless)."""
    return self._spent

  def remaining_fraction(self) -> float:
    """Unspent share of the budget, in [0, 1]."""
    return max(0.0, 1.0 - self._spent / self._target_epsilon)

  def check(self, event: dp_event.DpEvent) -> float:
    """Raises before a release that would exceed the budget.

    Args:
      event: the release about to happen.

    Returns:
      ε after the release, if it fits.

    Raises:
      BudgetExceededError: it would take ε past `target_epsilon`.
      ValueError: `event` is under another neighbouring relation than the ledger.
    """
    self._relation_with(event)
    after = self._epsilon_with([event])
    if not after <= self._target_epsilon:
      raise BudgetExceededError(
          f"release refused: spent ε={self._spent:.6g}, ε after this release "
          f"would be {after:.6g} > target ε={self._target_epsilon:.6g} at "
          f"δ={self._delta:g} ({self._accountant} accountant); requested "
          f"event: {event}")
    return after

  def record(self, event: dp_event.DpEvent, *, step: int,
             note: str = "") -> float:
    """Appends a release that happened (even if it overshoots the budget).

    Args:
      event: the release's DpEvent.
      step: its training step (>= the last recorded step).
      note: free text.

    Returns:
      The spent ε after recording.

    Raises:
      ValueError: `event` is under another neighbouring relation than the ledger (a
        programming error: nothing is recorded), or `step` goes backwards.
    """
    relation = self._relation_with(event)
    step = validation.check_int("step", step, minimum=0)
    if self._entries and step < self._entries[-1].step:
      raise ValueError(f"step {step} is before the last recorded step "
                       f"{self._entries[-1].step}: the ledger is append-only")
    self._spent = self._epsilon_with([event])
    self._relation = relation
    self._entries.append(LedgerEntry(event=event, step=step, note=str(note)))
    return self._spent

  def to_json(self) -> str:
    """Serializes the ledger (events, δ, target, accountant, spent ε)."""
    return json.dumps({
        "format": _FORMAT, "version": _VERSION,
        "target_epsilon": self._target_epsilon, "delta": self._delta,
        "accountant": self._accountant, "relation": self._relation,
        "spent_epsilon": self._spent,
        "num_entries": len(self._entries),
        "entries": [{"step": e.step, "note": e.note,
                     "event": event_to_dict(e.event)} for e in self._entries],
    }, indent=1)

  @classmethod
  def from_json(cls, text: str) -> "PrivacyLedger":
    """Rebuilds a ledger, recomputing ε from its events.

    Args:
      text: output of `to_json`.

    Returns:
      The ledger.

    Raises:
      ValueError: not a ledger, or its events give less ε than it stored
        (entries removed or altered).
    """
    data = _parse(text)
    try:
      ledger = cls(target_epsilon=data["target_epsilon"], delta=data["delta"],
                   accountant=data["accountant"], relation=data.get("relation"))
      entries = data["entries"]
      if len(entries) != data["num_entries"]:
        raise ValueError(f"ledger lists {len(entries)} entries but records "
                         f"num_entries={data['num_entries']}: it was altered")
      for entry in entries:
        ledger._entries.append(LedgerEntry(  # pylint: disable=protected-access
            event=event_from_dict(entry["event"]), step=int(entry["step"]),
            note=str(entry["note"])))
      stored = float(data["spent_epsilon"])
    except (KeyError, TypeError) as err:
      raise ValueError(f"malformed privacy ledger: {err!r}") from err
    # pylint: disable=protected-access
    # Version 1 stored no relation: the events fix it (raises if they disagree).
    relation = neighbouring.relation_of(ledger.composed_event())
    if relation is not None and ledger._relation not in (None, relation):
      raise ValueError(f"ledger records relation {ledger._relation!r} but its events are "
                       f"{relation}: it was altered")
    ledger._relation = ledger._relation or relation
    ledger._spent = ledger._epsilon_with([])
    # pylint: enable=protected-access
    if ledger.spent_epsilon() < stored * (1 - _RELATIVE_SLACK):
      raise ValueError(
          f"ledger events give ε={ledger.spent_epsilon():.6g} but the file "
          f"stored spent ε={stored:.6g}: entries were removed or altered")
    return ledger

  def save(self, path: str | os.PathLike) -> None:
    """Writes the JSON atomically; never replaces a longer ledger.

    Args:
      path: file path.

    Raises:
      ValueError: `path` holds a ledger with more entries (overwriting would
        lower the spent ε) or a file that is not a ledger.
    """
    path = os.fspath(path)
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        existing = _parse(f.read())
      if len(existing["entries"]) > len(self._entries):
        raise ValueError(
            f"refusing to overwrite {path}: it holds "
            f"{len(existing['entries'])} entries, this ledger only "
            f"{len(self._entries)} (that would lower the spent ε)")
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False,
                                     suffix=".tmp", encoding="utf-8") as f:
      f.write(self.to_json())
    os.replace(f.name, path)  # Atomic: a crash leaves the old file intact.

  @classmethod
  def load(cls, path: str | os.PathLike) -> "PrivacyLedger":
    """Reads a ledger written by `save` (see `from_json`)."""
    with open(os.fspath(path), encoding="utf-8") as f:
      return cls.from_json(f.read())


def _parse(text: str) -> dict[str, Any]:
  try:
    data = json.loads(text)
  except json.JSONDecodeError as err:
    raise ValueError(f"not a privacy ledger (invalid JSON): {err}") from err
  if not isinstance(data, dict) or data.get("format") != _FORMAT:
    raise ValueError("not a privacy ledger: missing format marker "
                     f"{_FORMAT!r}")
  if data.get("version") not in _READABLE_VERSIONS:
    raise ValueError(f"unsupported ledger version {data.get('version')!r}")
  return data
