"""DP-SGD's plan (`methods/dpsgd/privacy.py`): z given or calibrated, T, M, the budget; and the
single source of σ: the step's noise and the ledger's events come from the same plan object.
Fixtures in `dpsgd_fixtures.py`.
"""

import dataclasses
import json
import math
import os

import jax
import jax.flatten_util
import jax.numpy as jnp
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import run as run_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import plan as plan_lib
from dpkd_jax.train import checkpoint
from dpsgd_fixtures import DIGITS_TRAIN, inputs, key, make_config, make_plan, make_step


def test_plan_is_a_privacy_plan_with_replace_one_events():
  config = make_config()
  plan = make_plan(config)
  assert isinstance(plan, plan_lib.Plan) and plan.relation == accounting.REPLACE_ONE
  assert plan.releases == plan.steps == 4 and plan.accounting == "sound"
  q = 16 / DIGITS_TRAIN
  for relation in (accounting.REPLACE_ONE, accounting.ADD_REMOVE):
    expected = accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=q, steps=3,
                                      relation=relation)
    assert plan.event(3, relation=relation) == expected
  assert plan.event(3) == plan.event(3, relation=accounting.REPLACE_ONE)
  assert plan.sound_epsilon == pytest.approx(accounting.epsilon(plan.event(4), delta=1e-5))
  assert plan.epsilon_add_remove == pytest.approx(accounting.epsilon(
      plan.event(4, relation=accounting.ADD_REMOVE), delta=1e-5))
  assert plan.epsilon_add_remove < plan.sound_epsilon
  # No target: the budget is the planned ε (the ledger refuses anything beyond the plan).
  assert plan.budget_epsilon == plan.sound_epsilon and plan.target_epsilon is None
  assert (plan.noise_multiplier, plan.l2_clip_norm, plan.expected_batch_size) == (1.0, 2.0, 16)
  assert json.loads(json.dumps(plan.to_json()))["plan"] == "DPSGDPlan"


def test_no_noise_plans_infinite_epsilon_and_no_ledger():
  plan = make_plan(make_config(noise_multiplier=0.0))
  assert plan.sound_epsilon == plan.epsilon_add_remove == math.inf
  assert plan.budget_epsilon is None and not plan.private and plan.new_ledger() is None


def test_target_epsilon_calibrates_noise_for_the_whole_run():
  config = make_config(noise_multiplier=None, target_epsilon=2.0, delta=1e-5, steps=200)
  plan = make_plan(config)
  assert plan.target_epsilon == plan.budget_epsilon == 2.0
  assert 0.97 * 2.0 <= plan.sound_epsilon <= 2.0
  event = accounting.dpsgd_event(noise_multiplier=plan.noise_multiplier,
                                 sampling_rate=16 / DIGITS_TRAIN, steps=200,
                                 relation="replace-one")  # the budget's relation
  assert accounting.epsilon(event, delta=1e-5) == pytest.approx(plan.sound_epsilon)
  assert plan.event(200) == event


def test_param_averaging_leaves_the_plan_unchanged():
  # Post-processing of the iterates: the same z (given or calibrated), T, events and ε.
  averaging = dict(param_averaging_decay=0.99, param_averaging_start_step=2)
  for kw in (dict(), dict(noise_multiplier=None, target_epsilon=2.0, steps=200)):
    plain, averaged = make_plan(make_config(**kw)), make_plan(make_config(**kw, **averaging))
    assert averaged == plain and averaged.to_json() == plain.to_json()
    assert averaged.event(3) == plain.event(3)


def test_plan_from_epochs_and_max_batch_size():
  plan = dpsgd.make_plan(make_config(steps=None, epochs=2.0), num_examples=1000, num_devices=8)
  assert plan.steps == math.ceil(2.0 * 1000 / 16) and plan.steps_per_epoch == 63
  assert plan.max_batch_size % 8 == 0
  assert plan.max_batch_size >= data.suggested_max_batch_size(1000, 16 / 1000)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_batch_size=60), "not divisible by the 8 devices"),
    (dict(expected_batch_size=5000), "exceeds the 1442"),
])
def test_bad_plan_raises_before_compute(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    dpsgd.train_dpsgd(make_config(**kwargs), str(tmp_path), progress=False)
  assert not os.listdir(tmp_path)  # nothing trained or written


def test_release_over_budget_is_refused_before_it_runs(tmp_path, monkeypatch,
                                                       noisy_step_8_devices):
  config, _ = noisy_step_8_devices
  real_make_plan = run_lib.make_plan  # planned ε of `make_config()` is ~0.33 > 0.1
  monkeypatch.setattr(run_lib, "make_plan", lambda *a, **k: dataclasses.replace(
      real_make_plan(*a, **k), budget_epsilon=0.1))
  with pytest.raises(ledger_lib.BudgetExceededError, match="release refused"):
    dpsgd.train_dpsgd(config, str(tmp_path), progress=False)
  assert not os.path.exists(tmp_path / "checkpoints")


def test_step_noise_comes_from_the_plan(parts, batch, noisy_step_8_devices):
  """Same state, batch and key; only the plan's z changes (z, then 2z): the first (plain SGD)
  update is lr (G + z C n) / B, so the two updates differ by lr z C n / B, whose per-coordinate
  std is lr z C / B = 0.5 * 1 * 2 / 16 (the config's C and B, also read from the plan)."""
  config, step_z = noisy_step_8_devices  # compiled already: one new compile here
  plan = make_plan(config)
  step_2z = make_step(config, plan=dataclasses.replace(plan, noise_multiplier=2 * 1.0))
  new_z, _ = step_z(*inputs(parts, config, batch), key(5))
  new_2z, _ = step_2z(*inputs(parts, config, batch), key(5))
  diff, _ = jax.flatten_util.ravel_pytree(jax.tree.map(
      lambda a, b: a - b, jax.device_get(new_2z.params), jax.device_get(new_z.params)))
  expected_std = 0.5 * 1.0 * 2.0 / 16
  # ~15.8k coordinates: one sigma of the sample std is ~0.6%, so 3% is 5 sigma.
  assert diff.size > 15_000
  assert float(jnp.std(diff)) == pytest.approx(expected_std, rel=0.03)


def test_ledger_events_are_the_checkpointed_plans_events(tmp_path, noisy_step_8_devices):
  """A run stopped at step 1 and resumed to 4 charged `plan.event(1)` then `plan.event(3)`,
  `plan` being the one its checkpoint holds (the one the step took z from)."""
  config, _ = noisy_step_8_devices
  workdir = str(tmp_path)
  dpsgd.train_dpsgd(config, workdir, stop_at_step=1, progress=False)
  results = dpsgd.train_dpsgd(config, workdir, resume=True, progress=False)
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  fields = {k: v for k, v in meta["plan"].items() if k != "plan"}
  plan = dpsgd.DPSGDPlan(**fields)
  assert plan == make_plan(config) and meta["plan"]["plan"] == "DPSGDPlan"
  saved = ledger_lib.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  assert [ledger_lib.event_to_dict(e.event) for e in saved.entries] == [
      ledger_lib.event_to_dict(plan.event(n)) for n in (1, 3)]
  assert results["epsilon"] == pytest.approx(
      accounting.epsilon(plan.event(4), delta=plan.delta), rel=1e-9)
  assert results["noise_multiplier"] == plan.noise_multiplier
