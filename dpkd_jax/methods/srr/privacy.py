"""Privacy of DP-DFD with selective randomized response: the plan, its event, its report.

Unit: one record of the teacher's private training set (replace one). The teacher is not
private: a neighbouring dataset may change it arbitrarily, hence every label. Three figures:

* paper, "label-DP per query": given the query x_i and the public prior p_i, selective RR is
  ε-DP w.r.t. that query's teacher label (`randomized_response.selective_randomized_response`,
  `paper_accounting.paper_srr_label_epsilon`). It protects one label, not a record.
* labels, record level: if every query x_i and prior p_i depend on the private data only
  through earlier releases, the run is an adaptive composition of n = S*N ε-DP mechanisms,
  each a function of the data through the teacher: ε = PLD of n binary RR with ε
  (`accounting.srr_event`; binary RR dominates every ε-DP mechanism; it composes the RR PLDs
  itself, as dp-accounting 0.6.0's PLDAccountant counts a RandomizedResponseDpEvent once
  whatever its count). `target_epsilon` acts on this figure. The student, the generator
  fine-tuning and the priors are post-processing.
* record level, the sound figure: `generator_prior="teacher"` breaks the premise above: the
  generator minimises a loss of teacher(G(z)) and the teacher's BatchNorm running statistics
  with no noise, so the queries (and the student trained on them, the sample grid and the
  generator) are a noiseless function of the teacher, hence of the private data. Nothing
  bounds how much a record moves them: record-level ε = inf, and the RR composition holds only
  as "labels only, conditional on the generator". `generator_prior="none"` keeps the premise:
  the generator starts from public randomness and is updated only by CE(student(G(z)), noisy
  labels), the student only on (queries, noisy labels), the prior is the student's output; by
  induction every state is a function of public randomness and released labels, and the
  teacher is reached only inside `stage.private_labels`. Record-level ε = the RR composition.

`make_plan(config)` turns the flags into the executed ε per query and number of stages:

* no target: ε and stages as given.
* target and ε: the most stages (<= the requested ones) whose queries fit the target.
* target, no ε: the ε per query at which all requested queries fit the target.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax.methods.srr import config as config_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.privacy import plan as plan_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class SRRPlan(plan_lib.Plan):
  """The executed ε per query and stages, and both record-level figures.

  `releases` counts RR label queries (S * N; each is one release): `event(n)` is n of them
  composed, and the run charges `event(samples_per_stage)` before each stage (one ledger entry
  per stage, the entry the ledger has always held).

  Two record-level figures are kept, never merged:

  * `labels_epsilon`: ε of all planned label queries composed (`accounting.srr_event`).
  * `sound_epsilon`: the record-level ε of the whole run: `labels_epsilon` with
    `generator_prior="none"`, inf with `"teacher"` (the generator is a noiseless function of
    the teacher; module docstring). It never under-reports.

  The ledger's budget (`budget_epsilon`) is the labels' figure (`target_epsilon`, else
  `labels_epsilon`; None without noise): it bounds the queries the run may still ask, the only
  releases with noise, whichever prior. With the teacher prior the ledger therefore keeps a
  finite figure while `sound_epsilon` (what the results record reports) is inf; the results
  give both (`report`).

  Attributes:
    epsilon_per_query: ε of one RR query (math.inf: labels released without noise).
    stages: number of stages S.
    samples_per_stage: N, teacher queries per stage.
    generator_prior: "teacher" or "none".
    labels_epsilon: ε at `delta` of all RR queries composed (PLD); inf without noise.
  """

  epsilon_per_query: float
  stages: int
  samples_per_stage: int
  generator_prior: str
  labels_epsilon: float

  def __post_init__(self):
    super().__post_init__()
    if self.releases != self.stages * self.samples_per_stage:
      raise ValueError(f"releases={self.releases} must be stages * samples_per_stage ="
                       f" {self.stages * self.samples_per_stage} (one per RR query)")
    if self.generator_prior == "teacher" and self.sound_epsilon != math.inf:
      raise ValueError("a teacher-pretrained generator has record-level ε = inf")

  def event(self, releases: int) -> dp_event.DpEvent:
    """`releases` RR label queries at `epsilon_per_query`, composed (binary-RR bound)."""
    if math.isinf(self.epsilon_per_query):
      raise ValueError("labels released without noise (epsilon=inf) have no dp_accounting"
                       " event: such a plan keeps no ledger")
    return accounting.srr_event(epsilon_per_query=self.epsilon_per_query,
                                num_queries=releases)


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


def _fit_stages(config: config_lib.SRRConfig) -> int:
  """The most stages (<= config.stages) whose queries at config.epsilon fit the target."""
  n, delta = config.samples_per_stage, config.delta
  one_stage = labels_epsilon(config.epsilon, n, delta)
  if one_stage > config.target_epsilon:
    raise errors.UserError(
        f"target_epsilon={config.target_epsilon} allows no stage: one stage of {n} queries at"
        f" epsilon={config.epsilon} per query already costs record-level ε = {one_stage:.4g};"
        " raise --target_epsilon or lower --epsilon or --samples_per_stage")
  return calibration.calibrate_steps(
      lambda s: accounting.srr_event(epsilon_per_query=config.epsilon, num_queries=s * n),
      target_epsilon=config.target_epsilon, delta=delta, max_steps=config.stages)


def _fit_epsilon(config: config_lib.SRRConfig) -> float:
  """The ε per query at which all requested queries fit the target."""
  queries = config.stages * config.samples_per_stage
  # Calibrate the "noise" 1/ε per query: ε of the run decreases as it grows.
  try:
    inverse = calibration.calibrate_noise_multiplier(
        lambda s: accounting.srr_event(epsilon_per_query=1.0 / s, num_queries=queries),
        target_epsilon=config.target_epsilon, delta=config.delta)
  except ValueError as err:
    raise errors.UserError(f"cannot fit {queries} queries into target_epsilon="
                           f"{config.target_epsilon}: {err}") from err
  return 1.0 / inverse


def make_plan(config: config_lib.SRRConfig) -> SRRPlan:
  """Resolves the ε per query and the number of stages; see the module docstring.

  Raises:
    UserError: a target that not even one stage fits (or no ε per query fits).
  """
  epsilon, stages = config.epsilon, config.stages
  if config.target_epsilon is not None and epsilon is not None:
    stages = _fit_stages(config)
  elif config.target_epsilon is not None:
    epsilon = _fit_epsilon(config)
  releases = stages * config.samples_per_stage
  labels = labels_epsilon(epsilon, releases, config.delta)
  teacher_prior = config.generator_prior == "teacher"
  if config.target_epsilon is not None and teacher_prior:
    warnings.warn(f"the sound (record-level) epsilon of this run is inf > target_epsilon="
                  f"{config.target_epsilon:g}: the target bounds only the label queries, and "
                  "the generator pretrained against the teacher is not private "
                  "(generator_prior='none' keeps the target)", UserWarning, stacklevel=2)
  return SRRPlan(
      releases=releases, delta=config.delta,
      budget_epsilon=plan_lib.budget(target_epsilon=config.target_epsilon,
                                     accounting="sound", sound_epsilon=labels),
      sound_epsilon=math.inf if teacher_prior else labels,
      paper_epsilon=paper_label_epsilon(epsilon), epsilon_per_query=float(epsilon),
      stages=int(stages), samples_per_stage=config.samples_per_stage,
      generator_prior=config.generator_prior, labels_epsilon=labels)


def report(plan: SRRPlan, *, labels_epsilon: float) -> dict[str, object]:
  """The privacy block of results.json: both figures, always together, with what they mean.

  Args:
    plan: the executed plan.
    labels_epsilon: the record-level ε of the label queries actually released (the ledger's).

  Returns:
    JSON-ready dict.
  """
  teacher_prior = plan.generator_prior == "teacher"
  return {
      "paper_label_epsilon_per_query": plan.paper_epsilon,
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
