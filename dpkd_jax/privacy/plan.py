"""The one shape of a privacy plan, shared by every method (cf. jax_privacy's execution plan).

A method's `make_plan(config, ...)` resolves the user's privacy flags once (calibrating σ or
the number of releases for a target ε) into a frozen subclass of `Plan` that holds

* the executed noise parameters (method-specific fields, e.g. `noise_multiplier`),
* `releases`: how many releases the run will execute (steps, queries, rounds),
* `delta`, the neighbouring `relation` of its events, which `accounting` chose σ/releases,
* `budget_epsilon`: the ledger's budget (None: nothing is released with noise, no ledger),
* `sound_epsilon` of all planned releases and the paper's own figure beside it (or None),

and `event(n)`: the `dp_accounting` event of n of its releases, tagged with `relation`.

The step builder takes its σ from the plan and the ledger takes `event(n)` and
`budget_epsilon` from the same object, so σ has exactly one source: change the plan and both
change (each method has a test of that).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dp_accounting import dp_event

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import validation

ACCOUNTINGS = ("sound", "paper")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  """Base of every method's plan; subclasses add their noise fields and define `event`.

  Attributes:
    releases: releases the run executes (the unit of `event`).
    delta: δ of every ε of the plan.
    relation: the neighbouring relation of `event` (replace-one for every comparison table).
    accounting: "sound" (dp_accounting chose σ/releases) or "paper" (the paper's formula did;
      the sound figure is still the one reported and kept by the ledger).
    budget_epsilon: the ledger's budget, or None when nothing is released with noise.
    sound_epsilon: ε at `delta` of `event(releases)` (inf: a release without noise).
    paper_epsilon: the paper's own figure for the same run, or None.
  """

  releases: int
  delta: float
  relation: str = neighbouring.REPLACE_ONE
  accounting: str = "sound"
  budget_epsilon: float | None
  sound_epsilon: float
  paper_epsilon: float | None = None

  def __post_init__(self):
    if isinstance(self.releases, bool) or not isinstance(self.releases, int) or self.releases < 0:
      raise ValueError(f"releases must be an integer >= 0, got {self.releases!r}")
    if not 0 < self.delta < 1:
      raise ValueError(f"delta must be in (0, 1), got {self.delta}")
    neighbouring.check_relation(self.relation)
    if self.accounting not in ACCOUNTINGS:
      raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {self.accounting!r}")
    if self.budget_epsilon is not None and not self.budget_epsilon > 0:
      raise ValueError(f"budget_epsilon must be > 0 or None, got {self.budget_epsilon}")

  def event(self, releases: int) -> dp_event.DpEvent:
    """The dp_accounting event of `releases` releases of this plan, tagged with `relation`."""
    raise NotImplementedError(f"{type(self).__name__} must define event(releases)")

  @property
  def private(self) -> bool:
    """True when the run keeps a ledger (its releases carry noise)."""
    return self.budget_epsilon is not None

  def new_ledger(self) -> ledger_lib.PrivacyLedger | None:
    """An empty ledger with this plan's budget (None for a run without noise)."""
    if not self.private:
      return None
    return ledger_lib.PrivacyLedger(target_epsilon=self.budget_epsilon, delta=self.delta,
                                   relation=self.relation)

  def to_json(self) -> dict[str, Any]:
    """The plan as JSON-ready values (inf stays a float: `json` writes Infinity)."""
    out = dataclasses.asdict(self)
    out["plan"] = type(self).__name__
    return out


class PlanAccountant:
  """The releases a user's loop has made under a plan, and their ε: the plan's `event(n)`.

  `step()` after each release (DP-SGD step, DPDFD step); it refuses to pass the plan's
  `releases`, the count its noise was calibrated for. `epsilon()` is at the plan's δ.
  """

  def __init__(self, plan: Plan):
    self.plan, self.steps = plan, 0

  def step(self, count: int = 1) -> None:
    """Counts `count` more releases; raises `BudgetExceededError` past the plan's."""
    count = validation.check_int("count", count, minimum=0)
    if self.steps + count > self.plan.releases:
      raise ledger_lib.BudgetExceededError(
          f"the plan allows {self.plan.releases} releases; {self.steps + count} would exceed it")
    self.steps += count

  def event(self, *, relation: str | None = None) -> dp_event.DpEvent:
    """The event of the releases so far, under the plan's relation unless `relation` is given
    (only plans whose events exist under both relations, e.g. DP-SGD's, accept it)."""
    if relation is None:
      return self.plan.event(self.steps)
    return self.plan.event(self.steps, relation=relation)

  def epsilon(self, *, relation: str | None = None) -> float:
    """ε at the plan's δ of the releases so far (0 before the first)."""
    return accounting.epsilon(self.event(relation=relation), delta=self.plan.delta)


def budget(*, target_epsilon: float | None, accounting: str, sound_epsilon: float) -> float | None:
  """The ledger budget every method uses: the target in sound mode, else the sound ε of the
  planned run (the ledger still refuses anything beyond the plan); None without noise or
  without releases."""
  if math.isinf(sound_epsilon) or (sound_epsilon == 0 and target_epsilon is None):
    return None  # noise-free releases (no finite ε to keep), or nothing released at all
  if target_epsilon is not None and accounting == "sound":
    return float(target_epsilon)
  return float(sound_epsilon)
