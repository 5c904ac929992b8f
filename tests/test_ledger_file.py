"""The ledger file: charged before each release, never lower on resume, replays reuse charges."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import dp_event

from dpkd_jax import errors
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import ledger_file
from dpkd_jax.train import workdir

CONFIG = {"run": "ledger test"}
EVENT = dp_event.GaussianDpEvent(3.0)


def _fresh():
  return ledger_lib.PrivacyLedger(target_epsilon=50.0, delta=1e-5)


def _state(step):
  return {"w": jnp.asarray(np.random.default_rng(step).standard_normal((32, 32)), jnp.float32)}


def _chunk(run, ledger, step, state=None):
  """One release: charge, compute (here: look up the state), seal, save."""
  run.charge(EVENT, step=step, note=f"chunk {step}")
  host = run.seal(_state(step + 1) if state is None else state)
  run.save(step + 1, host, {"config": CONFIG, "ledger": ledger.to_json()})


def _crashed_run(path, chunks=2):
  """`chunks` releases checkpointed, then one more charged: the process dies mid-release."""
  with workdir.open_run(str(path), kind="test", config=CONFIG) as run:
    ledger = run.ledger(_fresh())
    for step in range(chunks):
      _chunk(run, ledger, step)
    run.charge(EVENT, step=chunks, note=f"chunk {chunks}")
    return ledger.spent_epsilon(), len(ledger.entries)


def _file(path):
  with open(os.path.join(path, ledger_file.FILE_NAME)) as f:
    return json.load(f)


def test_every_charge_is_in_the_file_before_the_release(tmp_path):
  spent, n = _crashed_run(tmp_path)
  saved = ledger_lib.PrivacyLedger.load(os.path.join(tmp_path, ledger_file.FILE_NAME))
  assert len(saved.entries) == n == 3 and saved.spent_epsilon() == pytest.approx(spent)
  seals = _file(tmp_path)["released_state_sha256"]
  assert seals[:2] == [checkpoint.checksum(_state(1)), checkpoint.checksum(_state(2))]
  assert seals[2] is None  # charged, nothing released yet


def test_resume_reuses_the_charge_of_a_release_that_never_came_out(tmp_path):
  spent, _ = _crashed_run(tmp_path)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    ledger = run.ledger(_fresh())
    assert run.step == 2 and ledger.spent_epsilon() == pytest.approx(spent)  # never lower
    _chunk(run, ledger, 2)  # the repeat of the lost release: same step, event and note
    assert len(ledger.entries) == 3
    _chunk(run, ledger, 3)  # a new release is charged
    assert len(ledger.entries) == 4


def test_fallback_keeps_the_charges_the_older_checkpoint_does_not_know(tmp_path):
  # Before: the older checkpoint's ledger (1 entry) replaced the spent one (3 entries).
  spent, _ = _crashed_run(tmp_path)
  ckpt_dir = os.path.join(tmp_path, "checkpoints")
  step = checkpoint.latest_step(ckpt_dir)
  data = max((os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ckpt_dir, str(step)))
              for f in fs if os.path.basename(d) == "d"), key=os.path.getsize)
  with open(data, "r+b") as f:
    f.seek(os.path.getsize(data) // 2)
    f.write(b"\xff" * 8)
  with pytest.warns(UserWarning, match="corrupt"):
    run = workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True)
  with run:
    ledger = run.ledger(_fresh())
    assert run.step == 1 and ledger.spent_epsilon() == pytest.approx(spent)
    _chunk(run, ledger, 1)  # identical repeat of a sealed release: its digest matches
    _chunk(run, ledger, 2)  # repeat of the unsealed one
    assert len(ledger.entries) == 3


def test_a_repeat_that_differs_is_charged_again(tmp_path):
  spent, _ = _crashed_run(tmp_path)
  shutil.rmtree(os.path.join(tmp_path, "checkpoints", "2"))  # fall back to step 1
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    ledger = run.ledger(_fresh())
    with pytest.warns(UserWarning, match="differs from the original"):
      _chunk(run, ledger, 1, state=_state(99))  # non-deterministic repeat
    assert len(ledger.entries) == 4 and ledger.spent_epsilon() > spent
  assert len(_file(tmp_path)["entries"]) == 4


def test_a_different_release_is_charged_and_the_pending_charges_stay(tmp_path):
  spent, _ = _crashed_run(tmp_path)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    ledger = run.ledger(_fresh())
    run.charge(dp_event.GaussianDpEvent(4.0), step=2, note="something else")
    assert len(ledger.entries) == 4 and ledger.spent_epsilon() > spent


def test_without_the_file_the_largest_checkpoint_ledger_wins(tmp_path):
  _crashed_run(tmp_path)
  os.remove(os.path.join(tmp_path, ledger_file.FILE_NAME))
  os.makedirs(os.path.join(tmp_path, "checkpoints.corrupt"))  # as `checkpoint.quarantine` does
  shutil.move(os.path.join(tmp_path, "checkpoints", "2"),
              os.path.join(tmp_path, "checkpoints.corrupt", "2"))
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    ledger = run.ledger(_fresh())
    assert run.step == 1 and len(ledger.entries) == 2  # the moved checkpoint's ledger
    _chunk(run, ledger, 1)  # its charge was released (digest unknown): charged again
    assert len(ledger.entries) == 3
  assert len(_file(tmp_path)["entries"]) == 3


def test_a_crash_before_the_first_checkpoint_still_needs_resume(tmp_path):
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    run.ledger(_fresh())
    run.charge(EVENT, step=0, note="chunk 0")
  with pytest.raises(errors.UserError, match="privacy ledger of a test run"):
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=False)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    ledger = run.ledger(_fresh())
    assert not run.resuming and len(ledger.entries) == 1
    _chunk(run, ledger, 0)  # nothing came out of the lost release: its charge is reused
    assert len(ledger.entries) == 1


@pytest.mark.parametrize("damage", ["{not json", '{"format": "something else"}', "\xff\xfe"])
def test_a_damaged_ledger_file_is_refused_never_reset(tmp_path, damage):
  _crashed_run(tmp_path)
  with open(os.path.join(tmp_path, ledger_file.FILE_NAME), "w", encoding="latin-1") as f:
    f.write(damage)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    with pytest.raises(ledger_file.CorruptLedgerError, match="privacy_ledger.json") as err:
      run.ledger(_fresh())
  assert isinstance(err.value, errors.UserError) and "\n" not in str(err.value)


def test_atomic_write_replaces_the_file(tmp_path):
  path = str(tmp_path / "f.json")
  ledger_file.write_atomically(path, "a")
  ledger_file.write_atomically(path, "b")
  assert open(path).read() == "b" and os.listdir(tmp_path) == ["f.json"]


def test_fallback_after_a_finished_run_reuses_the_sealed_charge(tmp_path):
  # The moved checkpoint's ledger ties with the file: the file (with its seals) must win, or
  # the repeat of the last release would be charged twice and exceed a tight budget.
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    ledger = run.ledger(_fresh())
    for step in range(3):
      _chunk(run, ledger, step)
  ckpt_dir = os.path.join(tmp_path, "checkpoints")
  os.makedirs(ckpt_dir + ".corrupt")
  shutil.move(os.path.join(ckpt_dir, "3"), os.path.join(ckpt_dir + ".corrupt", "3"))
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    ledger = run.ledger(_fresh())
    assert run.step == 2 and len(ledger.entries) == 3
    _chunk(run, ledger, 2)
    assert len(ledger.entries) == 3


def test_a_ledger_of_another_budget_is_refused(tmp_path):
  _crashed_run(tmp_path)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True) as run:
    with pytest.raises(errors.UserError, match="belongs to another run"):
      run.ledger(ledger_lib.PrivacyLedger(target_epsilon=49.0, delta=1e-5))


def test_damaged_ledger_in_checkpoint_metadata_is_a_one_line_refusal():
  assert ledger_file.ledger_of({}) is None
  for damaged in ("{not json", '{"format": "dpkd_jax.privacy_ledger", "entries": 3}'):
    with pytest.raises(ledger_file.CorruptLedgerError, match="checkpoint's metadata is damaged"):
      ledger_file.ledger_of({"ledger": damaged})
