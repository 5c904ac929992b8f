"""The privacy plan of a reverse k-NN run: the vote release's noise and its events.

One release = one labelling round: the (s, C) vote counts of the private records for the
round's s public queries. `make_plan(config)` splits the run's ε evenly over the T rounds,
ε_r = ε / T, and is the only place that does; the plan's fields are what the votes mechanism
executes (`votes.release_counts(plan, ...)`) and what `event(n)` accounts, so both come from
one object.

Relation: replace one private record (r = 1 label per record). A record adds exactly k ones
to the count matrix, one in each of its k nearest queries (distinct), in its label's column;
replacing it moves the matrix by at most Δ₁ = 2 k in L1 norm, and its local report by at most
2 k bits (`l1_sensitivity`, the same number in both modes).

* Central: exact discrete Laplace DLap(t) on every integer cell, t = `laplace_scale`, the
  rational Δ₁ / ε_r rounded up (`privacy.discrete_laplace.rational_scale`): each round is
  pure (Δ₁ / t <= ε_r)-DP, event `DiscreteLaplaceDpEvent(a = 1/t, Δ₁)`
  (`accounting.discrete_laplace_counts_event`). The released counts are integers.
* Local: every record flips each bit of its own (s · C) vote vector with
  p = 1 / (e^{ε_r / (2k)} + 1) (`flip_probability`, the float32 value the mechanism draws
  with), so its report is ε_r-LDP. The released counts are the debiased sum of the reports,
  post-processing of n reports of which a replaced record changes only its own: each round is
  also pure ε_r-DP under replace-one, accounted with binary randomized response of ε_r, which
  dominates every pure ε_r-DP mechanism (Kairouz et al. 2015; `accounting.srr_event` with
  `num_classes=None`). What the ledger charges is that central replace-one guarantee. The
  per-record local one holds against the curator only if the records draw their own flips;
  this run simulates them with the run's key, which the curator holds (checkpoint "rng"), so
  `privacy_unit` says "simulated".

Rounds compose: the run is pure ε-DP (δ = 0, the paper's figure, `paper_epsilon`); the ledger
keeps the PLD ε of the T events at `delta` (`sound_epsilon`, at most ε up to the PLD grid).
"""

from __future__ import annotations

import dataclasses
import fractions
from typing import Any

from dp_accounting import dp_event

from dpkd_jax import config_checks as checks
from dpkd_jax.methods.rknn import config as config_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import counts as counts_lib
from dpkd_jax.privacy import discrete_laplace
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import plan as plan_lib


def _central_scale(k: int, epsilon_per_round: float) -> fractions.Fraction:
  """t: Δ₁ / ε_r = 2k / ε_r rounded up to an exact rational (the scale executed)."""
  return discrete_laplace.rational_scale(2 * k, epsilon_per_round)


def _rounds_event(mode: str, k: int, epsilon_per_round: float,
                  rounds: int) -> dp_event.DpEvent:
  """The replace-one event of `rounds` vote releases of ε_r each (module docstring)."""
  if mode == "central":
    return accounting.discrete_laplace_counts_event(
        scale=_central_scale(k, epsilon_per_round), l1_sensitivity=2 * k, rounds=rounds)
  return accounting.srr_event(epsilon_per_query=epsilon_per_round, num_queries=rounds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RKNNPlan(plan_lib.Plan):
  """The executed noise of a reverse k-NN run; `releases` = rounds (module docstring).

  Attributes:
    mode: "central" (discrete Laplace counts) or "local" (per-record bit flipping).
    k: nearest queries each record votes for (the votes counted AND the sensitivity 2 k).
    epsilon_per_round: ε_r of one round's release (pure ε_r-DP).
  """

  mode: str
  k: int
  epsilon_per_round: float

  def __post_init__(self):
    super().__post_init__()
    checks.one_of("mode", self.mode, config_lib.MODES)
    checks.integer("k", self.k, minimum=1)
    checks.positive(self, "epsilon_per_round")
    if self.relation != neighbouring.REPLACE_ONE:
      raise ValueError(f"reverse k-NN sensitivities are derived under replace-one, not "
                       f"{self.relation!r}")

  @property
  def l1_sensitivity(self) -> float:
    """Δ₁ = 2 k: the L1 move of the counts (central) or Hamming move of a report (local)."""
    return 2.0 * self.k

  @property
  def laplace_scale(self) -> fractions.Fraction | None:
    """Central: the executed discrete Laplace scale t >= Δ₁ / ε_r; None in local mode."""
    return _central_scale(self.k, self.epsilon_per_round) if self.mode == "central" else None

  @property
  def flip_probability(self) -> float | None:
    """Local: each report bit's flip probability, as drawn (float32); None when central."""
    if self.mode != "local":
      return None
    return float(counts_lib.ldp_flip_probability(self.epsilon_per_round, self.k, 1))

  @property
  def privacy_unit(self) -> str:
    """What one ε protects, for the results."""
    if self.mode == "central":
      return "one private record, replace-one (central ε-DP of the released counts)"
    return ("one private record's own reports (local ε-DP, per record; simulated: the run "
            "draws every record's flips, the ledger charges the replace-one ε of the counts)")

  def event(self, releases: int) -> dp_event.DpEvent:
    """The replace-one event of `releases` rounds (a NoOp for 0)."""
    return _rounds_event(self.mode, self.k, self.epsilon_per_round, releases)

  def to_json(self) -> dict[str, Any]:
    """The fields and the derived noise parameters the mechanism executes."""
    scale = self.laplace_scale  # its denominator divides 1024: the float is exact
    return {**super().to_json(), "l1_sensitivity": self.l1_sensitivity,
            "laplace_scale": None if scale is None else float(scale),
            "flip_probability": self.flip_probability}


def make_plan(config: config_lib.RKNNConfig) -> RKNNPlan:
  """The plan of `config`: ε_r = ε / T for each of the T rounds (module docstring).

  The ledger's budget is the PLD ε of the planned rounds at δ (`plan.budget` without a
  target): `config.epsilon` is a pure ε (δ = 0), not a target at δ, and is kept as the
  paper's figure beside the sound one.
  """
  epsilon_per_round = config.epsilon / config.rounds
  sound_epsilon = accounting.epsilon(
      _rounds_event(config.mode, config.k, epsilon_per_round, config.rounds),
      delta=config.delta)
  return RKNNPlan(
      releases=config.rounds, delta=config.delta, accounting="sound",
      budget_epsilon=plan_lib.budget(target_epsilon=None, accounting="sound",
                                     sound_epsilon=sound_epsilon),
      sound_epsilon=sound_epsilon, paper_epsilon=config.epsilon, mode=config.mode, k=config.k,
      epsilon_per_round=epsilon_per_round)
