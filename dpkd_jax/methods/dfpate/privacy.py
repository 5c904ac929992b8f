"""The privacy plan of a data-free PATE run: `make_plan(config) -> DFPATEPlan`.

What a run releases about the private training set (replace-one; docs/privacy.md,
"Data-free PATE"):

1. With `query_source="dp_model"` (and teachers), once at the start: the DP query model's
   Gaussian releases (`query_model.query_model_event`: a second moment, `kmeans_iterations`
   Lloyd steps, per-cluster variances; mechanisms of `privacy.query_model_releases`).
2. Every round: `queries_per_round` noisy vote histograms, noise std σ per bin
   (`privacy.aggregation.noisy_histogram`). A record is in one shard, so it changes one
   teacher and each histogram by at most √2 in L2: `accounting.pate_event(noise_std=σ, ...)`.

Everything else (queries, selection, student, samples) is public randomness or
post-processing of these releases. `releases` counts ROUNDS (the ledger charges one entry per
round, `event(1)`); the query model is one more entry, `query_model_event()`, charged before
it is fitted. `run_event()` composes both, exactly what the run executes; `sound_epsilon` is
its ε. `make_plan` is the only place σ is resolved: given, or calibrated (PLD) so that the
whole run meets `target_epsilon`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax.methods.dfpate import config as config_lib
from dpkd_jax.methods.dfpate import query_model as query_model_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import aggregation
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import plan as plan_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFPATEPlan(plan_lib.Plan):
  """The executed noise of a data-free PATE run; `releases` = rounds.

  Attributes:
    noise_std: σ, std of the Gaussian noise per vote-histogram bin (0: no noise, ε = ∞).
    queries_per_round: noisy histograms released per round (one round = one release).
    query_model: the query model's releases (bounds, iterations, noise multipliers), or None
      when the queries are procedural.
    use_teachers: False: the histograms are zeros and the query model is fitted on zeros:
      nothing about the private data is released (every event is NoOp, ε = 0).
    secure_noise: histograms on an integer grid plus exact discrete Gaussian noise (same σ);
      `event` is then ρ-zCDP per histogram. num_teachers, num_classes: n and K (secure only).
  """

  noise_std: float
  queries_per_round: int
  query_model: query_model_lib.QueryModelConfig | None = None
  use_teachers: bool = True
  secure_noise: bool = False
  num_teachers: int | None = None
  num_classes: int | None = None

  @property
  def noise_multiplier(self) -> float:
    """σ / √2: the accountant's noise multiplier of one histogram."""
    return self.noise_std / aggregation.VOTE_L2_SENSITIVITY

  def event(self, releases: int) -> dp_event.DpEvent:
    """`releases` rounds of `queries_per_round` noisy vote histograms (tagged replace-one)."""
    if not self.use_teachers:
      return dp_event.NoOpDpEvent()
    return accounting.pate_event(noise_std=self.noise_std,
                                 num_queries=releases * self.queries_per_round,
                                 **self.secure_args())

  def secure_args(self) -> dict[str, Any]:
    """The secure-noise keywords of `accounting.pate_event` (none in the default mode)."""
    if not self.secure_noise:
      return {}
    return dict(secure_noise=True, num_teachers=self.num_teachers, num_classes=self.num_classes)

  def to_json(self) -> dict[str, Any]:
    out = super().to_json()
    if not self.secure_noise:  # the default plan saves what it saved before the secure mode
      for name in ("secure_noise", "num_teachers", "num_classes"):
        del out[name]
    return out

  def query_model_event(self) -> dp_event.DpEvent:
    """The query model's releases (NoOp for procedural queries or without teachers)."""
    if self.query_model is None or not self.use_teachers:
      return dp_event.NoOpDpEvent()
    return query_model_lib.query_model_event(self.query_model)

  def run_event(self) -> dp_event.DpEvent:
    """Everything the run releases: the query model, then every round's histograms."""
    return dp_event.ComposedDpEvent([self.query_model_event(), self.event(self.releases)])

  @classmethod
  def from_json(cls, values: dict[str, Any]) -> "DFPATEPlan":
    """The plan of `to_json` (e.g. the one saved in a checkpoint; the query model's bound
    saved as `l2_norm_bound` before it took the library's name `l2_clip_norm`)."""
    values = {k: v for k, v in values.items() if k != "plan"}
    if values.get("query_model") is not None:
      saved = dict(values["query_model"])
      if "l2_norm_bound" in saved:
        saved["l2_clip_norm"] = saved.pop("l2_norm_bound")
      values["query_model"] = query_model_lib.QueryModelConfig(**saved)
    return cls(**values)


def query_model_releases(config: config_lib.DFPATEConfig
                         ) -> query_model_lib.QueryModelConfig | None:
  """The query model's releases the flags ask for (None for procedural queries).

  `query_model_noise` scales the default noise multiplier of each kind of release.
  """
  if config.query_source != "dp_model":
    return None
  default = query_model_lib.QueryModelConfig
  scale = config.query_model_noise
  return default(num_components=config.query_model_components,
                 num_clusters=config.query_model_clusters,
                 pca_noise_multiplier=scale * default.pca_noise_multiplier,
                 kmeans_noise_multiplier=scale * default.kmeans_noise_multiplier,
                 variance_noise_multiplier=scale * default.variance_noise_multiplier,
                 temperature=config.query_temperature)


def _calibrated_noise_std(config: config_lib.DFPATEConfig,
                          query_model_event: dp_event.DpEvent) -> float:
  """Smallest σ whose run (the query model, then Q histograms) meets the target (PLD).

  Without teachers σ is still calibrated as if they voted (the baseline then has the σ of
  the private run), with the query model left out (it is fitted on zeros).
  """
  if config.secure_noise:  # procedural queries only (the config refuses the query model)
    secure = dict(secure_noise=True, num_teachers=config.num_teachers,
                  num_classes=config.info.num_classes)
    return calibration.calibrate_noise_multiplier(
        lambda std: accounting.pate_event(noise_std=std, num_queries=config.num_queries,
                                          **secure),
        target_epsilon=config.target_epsilon, delta=config.delta)
  if config.query_source == "procedural":
    return aggregation.calibrate_noise_std(target_epsilon=config.target_epsilon,
                                           delta=config.delta, num_queries=config.num_queries)
  if accounting.epsilon(query_model_event, delta=config.delta) >= config.target_epsilon:
    raise errors.UserError(f"the query model alone spends the target ε={config.target_epsilon}"
                           "; raise query_model_noise (--query_model_noise)")
  return calibration.calibrate_noise_multiplier(
      lambda std: dp_event.ComposedDpEvent([
          query_model_event,
          accounting.pate_event(noise_std=std, num_queries=config.num_queries)]),
      target_epsilon=config.target_epsilon, delta=config.delta)


def make_plan(config: config_lib.DFPATEConfig) -> DFPATEPlan:
  """Resolves σ (given or calibrated) and the query model's releases into the run's plan.

  Raises:
    UserError: the query model alone spends the target, or a given σ spends more than it.
  """
  plan = DFPATEPlan(releases=config.rounds, delta=config.delta, budget_epsilon=None,
                    sound_epsilon=0.0, noise_std=0.0 if config.noise_std is None
                    else float(config.noise_std), queries_per_round=config.queries_per_round,
                    query_model=query_model_releases(config), use_teachers=config.use_teachers,
                    secure_noise=config.secure_noise,
                    num_teachers=config.num_teachers if config.secure_noise else None,
                    num_classes=config.info.num_classes if config.secure_noise else None)
  if config.noise_std is None:
    plan = dataclasses.replace(
        plan, noise_std=_calibrated_noise_std(config, plan.query_model_event()))
  if not config.use_teachers:  # nothing private is released: no ledger, ε = 0
    return plan
  sound = accounting.epsilon(plan.run_event(), delta=config.delta)
  if config.target_epsilon is not None and sound > config.target_epsilon:
    raise errors.UserError(f"noise_std={plan.noise_std} over {config.num_queries} queries spends "
                           f"ε={sound:.4g} > target_epsilon={config.target_epsilon}: raise "
                           "--noise_std or --target_epsilon")
  budget = plan_lib.budget(target_epsilon=config.target_epsilon, accounting="sound",
                           sound_epsilon=sound)
  return dataclasses.replace(plan, sound_epsilon=sound, budget_epsilon=budget)
