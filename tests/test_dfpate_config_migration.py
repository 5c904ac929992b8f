"""dpkd_jax.methods.dfpate.config_migration: every saved form of a DF-PATE config loads as the
same config, and a checkpoint holding the old form is resumed; a teachers_dir saved with the
old identity (`teacher_lr`) is reused; a saved plan with the query model's old bound name loads;
a newer or unknown form is refused in one line."""

import json
import os
import pathlib

import chex
import jax
import numpy as np
import pytest
from teacher_fixtures import ENSEMBLE_CONFIG
from teacher_fixtures import copy_with_old_identity

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods import dfpate
from dpkd_jax.methods.dfpate import config_migration
from dpkd_jax.methods.dfpate import teachers as teachers_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import workdir as workdir_lib

_REPO = pathlib.Path(__file__).resolve().parent.parent
_OLD_NAMES = {"teacher_learning_rate": "teacher_lr",
              "student_learning_rate": "student_lr"}  # version 1's names, written here


def _config(**kw):
  base = dict(dataset="digits", num_teachers=4, rounds=2, queries_per_round=16,
              target_epsilon=5.0, seed=0)
  return dfpate.DFPATEConfig(**{**base, **kw})


def _version1(config: dfpate.DFPATEConfig) -> dict:
  """`config` as version 1 saved it: flat, the old names, `validation_examples` at 0 and
  `secure_noise` at False left out."""
  out = {_OLD_NAMES.get(k, k): v for k, v in config.to_json().items() if k != "version"}
  for name, default in config_migration.V1_OMITTED.items():
    if out[name] == default:
      del out[name]
  return out


@pytest.mark.parametrize("kw", [{}, dict(validation_examples=50, secure_noise=True,
                                         noise_std=3.0, target_epsilon=None,
                                         teacher_learning_rate=0.01,
                                         student_learning_rate=3e-4)])
def test_every_saved_form_loads_as_the_same_config(kw):
  config = _config(**kw)
  saved, old = config.to_json(), _version1(config)
  assert saved["version"] == config_migration.VERSION == 2
  assert "version" not in old and "student_lr" in old and "teacher_lr" in old
  for form in (saved, old):
    assert config_migration.migrate(form) == saved
    assert dfpate.DFPATEConfig.from_json(form) == config
  assert json.loads(json.dumps(saved)) == saved


def test_the_renames_are_the_cli_aliases_and_the_ensembles_names(capsys):
  from experiments import dfpate as dfpate_cli  # pylint: disable=import-outside-toplevel
  assert config_migration.V1_RENAMED == {old: new for new, old in _OLD_NAMES.items()}
  assert dfpate.DFPATEConfig.RENAMED == config_migration.V1_RENAMED
  flags = ["--dataset=digits", "--num_teachers=4", "--seed=0"]
  new, _ = dfpate_cli.parse_config(
      flags + ["--teacher_learning_rate=0.01", "--student_learning_rate=3e-4"])
  assert capsys.readouterr().err == ""
  old, _ = dfpate_cli.parse_config(flags + ["--teacher_lr=0.01", "--student_lr=3e-4"])
  assert old == new and (new.teacher_learning_rate, new.student_learning_rate) == (0.01, 3e-4)
  assert capsys.readouterr().err.count("deprecated: ") == 2
  # The ensemble's config and identity use the same name (teacher_ensemble's `RENAMED` too).
  assert new.teacher_identity()["teacher_learning_rate"] == 0.01
  assert new.ensemble_config().teacher_learning_rate == 0.01
  assert teacher_ensemble.TeacherEnsembleConfig.RENAMED == {"teacher_lr": "teacher_learning_rate"}


def test_a_version1_run_reuses_a_teachers_dir_saved_with_teacher_lr(ensemble_dir, tmp_path,
                                                                     monkeypatch):
  # A version-1 config (`teacher_lr`) and a store saved with the old identity, both read
  # under today's names: the same identity, so the saved teachers are reused, none trained.
  old_dir = copy_with_old_identity(ensemble_dir, str(tmp_path / "teachers"))
  config = dfpate.DFPATEConfig.from_json(_version1(dfpate.DFPATEConfig(
      **ENSEMBLE_CONFIG, teachers_dir=old_dir, seed=0)))
  saved, meta = teacher_ensemble.load(old_dir, flag="--teachers_dir")
  assert checkpoint.restore_metadata(old_dir)["identity"]["teacher_lr"] == 3e-3
  assert meta["identity"] == config.teacher_identity()
  monkeypatch.setattr(teacher_ensemble, "fit", None)  # training would fail loudly
  train, test = data.load("digits", "train"), data.load("digits", "test")
  ensemble, _, report = teachers_lib.get_teachers(
      config, train, test, init_key=jax.random.key(5), train_key=jax.random.key(6))
  chex.assert_trees_all_equal(ensemble.params, saved.params)
  assert report == meta["report"]


def test_an_unreadable_form_is_refused_in_one_line():
  saved = _config().to_json()
  with pytest.raises(ValueError, match="newer dpkd-jax"):
    dfpate.DFPATEConfig.from_json({**saved, "version": 3})
  with pytest.raises(ValueError, match="version must be an integer"):
    config_migration.migrate({**saved, "version": "2"})
  with pytest.raises(ValueError, match="does not know: colour"):
    dfpate.DFPATEConfig.from_json({**saved, "colour": 1})


def test_a_saved_plan_with_the_old_bound_name_loads():
  plan = dfpate.make_plan(_config(query_source="dp_model", query_model_components=6,
                                  query_model_clusters=4))
  saved = plan.to_json()
  assert "l2_clip_norm" in saved["query_model"]
  old = {**saved, "query_model": {("l2_norm_bound" if k == "l2_clip_norm" else k): v
                                  for k, v in saved["query_model"].items()}}
  assert dfpate.DFPATEPlan.from_json(old) == dfpate.DFPATEPlan.from_json(saved) == plan


@pytest.mark.filterwarnings("ignore:.*run_clock.json' is missing")  # no earlier process here
def test_a_checkpoint_of_the_old_form_resumes(tmp_path):
  # What train_dfpate opens its workdir with: the checkpoint's config is compared after the
  # migration, so a version-1 checkpoint of the same run resumes and one of another is refused.
  config = _config()
  workdir = str(tmp_path / "run")
  checkpoint.save(os.path.join(workdir, "checkpoints"), 1, {"x": np.zeros(2, np.float32)},
                  {"config": _version1(config), "round": 1})
  run = workdir_lib.open_run(workdir, kind="DF-PATE", config=config.to_json(), resume=True,
                             migrate=config_migration.migrate)
  assert run.resuming and run.step == 1
  run.close()
  other = _config(student_learning_rate=0.5).to_json()
  with pytest.raises(errors.UserError, match="another config"):
    workdir_lib.open_run(workdir, kind="DF-PATE", config=other, resume=True,
                         migrate=config_migration.migrate)


def test_the_flat_config_the_cli_resolved_before_loads():
  baselines = json.loads((_REPO / "tests" / "cli_baselines.json").read_text(encoding="utf-8"))
  flat = {command: case["config"] for command, case in baselines.items()
          if command.startswith("dfpate")}
  assert flat
  for command, saved in flat.items():
    config = dfpate.DFPATEConfig.from_json(saved)
    assert (config.teacher_learning_rate, config.student_learning_rate) == (
        saved["teacher_lr"], saved["student_lr"]), command
