"""The run prologue: workdir lock, resume-or-refuse, config check, checkpoint fallback."""

import os
import signal
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import errors
from dpkd_jax.train import checkpoint
from dpkd_jax.train import workdir

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks"))
import fault_injection  # noqa: E402  (the fault-injection script's byte overwriter)

CONFIG = {"lr": 0.1, "seed": None}


def _arrays(value):
  # Random values: incompressible, so that the array bytes fill the largest data file.
  w = np.random.default_rng(value).standard_normal((64, 64)).astype(np.float32)
  return {"w": jnp.asarray(w), "step": jnp.asarray(int(value))}


def _corrupt_newest(ckpt_dir):
  step = checkpoint.latest_step(ckpt_dir)
  fault_injection.overwrite_array_bytes(ckpt_dir, step)
  return step


def _finished_run(path, steps=(1, 2)):
  with workdir.open_run(str(path), kind="test", config=CONFIG) as run:
    for step in steps:
      run.save(step, _arrays(step), {"config": CONFIG, "step": step})


def test_second_run_is_refused_while_the_first_holds_the_lock(tmp_path):
  # Before: two runs in one workdir both trained, and interleaved their metrics and checkpoints.
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG):
    with pytest.raises(workdir.WorkdirInUseError, match=f"pid {os.getpid()} on ") as err:
      workdir.open_run(str(tmp_path), kind="test", config=CONFIG)
    assert isinstance(err.value, errors.UserError) and "\n" not in str(err.value)
  workdir.open_run(str(tmp_path), kind="test", config=CONFIG).close()  # released


def test_run_scope_releases_the_lock_when_the_run_raises(tmp_path):
  @workdir.run_scope
  def failing_run():
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG)
    raise RuntimeError("boom")

  with pytest.raises(RuntimeError, match="boom"):
    failing_run()
  workdir.open_run(str(tmp_path), kind="test", config=CONFIG).close()


def test_lock_of_a_killed_process_does_not_block(tmp_path):
  script = textwrap.dedent(f"""
      import sys, time
      from dpkd_jax.train import workdir
      run = workdir.open_run({str(tmp_path)!r}, kind="test", config={{}})
      print("locked", flush=True)
      time.sleep(120)
  """)
  env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
  holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=env)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(workdir.WorkdirInUseError, match=f"pid {holder.pid} "):
      workdir.open_run(str(tmp_path), kind="test", config={})
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  workdir.open_run(str(tmp_path), kind="test", config={}).close()  # stale: not an obstacle


def test_a_run_that_wrote_nothing_leaves_no_trace(tmp_path):
  with workdir.open_run(str(tmp_path / "new"), kind="test", config=CONFIG):
    assert os.path.exists(tmp_path / "new" / workdir.LOCK_NAME)
  assert not os.path.exists(tmp_path / "new")
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG):
    pass
  assert os.path.isdir(tmp_path) and not os.listdir(tmp_path)


def test_workdir_that_is_a_file_is_one_line(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(errors.UserError, match="cannot use workdir"):
    workdir.open_run(str(tmp_path / "file"), kind="test", config=CONFIG)


def test_resume_of_a_method_that_cannot_resume_is_refused_before_anything_is_written(tmp_path):
  with pytest.raises(errors.UserError, match="a test run cannot be resumed: use a fresh"):
    workdir.open_run(str(tmp_path / "new"), kind="test", config=CONFIG, resume=True,
                     resumable=False)
  assert not os.path.exists(tmp_path / "new")


def test_existing_run_needs_resume_and_the_same_config(tmp_path):
  _finished_run(tmp_path)
  with pytest.raises(errors.UserError, match="already holds a test checkpoint: pass resume"):
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=False)
  with pytest.raises(errors.UserError, match="cannot be resumed"):
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resumable=False)
  with pytest.raises(errors.UserError, match="another config"):
    workdir.open_run(str(tmp_path), kind="test", config={**CONFIG, "lr": 1.0}, resume=True)
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:  # resume=None
    assert run.resuming and run.step == 2 and run.saved == {"config": CONFIG, "step": 2}
    arrays, meta = run.restore(_arrays(0))
    np.testing.assert_array_equal(arrays["w"], _arrays(2)["w"])
    assert meta["step"] == 2


def test_corrupt_newest_checkpoint_falls_back_and_is_moved_aside(tmp_path):
  # Before: the corrupt newest checkpoint was restored silently.
  _finished_run(tmp_path)
  _corrupt_newest(str(tmp_path / "checkpoints"))
  with pytest.warns(UserWarning, match="step 2 .* is corrupt: moved to"):
    run = workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True)
  with run:
    assert run.step == 1
    arrays, _ = run.restore(_arrays(0))
    np.testing.assert_array_equal(arrays["w"], _arrays(1)["w"])
    run.save(2, _arrays(2), {"config": CONFIG, "step": 2})  # the step is free again
  assert checkpoint.all_steps(str(tmp_path / "checkpoints")) == [1, 2]
  assert len(os.listdir(str(tmp_path / "checkpoints") + ".corrupt")) == 1


def test_no_intact_checkpoint_is_refused_in_one_line(tmp_path):
  _finished_run(tmp_path, steps=(1,))
  _corrupt_newest(str(tmp_path / "checkpoints"))
  with pytest.raises(checkpoint.CorruptCheckpointError, match="no intact checkpoint") as err:
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True)
  assert "\n" not in str(err.value)
  assert checkpoint.all_steps(str(tmp_path / "checkpoints")) == [1]  # nothing moved
  workdir.open_run(str(tmp_path / "other"), kind="test", config=CONFIG).close()


def test_root_seed_is_the_saved_one_when_resuming(tmp_path):
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    seed = run.root_seed(None)
    assert seed.secret
    run.save(1, _arrays(1), {"config": CONFIG, "root_seed": list(seed)})
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    assert run.root_seed(None) == seed
  with workdir.open_run(str(tmp_path / "b"), kind="test", config=CONFIG) as run:
    assert run.root_seed(5).value == 5 and not run.root_seed(5).secret


def test_seal_must_follow_the_last_change_of_the_state(tmp_path):
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    run.seal(_arrays(1))
    with pytest.raises(RuntimeError, match="differs from the one sealed"):
      run.save(1, _arrays(2), {"config": CONFIG})


def test_a_run_without_a_ledger_charges_nothing(tmp_path):
  with workdir.open_run(str(tmp_path), kind="test", config=CONFIG) as run:
    with pytest.raises(RuntimeError, match="ledger"):
      run.charge(None, step=0)
    assert run.ledger(None) is None
    assert run.charge(None, step=0) == float("inf")
    run.save(1, _arrays(1), {"config": CONFIG})
  assert not os.path.exists(tmp_path / "privacy_ledger.json")


def _seeded_run(path, seed=(12345678901234567890, True)):  # > 2**63: 64 bits
  """Two checkpoints storing the secret root seed, and a ledger file with one charge."""
  from dp_accounting import dp_event  # pylint: disable=import-outside-toplevel
  from dpkd_jax.privacy import ledger as ledger_lib  # pylint: disable=import-outside-toplevel
  with workdir.open_run(str(path), kind="test", config=CONFIG) as run:
    run.ledger(ledger_lib.PrivacyLedger(target_epsilon=10.0, delta=1e-5))
    for step in (1, 2):
      run.charge(dp_event.GaussianDpEvent(5.0), step=step)
      run.save(step, _arrays(step), {"config": CONFIG, "root_seed": list(seed)})


@pytest.mark.parametrize("changed", [2, 1])
def test_a_changed_root_seed_is_refused_before_anything_is_written(tmp_path, changed):
  # Before: a digit of the stored seed changed was accepted and the run went on with it.
  _seeded_run(tmp_path)
  path = tmp_path / "checkpoints" / str(changed) / checkpoint.META_FILE
  path.write_text(path.read_text().replace("12345", "12346", 1))
  ledger_before = (tmp_path / "privacy_ledger.json").read_bytes()
  with pytest.raises(errors.UserError, match="meta/metadata") as err:
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True)
  assert str(path) in str(err.value) and "\n" not in str(err.value)
  assert checkpoint.all_steps(str(tmp_path / "checkpoints")) == [1, 2]  # nothing moved
  assert not os.path.exists(str(tmp_path / "checkpoints") + ".corrupt")
  assert (tmp_path / "privacy_ledger.json").read_bytes() == ledger_before  # nothing charged
  assert not os.path.exists(tmp_path / workdir.LOCK_NAME)  # the lock was released


def test_every_checkpoint_with_a_changed_seed_is_refused_in_one_line(tmp_path):
  _seeded_run(tmp_path)
  for step in (1, 2):
    path = tmp_path / "checkpoints" / str(step) / checkpoint.META_FILE
    path.write_text(path.read_text().replace("12345", "12346", 1))
  with pytest.raises(checkpoint.CorruptCheckpointError, match="no intact checkpoint.*meta/metadata"):
    workdir.open_run(str(tmp_path), kind="test", config=CONFIG, resume=True)
