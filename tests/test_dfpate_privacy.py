"""Tests of `dfpate.privacy` (DFPATEPlan, make_plan) and that σ has one source: the plan."""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax import teacher_ensemble as ensemble_lib
from dpkd_jax.methods import dfpate
from dpkd_jax.methods.dfpate import query_model as qm
from dpkd_jax.methods.dfpate import step as dfpate_step
from dpkd_jax.methods.dfpate import student as student_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import aggregation
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import secure_gaussian
from dpkd_jax.train import checkpoint
from dpkd_jax.train import ledger_file

_TINY = dict(dataset="digits", num_teachers=4, teacher_epochs=1, teacher_batch_size=32,
             rounds=2, queries_per_round=16, pool_factor=2, student_model="lenet5_half",
             student_epochs=1, student_batch_size=16, seed=0, query_source="dp_model",
             query_model_components=6, query_model_clusters=4)


def _events(events):
  return [ledger_lib.event_to_dict(e) for e in events]


def test_plan_events_and_budget():
  config = dfpate.DFPATEConfig(**{**_TINY, "query_source": "procedural"}, target_epsilon=5.0)
  plan = dfpate.make_plan(config)
  assert plan.releases == 2 and plan.queries_per_round == 16 and plan.query_model is None
  assert _events([plan.event(3)]) == _events([accounting.pate_event(
      noise_std=plan.noise_std, num_queries=48)])
  assert plan.noise_multiplier == plan.noise_std / aggregation.VOTE_L2_SENSITIVITY
  assert plan.sound_epsilon == accounting.epsilon(plan.run_event(), delta=1e-5)
  assert 4.9 < plan.sound_epsilon <= 5.0 and plan.budget_epsilon == 5.0
  assert dfpate.DFPATEPlan.from_json(plan.to_json()) == plan
  with_model = dfpate.make_plan(dfpate.DFPATEConfig(**_TINY, target_epsilon=8.0))
  assert dfpate.DFPATEPlan.from_json(with_model.to_json()) == with_model
  assert _events([with_model.query_model_event()]) == _events(
      [qm.query_model_event(with_model.query_model)])


def test_plan_without_noise_or_without_teachers_keeps_no_ledger():
  exact = dfpate.make_plan(dfpate.DFPATEConfig(**_TINY, target_epsilon=None, noise_std=0.0))
  assert math.isinf(exact.sound_epsilon) and exact.budget_epsilon is None
  assert exact.new_ledger() is None
  blind = dfpate.make_plan(dfpate.DFPATEConfig(**_TINY, use_teachers=False))
  assert blind.sound_epsilon == 0.0 and blind.budget_epsilon is None
  assert isinstance(blind.event(2), dp_event.NoOpDpEvent)
  assert isinstance(blind.query_model_event(), dp_event.NoOpDpEvent)
  # σ is still calibrated as if the teachers voted (the baseline gets the private run's σ).
  assert blind.noise_std > 0 and blind.query_model is not None


def test_given_noise_above_the_target_is_refused():
  config = dfpate.DFPATEConfig(**{**_TINY, "query_source": "procedural"}, target_epsilon=1.0,
                               noise_std=1.0)
  with pytest.raises(errors.UserError, match="target_epsilon"):
    dfpate.make_plan(config)


def test_query_model_spending_the_whole_target_is_refused():
  with pytest.raises(ValueError, match="query_model_noise"):
    dfpate.make_plan(dfpate.DFPATEConfig(**_TINY, target_epsilon=0.05))


def test_step_takes_sigma_from_the_plan(monkeypatch):
  # The student trains after the release: skip its compile, it cannot change the answers.
  monkeypatch.setattr(student_lib, "train_student", lambda state, *a, **k: (state, 0.0))
  config = dfpate.DFPATEConfig(**{**_TINY, "queries_per_round": 8, "pool_factor": 1,
                                  "student_batch_size": 8}, target_epsilon=8.0)
  plan = dfpate.make_plan(config)
  info = config.info
  d = int(np.prod(info.image_shape))
  model = qm.QueryModel(mean=jnp.full((d,), 0.3), components=jnp.eye(d)[:, :2],
                        centroids=jnp.zeros((1, 2)), counts=jnp.ones(1),
                        variances=jnp.ones((1, 2)))
  ensemble = ensemble_lib.init_ensemble("mlp", 4, info, jax.random.key(0))
  keys = {name: jax.random.key(i) for i, name in enumerate(("queries", "noise", "student"))}
  released = []
  for sigma in (plan.noise_std, 2 * plan.noise_std):
    train_step = dfpate.build_train_step(dataclasses.replace(plan, noise_std=sigma), config,
                                         ensemble=ensemble, query_model=model, keys=keys)
    state, _ = train_step(dfpate.init_state(config, jax.random.key(5)), 0)
    released.append(state.released)
  exact = aggregation.vote_histogram(ensemble_lib.ensemble_logits(ensemble, state.images, info))
  np.testing.assert_allclose(released[1] - exact, 2 * (released[0] - exact), rtol=1e-4,
                             atol=1e-4)
  assert not np.allclose(released[0], released[1])


def test_dfpate_with_the_query_model_charges_it_and_meets_the_target(tmp_path, monkeypatch):
  # One source: the query model is fitted with the plan's releases after the plan charged
  # them (before, the charge came after the fit), the ledger holds exactly the plan's events
  # and ε is the plan's.
  workdir = str(tmp_path / "run")
  fitted, made = [], []
  fit, make_plan = qm.fit_query_model, dfpate.privacy.make_plan

  def spy_fit(key, images, releases):
    on_file = ledger_file.load(os.path.join(workdir, ledger_file.FILE_NAME))
    fitted.append((releases, 0 if on_file is None else len(on_file[0].entries)))
    return fit(key, images, releases)

  def spy_plan(config):
    made.append(make_plan(config))
    return made[-1]

  monkeypatch.setattr(qm, "fit_query_model", spy_fit)
  monkeypatch.setattr(dfpate.privacy, "make_plan", spy_plan)
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=8.0)
  results = dfpate.train_dfpate(config, workdir, progress=False)
  (plan,) = made
  assert fitted == [(plan.query_model, 1)]  # the plan's releases, charged before the fit
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  assert dfpate.DFPATEPlan.from_json(meta["plan"]) == plan
  on_file, _ = ledger_file.load(os.path.join(workdir, ledger_file.FILE_NAME))
  assert _events([e.event for e in on_file.entries]) == _events(
      [plan.query_model_event(), plan.event(1), plan.event(1)])
  sigma = results["noise_std"]
  assert sigma == plan.noise_std
  total = accounting.epsilon(plan.run_event(), delta=1e-5)
  votes_only = accounting.epsilon(accounting.pate_event(noise_std=sigma, num_queries=32),
                                  delta=1e-5)
  assert results["epsilon"] == pytest.approx(total, rel=1e-9)
  assert total == plan.sound_epsilon
  assert votes_only < total <= 8.0 and total > 7.9
  ledger = ledger_lib.PrivacyLedger.from_json(meta["ledger"])
  assert len(ledger.entries) == 3  # the query model, then one entry per round
  assert ledger.spent_epsilon() == pytest.approx(total, rel=1e-6)
  assert os.path.exists(os.path.join(workdir, "samples.png"))


def test_secure_plan_is_zcdp_calibrated_and_never_below_the_float_epsilon():
  base = {**_TINY, "query_source": "procedural"}
  plan = dfpate.make_plan(dfpate.DFPATEConfig(**base, target_epsilon=5.0, secure_noise=True))
  assert plan.secure_noise and (plan.num_teachers, plan.num_classes) == (4, 10)
  event = plan.event(2)
  assert isinstance(event.event, dp_event.ZCDpEvent) and event.count == 32
  assert 4.5 < plan.sound_epsilon <= 5.0 and plan.budget_epsilon == 5.0
  assert dfpate.DFPATEPlan.from_json(plan.to_json()) == plan
  float_plan = dfpate.make_plan(dfpate.DFPATEConfig(
      **base, target_epsilon=None, noise_std=plan.noise_std))
  assert "secure_noise" not in float_plan.to_json()
  assert plan.sound_epsilon >= float_plan.sound_epsilon
  with pytest.raises(errors.UserError, match="query model"):
    dfpate.DFPATEConfig(**_TINY, target_epsilon=5.0, secure_noise=True)


def test_secure_votes_lie_on_the_grid_with_the_plans_sigma():
  config = dfpate.DFPATEConfig(**{**_TINY, "query_source": "procedural"}, noise_std=3.0,
                               target_epsilon=None, secure_noise=True)
  plan = dfpate.make_plan(config)
  histogram = jnp.tile(jnp.asarray([4.0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), (400, 1))  # (Q, K)
  votes = dfpate_step.release_votes(plan, jax.random.key(3), histogram)
  grid = secure_gaussian.choose_grid(noise_multiplier=3.0, bound=1.0, max_abs=4.0)
  units = np.asarray(votes.histogram, np.float64) / grid.step
  np.testing.assert_array_equal(units, np.round(units))
  noise = np.asarray(votes.histogram) - np.asarray(histogram)
  assert abs(noise.std() / 3.0 - 1) < 4 * math.sqrt(2 / noise.size)
