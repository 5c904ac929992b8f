"""Tests of data-free PATE (methods/dfpate*.py) on the embedded digits, with tiny configs."""

import json
import math
import os

import chex
import jax
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dfpate
from dpkd_jax.methods.dfpate import student as dfpate_student
from dpkd_jax.methods.dfpate import teachers as dfpate_teachers
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from experiments import dfpate as dfpate_cli

_TINY = dict(dataset="digits", num_teachers=4, teacher_epochs=1, teacher_batch_size=32,
             rounds=2, queries_per_round=16, pool_factor=2, student_model="lenet5_half",
             student_epochs=1, student_batch_size=16, seed=0)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("dfpate"))
  teachers_dir = os.path.join(workdir, "teachers")
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=5.0, teachers_dir=teachers_dir)
  results = dfpate.train_dfpate(config, os.path.join(workdir, "run"), progress=False)
  return config, workdir, results


def test_end_to_end_outputs_and_sound_epsilon(tiny_run):
  config, workdir, results = tiny_run
  run = os.path.join(workdir, "run")
  for name in ("results.json", "samples.png", "metrics.csv"):
    assert os.path.exists(os.path.join(run, name)), name
  with open(os.path.join(run, "results.json")) as f:
    assert json.load(f)["num_queries"] == 32
  expected = accounting.epsilon(accounting.pate_event(noise_std=results["noise_std"],
                                                      num_queries=32), delta=1e-5)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert 4.9 < results["epsilon"] <= 5.0  # calibrated to the target, never above
  assert len(results["accuracy_per_round"]) == 2
  assert 0.0 <= results["test_accuracy"] <= 1.0
  meta = checkpoint.restore_metadata(os.path.join(run, "checkpoints"))
  ledger = ledger_lib.PrivacyLedger.from_json(meta["ledger"])
  assert len(ledger.entries) == 2
  assert ledger.spent_epsilon() == pytest.approx(results["epsilon"], rel=1e-9)
  # Teacher accuracies / agreement are noiseless functions of the private teachers.
  with open(os.path.join(run, "results.json")) as f:
    saved = json.load(f)
  assert "teachers" not in saved and saved["warnings"] == []
  assert set(saved[outputs.PRIVATE_KEY]["teachers"]) == {"teacher_mean", "plurality", "agreement"}
  record = records.read_record(os.path.join(run, "record.json"))
  assert record["method"] == "dfpate" and record["test_accuracy"] == results["test_accuracy"]
  assert record["sound_epsilon"] == pytest.approx(results["epsilon"])


def test_refuses_existing_workdir_and_resumes(tiny_run):
  config, workdir, results = tiny_run
  run = os.path.join(workdir, "run")
  with pytest.raises(ValueError, match="resume"):
    dfpate.train_dfpate(config, run, progress=False)
  resumed = dfpate.train_dfpate(config, run, resume=True, progress=False)  # nothing left to do
  assert resumed["accuracy_per_round"] == results["accuracy_per_round"]
  assert resumed["epsilon"] == pytest.approx(results["epsilon"])


def test_saved_teachers_are_reused_only_for_the_same_training(tiny_run):
  config, workdir, _ = tiny_run
  other = dfpate.DFPATEConfig(**{**_TINY, "teacher_epochs": 2}, target_epsilon=5.0,
                              teachers_dir=config.teachers_dir)
  with pytest.raises(ValueError, match="another teachers_dir"):
    dfpate.train_dfpate(other, os.path.join(workdir, "other"), progress=False)


def test_baselines_epsilon_zero_and_inf(tiny_run, tmp_path, capsys):
  config, _, _ = tiny_run
  no_teacher = dfpate.DFPATEConfig(**{**_TINY, "rounds": 1}, use_teachers=False)
  r = dfpate.train_dfpate(no_teacher, str(tmp_path / "none"), progress=False)
  assert r["epsilon"] == 0.0 and r[outputs.PRIVATE_KEY]["teachers"] == {}
  # --noise_std=0 through the CLI: allowed, loudly not private (reuses the trained ensemble).
  flags = [f"--{k}={v}" for k, v in {**_TINY, "rounds": 1}.items()]
  dfpate_cli.main(flags + ["--target_epsilon=none", "--noise_std=0", "--no_progress",
                           f"--teachers_dir={config.teachers_dir}",
                           f"--workdir={tmp_path / 'exact'}"])
  assert "WARNING: epsilon = inf (NOT private)" in capsys.readouterr().out
  with open(tmp_path / "exact" / "results.json") as f:
    assert json.load(f)["epsilon"] == math.inf
  assert records.read_record(str(tmp_path / "exact" / "record.json"))["sound_epsilon"] == "inf"


@pytest.mark.parametrize("self_training", [False, True])
def test_one_record_changes_exactly_one_teacher(self_training):
  train = data.load("digits", "train")
  num_teachers = 3
  images, labels = dfpate_teachers.equal_shards(train, num_teachers, seed=0)
  # Neighbouring dataset: record 0 replaced (another image and label).
  changed = data.ArrayDataset(images=train.images.copy(), labels=train.labels.copy(),
                              info=train.info)
  changed.images[0] = 255 - changed.images[0]
  changed.labels[0] = (changed.labels[0] + 1) % 10
  images2, labels2 = dfpate_teachers.equal_shards(changed, num_teachers, seed=0)
  init = dfpate_teachers.init_ensemble("mlp", num_teachers, train.info, jax.random.key(0))
  kwargs = dict(epochs=1, batch_size=32, learning_rate=1e-3)
  a, _ = dfpate_teachers.train_ensemble(init, images, labels, train.info, jax.random.key(1),
                                        **kwargs)
  b, _ = dfpate_teachers.train_ensemble(init, images2, labels2, train.info, jax.random.key(1),
                                        **kwargs)
  if self_training:  # then each teacher labels a public pool itself and trains on it too
    pool = train.images[::7][:40]
    a, _ = dfpate_teachers.self_train(a, images, labels, pool, train.info, jax.random.key(2),
                                      threshold=0.2, **kwargs)
    b, _ = dfpate_teachers.self_train(b, images2, labels2, pool, train.info,
                                      jax.random.key(2), threshold=0.2, **kwargs)
  differs = [not all(np.array_equal(x[i], y[i]) for x, y in zip(jax.tree.leaves(a.params),
                                                                 jax.tree.leaves(b.params)))
             for i in range(num_teachers)]
  # Record 0 may have been cut by the equal-size trim: then no teacher changes.
  in_a_shard = (images != images2).any(axis=(2, 3, 4)).any(axis=1)  # (n,)
  assert in_a_shard.sum() <= 1
  assert differs == list(in_a_shard)


def test_own_pseudo_labels_threshold_and_unlabelled_images_carry_no_loss():
  train = data.load("digits", "train")
  init = dfpate_teachers.init_ensemble("mlp", 2, train.info, jax.random.key(0))
  pool = train.images[:30]
  logits = dfpate_teachers.ensemble_logits(init, pool, train.info)  # (2, 30, K)
  probs = np.asarray(jax.nn.softmax(logits, -1))
  threshold = float(np.median(probs.max(-1)))
  got = dfpate_teachers.own_pseudo_labels(init, pool, train.info, threshold=threshold)
  expected = np.where(probs.max(-1) >= threshold, probs.argmax(-1), -1)
  np.testing.assert_array_equal(got, expected)
  assert (got == -1).any() and (got >= 0).any()
  # Every label -1: no gradient, so training leaves the teachers where they are.
  images = np.broadcast_to(pool, (2, *pool.shape))
  unchanged, _ = dfpate_teachers.train_ensemble(init, images, np.full((2, 30), -1, np.int32),
                                                train.info, jax.random.key(1), epochs=1,
                                                batch_size=10, learning_rate=1e-2)
  chex.assert_trees_all_close(unchanged.params, init.params)


def test_targets_from_votes_and_margin_filter():
  hist = np.array([[8.0, 1.0, 1.0], [4.0, 5.0, 1.0]])
  targets, weights = dfpate_student.targets_from_votes(hist, 10, target="hard",
                                                       margin_threshold=0.3)
  np.testing.assert_array_equal(targets.argmax(-1), [0, 1])
  np.testing.assert_array_equal(weights, [1.0, 0.0])
  soft, soft_weights = dfpate_student.targets_from_votes(hist, 10, target="soft",
                                                         margin_threshold=0.3)
  np.testing.assert_allclose(soft, hist / 10)
  np.testing.assert_array_equal(soft_weights, [1.0, 1.0])


def test_select_queries_is_class_balanced_and_distinct():
  probs = np.asarray(jax.nn.softmax(3 * jax.random.normal(jax.random.key(0), (500, 5))))
  chosen = dfpate_student.select_queries(probs, 50)
  chex.assert_shape(chosen, (50,))
  assert len(np.unique(chosen)) == 50
  np.testing.assert_array_equal(np.bincount(probs[chosen].argmax(-1), minlength=5), [10] * 5)


@pytest.mark.parametrize("kwargs, match", [
    ({"dataset": "nope"}, "dataset"),
    ({"teacher_model": "nope"}, "teacher_model"),
    ({"student_model": "nope"}, "student_model"),
    ({"votes": "mean"}, "votes"),
    ({"target": "kl"}, "target"),
    ({"num_teachers": 0}, "num_teachers"),
    ({"rounds": 0}, "rounds"),
    ({"margin_threshold": 2.0}, "margin_threshold"),
    ({"target_epsilon": None, "noise_std": None}, "target_epsilon"),
    ({"target_epsilon": -1.0}, "target_epsilon"),
    ({"noise_std": -1.0}, "noise_std"),
    ({"delta": 1.0}, "delta"),
    ({"invert_probability": 2.0}, "invert_probability"),
    ({"seed": -1}, "seed"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    dfpate.DFPATEConfig(**{**_TINY, **kwargs})


def test_noise_std_above_target_is_refused(tmp_path):
  config = dfpate.DFPATEConfig(**_TINY, target_epsilon=1.0, noise_std=1.0)
  with pytest.raises(ValueError, match="target_epsilon"):
    dfpate.train_dfpate(config, str(tmp_path), progress=False)
