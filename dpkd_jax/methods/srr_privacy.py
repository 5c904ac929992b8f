"""Privacy planning of DP-DFD with selective randomized response: per-query ε, queries, and the
two figures that are always reported together.

* paper: ε-label-DP per synthetic query (`paper_accounting.paper_srr_label_epsilon`).
* labels: the record-level ε of the teacher labels, i.e. of all n RR queries composed
  (`accounting.srr_event`, PLD, binary-RR bound): one private record may change the teacher,
  hence every label. `target_epsilon` acts on this figure.
* record level: the labels figure when no teacher information reaches the generator except
  through the noisy labels (`generator_prior="none"`); infinite when the generator was
  pretrained against the teacher (`"teacher"`, the paper's pipeline), because the synthetic
  queries, and the student trained on them, are then a noiseless function of the teacher
  (see `srr` for the argument).

`plan(...)` turns the flags into the executed per-query ε and number of stages:

* no target: ε and stages as given.
* target and ε: the most stages (<= the requested ones) whose queries fit the target.
* target, no ε: the per-query ε at which all requested queries fit the target.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import paper_accounting

GENERATOR_PRIORS = ("teacher", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SRRPrivacyPlan:
  """What will be executed and what it costs.

  Attributes:
    epsilon_per_query: ε of one RR query (math.inf: labels released without noise).
    stages: number of stages S.
    samples_per_stage: N, teacher queries per stage.
    num_queries: S * N, each answered exactly once.
    labels_epsilon: record-level ε at `delta` of all RR queries composed (PLD).
    record_epsilon: record-level ε of the whole run: `labels_epsilon`, or inf if the
      generator was pretrained against the teacher.
    paper_label_epsilon: the paper's ε-label-DP per query (= epsilon_per_query).
    delta: δ.
    generator_prior: "teacher" or "none".
  """

  epsilon_per_query: float
  stages: int
  samples_per_stage: int
  num_queries: int
  labels_epsilon: float
  record_epsilon: float
  paper_label_epsilon: float
  delta: float
  generator_prior: str


def labels_epsilon(epsilon_per_query: float, num_queries: int, delta: float) -> float:
  """Record-level ε of `num_queries` ε-DP RR label queries composed (inf if ε is inf)."""
  if math.isinf(epsilon_per_query):
    return math.inf
  return accounting.epsilon(accounting.srr_event(
      epsilon_per_query=epsilon_per_query, num_queries=num_queries), delta=delta)


def paper_label_epsilon(epsilon_per_query: float) -> float:
  """The paper's per-query label-DP figure, without its (documented) warning."""
  if math.isinf(epsilon_per_query):
    return math.inf
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    return paper_accounting.paper_srr_label_epsilon(epsilon_per_query)


def check_request(*, epsilon: float | None, target_epsilon: float | None, delta: float,
                  stages: int, samples_per_stage: int, generator_prior: str) -> None:
  """Raises ValueError for inconsistent privacy flags (cheap: no accounting)."""
  if generator_prior not in GENERATOR_PRIORS:
    raise ValueError(f"generator_prior must be one of {GENERATOR_PRIORS}, got {generator_prior!r}")
  for name, value in (("stages", stages), ("samples_per_stage", samples_per_stage)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  if not 0 < delta < 1:
    raise ValueError(f"delta must be in (0, 1), got {delta}")
  if epsilon is None and target_epsilon is None:
    raise ValueError("give epsilon (per query), target_epsilon (record level), or both")
  if epsilon is not None and not (epsilon > 0 and not math.isnan(epsilon)):
    raise ValueError(f"epsilon (per query) must be > 0 (inf: no noise), got {epsilon}")
  if target_epsilon is not None and not (0 < target_epsilon < math.inf):
    raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon}")
  if target_epsilon is not None and epsilon is not None and math.isinf(epsilon):
    raise ValueError("a target_epsilon needs noisy labels: epsilon=inf has no finite ε")


def plan(*, epsilon: float | None, target_epsilon: float | None, delta: float, stages: int,
         samples_per_stage: int, generator_prior: str) -> SRRPrivacyPlan:
  """Resolves the per-query ε and the number of stages; see the module docstring.

  Raises:
    ValueError: inconsistent flags, or a target that not even one stage fits.
  """
  check_request(epsilon=epsilon, target_epsilon=target_epsilon, delta=delta, stages=stages,
                samples_per_stage=samples_per_stage, generator_prior=generator_prior)
  run_stages = stages
  if target_epsilon is not None and epsilon is not None:
    if labels_epsilon(epsilon, samples_per_stage, delta) > target_epsilon:
      raise ValueError(
          f"target_epsilon={target_epsilon} allows no stage: one stage of {samples_per_stage}"
          f" queries at epsilon={epsilon} per query already costs record-level ε ="
          f" {labels_epsilon(epsilon, samples_per_stage, delta):.4g}")
    run_stages = calibration.calibrate_steps(
        lambda s: accounting.srr_event(epsilon_per_query=epsilon,
                                       num_queries=s * samples_per_stage),
        target_epsilon=target_epsilon, delta=delta, max_steps=stages)
  elif target_epsilon is not None:
    # Calibrate the "noise" 1/ε per query: ε of the run decreases as it grows.
    try:
      inverse = calibration.calibrate_noise_multiplier(
          lambda s: accounting.srr_event(epsilon_per_query=1.0 / s,
                                         num_queries=stages * samples_per_stage),
          target_epsilon=target_epsilon, delta=delta)
    except ValueError as err:
      raise ValueError(f"cannot fit {stages * samples_per_stage} queries into target_epsilon="
                       f"{target_epsilon}: {err}") from err
    epsilon = 1.0 / inverse
  num_queries = run_stages * samples_per_stage
  labels = labels_epsilon(epsilon, num_queries, delta)
  if target_epsilon is not None and generator_prior == "teacher":
    warnings.warn(f"the sound (record-level) epsilon of this run is inf > target_epsilon="
                  f"{target_epsilon:g}: the target bounds only the label queries, and the "
                  "generator pretrained against the teacher is not private "
                  "(generator_prior='none' keeps the target)", UserWarning, stacklevel=2)
  return SRRPrivacyPlan(
      epsilon_per_query=float(epsilon), stages=int(run_stages),
      samples_per_stage=samples_per_stage, num_queries=num_queries, labels_epsilon=labels,
      record_epsilon=math.inf if generator_prior == "teacher" else labels,
      paper_label_epsilon=paper_label_epsilon(epsilon), delta=delta,
      generator_prior=generator_prior)


def report(plan: SRRPrivacyPlan, *, labels_epsilon: float) -> dict[str, object]:
  """The privacy block of results.json: both figures, always together, with what they mean.

  Args:
    plan: the executed plan.
    labels_epsilon: the record-level ε of the label queries actually released (the ledger's).

  Returns:
    JSON-ready dict.
  """
  teacher_prior = plan.generator_prior == "teacher"
  return {
      "paper_label_epsilon_per_query": plan.paper_label_epsilon,
      "paper_label_epsilon_note": "paper: label-DP per query (one teacher label), not record-level",
      "labels_epsilon": labels_epsilon,
      "labels_epsilon_note": (
          "record-level ε of all RR label queries composed (dp_accounting PLD, binary-RR bound)"
          + ("; labels only, conditional on the generator" if teacher_prior
             else "; the generator saw the teacher only through these labels")),
      "record_level_epsilon": math.inf if teacher_prior else labels_epsilon,
      "record_level_note": (
          "inf: the generator was pretrained against the non-private teacher without noise, so"
          " the queries and the student are a noiseless function of the private data"
          if teacher_prior else "the RR composition: the run is post-processing of the labels"),
      "delta": plan.delta,
      "epsilon_per_query": plan.epsilon_per_query,
      "generator_prior": plan.generator_prior,
  }
