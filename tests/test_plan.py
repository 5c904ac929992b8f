"""dpkd_jax.privacy.plan: the shared shape of every method's privacy plan."""

import dataclasses
import math

import pytest

from dpkd_jax import privacy
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import plan as plan_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class _GaussianPlan(privacy.Plan):
  noise_multiplier: float

  def event(self, releases):
    return privacy.dpdfd_event(noise_multiplier=self.noise_multiplier, batch_size=1,
                               steps=releases)


def _plan(**overrides):
  fields = dict(noise_multiplier=20.0, releases=10, delta=1e-5, budget_epsilon=5.0,
                sound_epsilon=1.0)
  return _GaussianPlan(**{**fields, **overrides})


def test_fields_are_validated():
  with pytest.raises(ValueError, match="releases"):
    _plan(releases=-1)
  with pytest.raises(ValueError, match="delta"):
    _plan(delta=1.0)
  with pytest.raises(ValueError, match="relation"):
    _plan(relation="swap")
  with pytest.raises(ValueError, match="accounting"):
    _plan(accounting="rdp")
  with pytest.raises(ValueError, match="budget_epsilon"):
    _plan(budget_epsilon=0.0)


def test_frozen_and_default_relation_is_replace_one():
  plan = _plan()
  assert plan.relation == neighbouring.REPLACE_ONE
  with pytest.raises(dataclasses.FrozenInstanceError):
    plan.releases = 3  # type: ignore[misc]


def test_base_event_must_be_defined():
  with pytest.raises(NotImplementedError, match="Plan must define event"):
    privacy.Plan(releases=1, delta=1e-5, budget_epsilon=None, sound_epsilon=math.inf).event(1)


def test_ledger_takes_budget_and_delta_from_the_plan():
  ledger = _plan().new_ledger()
  assert ledger.target_epsilon == 5.0 and ledger.delta == 1e-5
  assert ledger.relation == neighbouring.REPLACE_ONE  # a mixed-relation charge is refused
  assert _plan(budget_epsilon=None).new_ledger() is None
  assert not _plan(budget_epsilon=None).private


def test_budget_rule():
  assert plan_lib.budget(target_epsilon=2.0, accounting="sound", sound_epsilon=1.5) == 2.0
  # Paper mode: the ledger keeps the sound ε of the planned run, never the paper's target.
  assert plan_lib.budget(target_epsilon=2.0, accounting="paper", sound_epsilon=9.0) == 9.0
  assert plan_lib.budget(target_epsilon=None, accounting="sound", sound_epsilon=3.0) == 3.0
  assert plan_lib.budget(target_epsilon=None, accounting="sound", sound_epsilon=math.inf) is None
  assert plan_lib.budget(target_epsilon=None, accounting="sound", sound_epsilon=0.0) is None


def test_to_json_names_the_plan_and_keeps_every_field():
  out = _plan().to_json()
  assert out["plan"] == "_GaussianPlan" and out["noise_multiplier"] == 20.0
  assert out["relation"] == "replace-one" and out["releases"] == 10
