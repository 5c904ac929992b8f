"""DP-SGD's privacy plan: `DPSGDPlan` and `make_plan`, the one place z and T are resolved.

A run of T steps is `accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=T,
relation=...)` (N public, as in Opacus / jax_privacy; the mechanism and its sensitivity are in
`dpkd_jax.privacy.dpsgd_mechanism`). The plan's relation is REPLACE-ONE, the relation of every
other method here and so of the comparison tables (one record's clipped gradient moves from g
to g' in its sample slot): the ledger, its budget and a `target_epsilon` calibration use it.
The add/remove figure (a record joins or leaves the sample, Opacus' figure) is kept beside it.
Parameter averaging (`param_averaging_decay`) is post-processing of the noisy iterates: the plan
ignores it (same z, T, events and ε).
"""

from __future__ import annotations

import dataclasses
import math

from dp_accounting import dp_event

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import dpsgd_optax
from dpkd_jax.privacy import feature_moments
from dpkd_jax.privacy import plan as plan_lib
from dpkd_jax.methods.dpsgd.config import DPSGDConfig


def _event(noise_multiplier: float, sampling_rate: float, steps: int,
           relation: str) -> dp_event.DpEvent:
  """The tagged event of `steps` DP-SGD steps (the plan's and the calibration's, alike)."""
  return accounting.dpsgd_event(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
                                steps=steps, relation=relation)


def _with_setup(setup_noise_multiplier: float | None, event: dp_event.DpEvent,
                relation: str) -> dp_event.DpEvent:
  """`event` composed after the run's one-off feature-moments release (if it has one)."""
  if setup_noise_multiplier is None:
    return event
  return dp_event.ComposedDpEvent([feature_moments.moments_event(
      noise_multiplier=setup_noise_multiplier, relation=relation), event])


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPSGDPlan(dpsgd_optax.SGDPlan):
  """A config resolved for N records on a mesh: what the step executes and the ledger charges.

  The drop-in `SGDPlan` (its N, q, B, z, C, target ε, `steps` and `event`) plus what a run of
  the method needs. `releases` is T, the number of steps (one noisy clipped sum each);
  `sound_epsilon` is the replace-one ε at δ of all T steps (inf for z = 0), `budget_epsilon` the
  ledger's budget (`privacy.plan.budget`: target_epsilon if given, else the planned ε; None for
  z = 0).

  Attributes:
    num_examples: N, size of the private training split (public, as in Opacus).
    sampling_rate: q = B / N, the Poisson rate of every step.
    expected_batch_size: B = q N, the update's normaliser (data-independent).
    steps_per_epoch: ceil(N / B), the ledger / checkpoint / evaluation interval.
    max_batch_size: M, the padded batch (a multiple of the device count).
    noise_multiplier: z, noise std z C on every coordinate of the clipped sum.
    l2_clip_norm: C, the per-example clipping bound.
    target_epsilon: the user's budget (replace-one), or None when z was given.
    epsilon_add_remove: ε at δ of all T steps under add/remove (inf for z = 0).
    standardize_noise_multiplier: z of the one-off feature-moments release before the steps
      (`setup_event`), or None without one; `sound_epsilon`, the calibration and the
      add/remove figure compose it with the steps.
  """

  steps_per_epoch: int
  max_batch_size: int
  epsilon_add_remove: float
  standardize_noise_multiplier: float | None = None

  def setup_event(self, *, relation: str | None = None) -> dp_event.DpEvent | None:
    """The event of the feature-moments release charged once before the first step (None
    without one), under the plan's relation unless `relation` is given."""
    if self.standardize_noise_multiplier is None:
      return None
    return feature_moments.moments_event(noise_multiplier=self.standardize_noise_multiplier,
                                         relation=self.relation if relation is None else relation)

  def run_event(self, steps: int, *, relation: str | None = None) -> dp_event.DpEvent:
    """The whole event of a run that took `steps` steps: the setup release, then the steps."""
    relation = self.relation if relation is None else relation
    return _with_setup(self.standardize_noise_multiplier, self.event(steps, relation=relation),
                       relation)


def make_plan(config: DPSGDConfig, *, num_examples: int, num_devices: int) -> DPSGDPlan:
  """Resolves q, T, M and z (calibrating z for `target_epsilon`), cheap checks first.

  Args:
    config: the validated configuration.
    num_examples: N, size of the private training split.
    num_devices: size of the mesh's 'data' axis.

  Returns:
    The plan. Raises UserError for a batch larger than N, ValueError for an M not divisible
    by the devices. z = 0 (no noise) plans ε = inf and no budget: a non-private run, kept by
    no ledger.
  """
  if config.expected_batch_size > num_examples:
    raise errors.UserError(f"expected_batch_size={config.expected_batch_size} exceeds the "
                           f"{num_examples} private training examples")
  q = config.expected_batch_size / num_examples
  steps = config.steps if config.steps is not None else math.ceil(config.epochs / q)
  # Default M: the overflow-safe size rounded up to a multiple of the device count.
  max_batch_size = config.max_batch_size or -(
      -data.suggested_max_batch_size(num_examples, q) // num_devices) * num_devices
  if max_batch_size % num_devices:
    raise ValueError(f"max_batch_size={max_batch_size} is not divisible by the {num_devices} "
                     f"devices of the 'data' mesh axis; use a multiple of {num_devices}")
  relation = accounting.REPLACE_ONE  # the budget's and the comparison tables' relation
  setup = config.standardize_noise_multiplier
  noise_multiplier = float(config.noise_multiplier) if config.target_epsilon is None else (
      calibration.calibrate_noise_multiplier(
          lambda z: _with_setup(setup, _event(z, q, steps, relation), relation),
          target_epsilon=config.target_epsilon, delta=config.delta))

  def epsilon(of: str) -> float:
    return (math.inf if noise_multiplier == 0 else accounting.epsilon(
        _with_setup(setup, _event(noise_multiplier, q, steps, of), of), delta=config.delta))

  sound = epsilon(relation)
  return DPSGDPlan(
      releases=steps, delta=config.delta, relation=relation,
      budget_epsilon=plan_lib.budget(target_epsilon=config.target_epsilon, accounting="sound",
                                     sound_epsilon=sound),
      sound_epsilon=sound, num_examples=num_examples, sampling_rate=q,
      expected_batch_size=config.expected_batch_size,
      steps_per_epoch=math.ceil(num_examples / config.expected_batch_size),
      max_batch_size=max_batch_size, noise_multiplier=noise_multiplier,
      l2_clip_norm=float(config.l2_clip_norm),
      target_epsilon=None if config.target_epsilon is None else float(config.target_epsilon),
      epsilon_add_remove=epsilon(accounting.ADD_REMOVE),
      standardize_noise_multiplier=None if setup is None else float(setup))
