"""From canary scores and inclusion bits to lower bounds on ε: `jax_privacy.auditing`.

`audit_scores` hands the scores of the included (S_i = 1) and excluded canaries to
`jax_privacy.auditing.CanaryScoreAuditor` and reads off, at confidence 1 - significance
(95% by default):

  epsilon_lower_bound   Steinke, Nasr, Jagielski (2023), "Privacy auditing with one (1)
                        training run": the largest ε whose (ε, δ) claim the guesses "in" for
                        the top-scoring canaries falsify (`epsilon_one_run`);
  epsilon_lower_bound_fdp  Mahloujifar et al. (2024), "Auditing f-DP in one run": the same
                        guesses against Gaussian f-DP (`epsilon_one_run_fdp`), tighter when
                        the mechanism is Gaussian;
  auroc, tpr_at_1pct_fpr  the attack's ROC summary (descriptive, no confidence);
  epsilon_ceiling       the bound perfectly separated scores of the same m canaries would give:
                        no run audited with m canaries can show more (one-run bounds saturate
                        in m), so a claim above it cannot be falsified by this audit.

Both bounds take the threshold by Bonferroni over every threshold (the auditor's default), so
they hold at the stated confidence without a split. A bound above a sound claim would be the
evidence of a privacy bug; a bound of 0 proves nothing by itself (the ceiling and the
non-private reference runs show the audit's power).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from dpkd_jax import errors

CONFIDENCE = 0.95
FPR = 0.01


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditResult:
  """One audit of one released artefact.

  Attributes:
    epsilon_lower_bound: one-run (ε, δ) lower bound at `confidence` (>= 0).
    epsilon_lower_bound_fdp: the f-DP (Gaussian) one-run lower bound at `confidence` (>= 0).
    epsilon_ceiling: the bound of perfectly separated scores with the same m (module docstring).
    auroc: area under the attack's ROC curve (0.5: no signal).
    tpr_at_1pct_fpr: the attack's largest TPR at FPR 1%.
    m: canaries; included: how many had S_i = 1.
    delta: δ of the bounds (the run's claimed δ).
    confidence: 1 - significance of the bounds.
    score: what each canary's score is, in words.
    threat_model: what the attacker sees, in words.
  """

  epsilon_lower_bound: float
  epsilon_lower_bound_fdp: float
  epsilon_ceiling: float
  auroc: float
  tpr_at_1pct_fpr: float
  m: int
  included: int
  delta: float
  confidence: float
  score: str
  threat_model: str

  def __post_init__(self):
    for name in ("epsilon_lower_bound", "epsilon_lower_bound_fdp", "epsilon_ceiling"):
      value = getattr(self, name)
      if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value}")

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _auditing():
  """`jax_privacy.auditing` (the `audit` extra), or a one-line UserError saying how to get it."""
  try:
    from jax_privacy import auditing  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise errors.UserError("audits need jax-privacy: pip install 'dpkd-jax[audit]' "
                           f"({error})") from error
  return auditing


def _bounds(auditor: Any, significance: float,
            delta: float) -> tuple[float, float]:
  return (max(float(auditor.epsilon_one_run(significance, delta)), 0.0),
          max(float(auditor.epsilon_one_run_fdp(significance, delta)), 0.0))


def audit_scores(scores: np.ndarray, included: np.ndarray, *, delta: float,
                 confidence: float = CONFIDENCE, score: str = "", threat_model: str = ""
                 ) -> AuditResult:
  """The audit of m canary scores (higher = "more likely trained on").

  Args:
    scores: (m,) finite scores, computed without the inclusion bits.
    included: (m,) bool inclusion bits S_i; both values must occur.
    delta: δ of the claim the bound is compared with, in (0, 1).
    confidence: of the two ε bounds, in (0, 1).
    score / threat_model: descriptions kept in the result.
  """
  scores = np.asarray(scores, np.float64)
  included = np.asarray(included, bool)
  if scores.ndim != 1 or scores.shape != included.shape:
    raise ValueError(f"scores {scores.shape} and included {included.shape} must be (m,) alike")
  if not np.all(np.isfinite(scores)):
    raise ValueError("canary scores must be finite")
  if included.all() or not included.any():
    raise ValueError("an audit needs both included and excluded canaries")
  if not (0 < delta < 1 and 0 < confidence < 1):
    raise ValueError(f"delta {delta} and confidence {confidence} must be in (0, 1)")
  significance = 1.0 - confidence
  auditing = _auditing()
  auditor = auditing.CanaryScoreAuditor(scores[included], scores[~included])
  eps, eps_fdp = _bounds(auditor, significance, delta)
  k = int(included.sum())
  perfect = auditing.CanaryScoreAuditor(np.ones(k), np.zeros(len(scores) - k))
  return AuditResult(
      epsilon_lower_bound=eps, epsilon_lower_bound_fdp=eps_fdp,
      epsilon_ceiling=max(_bounds(perfect, significance, delta)),
      auroc=float(auditor.attack_auroc()), tpr_at_1pct_fpr=float(auditor.tpr_at_given_fpr(FPR)),
      m=len(scores), included=k, delta=float(delta), confidence=float(confidence),
      score=score, threat_model=threat_model)
