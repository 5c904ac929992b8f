"""RONA's privacy plan: the executed σ, the planned queries T and what they cost.

Every query sanitizes one (S, ...) batch of teacher knowledge: Frobenius clip to B, then
N(0, σ²B²) per coordinate. Under replace-one of a sensitive record the teacher, and so the whole
batch, may change: the clipped batches are within 2B, so each query is a Gaussian mechanism
with noise multiplier σ/2 (`accounting.rona_event`), for any B that does not depend on
sensitive data. T = (Th + R·Td)·ceil(|x_q|/S) queries (`accounting.rona_num_queries`) are
composed with dp_accounting (PLD); `target_epsilon` calibrates σ for them. The paper's own
per-query figure (`paper_accounting.paper_rona_epsilon`: classic Gaussian mechanism with
sensitivity B) is computed beside it with its warning; it is never the budget.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

from dpkd_jax.methods.rona_config import RONAConfig
from dpkd_jax.methods.rona_step import BoundState
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import paper_accounting


class RONAPlan(NamedTuple):
  """σ executed, T planned and what they cost: the sound ε (PLD, inf at σ = 0), the paper's
  per-query figure (None at σ = 0) and the ledger budget (target, else the planned ε)."""

  num_queries: int
  queries_per_epoch: int
  noise_multiplier: float
  planned_epsilon: float
  paper_epsilon_per_query: float | None
  paper_epsilon_warning: str | None
  budget_epsilon: float


def make_plan(config: RONAConfig) -> RONAPlan:
  """Resolves σ (calibrating it for `target_epsilon`) and the ε of the planned queries.

  Args:
    config: a validated `rona.RONAConfig`.

  Returns:
    The plan. Raises ValueError for a target ε with no queries to calibrate.
  """
  num_queries = config.num_queries()
  event = lambda sigma: accounting.rona_event(noise_multiplier=sigma,  # noqa: E731
                                              num_queries=num_queries)
  if config.target_epsilon is not None:
    if num_queries == 0:
      raise ValueError("target_epsilon needs queries: hint_epochs + rounds * "
                       "distillation_epochs is 0, nothing is released")
    sigma = calibration.calibrate_noise_multiplier(
        event, target_epsilon=config.target_epsilon, delta=config.delta)
  else:
    sigma = float(config.noise_multiplier)
  planned = accounting.epsilon(event(sigma), delta=config.delta) if sigma > 0 else (
      math.inf if num_queries else 0.0)
  paper = warning = None
  if sigma > 0:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always", paper_accounting.PaperAccountingWarning)
      paper = paper_accounting.paper_rona_epsilon(noise_multiplier=sigma, delta=config.delta)
    warning = "; ".join(str(w.message) for w in caught)
  budget = config.target_epsilon if config.target_epsilon is not None else planned
  return RONAPlan(num_queries=num_queries,
                  queries_per_epoch=-(-config.num_query_samples // config.batch_size),
                  noise_multiplier=sigma, planned_epsilon=planned,
                  paper_epsilon_per_query=paper, paper_epsilon_warning=warning,
                  budget_epsilon=budget)


def final_bounds(config: RONAConfig,
                 bounds: dict[str, BoundState]) -> dict[str, float | None]:
  """The B in force at the end per kind: the running mean (adaptive), the fixed B, or None."""
  if config.bound_mode == "fixed":
    return {"hint": config.hint_l2_bound, "distill": config.distill_l2_bound}
  if config.bound_mode == "none":
    return {"hint": None, "distill": None}
  return {k: float(b.norm_sum) / max(float(b.count), 1.0) for k, b in bounds.items()}
