"""dpkd_jax/teacher_ensemble (fit, save, load, the partition record) and its command
`python -m experiments.teacher_ensemble`, on digits with the 3-teacher `ensemble_dir`."""

import os

import chex
import jax
import numpy as np
import pytest
from teacher_fixtures import ENSEMBLE_CONFIG
from teacher_fixtures import copy_with_old_identity
from teacher_fixtures import copy_without_partition

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher_ensemble
from dpkd_jax import teacher_partition
from dpkd_jax.privacy import seeds
from dpkd_jax.teacher_ensemble import config as config_lib
from dpkd_jax.train import checkpoint
from experiments import dpdfd as dpdfd_cli
from experiments import teacher_ensemble as teacher_ensemble_cli

_CONFIG = teacher_ensemble.TeacherEnsembleConfig(**ENSEMBLE_CONFIG)
_DIGITS = data.DATASETS["digits"]


def test_fit_save_load_round_trip(ensemble_dir):
  loaded, meta = teacher_ensemble.load(ensemble_dir, flag="--x", dataset="digits", info=_DIGITS)
  train, test = data.load("digits", "train"), data.load("digits", "test")
  # train_and_save = fit with the seed's keys (fold_in 0 / 1 of the root key), then save.
  root = seeds.root_key(_CONFIG.seed)
  fitted, fresh = teacher_ensemble.fit(_CONFIG, train, test,
                                       init_key=jax.random.fold_in(root, 0),
                                       train_key=jax.random.fold_in(root, 1))
  assert loaded.size == fitted.size == 3
  chex.assert_trees_all_close(loaded.params, fitted.params, atol=1e-6)
  np.testing.assert_allclose(teacher_ensemble.ensemble_logits(loaded, test.images[:50], _DIGITS),
                             teacher_ensemble.ensemble_logits(fitted, test.images[:50], _DIGITS),
                             atol=1e-5)
  # The meta proves the partition: the split's size and digest, n shards, seed, shard size.
  assert meta["identity"] == _CONFIG.identity() == fresh["identity"]
  assert meta["partition"] == {
      "dataset": "digits", **teacher_partition.source_fields(train), "num_shards": 3,
      "shard_seed": 0, "shard_size": len(train) // 3, "scheme": "equal_shards"}
  assert set(meta["report"]) == {"teacher_mean", "plurality", "agreement"}
  assert meta["train_seconds"] > 0 and meta["seed"] == 0
  assert teacher_ensemble.overlap(meta, 3).teachers_per_record == 1


def test_equal_shards_are_disjoint_rows_of_one_partition():
  train = data.load("digits", "train")
  images, labels = teacher_ensemble.equal_shards(train, 3, seed=0)
  shards = data.shard_indices(len(train), 3, seed=0)
  size = len(train) // 3
  assert images.shape[:2] == labels.shape == (3, size)
  for i, shard in enumerate(shards):  # row i = the first `size` records of shard i
    np.testing.assert_array_equal(labels[i], train.labels[shard[:size]])
  assert not set(shards[0]) & set(shards[1])


def test_a_saved_ensemble_is_kept_and_another_refused(ensemble_dir, tmp_path):
  said = []
  meta = teacher_ensemble.train_and_save(_CONFIG, ensemble_dir, log=said.append)
  assert "already holds this ensemble" in said[0] and meta["partition"]["num_shards"] == 3
  other = teacher_ensemble.TeacherEnsembleConfig(**{**ENSEMBLE_CONFIG, "teacher_epochs": 2})
  with pytest.raises(errors.UserError, match="holds an ensemble trained for"):
    teacher_ensemble.train_and_save(other, ensemble_dir)
  old = copy_without_partition(ensemble_dir, str(tmp_path / "old"))
  with pytest.raises(errors.UserError, match="without the record of its shards"):
    teacher_ensemble.train_and_save(_CONFIG, old)


def test_a_saved_identity_is_migrated_once_to_the_learning_rate_name():
  identity = _CONFIG.identity()
  old = {("teacher_lr" if k == "teacher_learning_rate" else k): v for k, v in identity.items()}
  assert config_lib.IDENTITY_RENAMED == _CONFIG.RENAMED == {"teacher_lr": "teacher_learning_rate"}
  assert config_lib.migrate_identity(old) == identity == config_lib.migrate_identity(identity)
  assert config_lib.migrate_identity(None) is None  # not an identity: read_meta refuses it
  assert [k for k in identity if k.endswith("_lr")] == []


def test_a_store_saved_with_teacher_lr_is_found_and_kept(ensemble_dir, tmp_path):
  # Stores saved before the rename hold `teacher_lr`: read with today's identity (the files
  # are left as they are), the same teachers, kept by train_and_save; another rate is refused.
  old = copy_with_old_identity(ensemble_dir, str(tmp_path / "old"))
  assert "teacher_lr" in checkpoint.restore_metadata(old)["identity"]
  assert teacher_ensemble.read_meta(old, flag="--x")["identity"] == _CONFIG.identity()
  loaded, meta = teacher_ensemble.load(old, flag="--x")
  saved, _ = teacher_ensemble.load(ensemble_dir, flag="--x")
  assert meta["identity"] == _CONFIG.identity()
  chex.assert_trees_all_equal(loaded.params, saved.params)
  said = []
  kept = teacher_ensemble.train_and_save(_CONFIG, old, log=said.append)
  assert "already holds this ensemble" in said[0] and kept["identity"] == _CONFIG.identity()
  other = teacher_ensemble.TeacherEnsembleConfig(**ENSEMBLE_CONFIG, teacher_learning_rate=0.1)
  with pytest.raises(errors.UserError, match="holds an ensemble trained for"):
    teacher_ensemble.train_and_save(other, old)


def test_an_ensemble_without_its_partition_counts_every_teacher(ensemble_dir, tmp_path):
  old = copy_without_partition(ensemble_dir, str(tmp_path / "old"))
  loaded, meta = teacher_ensemble.load(old, flag="--x")
  overlap = teacher_ensemble.overlap(meta, loaded.size)
  assert overlap.teachers_per_record == 3 and "does not prove a partition" in overlap.reason


def test_bad_directories_are_one_line_user_errors(ensemble_dir, tmp_path):
  with pytest.raises(errors.UserError, match="--x: .* does not exist"):
    teacher_ensemble.read_meta(str(tmp_path / "typo"), flag="--x")
  with pytest.raises(errors.UserError, match="holds no saved teacher ensemble"):
    teacher_ensemble.read_meta(str(tmp_path), flag="--x")
  (tmp_path / "card.json").write_text("{}")  # an experiments.teacher workdir
  with pytest.raises(errors.UserError, match="one teacher's workdir: those go in --teacher_d"):
    teacher_ensemble.read_meta(str(tmp_path), flag="--x")
  with pytest.raises(errors.UserError, match="holds teachers of digits, not mnist"):
    teacher_ensemble.read_meta(ensemble_dir, flag="--x", dataset="mnist")
  with pytest.raises(errors.UserError, match="10 classes on .*this run needs 100"):
    teacher_ensemble.load(ensemble_dir, flag="--x", info=data.DATASETS["cifar100"])


def _user_error(main, argv, capsys, root) -> str:
  """Runs a CLI; asserts exit 2, one `error:` line, nothing written under `root`."""
  before = sorted(os.walk(root))
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
  assert sorted(os.walk(root)) == before
  return err


_ENSEMBLE_FLAGS = [f"--{k}={v}" for k, v in ENSEMBLE_CONFIG.items()]
_DPDFD = ["--dataset=digits", "--noise_multiplier=1", "--steps=2", "--batch_size=8",
          "--no_progress"]


def test_cli_keeps_this_ensemble_and_fails_in_one_line(ensemble_dir, tmp_path, capsys,
                                                        monkeypatch):
  monkeypatch.chdir(tmp_path)
  teacher_ensemble_cli.main(_ENSEMBLE_FLAGS + [f"--workdir={ensemble_dir}"])
  out = capsys.readouterr().out
  assert "already holds this ensemble" in out and "plurality vote" in out
  assert "num_teachers must be >= 1" in _user_error(teacher_ensemble_cli.main, [
      "--dataset=digits", "--num_teachers=0", "--workdir=new"], capsys, tmp_path)
  assert "holds an ensemble trained for" in _user_error(teacher_ensemble_cli.main, [
      *_ENSEMBLE_FLAGS, "--teacher_learning_rate=0.1", f"--workdir={ensemble_dir}"], capsys,
      tmp_path)


def test_cli_keeps_teacher_lr_as_a_deprecated_alias(capsys):
  new, _ = teacher_ensemble_cli.parse_config(["--dataset=digits", "--teacher_learning_rate=0.1"])
  assert capsys.readouterr().err == ""
  old, _ = teacher_ensemble_cli.parse_config(["--dataset=digits", "--teacher_lr=0.1"])
  assert old == new and new.teacher_learning_rate == 0.1
  assert capsys.readouterr().err == ("deprecated: --teacher_lr is now --teacher_learning_rate "
                                     "(same meaning); the old name still works\n")


@pytest.mark.parametrize("argv,fragment", [
    (["--teacher_ensemble_dir={ens}", "--teacher_dirs=a"],
     "give --teacher_dirs or --teacher_ensemble_dir, not both"),
    (["--teacher_ensemble_dir=typo"], "--teacher_ensemble_dir: 'typo' does not exist"),
    (["--teacher_ensemble_dir={ens}", "--dataset=mnist"], "holds teachers of digits, not mnist"),
], ids=["both", "missing", "other_dataset"])
def test_dpdfd_cli_ensemble_errors_are_one_line(argv, fragment, ensemble_dir, tmp_path, capsys,
                                                monkeypatch):
  monkeypatch.chdir(tmp_path)
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  (data_dir / "mnist.npz").write_bytes(b"")  # found (never read: the ensemble is refused first)
  monkeypatch.setenv("DPKD_DATA_DIR", str(data_dir))
  flags = _DPDFD + [a.format(ens=ensemble_dir) for a in argv]
  assert fragment in _user_error(dpdfd_cli.main, flags, capsys, tmp_path)
