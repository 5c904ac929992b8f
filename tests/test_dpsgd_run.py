"""DP-SGD's run (`methods/dpsgd/run.py`): resume, results, released vs private metrics,
seeds, refusals. Fixtures in `dpsgd_fixtures.py` (the runs reuse its trace-guarded step).
"""

import dataclasses
import json
import math
import os

import chex
import jax
import numpy as np
import pytest

from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import step as step_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train.state import TrainState
from dpsgd_fixtures import DIGITS_TRAIN, make_step
from experiments import dpsgd as dpsgd_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory, noisy_step_8_devices):
  """Run `a`: 4 steps in one go; run `b`: stopped at step 2, then resumed to 4; run `c`: as
  `a` without a seed (a secret one from OS entropy), logging its private diagnostics.

  They use the trace-guarded step of `noisy_step_8_devices`: the loop must not retrace.
  """
  config, guarded_step = noisy_step_8_devices
  assert make_step(config) is guarded_step
  dirs = {name: str(tmp_path_factory.mktemp(name)) for name in ("a", "b", "c")}
  one_go = dpsgd.train_dpsgd(config, dirs["a"], progress=False)
  first_half = dpsgd.train_dpsgd(config, dirs["b"], stop_at_step=2, progress=False)
  resumed = dpsgd.train_dpsgd(config, dirs["b"], resume=True, progress=False)
  secret = dpsgd.train_dpsgd(dataclasses.replace(config, seed=None, log_private_diagnostics=True),
                             dirs["c"], progress=False)
  return config, dirs, one_go, first_half, resumed, secret


def _restore_params(config, workdir):
  template = TrainState.create(dpsgd.init_model(config, jax.random.key(0)),
                               dpsgd.make_optimizer(config)).arrays()
  target = {"state": template, "rng": jax.random.key_data(jax.random.key(0))}
  arrays, meta = checkpoint.restore(os.path.join(workdir, "checkpoints"), target)
  return arrays, meta


def test_resume_is_bit_identical(runs):
  config, dirs, one_go, first_half, resumed, _ = runs
  assert first_half["steps"] == 2 and not first_half["finished"]
  assert resumed["steps"] == one_go["steps"] == 4 and resumed["finished"]
  arrays_a, meta_a = _restore_params(config, dirs["a"])
  arrays_b, meta_b = _restore_params(config, dirs["b"])
  chex.assert_trees_all_equal(arrays_a, arrays_b)  # params, momentum, step, key data
  assert resumed["test_accuracy"] == one_go["test_accuracy"]
  assert resumed["test_loss"] == one_go["test_loss"]
  assert resumed["epsilon"] == pytest.approx(one_go["epsilon"], rel=1e-12)
  assert first_half["epsilon"] < resumed["epsilon"]
  # The checkpoint carries the ledger: 1 entry of 4 steps vs 2 entries of 2 steps.
  assert len(json.loads(meta_a["ledger"])["entries"]) == 1
  assert len(json.loads(meta_b["ledger"])["entries"]) == 2


def test_resumed_record_counts_both_processes(runs):
  # Before: run `b`'s record counted only the resumed process's seconds.
  _, dirs, *_ = runs
  record = records.read_record(os.path.join(dirs["b"], "record.json"))
  with open(os.path.join(dirs["b"], "run_clock.json")) as f:
    first, second = json.load(f)["segments"]
  assert (first["start_step"], first["steps_to"], second["start_step"]) == (0, 2, 2)
  assert record["segments"] == 2 and record["commits"] == [record["commit"]]
  assert record["cpu_seconds"] >= first["cpu_seconds"] + second["cpu_seconds"] - 1e-9
  assert record["wall_seconds"] >= first["wall_seconds"]
  assert "segments" not in records.read_record(os.path.join(dirs["a"], "record.json"))


def test_results_epsilon_is_the_accountants(runs):
  config, dirs, one_go, _, _, _ = runs
  q = 16 / DIGITS_TRAIN
  expected = accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=1.0, sampling_rate=q, steps=4, relation="replace-one"), delta=config.delta)
  add_remove = accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=1.0, sampling_rate=q, steps=4, relation="add-remove"), delta=config.delta)
  assert one_go["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert one_go["neighbouring_relation"] == "replace-one"
  assert one_go["epsilon_add_remove"] == pytest.approx(add_remove, rel=1e-9)
  assert add_remove < expected
  assert one_go["sampling_rate"] == pytest.approx(q) and one_go["noise_multiplier"] == 1.0
  assert one_go["delta"] == config.delta and one_go["accountant"] == "pld"
  assert one_go["max_batch_size"] % 8 == 0 and one_go["max_batch_size"] >= 16
  with open(os.path.join(dirs["a"], "results.json")) as f:
    assert json.load(f) == one_go
  saved = ledger_lib.PrivacyLedger.load(os.path.join(dirs["a"], "privacy_ledger.json"))
  assert saved.spent_epsilon() == pytest.approx(expected, rel=1e-9)
  assert one_go["ledger"]["spent_epsilon"] == pytest.approx(expected, rel=1e-9)
  assert os.path.exists(os.path.join(dirs["a"], "metrics.csv"))
  assert 0.0 <= one_go["test_accuracy"] <= 1.0


def test_private_batch_metrics_are_off_by_default_and_kept_apart_when_asked(runs, capsys):
  _, dirs, one_go, _, _, secret = runs
  for run in ("a", "c"):  # released: the test split's loss/accuracy and ε only
    assert set(metrics_lib.read_metrics(dirs[run])) == {"test/accuracy", "test/loss",
                                                        "test/epsilon"}
  assert outputs.read_private_diagnostics(dirs["a"]) == {}
  assert outputs.PRIVATE_CSV not in os.listdir(dirs["a"])
  assert "files" not in one_go[outputs.PRIVATE_KEY]
  logged = outputs.read_private_diagnostics(dirs["c"])
  assert {f"private_diagnostics/train/{k}" for k in ("loss", "accuracy", "batch_size",
                                                      "clipped_fraction", "grad_norm")} == set(logged)
  assert secret[outputs.PRIVATE_KEY]["files"] == [outputs.PRIVATE_CSV]
  print("\n".join(dpsgd_cli.summary.summary_lines(secret, workdir=dirs["c"])))
  out = capsys.readouterr().out
  assert f"private diagnostics (not covered by epsilon) in {dirs['c']}/{outputs.PRIVATE_CSV}" in out
  record = records.read_record(os.path.join(dirs["a"], "record.json"))
  assert record["method"] == "dpsgd" and record["test_accuracy"] == one_go["test_accuracy"]
  assert record["sound_epsilon"] == pytest.approx(one_go["epsilon"]) and one_go["warnings"] == []
  assert "augmult" not in record and "augmult_max_shift" not in record  # a run without views


def test_cli_noise_multiplier_zero_is_allowed_and_loudly_not_private(tmp_path, capsys):
  # The flags of `make_config(noise_multiplier=0.0, l2_clip_norm=1e6)`: one plan, so one
  # compiled step with test_dpsgd_step's test_no_noise_huge_clip_is_sgd_on_summed_gradient_...
  # (`make_train_step` is cached per plan).
  workdir = str(tmp_path / "run")
  dpsgd_cli.main(["--dataset=digits", "--model=lenet5_half", "--expected_batch_size=16",
                  "--l2_clip_norm=1e6", "--noise_multiplier=0", "--steps=4",
                  "--learning_rate=0.5", "--momentum=0.9", "--seed=0", "--no-download",
                  f"--workdir={workdir}", "--no_progress"])
  assert "WARNING: epsilon = inf (NOT private)" in capsys.readouterr().out
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["epsilon"] == math.inf and saved["warnings"] == [outputs.NOT_PRIVATE]
  assert saved["ledger"] is None and saved["steps"] == 4
  assert records.read_record(os.path.join(workdir, "record.json"))["sound_epsilon"] == "inf"
  assert "test/epsilon" not in metrics_lib.read_metrics(workdir)  # nothing finite to plot


def test_default_seed_is_secret_and_fresh(runs):
  config, dirs, one_go, _, _, secret = runs
  assert one_go["seed"] == 0
  assert secret["seed"].startswith("os-entropy") and secret["config"]["seed"] is None
  arrays_a, _ = _restore_params(config, dirs["a"])
  arrays_c, _ = _restore_params(config, dirs["c"])
  # Another root key (not key(0)): the stored key data and so the noise differ.
  assert not np.array_equal(arrays_a["rng"], arrays_c["rng"])


def test_existing_checkpoint_needs_resume_and_same_config(runs):
  config, dirs, _, _, _, _ = runs
  with pytest.raises(ValueError, match="already holds"):
    dpsgd.train_dpsgd(config, dirs["a"], progress=False)
  other = dataclasses.replace(config, seed=1)
  with pytest.raises(ValueError, match="another config"):
    dpsgd.train_dpsgd(other, dirs["a"], resume=True, progress=False)


def test_saved_config_of_a_default_run_has_no_clipping_field(runs):
  # Workdirs saved before `clipping` existed hold this very dict: they keep resuming.
  config, dirs, one_go, _, _, _ = runs
  _, meta = _restore_params(config, dirs["a"])
  later = ("clipping", "features", "validation_examples", "standardize_noise_multiplier",
           "standardize_mean_clip", "standardize_second_moment_clip", "lr_schedule",
           "param_averaging_decay", "param_averaging_start_step", "augmult",
           "augmult_max_shift", "secure_noise")
  before = {k: v for k, v in dataclasses.asdict(config).items() if k not in later}
  assert meta["config"] == before and one_go["config"] == before
  with pytest.raises(ValueError, match="another config"):  # the clipping path is in the config
    dpsgd.train_dpsgd(dataclasses.replace(config, clipping="ghost"), dirs["a"], resume=True,
                      progress=False)


def test_ghost_clipping_run_matches_the_vmap_run(runs, tmp_path, monkeypatch):
  config, dirs, one_go, _, _, _ = runs
  ghost_config = dataclasses.replace(config, clipping="ghost")  # its check traces ghost too
  traced = []
  original = step_lib.ghost.ghost_clipped_sum
  monkeypatch.setattr(step_lib.ghost, "ghost_clipped_sum",
                      lambda *a, **k: traced.append(1) or original(*a, **k))
  results = dpsgd.train_dpsgd(ghost_config, str(tmp_path / "ghost"), progress=False)
  assert traced  # the loop's step computed its clipped sums by ghost clipping
  assert results["config"]["clipping"] == "ghost" and results["epsilon"] == one_go["epsilon"]
  arrays_ghost, meta = _restore_params(ghost_config, str(tmp_path / "ghost"))
  arrays_vmap, _ = _restore_params(config, dirs["a"])
  assert meta["config"] == ghost_config.to_json()
  chex.assert_trees_all_close(arrays_ghost["state"]["params"], arrays_vmap["state"]["params"],
                              atol=1e-5, rtol=1e-4)


def _mode(path) -> int:
  return os.stat(path).st_mode & 0o777


def test_files_holding_the_seed_or_the_noise_state_are_owner_only(runs):
  # Before: checkpoints (the root seed in their metadata, the key data as `rng`) were 0644
  # files in 0755 directories, readable by any local account.
  _, dirs, *_ = runs
  for name in ("a", "b", "c"):  # a chosen seed, the same resumed, a secret seed
    for root, _, files in os.walk(os.path.join(dirs[name], "checkpoints")):
      assert _mode(root) == checkpoint.DIR_MODE, root
      for file in files:
        assert _mode(os.path.join(root, file)) == checkpoint.FILE_MODE, os.path.join(root, file)
    for file in ("results.json", "record.json", "privacy_ledger.json"):  # seed, command, digests
      assert _mode(os.path.join(dirs[name], file)) == 0o600, file


def test_cli_resume_with_a_changed_seed_is_refused_in_one_line(runs, tmp_path, capsys):
  # Before: one digit of the stored secret seed changed was accepted on resume (results.json
  # then reported the new seed). The flags of `make_config(seed=None)`: the same plan and step.
  del runs  # the compiled step
  workdir = tmp_path / "run"
  flags = ["--dataset=digits", "--model=lenet5_half", "--expected_batch_size=16",
           "--l2_clip_norm=2", "--noise_multiplier=1", "--steps=4", "--learning_rate=0.5",
           "--momentum=0.9", "--no-download", "--no_progress", f"--workdir={workdir}"]
  dpsgd_cli.main([*flags, "--stop_at_step=2"])
  dpsgd_cli.main([*flags, "--resume", "--stop_at_step=3"])
  meta_path = workdir / "checkpoints" / "3" / checkpoint.META_FILE
  original = meta_path.read_text()
  seed = str(json.loads(original)["root_seed"][0])
  assert original.count(seed) == 1
  meta_path.write_text(original.replace(seed, seed[:-1] + str((int(seed[-1]) + 1) % 10)))
  ledger_path = workdir / "privacy_ledger.json"
  ledger_before = ledger_path.read_bytes()
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    dpsgd_cli.main([*flags, "--resume"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
  assert str(meta_path) in err and "root seed" in err
  assert ledger_path.read_bytes() == ledger_before  # nothing charged
  assert checkpoint.all_steps(str(workdir / "checkpoints")) == [2, 3]  # nothing moved
  meta_path.write_text(original)  # the original file: the run continues
  dpsgd_cli.main([*flags, "--resume"])
  with open(workdir / "results.json") as f:
    results = json.load(f)
  assert results["steps"] == 4 and results["seed"].startswith("os-entropy")
