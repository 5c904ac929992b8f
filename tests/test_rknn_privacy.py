"""Reverse k-NN privacy plan (`rknn/privacy.py`): ε split, events, relation, one source of the
noise for the release and the ledger."""

import dataclasses
import fractions
import json
import math
import os

import jax
import numpy as np
import pytest
from dp_accounting import dp_event

from dpkd_jax.methods import rknn
from dpkd_jax.methods.rknn import votes
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import discrete_laplace
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint

TINY_STUDENT = rknn.StudentConfig(model="lenet5_half", epochs=1, batch_size=32)


def _config(**kw):
  base = dict(dataset="digits", num_queries=10, k=1, epsilon=2.0, kmeans_restarts=1,
              kmeans_iterations=10, student=TINY_STUDENT, seed=0)
  base.update(kw)
  return rknn.RKNNConfig(**base)


def test_plan_splits_the_budget_over_the_rounds():
  plan = rknn.make_plan(_config(rounds=4, epsilon=1.0, k=3))
  assert plan.releases == 4 and plan.epsilon_per_round == 0.25 and plan.k == 3
  assert plan.relation == "replace-one" and plan.accounting == "sound"
  event = plan.event(1)  # one discrete Laplace round: scale t = 2k / ε_r = 24, a = 1/t
  assert event.count == 1 and event.event == dp_event.DiscreteLaplaceDpEvent(
      noise_parameter=discrete_laplace.noise_parameter(fractions.Fraction(24)), sensitivity=6)
  assert plan.l1_sensitivity == 6.0 and plan.laplace_scale == fractions.Fraction(24)
  assert event.event.noise_parameter * event.event.sensitivity >= 0.25  # never under-charged
  assert plan.flip_probability is None
  assert plan.event(4).count == 4 and isinstance(plan.event(0), dp_event.NoOpDpEvent)
  # Four pure 0.25-DP rounds: the paper's ε is 1 (δ = 0); the ledger's PLD ε at δ is the
  # budget, and cannot exceed it beyond the grid's rounding.
  assert plan.paper_epsilon == 1.0
  assert plan.budget_epsilon == plan.sound_epsilon == accounting.epsilon(
      plan.event(4), delta=plan.delta)
  assert 0.9 < plan.sound_epsilon <= 1.0 + 1e-3
  assert plan.new_ledger().target_epsilon == plan.sound_epsilon


def test_local_plan_is_honest_about_what_it_accounts():
  plan = rknn.make_plan(_config(mode="local", rounds=2, epsilon=3.0, k=2))
  eps_r = 1.5
  # The executed flip probability (float32, as drawn) makes a report eps_r-LDP: two reports
  # differ in at most 2k = l1_sensitivity bits, each a likelihood ratio (1 - p) / p.
  p = plan.flip_probability
  assert p == pytest.approx(1.0 / (math.exp(eps_r / 4) + 1.0), rel=1e-6)
  assert plan.l1_sensitivity * math.log((1 - p) / p) == pytest.approx(eps_r, rel=1e-6)
  assert plan.laplace_scale is None
  # Accounted as binary RR of eps_r under replace-one: the dominating pair of pure eps_r-DP.
  event = plan.event(1)
  assert event.relation == "replace-one" and event.count == 1
  assert isinstance(event.event, dp_event.RandomizedResponseDpEvent)
  assert event.event.num_buckets == 2
  rr = event.event.noise_parameter  # P(true answer) = 1 - rr / 2, each other answer rr / 2
  assert math.log((1 - rr / 2) / (rr / 2)) == pytest.approx(eps_r, rel=1e-12)
  # The local guarantee is simulated (the run draws the flips): the results say so.
  assert "per record" in plan.privacy_unit and "simulated" in plan.privacy_unit
  assert "replace-one" in plan.privacy_unit


@pytest.mark.parametrize("change,match", [
    (dict(relation="add-remove"), "replace-one"),
    (dict(mode="shuffle"), "unknown mode"),
    (dict(k=0), "k must be >= 1"),
    (dict(epsilon_per_round=0.0), "epsilon_per_round must be"),
])
def test_plan_refuses_what_its_events_do_not_cover(change, match):
  plan = rknn.make_plan(_config())
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(plan, **change)


def _data(seed=0, n=60, s=5, d=4):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32),
          rng.normal(size=(s, d)).astype(np.float32))


@pytest.mark.parametrize("mode", ["central", "local"])
def test_release_and_event_take_their_noise_from_the_same_plan(mode):
  plan = rknn.make_plan(_config(mode=mode, epsilon=1.0))
  stronger = dataclasses.replace(plan, epsilon_per_round=plan.epsilon_per_round / 2)
  embeddings, labels, queries = _data()

  def release(p):
    return np.asarray(votes.release_counts(p, jax.random.key(0), embeddings, labels, queries,
                                           num_classes=3, chunk_size=16))

  exact = np.asarray(votes.reverse_knn_counts(embeddings, labels, queries, k=1,
                                              num_classes=3), np.float64)
  if mode == "central":  # the plan's exact scale drives the draws and the event
    assert stronger.laplace_scale == 2 * plan.laplace_scale
    for p in (plan, stronger):
      noise = discrete_laplace.sample(jax.random.key(0), exact.shape, p.laplace_scale)
      np.testing.assert_array_equal(release(p), exact + np.asarray(noise))
      assert p.event(1).event.noise_parameter == discrete_laplace.noise_parameter(
          p.laplace_scale)
    assert not np.array_equal(release(stronger), release(plan))
  else:
    assert stronger.flip_probability > plan.flip_probability
    assert not np.array_equal(release(stronger), release(plan))
    assert stronger.event(1).event.noise_parameter > plan.event(1).event.noise_parameter


@pytest.mark.parametrize("mode", ["central", "local"])
def test_ledger_events_are_the_saved_plans_events(mode, tmp_path):
  config = _config(mode=mode, epsilon=4.0, rounds=2, uncertain_fraction=0.5,
                   kmeans_iterations=2)
  rknn.train_rknn(config, str(tmp_path), progress=False)
  meta = checkpoint.restore_metadata(os.path.join(tmp_path, "checkpoints"))
  saved = meta["plan"]
  plan = rknn.RKNNPlan(**{f.name: saved[f.name] for f in dataclasses.fields(rknn.RKNNPlan)})
  assert plan == rknn.make_plan(config) and saved == plan.to_json()
  ledger = ledger_lib.PrivacyLedger.load(os.path.join(tmp_path, "privacy_ledger.json"))
  assert ledger.target_epsilon == plan.budget_epsilon
  events = [ledger_lib.event_to_dict(entry.event) for entry in ledger.entries]
  assert events == [ledger_lib.event_to_dict(plan.event(1))] * plan.releases
  with open(os.path.join(tmp_path, "results.json")) as f:
    results = json.load(f)
  assert results["epsilon_per_round"] == plan.epsilon_per_round
  assert results["privacy_unit"] == plan.privacy_unit
