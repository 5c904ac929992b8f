"""Neighbouring relations of DpEvents: tags, and the flattening that checks them.

dp_accounting's DpEvents carry no neighbouring relation; its accountants take one for the
whole ledger. Here every event that `accounting` builds is a `TaggedDpEvent`: a
`SelfComposedDpEvent` (so `.event` and `.count` read as before, and dp_accounting's own
accountants still accept it) that also names the relation under which its sensitivity was
derived. `flatten` walks a tree, merges identical leaves and returns the ONE relation of the
tree, or raises if two parts disagree: a replace-one figure composed with an add/remove one is
neither.

Relations (the strings of `train/records.py`):

* `REPLACE_ONE` ("replace-one"): one private record is replaced by another; the comparison
  tables use it.
* `ADD_REMOVE` ("add-remove"): one private record is added or removed (DP-SGD's usual one).

Untagged leaves: randomized response is replace-one (dp_accounting analyses it only so); a
`PoissonSampledDpEvent` is add-remove (dp_accounting's default); a Gaussian or Laplace leaf
(noise multiplier = std ÷ the distance under the caller's relation, evaluated with a unit shift)
and NoOp / NonPrivate take the relation of the tree they are in (None if nothing fixes one).
"""

from __future__ import annotations

import attr
from dp_accounting import dp_event

REPLACE_ONE = "replace-one"
ADD_REMOVE = "add-remove"
RELATIONS = (REPLACE_ONE, ADD_REMOVE)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class TaggedDpEvent(dp_event.SelfComposedDpEvent):
  """`count` repetitions of `event`, all under the neighbouring relation `relation`.

  Attributes:
    event: the repeated event (its sensitivities derived under `relation`).
    count: number of repetitions (>= 1).
    relation: `REPLACE_ONE` or `ADD_REMOVE`.
  """

  relation: str

  def __attrs_post_init__(self):
    check_relation(self.relation)
    if not isinstance(self.event, dp_event.DpEvent):
      raise TypeError(f"TaggedDpEvent.event must be a DpEvent, got {self.event!r}")
    if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
      raise ValueError(f"TaggedDpEvent.count must be an integer >= 1, got {self.count!r}")


def check_relation(relation: str) -> str:
  """`relation` if it is one of `RELATIONS`, else ValueError."""
  if relation not in RELATIONS:
    raise ValueError(f"neighbouring relation must be one of {RELATIONS}, got {relation!r}")
  return relation


def tag(event: dp_event.DpEvent, relation: str, count: int = 1) -> dp_event.DpEvent:
  """`count` repetitions of `event` tagged with `relation` (NoOp if count is 0).

  Args:
    event: any event tree.
    relation: `REPLACE_ONE` or `ADD_REMOVE`.
    count: repetitions (>= 0).

  Returns:
    A `TaggedDpEvent`, or `NoOpDpEvent` for count 0 (nothing released, no relation needed).
  """
  check_relation(relation)
  if count == 0:
    return dp_event.NoOpDpEvent()
  return TaggedDpEvent(event, count, relation)


def _implicit_relation(leaf: dp_event.DpEvent) -> str | None:
  if isinstance(leaf, dp_event.RandomizedResponseDpEvent):
    return REPLACE_ONE
  if isinstance(leaf, dp_event.PoissonSampledDpEvent):
    return ADD_REMOVE
  return None


def _walk(event, count: int, relation: str | None, leaves: list, seen: dict) -> None:
  """Depth-first walk: merges leaves into `leaves`, records relations in `seen`."""
  if count == 0 or isinstance(event, dp_event.NoOpDpEvent):
    return
  if isinstance(event, TaggedDpEvent):
    if relation is not None and event.relation != relation:
      raise ValueError(
          f"mixed neighbouring relations: a {event.relation} event inside a {relation} one; "
          "account for them separately")
    seen.setdefault(event.relation, event)
    _walk(event.event, count * event.count, event.relation, leaves, seen)
  elif isinstance(event, dp_event.SelfComposedDpEvent):
    _walk(event.event, count * event.count, relation, leaves, seen)
  elif isinstance(event, dp_event.ComposedDpEvent):
    for sub_event in event.events:
      _walk(sub_event, count, relation, leaves, seen)
  else:
    implicit = _implicit_relation(event)
    if relation is not None and implicit is not None and implicit != relation:
      if isinstance(event, dp_event.RandomizedResponseDpEvent):
        raise ValueError(f"randomized response is analysed under {REPLACE_ONE} only; it "
                         f"cannot be part of a {relation} event")
      implicit = relation  # A tag fixes the relation of an untagged Poisson sample.
    if relation is None and implicit is not None:
      seen.setdefault(implicit, event)
    for pair in leaves:
      if pair[0] == event:
        pair[1] += count
        return
    leaves.append([event, count])


def flatten(event: dp_event.DpEvent) -> tuple[list[list], str | None]:
  """Merged [leaf, count] pairs of a tree and its one neighbouring relation.

  Args:
    event: any tree of Composed / SelfComposed / Tagged events over leaf events.

  Returns:
    (leaves, relation): relation is None if no part fixes one (e.g. only untagged Gaussians).

  Raises:
    ValueError: two parts of the tree are under different relations.
  """
  if not isinstance(event, dp_event.DpEvent):
    raise TypeError(f"event must be a dp_accounting DpEvent, got {event!r}")
  leaves, seen = [], {}
  _walk(event, 1, None, leaves, seen)
  if len(seen) > 1:
    examples = ", ".join(f"{type(part).__name__} under {rel}" for rel, part in seen.items())
    raise ValueError(
        "cannot compose events of different neighbouring relations (a replace-one ε and an "
        f"add/remove ε measure different things): {examples}. Build every part under one "
        "relation (e.g. dpsgd_event(..., relation='replace-one')) or account for them "
        "separately")
  return leaves, next(iter(seen), None)


def relation_of(event: dp_event.DpEvent) -> str | None:
  """The neighbouring relation of an event tree (None if nothing fixes one); raises if mixed."""
  return flatten(event)[1]
