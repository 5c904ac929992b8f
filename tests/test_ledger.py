"""Tests for dpkd_jax.privacy.ledger: budget, JSON round trip, tampering."""

import fractions
import json
import math

from dp_accounting import dp_event
import pytest

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib

DELTA = 1e-5
# One DPDFD step with B = 256, σ = 100: ε ≈ 1.2 at δ = 1e-5.
STEP_EVENT = accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                    steps=1)


def make_ledger(target: float = 3.0) -> ledger_lib.PrivacyLedger:
  return ledger_lib.PrivacyLedger(target_epsilon=target, delta=DELTA)


def test_check_raises_before_the_release_that_would_exceed():
  ledger = make_ledger(target=3.0)
  released = 0
  with pytest.raises(ledger_lib.BudgetExceededError) as err:
    while True:
      ledger.check(STEP_EVENT)  # Raises before the overshooting release.
      ledger.record(STEP_EVENT, step=released, note="dpdfd")
      released += 1
  assert released >= 1
  spent = ledger.spent_epsilon()
  assert spent <= 3.0
  # The refused release would have overshot, and nothing was recorded for it.
  after = accounting.epsilon(dp_event.ComposedDpEvent(
      [STEP_EVENT] * (released + 1)), delta=DELTA)
  assert after > 3.0
  assert len(ledger.entries) == released
  message = str(err.value)
  for expected in (f"{spent:.6g}", f"{after:.6g}", "target ε=3", "δ=1e-05"):
    assert expected in message


def test_record_never_refuses_and_remaining_fraction():
  ledger = make_ledger(target=1.0)
  assert ledger.remaining_fraction() == 1.0
  ledger.record(STEP_EVENT, step=0)
  ledger.record(STEP_EVENT, step=1)
  assert ledger.spent_epsilon() > 1.0
  assert ledger.remaining_fraction() == 0.0


def test_spent_epsilon_matches_the_composed_event():
  ledger = make_ledger(target=100.0)
  for step in range(5):
    ledger.record(STEP_EVENT, step=step)
  assert ledger.spent_epsilon() == pytest.approx(accounting.epsilon(
      accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256, steps=5),
      delta=DELTA), abs=1e-9)


def test_rr_entries_grow_epsilon_with_count():
  ledger = make_ledger(target=100.0)
  query = accounting.srr_event(epsilon_per_query=1.0, num_queries=1)
  spent = [ledger.record(query, step=i) for i in range(10)]
  assert all(a < b for a, b in zip(spent, spent[1:]))
  assert spent[-1] == pytest.approx(accounting.epsilon(accounting.srr_event(
      epsilon_per_query=1.0, num_queries=10), delta=DELTA), abs=1e-9)


@pytest.mark.parametrize("event", [
    dp_event.GaussianDpEvent(1.5),
    dp_event.LaplaceDpEvent(0.25),
    dp_event.RandomizedResponseDpEvent(noise_parameter=0.3, num_buckets=7),
    dp_event.NoOpDpEvent(),
    dp_event.NonPrivateDpEvent(),
    accounting.dpsgd_event(noise_multiplier=1.1, sampling_rate=0.01, steps=9,
                           relation="add-remove"),
    accounting.dpsgd_event(noise_multiplier=1.1, sampling_rate=0.01, steps=9,
                           relation=accounting.REPLACE_ONE),
    dp_event.ComposedDpEvent([
        accounting.srr_event(epsilon_per_query=0.5, num_queries=3),
        accounting.laplace_counts_event(epsilon_per_round=0.1, rounds=2)]),
    accounting.discrete_laplace_counts_event(scale=fractions.Fraction(6827, 512),
                                             l1_sensitivity=4, rounds=3),
])
def test_event_dict_round_trip(event):
  as_json = json.dumps(ledger_lib.event_to_dict(event))
  assert ledger_lib.event_from_dict(json.loads(as_json)) == event


def test_unsupported_events_are_rejected_at_record_time():
  ledger = make_ledger()
  with pytest.raises(ValueError, match="cannot serialize"):
    ledger.record(dp_event.MixtureOfGaussiansDpEvent(
        standard_deviation=1.0, sensitivities=[1.0], sampling_probs=[1.0]), step=0)
  with pytest.raises(ValueError, match="unknown serialized event"):
    ledger_lib.event_from_dict({"type": "mixture_of_gaussians", "standard_deviation": 1.0})
  # zCDP (the secure-noise releases) is serialized since that mode exists.
  zcdp = dp_event.ZCDpEvent(rho=0.1, xi=0.0)
  assert ledger_lib.event_from_dict(ledger_lib.event_to_dict(zcdp)) == zcdp


def test_json_round_trip_preserves_epsilon_and_entries(tmp_path):
  ledger = make_ledger(target=50.0)
  ledger.record(STEP_EVENT, step=0, note="dpdfd")
  ledger.record(accounting.srr_event(epsilon_per_query=1.0, num_queries=20),
                step=3, note="srr labels")
  ledger.record(accounting.laplace_counts_event(epsilon_per_round=0.5,
                                                rounds=2), step=3)
  path = tmp_path / "ledger.json"
  ledger.save(path)
  loaded = ledger_lib.PrivacyLedger.load(path)
  assert loaded.entries == ledger.entries
  assert loaded.spent_epsilon() == ledger.spent_epsilon()
  assert (loaded.target_epsilon, loaded.delta, loaded.accountant) == (
      50.0, DELTA, "pld")
  stored = json.loads(path.read_text())
  assert stored["spent_epsilon"] == ledger.spent_epsilon()


def test_shortened_ledger_is_detected():
  ledger = make_ledger(target=50.0)
  for step in range(3):
    ledger.record(STEP_EVENT, step=step)
  data = json.loads(ledger.to_json())
  data["entries"].pop()
  with pytest.raises(ValueError, match="altered"):
    ledger_lib.PrivacyLedger.from_json(json.dumps(data))
  data["num_entries"] = 2  # Cover the count too: ε still gives it away.
  with pytest.raises(ValueError, match="removed or altered"):
    ledger_lib.PrivacyLedger.from_json(json.dumps(data))


def test_malformed_ledger_raises_value_error():
  data = json.loads(make_ledger().to_json())
  del data["spent_epsilon"]
  with pytest.raises(ValueError, match="malformed"):
    ledger_lib.PrivacyLedger.from_json(json.dumps(data))


def test_save_refuses_to_overwrite_a_longer_ledger(tmp_path):
  path = tmp_path / "ledger.json"
  longer = make_ledger()
  longer.record(STEP_EVENT, step=0)
  longer.record(STEP_EVENT, step=1)
  longer.save(path)
  shorter = make_ledger()
  shorter.record(STEP_EVENT, step=0)
  with pytest.raises(ValueError, match="refusing to overwrite"):
    shorter.save(path)
  assert len(ledger_lib.PrivacyLedger.load(path).entries) == 2
  longer.record(STEP_EVENT, step=2)
  longer.save(path)  # Growing the same file is fine.
  assert len(ledger_lib.PrivacyLedger.load(path).entries) == 3


def test_loading_or_overwriting_a_non_ledger_file_raises(tmp_path):
  path = tmp_path / "notes.json"
  path.write_text('{"hello": 1}')
  with pytest.raises(ValueError, match="not a privacy ledger"):
    ledger_lib.PrivacyLedger.load(path)
  with pytest.raises(ValueError, match="not a privacy ledger"):
    make_ledger().save(path)


def test_steps_are_append_only():
  ledger = make_ledger()
  ledger.record(STEP_EVENT, step=5)
  with pytest.raises(ValueError, match="append-only"):
    ledger.record(STEP_EVENT, step=4)
  with pytest.raises(ValueError, match="step"):
    ledger.record(STEP_EVENT, step=-1)


def test_noiseless_release_spends_everything():
  ledger = make_ledger()
  with pytest.raises(ledger_lib.BudgetExceededError):
    ledger.check(dp_event.NonPrivateDpEvent())
  ledger.record(dp_event.NonPrivateDpEvent(), step=0)
  assert ledger.spent_epsilon() == math.inf
  loaded = ledger_lib.PrivacyLedger.from_json(ledger.to_json())
  assert loaded.spent_epsilon() == math.inf


@pytest.mark.parametrize("kwargs,match", [
    (dict(target_epsilon=0.0, delta=DELTA), "target_epsilon"),
    (dict(target_epsilon=math.inf, delta=DELTA), "target_epsilon"),
    (dict(target_epsilon=1.0, delta=0.0), "delta"),
    (dict(target_epsilon=1.0, delta=1.0), "delta"),
    (dict(target_epsilon=1.0, delta=DELTA, accountant="gdp"), "accountant"),
])
def test_bad_configuration_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ledger_lib.PrivacyLedger(**kwargs)


def test_ledger_keeps_one_neighbouring_relation(tmp_path):
  ledger = make_ledger(target=100.0)
  assert ledger.relation is None
  ledger.record(dp_event.GaussianDpEvent(50.0), step=0)  # untagged: fixes no relation
  assert ledger.relation is None
  ledger.record(STEP_EVENT, step=1)
  assert ledger.relation == accounting.REPLACE_ONE
  add_remove = accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.01, steps=5,
                                      relation="add-remove")
  for call in (lambda: ledger.check(add_remove), lambda: ledger.record(add_remove, step=2)):
    with pytest.raises(ValueError, match="replace-one relation"):
      call()
  assert len(ledger.entries) == 2  # nothing recorded for the refused event
  ledger.record(accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.01, steps=5,
                                       relation=accounting.REPLACE_ONE), step=2)
  path = tmp_path / "ledger.json"
  ledger.save(path)
  assert json.loads(path.read_text())["relation"] == accounting.REPLACE_ONE
  loaded = ledger_lib.PrivacyLedger.load(path)
  assert loaded.relation == accounting.REPLACE_ONE and loaded.entries == ledger.entries
  with pytest.raises(ValueError, match="replace-one relation"):
    loaded.record(add_remove, step=3)


def test_ledger_relation_can_be_fixed_up_front():
  ledger = ledger_lib.PrivacyLedger(target_epsilon=10.0, delta=DELTA,
                                    relation=accounting.ADD_REMOVE)
  with pytest.raises(ValueError, match="add-remove relation"):
    ledger.check(STEP_EVENT)
  with pytest.raises(ValueError, match="neighbouring relation must be"):
    ledger_lib.PrivacyLedger(target_epsilon=10.0, delta=DELTA, relation="replace")


def test_version_1_ledgers_still_load_and_get_their_relation():
  # A DP-SGD ledger written before relation tags: untagged Poisson events (add/remove).
  old = {"format": "dpkd_jax.privacy_ledger", "version": 1, "target_epsilon": 10.0,
         "delta": DELTA, "accountant": "pld", "spent_epsilon": 0.0, "num_entries": 1,
         "entries": [{"step": 9, "note": "dpsgd", "event": {
             "type": "self_composed", "count": 9, "event": {
                 "type": "poisson_sampled", "sampling_probability": 0.01,
                 "event": {"type": "gaussian", "noise_multiplier": 1.1}}}}]}
  loaded = ledger_lib.PrivacyLedger.from_json(json.dumps(old))
  assert loaded.relation == accounting.ADD_REMOVE
  assert loaded.spent_epsilon() == pytest.approx(accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=1.1, sampling_rate=0.01, steps=9,
      relation="add-remove"), delta=DELTA), rel=1e-12)
  old["relation"] = accounting.REPLACE_ONE  # a relation that its events contradict
  with pytest.raises(ValueError, match="altered"):
    ledger_lib.PrivacyLedger.from_json(json.dumps(old))
