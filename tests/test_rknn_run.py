"""Reverse k-NN labelling end to end on the embedded digits (`rknn/run.py`), splits, CLI.

Tiny runs: private = 1,442 digits training images, public = 177 test images, evaluation =
178; s = 10 queries, PCA, a LeNet-5/2 student for 1 epoch. Accuracies are not asserted
(1 epoch), only the bookkeeping: results, ledger, checkpoint, privacy accounting.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import representations
from dpkd_jax.methods import rknn
from dpkd_jax.methods.rknn import run as rknn_run
from dpkd_jax.methods.rknn import student as student_lib
from dpkd_jax.methods.rknn import votes
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import sharding
from experiments import rknn as rknn_cli

TINY_STUDENT = rknn.StudentConfig(model="lenet5_half", epochs=1, batch_size=32)


def _config(**kw):
  base = dict(dataset="digits", num_queries=10, k=1, epsilon=2.0, kmeans_restarts=1,
              kmeans_iterations=10, student=TINY_STUDENT, seed=0)
  base.update(kw)
  return rknn.RKNNConfig(**base)


def test_public_evaluation_split_is_a_seeded_partition():
  public, evaluation = rknn.public_evaluation_split(10_000, 5_000, seed=0)
  assert len(public) == len(evaluation) == 5_000
  np.testing.assert_array_equal(np.sort(np.concatenate([public, evaluation])),
                                np.arange(10_000))
  again, _ = rknn.public_evaluation_split(10_000, 5_000, seed=0)
  other, _ = rknn.public_evaluation_split(10_000, 5_000, seed=1)
  np.testing.assert_array_equal(public, again)
  assert not np.array_equal(public, other)
  with pytest.raises(ValueError, match="num_public=355"):
    rknn.public_evaluation_split(355, 355, seed=0)


class _StopAfterQueries(Exception):
  pass


_SMALL_SPECTRAL = representations.spectral.SpectralConfig(components=6, graph_neighbours=8,
                                                          extension_neighbours=4)


@pytest.mark.parametrize("representation,representation_config",
                         [("pca", None), ("spectral", _SMALL_SPECTRAL)])
def test_representation_and_queries_do_not_depend_on_private_data(
    monkeypatch, tmp_path, representation, representation_config):
  """The representation is fitted on public images only: altering every private record leaves
  the fitted representation and the k-means queries unchanged (the run is stopped there)."""
  fitted, queries = [], []
  real_fit, real_kmeans = rknn_run.representations.fit, votes.kmeans

  def spy_fit(kind, images, key, config, **kw):
    fitted.append(np.array(images))
    return real_fit(kind, images, key, config, **kw)

  def spy_kmeans(*args, **kw):
    queries.append(np.asarray(real_kmeans(*args, **kw).centres))
    raise _StopAfterQueries

  monkeypatch.setattr(rknn_run.representations, "fit", spy_fit)
  monkeypatch.setattr(votes, "kmeans", spy_kmeans)
  real_load = data.load
  for flip_private in (False, True):
    def load(name, split, **kw):
      dataset = real_load(name, split, **kw)
      if split == "train" and flip_private:  # a completely different private set
        return data.ArrayDataset(images=255 - dataset.images,
                                 labels=(dataset.labels + 1) % 10, info=dataset.info)
      return dataset
    monkeypatch.setattr(rknn_run.data, "load", load)
    with pytest.raises(_StopAfterQueries):
      rknn.train_rknn(_config(representation=representation,
                              representation_config=representation_config),
                      str(tmp_path / str(flip_private)), progress=False)
  test = real_load("digits", "test")
  public, _ = rknn.public_evaluation_split(len(test), len(test) // 2, seed=0)
  np.testing.assert_array_equal(fitted[0], test.images[public])  # only public images
  np.testing.assert_array_equal(fitted[1], fitted[0])
  np.testing.assert_array_equal(queries[1], queries[0])


def test_end_to_end_two_rounds_with_secret_seed(tmp_path):
  workdir = str(tmp_path / "run")
  config = _config(rounds=2, epsilon=1.0, uncertain_fraction=0.5, seed=None)
  results = rknn.train_rknn(config, workdir, progress=False)
  with open(os.path.join(workdir, "results.json")) as f:
    on_disk = json.load(f)
  assert on_disk["student_accuracy"] == results["student_accuracy"]
  for name in ("label_accuracy", "student_accuracy"):  # Acc_pl, Acc_pc
    assert 0.0 <= results[name] <= 1.0
  assert (results["num_private"], results["num_public"], results["num_evaluation"]) == (
      1442, 177, 178)
  assert [r["num_queried_public"] for r in results["per_round"]] == [177, 89]
  assert results["representation"]["kind"] == "pca"
  assert results["seed"].startswith("os-entropy")  # the secret seed is never written
  # Two rounds of pure 0.5-DP Laplace: ε = 1 (δ = 0); PLD at δ = 1e-5 cannot exceed it.
  assert results["epsilon"] == 1.0 and results["delta"] == 0.0
  assert results["epsilon_per_round"] == 0.5
  assert 0.9 < results["ledger_epsilon"] <= 1.0 + 1e-9
  ledger = ledger_lib.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  assert len(ledger.entries) == 2 and ledger.spent_epsilon() == results["ledger_epsilon"]
  assert checkpoint.latest_step(os.path.join(workdir, "checkpoints")) == 2
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  assert meta["config"] == on_disk["config"] and meta["round"] == 2
  assert meta["plan"] == rknn.make_plan(config).to_json()
  with pytest.raises(ValueError, match="already holds"):
    rknn.train_rknn(config, workdir, progress=False)
  # Everything written is released (public data + noisy counts): no private diagnostics.
  assert on_disk[outputs.PRIVATE_KEY] == {"_note": outputs.PRIVATE_NOTE}
  record = records.read_record(os.path.join(workdir, "record.json"))
  assert record["method"] == "rknn" and record["test_accuracy"] == results["student_accuracy"]
  assert record["sound_epsilon"] == results["ledger_epsilon"] and record["delta"] == 1e-5
  assert record["paper_epsilon"] == record["pure_epsilon"] == 1.0


def test_cli_local_mode_run(tmp_path, capsys):
  workdir = str(tmp_path / "local")
  rknn_cli.main(["--dataset=digits", "--mode=local", "--epsilon=8", "--num_queries=10",
                 "--student_model=lenet5_half", "--epochs=1", "--batch_size=32", "--seed=3",
                 f"--workdir={workdir}", "--no_progress"])
  out = capsys.readouterr().out
  assert "Acc_pl" in out and "WARNING" not in out and "private diagnostics" not in out
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["mode"] == "local" and results["seed"] == 3
  assert "per record" in results["privacy_unit"] and "simulated" in results["privacy_unit"]
  # Local mode is accounted as pure 8-DP per round (binary RR dominating pair).
  assert results["epsilon"] == 8.0 and 7.5 < results["ledger_epsilon"] <= 8.0 + 1e-3
  assert results["config"]["student"]["model"] == "lenet5_half"


@pytest.mark.parametrize("argv,match", [
    (["--k=0"], "k must be >= 1"),
    (["--epsilon=0"], "epsilon must be"),
    (["--representation=hog"], "unknown representation"),
    (["--num_queries=1"], "num_queries must be >= 2"),
])
def test_cli_bad_flags_exit_with_message(argv, match, capsys):
  with pytest.raises(SystemExit):
    rknn_cli.main(argv)
  assert match in capsys.readouterr().err


def test_cli_representation_overrides(capsys):
  config, args = rknn_cli.parse_config(["--representation=simclr", "--simclr_steps=7"])
  assert config.representation_config.steps == 7
  assert args.workdir == os.path.join("runs", "rknn", "digits_simclr_central_s40_k1_eps0.1")
  config, _ = rknn_cli.parse_config(["--pca_components=12"])
  assert dataclasses.asdict(config)["representation_config"]["num_components"] == 12
  config, _ = rknn_cli.parse_config(["--representation=spectral", "--spectral_components=8",
                                     "--graph_neighbours=6", "--extension_neighbours=3"])
  spectral = config.representation_config
  assert (spectral.components, spectral.graph_neighbours, spectral.extension_neighbours) == (
      8, 6, 3)
  # A flag of another representation would do nothing: one line, exit 2.
  with pytest.raises(SystemExit) as exit_info:
    rknn_cli.parse_config(["--representation=simclr", "--pca_components=3"])
  assert exit_info.value.code == 2
  assert "--pca_components does not apply to --representation=simclr" in (
      capsys.readouterr().err)


def test_self_training_relabels_the_public_set_without_a_release(tmp_path):
  workdir = str(tmp_path / "run")
  config = _config(student=dataclasses.replace(TINY_STUDENT, self_training_rounds=2))
  results = rknn.train_rknn(config, workdir, progress=False)
  labelling, *self_training = results["per_round"]
  assert [r["self_training_round"] for r in self_training] == [1, 2]
  assert results["label_accuracy"] == labelling["label_accuracy"]  # Acc_pl: the DP labels
  assert results["student_accuracy"] == self_training[-1]["student_accuracy"]
  ledger = ledger_lib.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  assert len(ledger.entries) == 1  # the one release; self-training charges nothing
  assert results["ledger_epsilon"] == labelling["ledger_epsilon"]
  assert checkpoint.latest_step(os.path.join(workdir, "checkpoints")) == 3
  plain = rknn.train_rknn(_config(), str(tmp_path / "plain"), progress=False)
  assert plain["per_round"][0]["student_accuracy"] == labelling["student_accuracy"]


def test_cli_too_few_public_images_for_the_representation(tmp_path, capsys):
  """The representation's size check is a user error: one line, exit 2, no workdir left."""
  workdir = tmp_path / "run"
  with pytest.raises(SystemExit) as exit_info:
    rknn_cli.main(["--representation=spectral", "--num_public=15", "--num_queries=10",
                   f"--workdir={workdir}", "--no_progress"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "15 public images are too few" in err and "Traceback" not in err
  assert not workdir.exists()


def test_a_validation_hold_out_keeps_the_evaluation_split_for_the_end(tmp_path):
  # The hold-out leaves the private split (fewer voters), the rounds are evaluated on it in
  # the private diagnostics only, and the evaluation split is read once at the end.
  workdir = str(tmp_path / "held")
  student = dataclasses.replace(TINY_STUDENT, self_training_rounds=1)
  results = rknn.train_rknn(_config(validation_examples=100, student=student), workdir,
                            progress=False)
  plain_private = len(data.load("digits", "train"))
  assert results["num_private"] == plain_private - 100
  assert all("student_accuracy" not in r for r in results["per_round"])
  assert 0 <= results["student_accuracy"] <= 1
  private = results[outputs.PRIVATE_KEY]
  assert private["validation_examples"] == 100 and 0 <= private["validation_accuracy"] <= 1
  assert not any("student_accuracy" in name for name in metrics_lib.read_metrics(workdir))
  assert set(outputs.read_private_diagnostics(workdir)) == {
      "private_diagnostics/validation/accuracy", "private_diagnostics/validation/loss"}
  with open(os.path.join(workdir, "record.json")) as f:
    assert json.load(f)["selection"] == "validation"


def _same_run(a: dict, b: dict) -> None:
  for key in ("per_round", "student_accuracy", "label_accuracy", "ledger_epsilon", "seed"):
    assert a[key] == b[key], key


@pytest.mark.parametrize("stop_after", [1, 2])  # after a labelling round / its last one
def test_a_stopped_run_resumes_to_the_uninterrupted_one(tmp_path, stop_after):
  config = _config(rounds=2, epsilon=1.0, uncertain_fraction=0.5,
                   student=dataclasses.replace(TINY_STUDENT, self_training_rounds=1))
  whole = rknn.train_rknn(config, str(tmp_path / "whole"), progress=False)
  workdir = str(tmp_path / "parts")
  assert rknn.train_rknn(config, workdir, progress=False, stop_after_rounds=stop_after) is None
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  with pytest.raises(ValueError, match="already holds"):  # not without resume=True
    rknn.train_rknn(config, workdir, progress=False)
  resumed = rknn.train_rknn(config, workdir, resume=True, progress=False)
  _same_run(resumed, whole)
  ledger = ledger_lib.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  assert len(ledger.entries) == 2  # each release charged once
  assert (metrics_lib.read_metrics(workdir)
          == metrics_lib.read_metrics(str(tmp_path / "whole")))  # each step logged once


def test_a_run_with_a_hold_out_resumes_to_the_same_private_figures(tmp_path):
  """Resumed after the last labelling round: the hold-out's figures (private diagnostics) are
  those of the uninterrupted run, and no checkpoint holds them."""
  config = _config(validation_examples=100,
                   student=dataclasses.replace(TINY_STUDENT, self_training_rounds=1))
  whole = rknn.train_rknn(config, str(tmp_path / "whole"), progress=False)
  workdir = str(tmp_path / "parts")
  rknn.train_rknn(config, workdir, progress=False, stop_after_rounds=1)
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  dumped = json.dumps({k: v for k, v in meta.items() if k != "config"})
  assert "validation" not in dumped and "student_accuracy" not in dumped
  resumed = rknn.train_rknn(config, workdir, resume=True, progress=False)
  _same_run(resumed, whole)
  assert resumed[outputs.PRIVATE_KEY] == {
      **whole[outputs.PRIVATE_KEY], "files": resumed[outputs.PRIVATE_KEY].get("files")}


def test_a_killed_run_resumes_with_its_secret_seed_and_replays_the_round(tmp_path, monkeypatch):
  """Killed while the second round's student trains (after its release was charged): the
  resumed run replays that round with the same keys, under the secret seed it saved."""
  config = _config(rounds=2, epsilon=1.0, uncertain_fraction=0.5, seed=None)
  workdir = str(tmp_path / "run")
  calls, train = [], student_lib.train_student

  def dies_in_round_two(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return train(*args, **kwargs)

  monkeypatch.setattr(student_lib, "train_student", dies_in_round_two)
  with pytest.raises(KeyboardInterrupt):
    rknn.train_rknn(config, workdir, progress=False)
  monkeypatch.setattr(student_lib, "train_student", train)
  assert checkpoint.latest_step(os.path.join(workdir, "checkpoints")) == 1
  resumed = rknn.train_rknn(config, workdir, resume=True, progress=False)
  assert resumed["seed"].startswith("os-entropy")
  assert [r["round"] for r in resumed["per_round"]] == [1, 2]
  assert resumed["ledger_epsilon"] <= 1.0 + 1e-9  # the replayed release is not charged twice
  assert checkpoint.latest_step(os.path.join(workdir, "checkpoints")) == 2


def test_cli_stop_then_resume(tmp_path, capsys):
  workdir = tmp_path / "run"
  flags = ["--num_queries=10", "--k=1", "--epsilon=2", "--kmeans_restarts=1",
           "--kmeans_iterations=10", "--student_model=lenet5_half", "--epochs=1",
           "--batch_size=32", "--rounds=2", "--seed=0", f"--workdir={workdir}", "--no_progress"]
  rknn_cli.main([*flags, "--stop_after_rounds=1"])
  assert "continue with --resume" in capsys.readouterr().out
  rknn_cli.main([*flags, "--resume"])
  assert os.path.exists(workdir / "results.json")
  with pytest.raises(SystemExit) as exit_info:
    rknn_cli.main([*flags, "--stop_after_rounds=0"])
  assert exit_info.value.code == 2


def test_the_student_split_over_8_devices_equals_one_device():
  """`train_student` with the batch split over the 8 test devices (a run's default mesh)
  trains the same student as on one device, up to the order of float reductions."""
  assert len(jax.devices()) == 8
  config = _config()
  public = data.load("digits", "test").subset(np.arange(64))
  key = jax.random.key(3)
  one = student_lib.train_student(config, key, public.images, public.labels,
                                  mesh=sharding.data_mesh(jax.devices()[:1]))
  eight = student_lib.train_student(config, key, public.images, public.labels,
                                    mesh=sharding.data_mesh())
  unsharded = student_lib.train_student(config, key, public.images, public.labels)
  for a, b, c in zip(jax.tree.leaves((one.params, one.batch_stats)),
                     jax.tree.leaves((eight.params, eight.batch_stats)),
                     jax.tree.leaves((unsharded.params, unsharded.batch_stats))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(c), np.asarray(a))


def test_the_default_mesh_is_every_device_where_the_batch_splits_else_one_device():
  assert rknn_run._student_mesh(None, 32).size == 8  # pylint: disable=protected-access
  with pytest.warns(UserWarning, match="batch of 100 does not split over the 8 devices"):
    assert rknn_run._student_mesh(None, 100) is None  # pylint: disable=protected-access
  with pytest.raises(errors.UserError, match="not divisible by the 8 devices"):
    rknn_run._student_mesh(sharding.data_mesh(), 100)  # pylint: disable=protected-access
