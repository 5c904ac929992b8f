"""DPDFD privacy plans: which σ and how many steps, under which accounting.

`make_plan(config)` turns the user's privacy flags into the executed noise multiplier and step
count (`DPDFDPlan`), the only place either is resolved:

* no target ε: σ and steps are used as given; ε is reported.
* target ε and σ: the largest step count (<= the requested steps) that fits the target.
* target ε, no σ: σ calibrated so that the requested steps fit the target.

`accounting="sound"` (default) calibrates with `dp_accounting` on the event of the executed
noise (`accounting.dpdfd_event`: Gaussian with multiplier σ/(2m·√R) per step, R = the rows of
one release (B, or B·(1 + probes) with the disagreement generator), replace-one, the teacher
not private, m = the most teachers one record reaches). `accounting="paper"`
calibrates with the paper's Theorem 3 (our reconstruction,
`paper_accounting.paper_dpdfd_epsilon`), warns, and the sound ε of the same run is always
reported beside it: the paper figure is never shown alone. Theorem 3 counts steps and ignores
how many rows a step releases, so probe rows leave the paper figure unchanged.

`make_direct_plan(config)` is the plan of the direct mode (`direct.py`): the same mechanism
A_{C,σ} on private inputs, which is not DP whatever σ is, so its event is `NonPrivateDpEvent`
(ε = inf, no ledger) and only the paper-formula figure is finite.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from dp_accounting import dp_event

from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.privacy import plan as plan_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputGradientPlan(plan_lib.Plan):
  """A_{C,σ} as executed (both modes): each row bounded to norm C, plus N(0, σ²C²).

  Attributes:
    noise_multiplier: σ (noise std σ·C per output coordinate); 0 means no noise.
    l2_clip_norm: C, the per-row norm bound.
    stability: e in C·g/(||g|| + e).
    bound_method: "normalize" (paper) or "clip".
  """

  noise_multiplier: float
  l2_clip_norm: float
  stability: float
  bound_method: str

  @property
  def l2_norm_bound(self) -> float:
    """The old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`)."""
    warnings.warn("l2_norm_bound is deprecated, use l2_clip_norm (same meaning)",
                  DeprecationWarning, stacklevel=2)
    return self.l2_clip_norm


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPDFDPlan(OutputGradientPlan):
  """The data-free run: `releases` steps, each releasing B·(1 + probes) noisy rows in one draw.

  Attributes:
    batch_size: B, synthetic samples per step.
    probes_per_sample: rows released per sample beside its own (the "disagreement"
      generator's probes x + δu; 0 for the paper's generator). Every row, probe or not, is a
      teacher query bounded to norm C.
    num_teachers: n, teachers whose rows are summed.
    teachers_per_record: m, the most teachers one record reaches (`teacher_partition`).
    secure_noise: rows on an integer grid plus exact discrete Gaussian noise (same std σC);
      `event` is then ρ-zCDP per step (`accounting.dpdfd_secure_event`).
    grid_bits: the secure grid's k (None: automatic); num_outputs: K, the row length.
  """

  batch_size: int
  probes_per_sample: int = 0
  num_teachers: int = 1
  teachers_per_record: int = 1
  secure_noise: bool = False
  grid_bits: int | None = None
  num_outputs: int | None = None

  @property
  def rows_per_step(self) -> int:
    """R = B·(1 + probes): the rows of one release (its sensitivity is 2C·m·√R)."""
    return self.batch_size * (1 + self.probes_per_sample)

  def event(self, releases: int) -> dp_event.DpEvent:
    """`releases` steps of the executed noise (`accounting.dpdfd_event`, replace-one)."""
    return _event(self.noise_multiplier, releases, rows=self.rows_per_step,
                  num_teachers=self.num_teachers, teachers_per_record=self.teachers_per_record,
                  **self.secure_args())

  def to_json(self) -> dict:
    out = super().to_json()
    if not self.secure_noise:  # the default plan saves what it saved before the secure mode
      for name in ("secure_noise", "grid_bits", "num_outputs"):
        del out[name]
    return out

  def secure_args(self) -> dict:
    """The secure-noise keywords of `accounting.dpdfd_event` (none in the default mode)."""
    if not self.secure_noise:
      return {}
    return dict(secure_noise=True, grid_bits=self.grid_bits, num_outputs=self.num_outputs)


def _event(sigma: float, steps: int, *, rows: int, num_teachers: int, teachers_per_record: int,
           **secure) -> dp_event.DpEvent:
  return accounting.dpdfd_event(noise_multiplier=sigma, batch_size=rows, steps=steps,
                                num_teachers=num_teachers,
                                teachers_per_record=teachers_per_record, **secure)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DirectPlan(OutputGradientPlan):
  """The direct mode: not DP (the private inputs reach the update through the model's
  Jacobian, neither bounded nor noised), so every release is a `NonPrivateDpEvent`."""

  def event(self, releases: int) -> dp_event.DpEvent:
    return neighbouring.tag(dp_event.NonPrivateDpEvent(), self.relation, releases)


def paper_epsilon(*, noise_multiplier: float, l2_clip_norm: float, steps: int,
                  delta: float) -> float | None:
  """The paper-formula ε of `steps` releases (Theorem 3 reconstruction; None without noise).

  Computed silently: callers warn once, where the figure is requested."""
  if noise_multiplier == 0:
    return None
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    return paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=noise_multiplier, l2_clip_norm=l2_clip_norm, steps=steps,
        delta=delta)


def paper_rho(target_epsilon: float, delta: float) -> float:
  """ρ = T·C²/(2σ²) of the paper formula at `target_epsilon`
  (`paper_accounting.gaussian_rdp_rho`)."""
  return paper_accounting.gaussian_rdp_rho(target_epsilon, delta)


def _secure_args(config: config_lib.DPDFDConfig) -> dict:
  if not config.secure_noise:
    return {}
  return dict(secure_noise=True, grid_bits=config.secure_grid_bits,
              num_outputs=config.info.num_classes)


def _resolve(config: config_lib.DPDFDConfig, *, num_teachers: int,
             teachers_per_record: int) -> tuple[float, int]:
  """(σ, steps) the run executes: the config's, or calibrated for its target ε."""
  sigma, steps, target = config.noise_multiplier, config.steps, config.target_epsilon
  if target is None:
    return sigma, steps
  rows = config.batch_size * (1 + config.probes_per_sample)  # one release's rows
  shape = dict(target_epsilon=target, delta=config.delta, batch_size=rows,
               num_teachers=num_teachers, teachers_per_record=teachers_per_record)
  if config.accounting == "sound" and config.secure_noise:
    shape = dict(rows=rows, num_teachers=num_teachers, teachers_per_record=teachers_per_record,
                 **_secure_args(config))
    goal = dict(target_epsilon=target, delta=config.delta)
    if sigma is None:
      return calibration.calibrate_noise_multiplier(
          lambda s: _event(s, steps, **shape), **goal), steps
    return sigma, calibration.calibrate_steps(lambda t: _event(sigma, t, **shape), **goal,
                                              max_steps=steps)
  if config.accounting == "sound":
    if sigma is None:
      return calibration.calibrate_dpdfd_noise_multiplier(**shape, steps=steps), steps
    return sigma, calibration.calibrate_dpdfd_steps(**shape, noise_multiplier=sigma,
                                                    max_steps=steps)
  warnings.warn("accounting='paper': steps/sigma are set by the DPDFD paper's Theorem 3"
                " (a reconstruction), which is NOT a valid guarantee for this mechanism;"
                " the sound epsilon of the run is reported beside it.",
                paper_accounting.PaperAccountingWarning, stacklevel=3)
  rho, bound = paper_rho(target, config.delta), config.l2_clip_norm
  if sigma is None:
    sigma = bound * math.sqrt(steps / (2.0 * rho))
  else:
    steps = min(steps, math.floor(2.0 * sigma**2 * rho / bound**2))
  if steps < 1:
    raise ValueError(f"target_epsilon={target} allows no step at sigma={sigma}"
                     " under the paper accounting")
  return sigma, steps


def make_plan(config: config_lib.DPDFDConfig, teachers_per_record: int | None = None, *,
              num_teachers: int | None = None) -> DPDFDPlan:
  """Resolves σ, the step count and the ledger's budget of a DPDFD run.

  Args:
    config: the validated run config.
    teachers_per_record: m, the most teachers one record reaches; None (default) assumes
      every teacher (worst case): pass `teacher_partition.teachers_per_record(cards)` for
      what the cards prove. The paper formula knows nothing of it.
    num_teachers: n, the teachers whose rows are summed; default len(config.teacher_dirs).
      Required with `config.teacher_ensemble_dir` (n is the size of the loaded stack).

  Raises:
    ValueError: a target that not even one step fits; no n for an ensemble directory.
  """
  if num_teachers is None:
    if config.teacher_ensemble_dir is not None:
      raise ValueError("make_plan: pass num_teachers, the size of the ensemble loaded from "
                       "teacher_ensemble_dir")
    num_teachers = len(config.teacher_dirs)
  m = num_teachers if teachers_per_record is None else teachers_per_record
  sigma, steps = _resolve(config, num_teachers=num_teachers, teachers_per_record=m)
  # The event of the whole run, as the plan's `event(steps)` builds it.
  sound = math.inf if sigma == 0 else accounting.epsilon(_event(
      sigma, steps, rows=config.batch_size * (1 + config.probes_per_sample),
      num_teachers=num_teachers, teachers_per_record=m, **_secure_args(config)),
      delta=config.delta)
  target = config.target_epsilon
  if (target is not None and sound > target and config.secure_noise
      and config.accounting == "sound"):
    raise ValueError(f"the calibrated run's epsilon {sound:.6g} exceeds target_epsilon="
                     f"{target:g}")  # grid rounding: ε(σ) is not smooth in σ
  if target is not None and sound > target:
    # Only the paper mode gets here (sound calibration lands at or below the target).
    warnings.warn(f"the sound epsilon of this run is {sound:.4g} > target_epsilon="
                  f"{target:g}: accounting='{config.accounting}' bounds only the paper's"
                  " formula", paper_accounting.PaperAccountingWarning, stacklevel=2)
  return DPDFDPlan(
      noise_multiplier=float(sigma), l2_clip_norm=config.l2_clip_norm,
      stability=config.stability, bound_method=config.bound_method,
      batch_size=config.batch_size, probes_per_sample=config.probes_per_sample,
      num_teachers=num_teachers, teachers_per_record=m,
      secure_noise=config.secure_noise, grid_bits=config.secure_grid_bits,
      num_outputs=config.info.num_classes if config.secure_noise else None,
      releases=int(steps), delta=config.delta, accounting=config.accounting,
      sound_epsilon=sound, budget_epsilon=plan_lib.budget(
          target_epsilon=target, accounting=config.accounting, sound_epsilon=sound),
      paper_epsilon=paper_epsilon(noise_multiplier=sigma, l2_clip_norm=config.l2_clip_norm,
                                  steps=steps, delta=config.delta))


def make_direct_plan(config: config_lib.DirectConfig) -> DirectPlan:
  """The direct mode's plan: σ as given, `config.steps` releases, ε = inf, no ledger."""
  return DirectPlan(
      noise_multiplier=float(config.noise_multiplier), l2_clip_norm=config.l2_clip_norm,
      stability=config.stability, bound_method=config.bound_method, releases=config.steps,
      delta=config.delta, budget_epsilon=None, sound_epsilon=math.inf,
      paper_epsilon=paper_epsilon(noise_multiplier=config.noise_multiplier,
                                  l2_clip_norm=config.l2_clip_norm, steps=config.steps,
                                  delta=config.delta))
