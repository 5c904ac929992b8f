"""DP-SGD for a user's own loop: a frozen plan, an optax transform and a step accountant.

    plan = privacy.dpsgd_plan(num_examples=N, expected_batch_size=B, steps=T,
                              l2_clip_norm=C, delta=δ, target_epsilon=ε)   # σ resolved once
    clipped = privacy.clipped_grad(loss_fn, l2_clip_norm=plan.l2_clip_norm)
    tx = optax.chain(privacy.dpsgd_privatizer(plan, key=k), optax.sgd(lr))
    accountant = privacy.PlanAccountant(plan)
    ... grads = clipped(params, x, y, mask=mask)                # Σ clip_C(g_i), Poisson batch
        updates, state = tx.update(grads, state, params)      # + N(0, z²C²), then / B
        accountant.step()                                      # refuses step T + 1
    accountant.epsilon()                                       # replace-one unless asked

z, C and B come from the plan only, and the accountant charges `plan.event(steps)`: σ has one
source, as in every method's plan (`plan.py`). The method's own `DPSGDPlan`
(`methods/dpsgd/privacy.py`) extends `SGDPlan`, so the transform and the accountant take it
too. B is the PUBLIC expected batch size q·N, not the sample's size (which is private).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import optax
from dp_accounting import dp_event

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.privacy import plan as plan_lib
from dpkd_jax.privacy import validation


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGDPlan(plan_lib.Plan):
  """T DP-SGD steps on N records: what the transform executes and the accountant charges.

  Attributes:
    num_examples: N (public). sampling_rate: q = B / N, the Poisson rate of every step.
    expected_batch_size: B, the update's normaliser. noise_multiplier: z (std z C).
    l2_clip_norm: C. target_epsilon: the budget z was calibrated for, or None.
  """

  num_examples: int
  sampling_rate: float
  expected_batch_size: int
  noise_multiplier: float
  l2_clip_norm: float
  target_epsilon: float | None = None

  @property
  def steps(self) -> int:
    """T: the planned steps (= `releases`)."""
    return self.releases

  def event(self, releases: int, *, relation: str | None = None) -> dp_event.DpEvent:
    """`releases` steps under the plan's relation unless `relation` is given."""
    return accounting.dpsgd_event(noise_multiplier=self.noise_multiplier,
                                  sampling_rate=self.sampling_rate, steps=releases,
                                  relation=self.relation if relation is None else relation)


def dpsgd_plan(*, num_examples: int, expected_batch_size: int, steps: int, l2_clip_norm: float,
               delta: float, noise_multiplier: float | None = None,
               target_epsilon: float | None = None,
               relation: str = accounting.REPLACE_ONE) -> SGDPlan:
  """Resolves z (given, or calibrated for `target_epsilon` under `relation`) into a frozen plan.

  Args:
    num_examples: N >= B; expected_batch_size: B >= 1; steps: T >= 1; l2_clip_norm: C > 0.
    delta: δ in (0, 1).
    noise_multiplier, target_epsilon: exactly one of them (z >= 0, or ε > 0).
    relation: "replace-one" (default: the relation of every method here) or "add-remove".

  Returns:
    `SGDPlan`. Raises `calibration.CalibrationError` when no z meets the target.
  """
  n = validation.check_int("num_examples", num_examples, minimum=1)
  b = validation.check_int("expected_batch_size", expected_batch_size, minimum=1)
  steps = validation.check_int("steps", steps, minimum=1)
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  if b > n:
    raise ValueError(f"expected_batch_size={b} exceeds num_examples={n}")
  if (noise_multiplier is None) == (target_epsilon is None):
    raise ValueError("give exactly one of noise_multiplier and target_epsilon")
  q = b / n
  if noise_multiplier is None:
    noise_multiplier = calibration.calibrate_noise_multiplier(
        lambda z: accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps,
                                         relation=relation),
        target_epsilon=target_epsilon, delta=delta)
  z = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  sound = math.inf if z == 0 else accounting.epsilon(
      accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps,
                             relation=relation), delta=delta)
  return SGDPlan(releases=steps, delta=delta, relation=relation,
                 budget_epsilon=plan_lib.budget(target_epsilon=target_epsilon,
                                                accounting="sound", sound_epsilon=sound),
                 sound_epsilon=sound, num_examples=n, sampling_rate=q, expected_batch_size=b,
                 noise_multiplier=z, l2_clip_norm=float(l2_clip_norm),
                 target_epsilon=None if target_epsilon is None else float(target_epsilon))


class PrivatizerState(NamedTuple):
  """The transform's state: the key of the next draw (split at every update)."""

  key: jax.Array


def dpsgd_privatizer(plan: SGDPlan, *, key: jax.Array) -> optax.GradientTransformation:
  """Adds N(0, z²C²) to a clipped sum and divides by B: the noisy mean gradient of DP-SGD.

  Args:
    plan: an `SGDPlan` (the method's `DPSGDPlan` is one): z = `noise_multiplier`,
      C = `l2_clip_norm`, B = `expected_batch_size`.
    key: a `jax.random.key`; the state splits it at every update (one fresh draw per step).

  Returns:
    A `GradientTransformation` whose `update(clipped_sum, state, params=None)` returns
    (noisy_sum / B, state): chain an optimizer after it. Its input must be the output of
    `clipped_grad` with the plan's C (one call per step), or the event is not the plan's.
  """
  z, c = float(plan.noise_multiplier), float(plan.l2_clip_norm)
  normaliser = float(plan.expected_batch_size)

  def init_fn(params):
    del params
    return PrivatizerState(key)

  def update_fn(updates, state, params=None):
    del params
    key, draw = jax.random.split(state.key)
    release = dpsgd_mechanism.dpsgd_add_noise(draw, updates, l2_clip_norm=c,
                                              noise_multiplier=z)
    return jax.tree.map(lambda g: g / normaliser, release.noisy_sum), PrivatizerState(key)

  return optax.GradientTransformation(init_fn, update_fn)
