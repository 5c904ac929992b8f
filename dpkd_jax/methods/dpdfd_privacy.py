"""DPDFD privacy planning: which sigma and how many steps, under which accounting.

`plan(...)` turns the user's privacy flags into the executed noise multiplier and step count:

* no target ε: sigma and steps are used as given; ε is reported.
* target ε and sigma: the largest step count (<= the requested steps) that fits the target.
* target ε, no sigma: sigma calibrated so that the requested steps fit the target.

`accounting="sound"` (default) calibrates with `dp_accounting` on the event of the executed
noise (`accounting.dpdfd_event`: Gaussian with multiplier sigma/(2m sqrt(B)) per step, the
teacher not private, m = the most teachers one record reaches). `accounting="paper"` calibrates with the paper's Theorem 3 (our
reconstruction, `paper_accounting.paper_dpdfd_epsilon`), warns, and the sound ε of the same run
is always reported beside it: the paper figure is never shown alone.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import paper_accounting

ACCOUNTINGS = ("sound", "paper")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyPlan:
  """What will be executed and what it costs.

  Attributes:
    noise_multiplier: sigma of Algorithm 1 (noise std sigma*C per output coordinate).
    steps: number of DPDFD steps (releases).
    sound_epsilon: ε at `delta` from dp_accounting (PLD) of the executed noise; inf if sigma=0.
    paper_epsilon: the paper-formula ε of the same run (None if sigma = 0).
    delta: δ.
    accounting: which of the two set the steps/sigma ("sound" or "paper").
    teachers_per_record: m, the most teachers one record reaches (`teacher_partition`); the
      sound ε is that of sensitivity m times one teacher's.
  """

  noise_multiplier: float
  steps: int
  sound_epsilon: float
  paper_epsilon: float | None
  delta: float
  accounting: str
  teachers_per_record: int = 1


def _paper_epsilon(sigma: float, l2_norm_bound: float, steps: int, delta: float) -> float | None:
  if sigma == 0:
    return None
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    return paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=sigma, l2_norm_bound=l2_norm_bound, steps=steps, delta=delta)


def _paper_rho(target_epsilon: float, delta: float) -> float:
  # eps = rho + 2 sqrt(rho log(1/delta))  <=>  sqrt(rho) = sqrt(log(1/delta) + eps) - sqrt(log(1/delta))
  log_inv_delta = math.log(1.0 / delta)
  return (math.sqrt(log_inv_delta + target_epsilon) - math.sqrt(log_inv_delta)) ** 2


def check_request(*, noise_multiplier: float | None, target_epsilon: float | None, delta: float,
                  steps: int, accounting_mode: str) -> None:
  """Raises ValueError for inconsistent privacy flags; cheap (no calibration), so configs call
  it at construction and `plan` calls it before calibrating."""
  if accounting_mode not in ACCOUNTINGS:
    raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {accounting_mode!r}")
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  if not 0 < delta < 1:
    raise ValueError(f"delta must be in (0, 1), got {delta}")
  if target_epsilon is None and noise_multiplier is None:
    raise ValueError("give noise_multiplier, target_epsilon, or both")
  if target_epsilon is not None and not target_epsilon > 0:
    raise ValueError(f"target_epsilon must be > 0, got {target_epsilon}")
  if noise_multiplier is not None and noise_multiplier < 0:
    raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
  if target_epsilon is not None and noise_multiplier is not None and noise_multiplier <= 0:
    raise ValueError(f"a target epsilon needs noise: noise_multiplier={noise_multiplier} must be > 0")


def plan(*, noise_multiplier: float | None, target_epsilon: float | None, delta: float,
         steps: int, batch_size: int, l2_norm_bound: float, num_teachers: int = 1,
         teachers_per_record: int = 1, accounting_mode: str = "sound") -> PrivacyPlan:
  """Resolves sigma and the step count; see the module docstring.

  `teachers_per_record` (m, see `accounting.dpdfd_event`) enters the sound ε and its
  calibration; the paper formula knows nothing of it.

  Raises:
    ValueError: inconsistent or impossible requests (sigma <= 0 with a target ε, a target that
      not even one step fits, unknown accounting mode, ...).
  """
  check_request(noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, delta=delta,
                steps=steps, accounting_mode=accounting_mode)
  def sound(sigma, t):
    return accounting.epsilon(accounting.dpdfd_event(
        noise_multiplier=sigma, batch_size=batch_size, steps=t, num_teachers=num_teachers,
        teachers_per_record=teachers_per_record), delta=delta)

  sigma, run_steps = noise_multiplier, steps
  if target_epsilon is not None:
    if accounting_mode == "sound":
      if sigma is None:
        sigma = calibration.calibrate_dpdfd_noise_multiplier(
            target_epsilon=target_epsilon, delta=delta, batch_size=batch_size, steps=steps,
            num_teachers=num_teachers, teachers_per_record=teachers_per_record)
      else:
        run_steps = calibration.calibrate_dpdfd_steps(
            target_epsilon=target_epsilon, delta=delta, noise_multiplier=sigma,
            batch_size=batch_size, max_steps=steps, num_teachers=num_teachers,
            teachers_per_record=teachers_per_record)
    else:
      warnings.warn("accounting='paper': steps/sigma are set by the DPDFD paper's Theorem 3"
                    " (a reconstruction), which is NOT a valid guarantee for this mechanism;"
                    " the sound epsilon of the run is reported beside it.",
                    paper_accounting.PaperAccountingWarning, stacklevel=2)
      rho = _paper_rho(target_epsilon, delta)
      if sigma is None:
        sigma = l2_norm_bound * math.sqrt(steps / (2.0 * rho))
      else:
        run_steps = min(steps, math.floor(2.0 * sigma**2 * rho / l2_norm_bound**2))
      if run_steps < 1:
        raise ValueError(f"target_epsilon={target_epsilon} allows no step at sigma={sigma}"
                         " under the paper accounting")
  sound_epsilon = math.inf if sigma == 0 else sound(sigma, run_steps)
  if target_epsilon is not None and sound_epsilon > target_epsilon:
    # Only the paper mode gets here (sound calibration lands at or below the target).
    warnings.warn(f"the sound epsilon of this run is {sound_epsilon:.4g} > target_epsilon="
                  f"{target_epsilon:g}: accounting='{accounting_mode}' bounds only the paper's"
                  " formula", paper_accounting.PaperAccountingWarning, stacklevel=2)
  return PrivacyPlan(noise_multiplier=float(sigma), steps=int(run_steps),
                     sound_epsilon=sound_epsilon,
                     paper_epsilon=_paper_epsilon(sigma, l2_norm_bound, run_steps, delta),
                     delta=delta, accounting=accounting_mode,
                     teachers_per_record=teachers_per_record)
