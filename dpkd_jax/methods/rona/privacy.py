"""RONA's privacy plan: the executed σ and bound, the planned queries T and what they cost.

Every query sanitizes one (S, ...) batch of teacher knowledge: Frobenius clip to B, then
N(0, σ²B²) per coordinate. Under replace-one of a sensitive record the teacher, and so the whole
batch, may change: the clipped batches are within 2B, so each query is a Gaussian mechanism
with noise multiplier σ/2 (`accounting.rona_event`), for any B that does not depend on
sensitive data. T = (Th + R·Td)·ceil(|x_q|/S) queries (`accounting.rona_num_queries`) are
composed with dp_accounting (PLD); `target_epsilon` calibrates σ for them. The paper's own
figures are computed beside it, never as the budget: its Theorem 2 over the T queries
(`paper_accounting.paper_rona_composed_epsilon`, a reconstruction: moments accountant at
sensitivity B) and its per-query classic Gaussian figure (`paper_rona_epsilon`). With
`accounting="paper"` the paper's Theorem 2 calibrates σ instead (warned); the ledger still
keeps the sound ε of the same run, which is then above the target.

`make_plan` is the only place σ is resolved; the steps take σ and B from the plan
(`RONAPlan.sanitize_config`) and the ledger takes `plan.event(n)`, so both have one source.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from dp_accounting import dp_event

from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona.config import RONAConfig
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.privacy import plan as plan_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class RONAPlan(plan_lib.Plan):
  """σ and B executed, T queries planned (`releases`) and what they cost.

  `sound_epsilon` is the PLD ε of the T queries (inf at σ = 0 with queries, 0 without any);
  `paper_epsilon` the paper's Theorem 2 figure of the T queries (None at σ = 0);
  `budget_epsilon` the target in sound mode, else the planned sound ε (None without noise: no
  ledger).

  Attributes:
    noise_multiplier: σ >= 0 of every query (noise std σB).
    queries_per_epoch: ceil(|x_q|/S), the queries of one private epoch (what is charged).
    bound_mode: "adaptive", "fixed" or "none" (σ = 0 only).
    hint_l2_clip_norm, distill_l2_clip_norm: B of the fixed mode per kind, else None.
    paper_epsilon_per_query: the paper's per-query classic Gaussian figure (None at σ = 0).
    paper_epsilon_warning: the paper formula's warnings (premise not met), or None.
  """

  noise_multiplier: float
  queries_per_epoch: int
  bound_mode: str = "adaptive"
  hint_l2_clip_norm: float | None = None
  distill_l2_clip_norm: float | None = None
  paper_epsilon_per_query: float | None = None
  paper_epsilon_warning: str | None = None

  def __post_init__(self):
    super().__post_init__()
    for kind in ("hint", "distill"):
      self.sanitize_config(kind)  # σ >= 0 and the bound of each kind are valid

  def event(self, releases: int) -> dp_event.DpEvent:
    """`releases` queries: Gaussian(σ/2) each, replace-one (`accounting.rona_event`)."""
    return accounting.rona_event(noise_multiplier=self.noise_multiplier, num_queries=releases)

  def sanitize_config(self, kind: str) -> sanitize.SanitizeConfig:
    """σ and the bound of the release of `kind` ("hint" or "distill") knowledge."""
    bound = {"hint": self.hint_l2_clip_norm, "distill": self.distill_l2_clip_norm}[kind]
    return sanitize.SanitizeConfig(noise_multiplier=self.noise_multiplier,
                                   bound_mode=self.bound_mode, l2_bound=bound)

  def results_fields(self) -> dict[str, Any]:
    """The plan as results.json has always shown it (RONA's names of the shared fields)."""
    return {"num_queries": self.releases, "queries_per_epoch": self.queries_per_epoch,
            "noise_multiplier": self.noise_multiplier, "planned_epsilon": self.sound_epsilon,
            "accounting": self.accounting, "paper_epsilon_composed": self.paper_epsilon,
            "paper_epsilon_per_query": self.paper_epsilon_per_query,
            "paper_epsilon_warning": self.paper_epsilon_warning,
            "budget_epsilon": self.budget_epsilon}


def _paper_figures(sigma: float, delta: float, num_queries: int
                   ) -> tuple[float | None, float | None, str | None]:
  """(the paper's Theorem 2 ε of the T queries, its per-query ε, the per-query formula's
  warnings joined) at σ > 0; (None, None, None) at σ = 0."""
  if sigma == 0:
    return None, None, None
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", paper_accounting.PaperAccountingWarning)
    per_query = paper_accounting.paper_rona_epsilon(noise_multiplier=sigma, delta=delta)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    composed = paper_accounting.paper_rona_composed_epsilon(
        noise_multiplier=sigma, num_queries=num_queries, delta=delta)
  return composed, per_query, "; ".join(str(w.message) for w in caught)


def _calibrate(config: RONAConfig, num_queries: int, event) -> float:
  """σ for `config.target_epsilon` over `num_queries` queries: by dp_accounting (sound) or by
  the paper's Theorem 2 reconstruction (paper; warned)."""
  if num_queries == 0:
    raise ValueError("target_epsilon needs queries: hint_epochs + rounds * "
                     "distillation_epochs is 0, nothing is released")
  if config.accounting == "sound":
    return calibration.calibrate_noise_multiplier(
        event, target_epsilon=config.target_epsilon, delta=config.delta)
  warnings.warn("accounting='paper': sigma is set by RONA's Theorem 2 (a reconstruction, "
                "sensitivity B), which is NOT a valid guarantee for this mechanism; the sound "
                "epsilon of the run is reported and kept by the ledger.",
                paper_accounting.PaperAccountingWarning, stacklevel=3)
  return paper_accounting.paper_rona_noise_multiplier(
      target_epsilon=config.target_epsilon, num_queries=num_queries, delta=config.delta)


def make_plan(config: RONAConfig) -> RONAPlan:
  """Resolves σ (calibrating it for `target_epsilon`) and the ε of the planned queries.

  Args:
    config: a validated `RONAConfig`.

  Returns:
    The plan. Raises ValueError for a target ε with no queries to calibrate.
  """
  num_queries = config.num_queries()
  event = lambda sigma: accounting.rona_event(noise_multiplier=sigma,  # noqa: E731
                                              num_queries=num_queries)
  if config.target_epsilon is not None:
    sigma = _calibrate(config, num_queries, event)
  else:
    sigma = float(config.noise_multiplier)
  planned = accounting.epsilon(event(sigma), delta=config.delta) if sigma > 0 else (
      math.inf if num_queries else 0.0)
  paper, per_query, warning = _paper_figures(sigma, config.delta, num_queries)
  return RONAPlan(
      releases=num_queries, queries_per_epoch=config.queries_per_epoch(),
      noise_multiplier=sigma, bound_mode=config.bound_mode,
      hint_l2_clip_norm=config.hint_l2_clip_norm,
      distill_l2_clip_norm=config.distill_l2_clip_norm, delta=config.delta,
      accounting=config.accounting,
      budget_epsilon=plan_lib.budget(target_epsilon=config.target_epsilon,
                                     accounting=config.accounting, sound_epsilon=planned),
      sound_epsilon=planned, paper_epsilon=paper, paper_epsilon_per_query=per_query,
      paper_epsilon_warning=warning)


def final_bounds(plan: RONAPlan,
                 bounds: dict[str, sanitize.BoundState]) -> dict[str, float | None]:
  """The B in force at the end per kind: the running mean (adaptive), the fixed B, or None."""
  if plan.bound_mode == "fixed":
    return {"hint": plan.hint_l2_clip_norm, "distill": plan.distill_l2_clip_norm}
  if plan.bound_mode == "none":
    return {"hint": None, "distill": None}
  return {k: float(b.norm_sum) / max(float(b.count), 1.0) for k, b in bounds.items()}
