"""SRR privacy: the plan's figures (labels ε, record-level ε, paper's per-query ε), calibration,
and the single source of ε: the RR draws and the ledger's events come from the same plan."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import errors
from dpkd_jax.methods import srr
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import neighbouring
from dpkd_jax.train import checkpoint
from dpkd_jax.train import sharding


def _plan(**kw):
  base = dict(dataset="digits", teacher_dir="unused", epsilon=1.0, target_epsilon=None,
              delta=1e-5, stages=2, samples_per_stage=10, batch_size=5, generator_prior="none")
  base.update(kw)
  return srr.make_plan(srr.SRRConfig(**base))


def test_record_epsilon_grows_with_queries_and_is_the_srr_composition():
  seen = []
  for stages in (1, 3, 9):
    plan = _plan(stages=stages)
    expected = accounting.epsilon(accounting.srr_event(epsilon_per_query=1.0,
                                                       num_queries=stages * 10), delta=1e-5)
    assert plan.releases == stages * 10  # the unit of event(): RR queries
    assert plan.labels_epsilon == pytest.approx(expected, rel=1e-12)
    assert plan.sound_epsilon == plan.labels_epsilon and plan.paper_epsilon == 1.0
    assert accounting.epsilon(plan.event(plan.releases), delta=1e-5) == pytest.approx(
        plan.sound_epsilon, rel=1e-12)
    seen.append(plan.sound_epsilon)
  assert seen[0] < seen[1] < seen[2]


def test_event_is_n_rr_queries_composed_under_replace_one():
  plan = _plan()
  event = plan.event(7)
  assert neighbouring.relation_of(event) == neighbouring.REPLACE_ONE == plan.relation
  assert ledger_lib.event_to_dict(event) == ledger_lib.event_to_dict(
      accounting.srr_event(epsilon_per_query=1.0, num_queries=7))
  # RR PLDs composed by hand (dp-accounting 0.6.0 would count a RR event once): ε grows with n.
  eps = [accounting.epsilon(plan.event(n), delta=1e-5) for n in (1, 10, 100)]
  assert eps[0] < eps[1] < eps[2]


def test_teacher_prior_has_no_finite_record_epsilon():
  plan = _plan(generator_prior="teacher")
  assert plan.sound_epsilon == math.inf  # never under-reported
  assert plan.labels_epsilon == pytest.approx(_plan().labels_epsilon)
  # The ledger keeps the labels' figure: the only releases with noise (SRRPlan docstring).
  assert plan.budget_epsilon == plan.labels_epsilon < math.inf and plan.private
  assert plan.to_json()["sound_epsilon"] == math.inf
  nonprivate = _plan(epsilon=math.inf)
  assert nonprivate.labels_epsilon == math.inf and nonprivate.paper_epsilon == math.inf
  assert nonprivate.new_ledger() is None and not nonprivate.private
  with pytest.raises(ValueError, match="without noise"):
    nonprivate.event(1)


def test_the_plan_refuses_a_finite_record_epsilon_for_the_teacher_prior():
  plan = _plan(generator_prior="teacher")
  with pytest.raises(ValueError, match="inf"):
    dataclasses.replace(plan, sound_epsilon=plan.labels_epsilon)
  with pytest.raises(ValueError, match="releases"):
    dataclasses.replace(plan, releases=plan.releases + 1)


def test_target_epsilon_bounds_the_number_of_queries():
  plan = _plan(target_epsilon=100.0, stages=50)
  eps = lambda s: accounting.epsilon(  # noqa: E731
      accounting.srr_event(epsilon_per_query=1.0, num_queries=10 * s), delta=1e-5)
  assert 1 <= plan.stages < 50 and plan.budget_epsilon == 100.0
  assert eps(plan.stages) <= 100.0 < eps(plan.stages + 1)
  calibrated = _plan(epsilon=None, target_epsilon=5.0, stages=2)
  assert 4.9 < calibrated.labels_epsilon <= 5.0 and calibrated.epsilon_per_query < 1.0
  with pytest.raises(errors.UserError, match="allows no stage"):  # one line at the CLI
    _plan(target_epsilon=2.0)


def test_a_target_with_the_teacher_prior_warns_that_the_sound_epsilon_is_inf():
  with pytest.warns(UserWarning, match=r"sound \(record-level\) epsilon of this run is inf > "
                                       r"target_epsilon=100"):
    _plan(target_epsilon=100.0, stages=2, generator_prior="teacher")


def test_report_keeps_both_figures():
  plan = _plan(generator_prior="teacher")
  block = srr.report(plan, labels_epsilon=3.0)
  assert block["labels_epsilon"] == 3.0 and block["record_level_epsilon"] == math.inf
  assert block["paper_label_epsilon_per_query"] == 1.0 == block["epsilon_per_query"]
  sound = srr.report(_plan(), labels_epsilon=3.0)
  assert sound["record_level_epsilon"] == sound["labels_epsilon"] == 3.0


# ----------------------------------------------------------------------------- single source


def _config(teacher_dir="unused", **kw):
  base = dict(dataset="digits", teacher_dir=teacher_dir, epsilon=1.0, student_model="lenet5",
              generator_channels=8, latent_dim=8, stages=2, samples_per_stage=32, batch_size=16,
              student_epochs=2, generator_epochs=0, generator_prior="none", seed=0)
  base.update(kw)
  return srr.SRRConfig(**base)


def test_the_step_draws_with_the_plans_epsilon():
  config = _config()  # config.epsilon = 1 throughout: only the plan changes
  plan = srr.make_plan(config)
  mesh = sharding.data_mesh()
  state = srr.init_state(config, jax.random.key(0), stages=2)
  teacher = lambda queries: jnp.full((queries.shape[0],), 3, jnp.int32)  # noqa: E731
  released = {}
  for eps in (1e-3, 50.0):
    step = srr.build_train_step(dataclasses.replace(plan, epsilon_per_query=eps), config,
                                teacher, mesh=mesh)
    fresh = sharding.replicate(jax.tree.map(jnp.copy, state), mesh)  # the steps donate it
    released[eps] = np.asarray(step(fresh, jax.random.key(1), 0).noisy_labels)
  assert (released[50.0] == 3).all()  # ε = 50: the true label, kept
  assert (released[1e-3] == 3).mean() < 0.5  # ε ~ 0: uniform over the 10 candidates


def test_the_ledger_charges_the_event_of_the_saved_plan(teacher_dir, tmp_path):
  # ε per query calibrated from the target: neither the config nor a default holds it.
  config = _config(teacher_dir, epsilon=None, target_epsilon=30.0)
  srr.train_srr(config, str(tmp_path), progress=False)
  meta = checkpoint.restore_metadata(os.path.join(str(tmp_path), "checkpoints"))
  plan = srr.SRRPlan(**{k: v for k, v in meta["plan"].items() if k != "plan"})
  assert plan == srr.make_plan(config) and plan.epsilon_per_query != config.epsilon
  with open(tmp_path / "privacy_ledger.json") as f:
    entries = json.load(f)["entries"]
  assert len(entries) == plan.stages == 2
  expected = ledger_lib.event_to_dict(plan.event(plan.samples_per_stage))
  assert all(entry["event"] == expected for entry in entries)
